#!/usr/bin/env bash
# loom under a real Slurm cluster of one node (tests/slurm/cluster.sh: munged,
# slurmctld and slurmd under WORKDIR, stopped by PID at the end):
#   pmix     srun -n 4 --mpi=pmix on dp2 x tp2 ZeRO-1: every rank logs a world
#            of 4 and the losses equal one process's over 8 steps (1e-5);
#   none     srun -n 2 --mpi=none on dp=2: the launcher's error, naming the
#            fix, on every task, and nothing trained;
#   requeue  an sbatch job (srun -n 2, dp=2) that would outlast its --time,
#            with --signal=TERM@30: loom checkpoints on the SIGTERM and exits,
#            the job resubmitted resumes from that step and ends with the model
#            of an uninterrupted run, bitwise;
#   bench    srun -n 2 loom bench comm prints bus bandwidth and an srun
#            reproduce line.
# Exits 77 (skipped) without root or Slurm's and munge's programs.
#
# usage: slurm_jobs.sh LOOM WORKDIR CONFIG   (WORKDIR/data holds train_*.bin, val_*.bin)
set -uo pipefail
loom=$(realpath "$1") work=$(realpath "$2") config=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)

for p in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$p" > /dev/null || { echo "skipped: $p not found (scripts/setup.sh --launchers installs slurmctld, slurmd, slurm-client and munge)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "skipped: slurmd must run as root to start tasks"; exit 77; }

failed=0
check() {  # check CONDITION_STATUS "what"
  if [[ $1 == 0 ]]; then echo "ok $2"; else echo "FAIL $2"; failed=1; fi
}

# shellcheck source=tests/slurm/cluster.sh
. "$here/cluster.sh"
trap slurm_down EXIT
rm -rf "$work/cluster" "$work/runs"
mkdir -p "$work/runs"
slurm_up "$work/cluster" || exit 1
cd "$work/runs" || exit 1

keys=(--config "$config" --set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin"
      --set train.eval_every=0 --threads 1)
losses_equal() {  # losses_equal A.jsonl B.jsonl TOLERANCE: same steps, relative difference within TOLERANCE
  python3 - "$@" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
steps_a, steps_b = [r["step"] for r in a], [r["step"] for r in b]
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b)) if a and b else float("inf")
print(f"  steps {steps_a[0] if a else None}..{steps_a[-1] if a else None}, max rel loss diff {worst:.3g}")
sys.exit(0 if steps_a == steps_b and worst <= float(sys.argv[3]) else 1)
EOF
}

# ---- pmix: dp2 x tp2 ZeRO-1 under srun equals one process ----
"$loom" train "${keys[@]}" --set train.steps=8 --set train.grad_accum=4 --metrics one.jsonl > one.log 2>&1
check $? "pmix: the one-process reference trained"
timeout 300 srun -n 4 --mpi=pmix "$loom" train "${keys[@]}" --set train.steps=8 --set train.grad_accum=2 \
  --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=1 --metrics four.jsonl --memory-json > four.log 2>&1
check $? "pmix: srun -n 4 --mpi=pmix loom train (dp2 x tp2, ZeRO-1) exited 0"
grep -q "^\[rank 0/4\] step 8/8" four.log; check $? "pmix: rank 0's log lines say world 4"
ranks=$(grep -o '"world_rank":[0-9]*' four.log | sort -u | tr -d '\n')
[[ $ranks == '"world_rank":0"world_rank":1"world_rank":2"world_rank":3' ]]
check $? "pmix: ranks 0-3 of one world each report their memory (--memory-json)"
losses_equal four.jsonl one.jsonl 1e-5; check $? "pmix: losses equal the one-process run's (1e-5)"

# ---- none: no PMIx, a clear error and nothing trained ----
timeout 120 srun -n 2 --mpi=none "$loom" train "${keys[@]}" --set train.steps=8 --set parallel.dp=2 \
  --metrics none.jsonl > none.log 2>&1
code=$?
[[ $code != 0 ]]; check $? "none: srun -n 2 --mpi=none failed (status $code)"
n=$(grep -c "error: Slurm's srun started this process as rank [01] of 2 (SLURM_STEP_NUM_TASKS=2) without a PMIx server.*srun --mpi=pmix" none.log)
[[ $n == 2 ]]; check $? "none: both tasks name the launcher and the fix ($n lines)"
! grep -q "step 1/" none.log && [[ ! -e none.jsonl ]]; check $? "none: nothing trained"

# ---- requeue: a job ended by its time limit resumes bitwise when resubmitted ----
steps=150
timeout 300 srun -n 2 "$loom" train "${keys[@]}" --set train.steps=$steps --set parallel.dp=2 \
  --set checkpoint.dir="$work/runs/whole" > whole.log 2>&1
check $? "requeue: the uninterrupted reference trained $steps steps"
cat > job.sh <<EOF
#!/bin/bash
#SBATCH -n 2
#SBATCH --time=2
#SBATCH --signal=TERM@30
#SBATCH -o $work/runs/job_%j.out
srun "$loom" train ${keys[*]@Q} --set train.steps=$steps --set parallel.dp=2 --set checkpoint.dir=$work/runs/ckpt \
  --set checkpoint.every=100000 --metrics $work/runs/job_\$SLURM_JOB_ID.jsonl
EOF
# slurmctld checks time limits every 30 s and sends --signal's SIGTERM at
# the first check within 30 + 30 s of the limit: 60 to 90 s into this job,
# long after loom is ready for it. Each step is slowed to 800 ms (timing only:
# LOOM_DP_DELAY, train/trainer.h) so the 150 steps would take 120 s.
start=$(date +%s)
LOOM_DP_DELAY=rotate:800 sbatch --wait --parsable job.sh > first.id 2> first.err
first=$(cat first.id)
echo "  the first job ran $(( $(date +%s) - start )) s"
grep -q "SIGTERM" "job_$first.out"; check $? "requeue: the first job's tasks got Slurm's SIGTERM"
saved=$(ls -d ckpt/step_* 2> /dev/null | tail -1)
[[ -n $saved ]] && ((10#${saved##*_} < steps)); check $? "requeue: the first job left a checkpoint before the end (${saved:-none})"
env -u LOOM_DP_DELAY sbatch --wait --parsable job.sh > second.id 2> second.err
check $? "requeue: the resubmitted job finished"
second=$(cat second.id)
first_step=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['step'])" "job_$second.jsonl" 2> /dev/null)
[[ -n $saved && $first_step == $((10#${saved##*_} + 1)) ]]; check $? "requeue: it resumed at step $first_step, the one after the checkpoint"
cmp -s ckpt/model.safetensors whole/model.safetensors; check $? "requeue: its final model equals the uninterrupted run's bitwise"
if [[ $failed != 0 ]]; then tail -n 5 "job_$first.out" "job_$second.out" first.err second.err; fi

# ---- bench: srun -n 2 loom bench comm ----
timeout 120 srun -n 2 "$loom" bench comm --max 1048576 > bench.log 2>&1
check $? "bench: srun -n 2 loom bench comm exited 0"
grep -q "busbw_GB/s" bench.log && grep -q "reproduce: srun -n 2 --mpi=pmix" bench.log
check $? "bench: it prints bus bandwidth and how to reproduce it under srun"

[[ $failed == 0 ]] || { for f in four.log none.log bench.log; do echo "== $f"; tail -n 5 "$f"; done; }
exit $failed
