# Sourced by the GGUF interop scripts (gguf_llama_cpp.sh, gguf_llama_quantize.sh):
# tiny models trained on one repeated sentence (so greedy decoding has clear
# winners) and their greedy tokens against llama.cpp's. Needs $loom, $tokenizer,
# $here and $work set by the caller ($node and $interop too for greedy_as_llama_cpp).
#
#   sentence_data WORK                    # WORK/data: shards of the sentence
#   train_tiny WORK NAME STEPS key=value...  # WORK/NAME: a checkpoint after STEPS steps of configs/tiny.toml
#   greedy_as_llama_cpp N PROMPT FILE...  # loom's greedy tokens against llama.cpp's, each file

sentence_data() {
  local work=$1
  mkdir -p "$work/in"
  for i in $(seq 200); do echo "The quick brown fox number $i jumps over the lazy dog."; done >"$work/in/a.txt"
  cp "$work/in/a.txt" "$work/in/b.txt"
  "$loom" data prepare --tokenizer "$tokenizer" --input "$work/in" --output "$work/data" --val-fraction 0.5 >/dev/null
}

train_tiny() {
  local work=$1 name=$2 steps=$3
  shift 3
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  "$loom" train --config "$here/../../configs/tiny.toml" --set "data.train=$work/data/train_*.bin" \
    --set "data.val=$work/data/val_*.bin" --set "train.steps=$steps" --set train.lr=3e-3 --set train.warmup_steps=10 \
    --set train.eval_every=0 --set "log.every=$steps" --set "checkpoint.dir=$work/$name" \
    --set "checkpoint.every=$steps" "${sets[@]}" --threads 2 >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
}

# greedy_as_llama_cpp N PROMPT FILE...: each GGUF file decoded greedily (N
# tokens from PROMPT) by llama.cpp (llama_cpp_greedy.mjs; needs $node and
# $interop) and by `loom generate`; prints each file's agreement and exits
# non-zero at the first file whose tokens differ.
greedy_as_llama_cpp() {
  local n=$1 prompt=$2 f loom_tokens
  shift 2
  "$node" "$here/llama_cpp_greedy.mjs" "$interop" "$n" "$prompt" "$@" >"$work/llama_cpp.jsonl"
  for f in "$@"; do
    loom_tokens=$("$loom" generate --model "$f" --prompt "$prompt" --max-tokens "$n" --temperature 0 --json \
      2>"$work/err" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])') ||
      { cat "$work/err"; exit 1; }
    python3 - "$f" "$loom_tokens" "$work/llama_cpp.jsonl" <<'PY'
import json, os, sys
f, loom, lines = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
ref = next(json.loads(l) for l in open(lines) if json.loads(l)["file"] == f)
agree = 0
while agree < min(len(loom), len(ref["tokens"])) and loom[agree] == ref["tokens"][agree]:
    agree += 1
name = os.path.basename(f)[:-5]
print(f"{name}: {agree} of {len(loom)} tokens agree; loom {loom}; llama.cpp {ref['tokens']}")
sys.exit(0 if agree == len(loom) == len(ref["tokens"]) else 1)
PY
  done
}
