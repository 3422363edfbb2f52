#!/bin/sh
# A job whose ranks run in different working directories, as on nodes whose
# file systems differ, for the mpi.cli tests:
#   mpirun -np N sh in_rank_dir.sh PREFIX COMMAND ARGS...
# runs COMMAND ARGS... on each rank in PREFIX<rank> (OpenMPI's launcher tells
# each process its rank in OMPI_COMM_WORLD_RANK), so a relative path in a
# flag names a different file on each rank.
prefix=$1
shift
cd "$prefix$OMPI_COMM_WORLD_RANK" || exit 1
exec "$@"
