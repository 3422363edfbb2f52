#!/usr/bin/env bash
# loom run against a store, in this process (no server at --host):
#   run_chat.sh LOOM WORKDIR TOKENIZER
# one answer for a PROMPT (stdout the answer alone); a piped conversation (/set parameter, a """
# multi-line message, /show, /bye); an unknown model's error; and Ctrl-C
# during a long answer stops that answer, not the program: the next message
# is answered and /bye ends it with status 0.
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

one=$(run tiny "Hello there")
[[ -n $one ]] || { echo "no answer for a prompt"; exit 1; }
# stdout is the answer alone: the in-process server's progress goes to stderr.
if grep -q '^\[rank' <<<"$one"; then echo "log lines in the answer: $one"; exit 1; fi
"$loom" run tiny "Hello" --models "$work/s" --host "$none" --threads 1 --tokenizer "$tokenizer" >/dev/null 2>"$work/stderr"
if grep -q '^\[rank' "$work/stderr"; then echo "rank prefixes beside the chat: $(cat "$work/stderr")"; exit 1; fi
echo "prompt: answered"
out=$(printf '/set parameter num_predict 3\n/set parameter nope 1\nHello\n"""two\nlines"""\n/show\n/bye\nnever sent\n' | run tiny)
grep -q "Set parameter 'num_predict' to '3'" <<<"$out"
grep -q "unknown PARAMETER 'nope'" <<<"$out"
grep -q 'parameters: {"num_predict":3}' <<<"$out"
echo "conversation: /set, multi-line, /show, /bye"
# A conversation longer than the context (num_ctx 64): the oldest messages are left out, every turn is answered.
printf 'FROM ./m\nPARAMETER temperature 0\nPARAMETER num_predict 4\nPARAMETER num_ctx 64\n' >"$work/Small"
"$loom" create small -f "$work/Small" --models "$work/s" >/dev/null
long="one two three four five six seven eight nine ten eleven twelve"
printf '%s\n%s\n%s\n%s\n/bye\n' "$long" "$long" "$long" "$long" |
  "$loom" run small --models "$work/s" --host "$none" --threads 1 --tokenizer "$tokenizer" >"$work/shift" 2>"$work/shift.err"
[[ $(grep -c "outgrew the model's context" "$work/shift.err") == 1 ]] || { cat "$work/shift.err"; exit 1; }
if grep -q "error" "$work/shift.err"; then cat "$work/shift.err"; exit 1; fi
echo "context shift: the oldest messages left out, every turn answered"
if "$loom" run nope "x" --models "$work/s" --host "$none" --tokenizer "$tokenizer" 2>"$work/err"; then echo "nope ran"; exit 1; fi
grep -q "model 'nope' not found" "$work/err" && echo "unknown model: error"

# Ctrl-C: an answer of up to 2000 tokens is interrupted; the program goes on.
{ echo "/set parameter num_predict 2000"; echo "Hello"; sleep 4; echo "/set parameter num_predict 2"; echo "Again";
  echo "/bye"; } | "$loom" run tiny --models "$work/s" --host "$none" --threads 1 --tokenizer "$tokenizer" \
  >"$work/ctrlc" 2>&1 &
pid=$!
# Ctrl-C once the answer is being written (the model may take a while to load on a busy machine).
for _ in $(seq 300); do
  grep -v "loading model\|Set parameter" "$work/ctrlc" | grep -q "[a-zA-Z]" && break
  sleep 0.1
done
kill -INT "$pid"
status=0
wait "$pid" || status=$?
((status == 0)) || { echo "loom run exited $status after Ctrl-C"; cat "$work/ctrlc"; exit 1; }
lines=$(grep -vc "loading model\|Set parameter" "$work/ctrlc" || true)
((lines == 2)) || { echo "expected the cut answer and the next one"; cat "$work/ctrlc"; exit 1; }
words=$(grep -v "loading model\|Set parameter" "$work/ctrlc" | head -1 | wc -w)
((words < 1950)) || { echo "the first answer ran to $words words: Ctrl-C did not cut it"; exit 1; }
echo "ctrl-c: stopped the answer, answered the next message, exit 0"
