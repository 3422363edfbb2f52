#!/usr/bin/env bash
# loom across two Slurm nodes: each "host" a network namespace with its own
# slurmd, joined by a veth pair (tests/slurm/cluster.sh slurm_up_two_hosts).
# srun -N 2 --ntasks-per-node=2 --mpi=pmix trains dp2 x tp2 ZeRO-1 with its
# ranks on two nodes (MPI sees two of them: shared memory within a node, TCP
# across) and must give one process's losses over 8 steps (1e-5).
# Exits 77 (skipped) without root, Slurm's programs or network namespaces.
#
# usage: two_hosts.sh LOOM WORKDIR CONFIG   (WORKDIR/data holds train_*.bin, val_*.bin)
set -uo pipefail
loom=$(realpath "$1") work=$(realpath "$2") config=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)

for p in munged slurmctld slurmd srun sinfo ip nsenter unshare; do
  command -v "$p" > /dev/null || { echo "skipped: $p not found (scripts/setup.sh --launchers installs what the Slurm tests need)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "skipped: network namespaces and slurmd need root"; exit 77; }

failed=0
check() {
  if [[ $1 == 0 ]]; then echo "ok $2"; else echo "FAIL $2"; failed=1; fi
}

# shellcheck source=tests/slurm/cluster.sh
. "$here/cluster.sh"
trap slurm_down EXIT
rm -rf "$work/cluster2" "$work/runs2"
mkdir -p "$work/runs2"
slurm_up_two_hosts "$work/cluster2"
case $? in
  0) ;;
  77) echo "skipped: cannot make network namespaces and a veth pair here (seen in a chroot: 'mount --make-rslave /' fails)"; exit 77 ;;
  *) exit 1 ;;
esac
cd "$work/runs2" || exit 1

keys=(--config "$config" --set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin"
      --set train.eval_every=0 --set train.steps=8 --threads 1)
"$loom" train "${keys[@]}" --set train.grad_accum=4 --metrics one.jsonl > one.log 2>&1
check $? "two hosts: the one-process reference trained"

# OpenMPI 4.1's TCP transport finds no interface of its own inside a network
# namespace unless told which to use (on real hosts it looks at them all).
slurm_on_node1 env OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 OMPI_MCA_btl_tcp_disable_family=6 \
  timeout 300 srun -N 2 --ntasks-per-node=2 --mpi=pmix bash -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME"' > where.log 2>&1
check $? "two hosts: srun -N 2 --ntasks-per-node=2 started its tasks"
[[ $(grep -c "on node1" where.log) == 2 && $(grep -c "on node2" where.log) == 2 ]]
check $? "two hosts: two tasks on node1 and two on node2"
slurm_on_node1 env OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 OMPI_MCA_btl_tcp_disable_family=6 \
  timeout 300 srun -N 2 --ntasks-per-node=2 --mpi=pmix "$loom" train "${keys[@]}" --set train.grad_accum=2 \
  --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=1 --metrics two.jsonl --memory-json > two.log 2>&1
check $? "two hosts: srun -N 2 -n 4 loom train (dp2 x tp2, ZeRO-1) exited 0"
ranks=$(grep -o '"world_rank":[0-9]*' two.log | sort -u | tr -d '\n')
[[ $ranks == '"world_rank":0"world_rank":1"world_rank":2"world_rank":3' ]]
check $? "two hosts: ranks 0-3 of one world each report their memory"
python3 - one.jsonl two.jsonl <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)) if a and b else float("inf")
ok = [r["step"] for r in a] == [r["step"] for r in b] and worst <= 1e-5
print(f"{'ok' if ok else 'FAIL'} two hosts: losses equal the one-process run's over {len(b)} steps (max rel diff {worst:.3g})")
sys.exit(0 if ok else 1)
EOF
[[ $? == 0 ]] || failed=1
[[ $failed == 0 ]] || { tail -n 20 where.log two.log; tail -n 5 "$work"/cluster2/log/*.log; }
exit $failed
