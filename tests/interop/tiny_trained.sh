# Sourced by the GGUF interop scripts (gguf_llama_cpp.sh, gguf_llama_quantize.sh):
# tiny models trained on one repeated sentence, so greedy decoding has clear
# winners to compare. Needs $loom, $tokenizer and $here set by the caller.
#
#   sentence_data WORK                    # WORK/data: shards of the sentence
#   train_tiny WORK NAME STEPS key=value...  # WORK/NAME: a checkpoint after STEPS steps of configs/tiny.toml

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
