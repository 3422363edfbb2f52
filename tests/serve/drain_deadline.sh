#!/usr/bin/env bash
# SIGTERM with a drain deadline shorter than the requests in flight: each is
# cut at the deadline and says so (OpenAI finish_reason "abort", as vLLM
# reports it; ollama done_reason "abort"), streamed or not.
#   drain_deadline.sh LOOM WORKDIR TOKENIZER
set -euo pipefail
source "$(dirname "$0")/ready_port.sh"
loom=$1 work=$2 tokenizer=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=4096 --out "$work/m" >/dev/null
"$loom" serve --model "$work/m" --port 0 --threads 1 --tokenizer "$tokenizer" --drain-seconds 1 >"$work/log" 2>&1 &
server=$!
port=$(ready_port "$work/log" "$server" 300)
[[ -n $port ]] || { cat "$work/log"; exit 1; }
LOOM_URL="http://127.0.0.1:$port" LOOM_SERVER_PID=$server node "$here/clients/drain_deadline.mjs" ||
  { cat "$work/log"; exit 1; }
status=0
wait "$server" || status=$?
echo "loom serve exited $status"
