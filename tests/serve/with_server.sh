#!/usr/bin/env bash
# Runs a command against a real `loom serve` on loopback:
#   with_server.sh LOOM WORKDIR [--store] [SERVE-FLAGS...] -- COMMAND...
# A fresh tiny GPT-2 model (loom init-model, GPT-2's vocabulary) is served on
# a free port: the directory itself (--model), or with --store a model store
# in WORKDIR/store that holds it as "tiny" (loom create from a Modelfile with
# PARAMETER temperature 0 and a SYSTEM prompt). COMMAND runs with LOOM_URL
# (http://127.0.0.1:PORT), LOOM_MODEL (the served name), LOOM_STORE and
# LOOM_WORK set. Then the server gets SIGTERM and must exit 0 within its
# drain. The server's log is printed when anything fails. The model's
# context is 128 tokens, or LOOM_SERVE_MAX_SEQ.
set -euo pipefail
source "$(dirname "$0")/ready_port.sh"
loom=$1 work=$2
shift 2
store=0
if [[ ${1:-} == --store ]]; then store=1; shift; fi
flags=()
while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
[[ ${1:-} == -- ]] || { echo "with_server.sh: missing -- COMMAND" >&2; exit 2; }
shift

rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len="${LOOM_SERVE_MAX_SEQ:-128}" --seed 7 \
  --out "$work/tiny" >/dev/null
log="$work/serve.log"
if ((store)); then
  printf 'FROM ./tiny\nPARAMETER temperature 0\nSYSTEM """You are terse."""\n' >"$work/Modelfile"
  "$loom" create tiny -f "$work/Modelfile" --models "$work/store" >/dev/null
  # From WORKDIR, which holds the model folder ./tiny as well as the store's tiny: over the API a FROM names
  # the store model only (ollama_client.mjs's createFromTheStoreNeverReadsAFolder).
  (cd "$work" && exec "$loom" serve --models "$work/store" --port 0 --threads 1 "${flags[@]}") >"$log" 2>&1 &
else
  "$loom" serve --model "$work/tiny" --port 0 --threads 1 "${flags[@]}" >"$log" 2>&1 &
fi
server=$!
fail() {
  echo "with_server.sh: $*" >&2
  echo "--- loom serve's log ---" >&2
  cat "$log" >&2
  kill -9 "$server" 2>/dev/null || true
  exit 1
}
port=$(ready_port "$log" "$server")  # up to 60 s to start
[[ -n $port ]] || fail "loom serve exited or was not ready within 60 s"
export LOOM_URL="http://127.0.0.1:$port" LOOM_MODEL=tiny LOOM_STORE="$work/store" LOOM_WORK="$work"
status=0
"$@" || status=$?
kill -TERM "$server"
server_status=0
wait "$server" || server_status=$?
((status == 0)) || fail "the command failed (exit $status)"
((server_status == 0)) || fail "loom serve exited $server_status after SIGTERM (expected 0)"
echo "with_server.sh: passed; loom serve drained and exited 0"
