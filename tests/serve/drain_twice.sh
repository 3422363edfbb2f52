#!/usr/bin/env bash
# SIGTERM on loom serve: new requests get 503 (and /health), the stream in
# flight goes on; a second SIGTERM exits at once (status 143).
#   drain_twice.sh LOOM WORKDIR TOKENIZER
set -euo pipefail
source "$(dirname "$0")/ready_port.sh"
loom=$1 work=$2 tokenizer=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=2048 --out "$work/m" >/dev/null
"$loom" serve --model "$work/m" --port 0 --threads 1 --tokenizer "$tokenizer" --drain-seconds 60 >"$work/log" 2>&1 &
server=$!
port=$(ready_port "$work/log" "$server" 300)
[[ -n $port ]] || { cat "$work/log"; exit 1; }
LOOM_URL="http://127.0.0.1:$port" LOOM_SERVER_PID=$server node "$here/clients/drain.mjs"
status=0
wait "$server" || status=$?
echo "loom serve exited $status"
