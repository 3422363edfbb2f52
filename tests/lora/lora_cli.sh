#!/bin/sh
# loom train with [lora] end to end: a base model, adapters trained on it and
# written in PEFT's format, the adapter evaluated unmerged (eval --lora) and
# merged (lora merge) to the same loss, and the [lora] mistakes a user makes
# refused with the key and what is allowed.
#   $1 loom  $2 work dir  $3 tokenizer dir
set -u
loom=$1 d=$2 tok=$3
rm -rf "$d" && mkdir -p "$d/in"
for i in $(seq 60); do echo "The quick brown fox number $i jumps over the lazy dog."; done > "$d/in/a.txt"
cp "$d/in/a.txt" "$d/in/b.txt"
"$loom" data prepare --tokenizer "$tok" --input "$d/in" --output "$d/data" --val-fraction 0.5 > /dev/null || exit 1
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=32 --out "$d/base" --seed 3 \
  > /dev/null 2>&1 || exit 1
cat > "$d/lora.toml" <<TOML
[data]
train = "$d/data/train_*.bin"
val = "$d/data/val_*.bin"
[train]
seq_len = 16
micro_batch = 2
grad_accum = 2
steps = 4
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
eval_every = 0
seed = 7
[log]
peak_tflops = 1.0
[lora]
rank = 4
alpha = 8
targets = ["c_attn", "c_proj", "c_fc"]
base = "$d/base"
TOML
"$loom" train --config "$d/lora.toml" --out "$d/adapter" --threads 1 2>&1 | grep -E "LoRA" || exit 1
/usr/bin/python3 - "$d/adapter/adapter_config.json" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
assert c["peft_type"] == "LORA" and c["r"] == 4 and c["lora_alpha"] == 8, c
assert c["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"], c["target_modules"]
print("adapter_config: peft_type LORA, r 4, lora_alpha 8, 4 target modules")
PY
"$loom" lora merge --base "$d/base" --adapter "$d/adapter" --out "$d/merged" > /dev/null 2>&1 || exit 1
e() { "$loom" eval --data "$d/data/val_000000.bin" --seq-len 16 --json --threads 1 "$@"; }
/usr/bin/python3 - "$(e --model "$d/base" --lora "$d/adapter")" "$(e --model "$d/merged")" "$(e --model "$d/base")" <<'PY' || exit 1
import json, sys
unmerged, merged, base = (json.loads(a)["loss"] for a in sys.argv[1:])
assert abs(unmerged - merged) <= 1e-5 * abs(merged), (unmerged, merged)
assert unmerged < base, (unmerged, base)
print("merged loss equals the unmerged adapter's; both below the base's")
PY
# Merged into bf16 weights (Hugging Face layout): BF16 tensors that loom
# reads back, the loss within bf16's rounding of the f32 merge's.
"$loom" lora merge --base "$d/base" --adapter "$d/adapter" --out "$d/merged16" --dtype bf16 --to hf > /dev/null 2>&1 \
  || exit 1
/usr/bin/python3 - "$d/merged16/model.safetensors" "$(e --model "$d/merged16")" "$(e --model "$d/merged")" <<'PY' || exit 1
import json, struct, sys
f = open(sys.argv[1], "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}, header
low, full = (json.loads(a)["loss"] for a in sys.argv[2:])
assert abs(low - full) <= 1e-2 * abs(full), (low, full)
print("merged into bf16: BF16 tensors, loss within 1e-2 of the f32 merge's")
PY
# Mistakes: each one line naming the key.
refused() {
  out=$("$loom" train --config "$d/lora.toml" --threads 1 "$@" 2>&1); code=$?
  printf '%s\n' "$out" | tail -1; echo "exit=$code"
}
refused --set lora.rank=0
refused --set 'lora.targets=["q_proj"]'
refused --set lora.rank=999
refused --set model.n_layer=3
refused --set lora.base="$d/nowhere"
refused --set lora.dropout=1
# A checkpoint of adapters resumed on another base is refused.
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=32 --out "$d/other" --seed 4 \
  > /dev/null 2>&1 || exit 1
"$loom" train --config "$d/lora.toml" --set "checkpoint.dir=$d/ckpt" --set checkpoint.every=2 --set train.steps=2 \
  --threads 1 > /dev/null 2>&1 || exit 1
refused --set "checkpoint.dir=$d/ckpt" --set checkpoint.every=2 --set "lora.base=$d/other"
