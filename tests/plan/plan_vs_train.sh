#!/usr/bin/env bash
# loom plan's prediction equals what loom train then measures (--memory-json),
# every rank and tag, for each layout below (dp with ZeRO 0 to 3, tp, cp,
# pp with every schedule, ep, and their products): one training step of
# configs/tiny.toml on a small prepared corpus; and LoRA runs of the same
# model (adapters on an f32, bf16 or q8_0 GGUF base, dropout) under dp
# (ZeRO 2 and 3), tp with SP (and a q8_0 base split over tp) and pp.
#   plan_vs_train.sh LOOM WORK TOKENIZER CONFIG            the one-process layouts
#   plan_vs_train.sh LOOM WORK TOKENIZER CONFIG MPIRUN...  the layouts of 2 and 4 ranks
# A bf16 layout is skipped (said so) on a CPU without a bf16 GEMM.
set -euo pipefail
loom=$1 work=$2 tok=$3 config=$4
shift 4
compare=$(dirname "$0")/compare_memory.py
rm -rf "$work" && mkdir -p "$work/in"
for i in $(seq 60); do echo "The quick brown fox number $i jumps over the lazy dog."; done >"$work/in/a.txt"
cp "$work/in/a.txt" "$work/in/b.txt"
"$loom" data prepare --tokenizer "$tok" --input "$work/in" --output "$work/data" --val-fraction 0.5 >/dev/null
n=0
# case NP LAYOUT [--out] --set ... : plan, train, compare.
case_() {
  local np=$1 name=$2
  shift 2
  local out=()
  if [[ ${1:-} == --out ]]; then out=(--out "$work/model.$n"); shift; fi
  local sets=(--set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin" --set train.steps=1 "$@")
  "$loom" plan --config "$conf" "${sets[@]}" "${out[@]}" --json >"$work/plan.$n"
  local launch=()
  if ((np > 1)); then launch=("${mpirun[@]}" -np "$np"); fi
  if ! "${launch[@]}" "$loom" train --config "$conf" "${sets[@]}" "${out[@]}" --memory-json --threads 1 \
    >"$work/train.$n" 2>"$work/train.$n.err"; then
    if grep -q "no bf16 GEMM" "$work/train.$n.err"; then echo "skipped: $name (this CPU has no bf16 GEMM)"; return; fi
    cat "$work/train.$n" "$work/train.$n.err" >&2
    exit 1
  fi
  /usr/bin/python3 "$compare" "$work/plan.$n" "$work/train.$n" "$name"
  n=$((n + 1))
}
# The LoRA runs' config: tiny.toml's, its [model] given by lora.base instead.
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=32 --seed 3 --out "$work/base" >/dev/null
"$loom" quantize "$work/base" "$work/base_q8.gguf" --type q8_0 --tokenizer "$tok" >/dev/null 2>&1
/usr/bin/python3 - "$config" "$work/base" >"$work/lora.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
print(re.sub(r"\[model\][^\[]*", "", text) + f'\n[lora]\nrank = 4\nalpha = 8\nbase = "{sys.argv[2]}"\n')
PY
conf=$config
lora() { conf=$work/lora.toml; case_ "$@"; conf=$config; }
mpirun=("$@")
if ((${#mpirun[@]} == 0)); then
  lora 1 "LoRA, f32 base, adapters written" --out
  lora 1 "LoRA, bf16 base, dropout, full recompute" --set train.dtype=bf16 --set lora.dropout=0.1 --set train.recompute=full
  lora 1 "QLoRA, q8_0 base, dropout" --set "lora.base=$work/base_q8.gguf" --set lora.dropout=0.1
  case_ 1 "fp32" --set train.recompute=none
  case_ 1 "fp32, selective recompute, model written" --out --set train.recompute=selective
  case_ 1 "fp32, small buckets" --set parallel.bucket_mb=0.05
  case_ 1 "bf16, full recompute, model written" --out --set train.dtype=bf16 --set train.recompute=full
  case_ 1 "fp32, optimizer offloaded" --set parallel.offload_optimizer=true
  case_ 1 "fp16, optimizer and master weights on disk, model written" --out --set train.dtype=fp16 --set parallel.offload=optimizer --set "parallel.offload_dir=$work/offload" --set parallel.offload_budget_mb=1
  case_ 1 "ZeRO 3, fp16, parameters, gradients and optimizer on disk, model written" --out --set train.dtype=fp16 --set parallel.zero_stage=3 --set parallel.offload=params --set "parallel.offload_dir=$work/offload" --set parallel.offload_budget_mb=1
  case_ 1 "llama, fp32" --set model.preset=llama-tiny --set model.vocab_size=50257
  case_ 1 "ZeRO 2 on one rank, small buckets, 2 micro-batches" --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05 --set train.grad_accum=2
  case_ 1 "MoE, ZeRO 2, 3 micro-batches" --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05 --set train.grad_accum=3
  case_ 1 "ZeRO 3 on one rank, bf16, model written" --out --set parallel.zero_stage=3 --set train.dtype=bf16
else
  lora 2 "LoRA, dp 2, ZeRO 2" --set parallel.dp=2 --set parallel.zero_stage=2
  lora 2 "LoRA, dp 2, ZeRO 3, dropout, adapters written" --out --set parallel.dp=2 --set parallel.zero_stage=3 --set lora.dropout=0.1
  lora 2 "LoRA, tp 2, sequence parallel" --set parallel.tp=2 --set parallel.sequence_parallel=true
  lora 2 "QLoRA, q8_0 base split over tp 2" --set "lora.base=$work/base_q8.gguf" --set parallel.tp=2
  lora 2 "LoRA, pp 2, 1F1B, 2 micro-batches" --set parallel.pp=2
  case_ 2 "dp 2, ZeRO 0" --set parallel.dp=2
  case_ 2 "dp 2, ZeRO 3, optimizer on disk" --set parallel.dp=2 --set parallel.zero_stage=3 --set parallel.offload=optimizer --set "parallel.offload_dir=$work/offload" --set parallel.offload_budget_mb=1
  case_ 2 "dp 2, ZeRO 3, parameters on disk" --set parallel.dp=2 --set parallel.zero_stage=3 --set parallel.offload=params --set "parallel.offload_dir=$work/offload" --set parallel.offload_budget_mb=1
  case_ 2 "dp 2, ZeRO 1, small buckets, model written" --out --set parallel.dp=2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.05
  case_ 2 "tp 2" --set parallel.tp=2
  case_ 2 "tp 2, sequence parallel, bf16" --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.dtype=bf16
  case_ 4 "dp 2 x tp 2, ZeRO 1, model written" --out --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=1
  case_ 3 "dp 3, ZeRO 1 (uneven shards)" --set parallel.dp=3 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.05
  case_ 2 "dp 2, ZeRO 2, small buckets, model written" --out --set parallel.dp=2 --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05
  case_ 4 "dp 4, ZeRO 2, bf16, llama" --set parallel.dp=4 --set parallel.zero_stage=2 --set train.dtype=bf16 --set model.preset=llama-tiny --set model.vocab_size=50257 --set parallel.bucket_mb=0.1
  case_ 4 "dp 2 x tp 2, ZeRO 2" --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05
  case_ 2 "dp 2, ZeRO 3, model written" --out --set parallel.dp=2 --set parallel.zero_stage=3
  case_ 2 "dp 2, ZeRO 3, MoE, optimizer offloaded" --set parallel.dp=2 --set parallel.zero_stage=3 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set parallel.offload_optimizer=true
  case_ 2 "dp 2, ZeRO 2, optimizer offloaded, 1 micro-batch" --set parallel.dp=2 --set parallel.zero_stage=2 --set parallel.offload_optimizer=true --set train.grad_accum=1
  case_ 4 "dp 4, ZeRO 3, llama, full recompute" --set parallel.dp=4 --set parallel.zero_stage=3 --set model.preset=llama-tiny --set model.vocab_size=50257 --set train.recompute=full
  case_ 2 "cp 2, ring" --set parallel.cp=2
  case_ 2 "cp 2, all-gather, bf16, model written" --out --set parallel.cp=2 --set parallel.cp_algo=allgather --set train.dtype=bf16
  case_ 4 "dp 2 x cp 2, ZeRO 1, llama, selective recompute" --set parallel.dp=2 --set parallel.cp=2 --set parallel.zero_stage=1 --set model.preset=llama-tiny --set model.vocab_size=50257 --set train.recompute=selective
  case_ 4 "cp 2 x tp 2" --set parallel.cp=2 --set parallel.tp=2
  case_ 2 "cp 2, ZeRO 2, small buckets, 2 micro-batches" --set parallel.cp=2 --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05 --set train.grad_accum=2
  case_ 2 "cp 2, ZeRO 3, all-gather, full recompute" --set parallel.cp=2 --set parallel.zero_stage=3 --set parallel.cp_algo=allgather --set train.recompute=full
  case_ 4 "pp 2 x cp 2, 1F1B, 2 micro-batches" --set parallel.pp=2 --set parallel.cp=2 --set train.grad_accum=2
  case_ 2 "cp 2, MoE, all-gather" --set parallel.cp=2 --set parallel.cp_algo=allgather --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 2 x cp 2 x ep 2, ZeRO 1, MoE, small buckets" --set parallel.dp=2 --set parallel.cp=2 --set parallel.ep=2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.05 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 2 x cp 2, ZeRO 2, MoE, full recompute" --set parallel.dp=2 --set parallel.cp=2 --set parallel.zero_stage=2 --set train.recompute=full --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 2 x cp 2, ZeRO 3, bf16, llama, selective recompute, model written" --out --set parallel.dp=2 --set parallel.cp=2 --set parallel.zero_stage=3 --set train.dtype=bf16 --set model.preset=llama-tiny --set model.vocab_size=50257 --set train.recompute=selective
  case_ 4 "dp 2 x tp 2, ZeRO 3, bf16, sequence parallel" --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=3 --set train.dtype=bf16 --set parallel.sequence_parallel=true
  case_ 2 "pp 2, 1F1B, 4 micro-batches, tied embedding" --set parallel.pp=2 --set train.grad_accum=4
  case_ 2 "pp 2, GPipe, bf16, 3 micro-batches" --set parallel.pp=2 --set parallel.pp_schedule=afab --set train.dtype=bf16 --set train.grad_accum=3
  case_ 2 "pp 2, interleaved (v 2), 4 micro-batches, model written" --out --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.virtual_stages=2 --set model.n_layer=4 --set train.grad_accum=4
  case_ 3 "pp 3, 1F1B, llama, 5 micro-batches, selective recompute" --set parallel.pp=3 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_layer=3 --set train.grad_accum=5 --set train.recompute=selective
  case_ 4 "pp 4, 1F1B, bf16, full recompute, uneven split" --set parallel.pp=4 --set model.n_layer=5 --set parallel.pp_layers=[2,1,1,1] --set train.dtype=bf16 --set train.recompute=full --set train.grad_accum=6
  case_ 4 "pp 2 x dp 2, ZeRO 1, small buckets, model written" --out --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.05 --set train.grad_accum=2
  case_ 4 "pp 2 x tp 2, sequence parallel, bf16" --set parallel.pp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.dtype=bf16 --set train.grad_accum=2
  case_ 2 "dp 2 x ep 2, MoE" --set parallel.dp=2 --set parallel.ep=2 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 4 x ep 2, ZeRO 1, bf16, MoE, 3 micro-batches" --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero_stage=1 --set train.dtype=bf16 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set train.grad_accum=3
  case_ 4 "dp 2 x ep 2 x tp 2, ZeRO 1, small buckets, MoE, model written" --out --set parallel.dp=2 --set parallel.ep=2 --set parallel.tp=2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.05 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 2 "dp 2 x ep 2, ZeRO 2, MoE, small buckets, 2 micro-batches" --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero_stage=2 --set parallel.bucket_mb=0.05 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set train.grad_accum=2
  case_ 4 "dp 4 x ep 2, ZeRO 2, MoE, model written" --out --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero_stage=2 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 4 x ep 2, ZeRO 2, bf16, MoE" --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero_stage=2 --set train.dtype=bf16 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "dp 4 x ep 2, ZeRO 3, bf16, MoE, model written" --out --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero_stage=3 --set train.dtype=bf16 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2
  case_ 4 "pp 2 x dp 2 x ep 2, MoE" --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set train.grad_accum=2
  case_ 2 "pp 2, optimizer offloaded, MoE" --set parallel.pp=2 --set model.preset=llama-tiny --set model.vocab_size=50257 --set model.n_expert=4 --set model.top_k=2 --set parallel.offload_optimizer=true --set train.grad_accum=2
fi
echo "plan_vs_train: $n layouts, every rank and tag equal"
