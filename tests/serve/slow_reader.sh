#!/usr/bin/env bash
# A client that stops reading its stream cannot hold its slot forever: once
# the socket buffers are full (the server's is 256 KiB), the server's write
# waits at most --timeout (2 s here), then drops the client and aborts its
# request.
#   slow_reader.sh LOOM WORKDIR TOKENIZER
set -euo pipefail
source "$(dirname "$0")/ready_port.sh"
loom=$1 work=$2 tokenizer=$3
rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=2048 --out "$work/m" >/dev/null
"$loom" serve --model "$work/m" --port 0 --threads 1 --tokenizer "$tokenizer" --timeout 2 >"$work/log" 2>&1 &
server=$!
trap 'kill -9 $server 2>/dev/null || true' EXIT
port=$(ready_port "$work/log" "$server" 300)
[[ -n $port ]] || { cat "$work/log"; exit 1; }
/usr/bin/python3 - "$port" <<'PY'
import json, socket, sys, time, urllib.request
port = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # a small window, and nothing read
s.connect(("127.0.0.1", port))
body = json.dumps({"model": "m", "prompt": "Hello", "max_tokens": 2000, "ignore_eos": True, "stream": True,
                   "logprobs": 5}).encode()  # ~700 bytes an event: the 256 KiB send buffer fills in ~400 tokens
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
start = time.time()
while time.time() - start < 120:
    time.sleep(0.5)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    if 'loom_num_requests_in_flight{model="m"} 0' in metrics:
        break
tokens = [l for l in metrics.splitlines() if l.startswith("loom_generation_tokens_total")][0].split()[-1]
assert 'loom_num_requests_in_flight{model="m"} 0' in metrics, "the stalled client still holds its request"
assert float(tokens) < 2000, f"the request ran to its end ({tokens} tokens): the client was never dropped"
print(f"slow reader: dropped and its request aborted after {float(tokens):.0f} of 2000 tokens")
r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
    data=json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 2}).encode()), timeout=30)
assert r.status == 200
print("a normal request then completes")
PY
grep -q '"POST /v1/completions" 200 client_gone' "$work/log" && echo "access log: client_gone"
