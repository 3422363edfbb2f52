#!/bin/sh
# A job whose ranks were given different flags, for the mpi.cli tests:
#   mpirun -np N sh per_rank_set.sh RANK KEY=VALUE LOOM ARGS...
# runs LOOM ARGS... on every rank, with --set KEY=VALUE added on world rank
# RANK only (OpenMPI's launcher tells each process its rank in
# OMPI_COMM_WORLD_RANK).
rank=$1
set_arg=$2
shift 2
if [ "$OMPI_COMM_WORLD_RANK" = "$rank" ]; then exec "$@" --set "$set_arg"; fi
exec "$@"
