# Sourced by the GGUF interop scripts, which set loom, node, interop, here
# and work. same_greedy_as_llama_cpp MODEL N PROMPT: loom's N greedy tokens
# for PROMPT equal llama.cpp's (node-llama-cpp, special tokens parsed as
# llama.cpp's server does), else the script exits 1 with both lists.
same_greedy_as_llama_cpp() {
  local model=$1 n=$2 prompt=$3
  LOOM_PARSE_SPECIAL=1 "$node" "$here/llama_cpp_greedy.mjs" "$interop" "$n" "$prompt" "$model" >"$work/ref.json"
  "$loom" generate --model "$model" --prompt "$prompt" --max-tokens "$n" --temperature 0 --json \
    2>"$work/err" >"$work/loom.json" || { cat "$work/err"; exit 1; }
  /usr/bin/python3 "$here/same_greedy.py" "$work/loom.json" "$work/ref.json" "$prompt" || exit 1
}
