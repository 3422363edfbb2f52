#!/usr/bin/env bash
# loom train --memory-budget-mb with the optimizer on disk (issue 41): a
# model whose f32 weights, gradients and AdamW state (16 bytes a parameter)
# are over the budget is refused at start when nothing is offloaded, with
# loom plan's numbers and what parallel.offload = optimizer would need; with
# the optimizer's state and master weights on disk the same run trains
# within the budget, as the OS counts it (the child's ru_maxrss, read by
# Python, not loom).
#   memory_budget.sh LOOM WORK TOKENIZER
set -euo pipefail
loom=$1 work=$2 tok=$3
rm -rf "$work"
mkdir -p "$work/in"
for i in $(seq 300); do echo "The quick brown fox number $i jumps over the lazy dog."; done >"$work/in/a.txt"
"$loom" data prepare --tokenizer "$tok" --input "$work/in" --output "$work/data" --val-fraction 0 >/dev/null
# GPT-2 of 4 layers, C = 512: 38.4M parameters (16 bytes each: 586 MiB of
# f32 weights, gradients and AdamW moments), fp16 compute (so f32 master
# weights too), ZeRO 1 on one rank; the start-up GEMM measurement is skipped
# (log.peak_tflops), and no checkpoint is written (a save gathers the whole
# shard state in memory: not yet streamed).
cat >"$work/run.toml" <<TOML
[model]
preset = "gpt2-tiny"
n_layer = 4
n_embd = 512
n_head = 8
d_ff = 2048
vocab_size = 50257
max_seq_len = 64
[data]
train = "$work/data/train_*.bin"
[train]
seq_len = 64
micro_batch = 1
steps = 3
dtype = "fp16"
eval_every = 0
[parallel]
zero_stage = 1
[log]
peak_tflops = 1.0
TOML
budget=450
echo "state: $((38400000 * 16 / 1048576)) MiB of f32 weights, gradients and AdamW moments; budget: $budget MiB"
set +e
refused=$("$loom" train --config "$work/run.toml" --memory-budget-mb $budget --threads 2 2>&1)
code=$?
set -e
echo "$refused" | grep -o -- "--memory-budget-mb = $budget: rank 0 needs [0-9.]* MiB: its buffers peak at [^(]*" || true
echo "$refused" | grep -o "with parallel.offload = optimizer (AdamW's state and the master weights on disk) its buffers would peak at [0-9.]* MiB" || true
echo "exit=$code"
# The same run with the optimizer on disk, measured from outside.
/usr/bin/python3 - "$loom" "$work" "$budget" <<'PY'
import resource, subprocess, sys
loom, work, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
def run(steps):
    cmd = [loom, "train", "--config", work + "/run.toml", "--memory-budget-mb", str(budget), "--threads", "2",
           "--memory-report", "--set", "parallel.offload=optimizer", "--set", "parallel.offload_dir=" + work + "/offload",
           "--set", "parallel.offload_budget_mb=16", "--set", "train.steps=%d" % steps]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: the offloaded run failed (%d):\n%s" % (p.returncode, (p.stdout + p.stderr)[-3000:]))
    return p.stdout + p.stderr
out = run(3)
peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
print("offloaded run's peak resident memory (ru_maxrss): %.1f MiB" % peak_mib)
print("offloaded: peak resident %s MiB (ru_maxrss), within the budget: %s" % (
    "%.0f" % peak_mib if peak_mib > budget else "<= %d" % budget, peak_mib <= budget))
PY
