#!/usr/bin/env bash
# loom run against a store, in this process (no server at --host):
#   run_chat.sh LOOM WORKDIR TOKENIZER
# one answer for a PROMPT (stdout the answer alone); what loom run sends, seen
# by a stand-in server: piped stdin is one message before the PROMPT (as
# ollama's cmd.go), /set system (one line or """ lines), /set parameter stop
# unquoted and replaced; a conversation at a terminal (a pty from script(1):
# /set parameter, a """ multi-line message, /show, /bye); an unknown model's
# error; and Ctrl-C during a long answer stops that answer, not the program:
# the next message is answered and /bye ends it with status 0.
set -euo pipefail
# A step that fails says which (its output is what ctest shows of a failure).
trap 'echo "run_chat.sh: the step at line $LINENO failed"' ERR
loom=$1 work=$2 tokenizer=$3
rm -rf "$work" && mkdir -p "$work"
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=2048 --out "$work/m" >/dev/null
printf 'FROM ./m\nPARAMETER temperature 0\nPARAMETER num_predict 6\n' >"$work/Modelfile"
"$loom" create tiny -f "$work/Modelfile" --models "$work/s" >/dev/null
none=http://127.0.0.1:9  # nothing listens there: loom run serves the store itself
run() { "$loom" run "$@" --models "$work/s" --host "$none" --threads 1 --tokenizer "$tokenizer" 2>/dev/null; }
# At a terminal: stdin goes through a pty, so loom run converses (piped, it sends stdin as one message). The
# terminal does not echo (what is typed ahead would mix with the answers); tty_text leaves out the >>> prompts
# and any line typed before echo was off.
# loom run replaces the shell (exec): the terminal's ^C reaches it alone, as at a real terminal, and not a
# shell that SIGINT would end.
run_tty() {
  script -qec "stty -echo; exec $(printf '%q ' "$loom" run "$@" --models "$work/s" --host "$none" --threads 1 \
    --tokenizer "$tokenizer")" /dev/null
}
tty_text() { tr -d '\r' <"$1" | sed 's/^\(>>> \)*//' | grep -vx -f "$work/typed" || true; }

# A stand-in ollama server that writes each /api/chat's messages and options to its log, one JSON line each.
cat >"$work/stand_in.py" <<'PY'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self): self.reply({"version": "0"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/api/chat":
            print(json.dumps({"messages": body["messages"], "options": body["options"]}), flush=True)
            return self.reply({"message": {"role": "assistant", "content": "ok"}, "done": True})
        self.reply({"modelfile": ""})
    def reply(self, j):
        data = (json.dumps(j) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_port, flush=True)
s.serve_forever()
PY
python3 "$work/stand_in.py" >"$work/stand_in.log" &
stand_in=$!
for _ in $(seq 100); do [[ -s $work/stand_in.log ]] && break; sleep 0.1; done
fake="http://127.0.0.1:$(head -1 "$work/stand_in.log")"
printf 'line one\nline two\n' | "$loom" run m "Summarize:" --host "$fake" >/dev/null
printf 'just the file\n' | "$loom" run m --host "$fake" >/dev/null
printf '%s\n' '/set parameter stop "User:"' '/set system Be a pirate.' hi '/set parameter stop A B' \
  '/set system """Two' 'lines."""' ho /bye |
  script -qec "$(printf '%q ' "$loom" run m --host "$fake")" /dev/null >/dev/null
kill "$stand_in"
sent=$(tail -n +2 "$work/stand_in.log")
expected=$(printf '%s\n' \
  '{"messages": [{"content": "line one\nline two\n Summarize:", "role": "user"}], "options": {}}' \
  '{"messages": [{"content": "just the file\n", "role": "user"}], "options": {}}' \
  '{"messages": [{"content": "Be a pirate.", "role": "system"}, {"content": "hi", "role": "user"}], "options": '\
'{"stop": ["User:"]}}' \
  '{"messages": [{"content": "Two\nlines.", "role": "system"}, {"content": "hi", "role": "user"}, '\
'{"content": "ok", "role": "assistant"}, {"content": "ho", "role": "user"}], "options": {"stop": ["A", "B"]}}')
[[ $sent == "$expected" ]] || { echo "loom run sent:"; echo "$sent"; exit 1; }

one=$(run tiny "Hello there")
[[ -n $one ]] || { echo "no answer for a prompt"; exit 1; }
# stdout is the answer alone: the in-process server's progress goes to stderr.
if grep -q '^\[rank' <<<"$one"; then echo "log lines in the answer: $one"; exit 1; fi
"$loom" run tiny "Hello" --models "$work/s" --host "$none" --threads 1 --tokenizer "$tokenizer" >/dev/null 2>"$work/stderr"
if grep -q '^\[rank' "$work/stderr"; then echo "rank prefixes beside the chat: $(cat "$work/stderr")"; exit 1; fi
echo "prompt: answered"
printf '/set parameter num_predict 3\n/set parameter nope 1\nHello\n"""two\nlines"""\n/show\n/bye\nnever sent\n' |
  tee "$work/typed" | run_tty tiny >"$work/conversation"
out=$(tty_text "$work/conversation")
grep -q "Set parameter 'num_predict' to '3'" <<<"$out"
grep -q "unknown PARAMETER 'nope'" <<<"$out"
grep -q 'parameters: {"num_predict":3}' <<<"$out"
! grep -q "error" <<<"$out"
echo "conversation: /set, multi-line, /show, /bye; what is sent: piped stdin, /set system, stop"
# A conversation longer than the context (num_ctx 64): the oldest messages are left out, every turn is answered.
printf 'FROM ./m\nPARAMETER temperature 0\nPARAMETER num_predict 4\nPARAMETER num_ctx 64\n' >"$work/Small"
"$loom" create small -f "$work/Small" --models "$work/s" >/dev/null
long="one two three four five six seven eight nine ten eleven twelve"
printf '%s\n%s\n%s\n%s\n/bye\n' "$long" "$long" "$long" "$long" | tee "$work/typed" | run_tty small >"$work/shift"
[[ $(grep -c "outgrew the model's context" "$work/shift") == 1 ]] || { cat "$work/shift"; exit 1; }
if grep -q "error" "$work/shift"; then cat "$work/shift"; exit 1; fi
echo "context shift: the oldest messages left out, every turn answered"
if "$loom" run nope "x" --models "$work/s" --host "$none" --tokenizer "$tokenizer" 2>"$work/err"; then echo "nope ran"; exit 1; fi
grep -q "model 'nope' not found" "$work/err" && echo "unknown model: error"

# Ctrl-C (the terminal's ^C, through the pty): an answer of up to 2000 tokens is interrupted; the program goes
# on. ^C is typed once the answer is being written (the model may take a while to load on a busy machine).
printf '/set parameter num_predict 2000\nHello\n/set parameter num_predict 2\nAgain\n/bye\n' >"$work/typed"
answer_lines() { tty_text "$work/ctrlc" | grep -v "loading model\|Set parameter\|^$" || true; }
{
  echo "/set parameter num_predict 2000"
  echo "Hello"
  # The answer has begun once a prompt was shown (loom run catches SIGINT from then on; a log line of the
  # start-up, on a machine that prints one, is not the answer) and text follows it.
  for _ in $(seq 300); do
    grep -q '>>> ' "$work/ctrlc" && answer_lines | grep -q "[a-zA-Z]" && break
    sleep 0.1
  done
  printf '\003'
  sleep 0.5
  echo "/set parameter num_predict 2"
  echo "Again"
  echo "/bye"
} | run_tty tiny >"$work/ctrlc" && status=0 || status=$?  # (not ERR's exit: what it wrote is shown below)
((status == 0)) || { echo "loom run exited $status after Ctrl-C"; cat "$work/ctrlc"; exit 1; }
lines=$(answer_lines | wc -l)
((lines == 2)) || { echo "expected the cut answer and the next one"; cat "$work/ctrlc"; exit 1; }
words=$(answer_lines | head -1 | wc -w)
((words < 1950)) || { echo "the first answer ran to $words words: Ctrl-C did not cut it"; exit 1; }
echo "ctrl-c: stopped the answer, answered the next message, exit 0"
