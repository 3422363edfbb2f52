#!/usr/bin/env bash
# A store model made FROM a model directory keeps the directory's own
# tokenizer and serves with it: a Llama-3-style tokenizer.json (with its
# tokenizer_config.json) and a SentencePiece tokenizer.model, each answered
# by loom run in process while the server's tokenizer (--tokenizer) does not
# exist, so a model that fell back to it would fail. A directory whose
# tokenizer is broken is refused at create, naming the Modelfile's FROM, and
# nothing is stored.
#
#   store_tokenizer.sh LOOM WORKDIR HF_TOKENIZER_IDS GPT2_TOKENIZER_DIR SPM_MODEL
set -euo pipefail
loom=$1 work=$2 ids=$3 gpt2=$4 spm=$5
rm -rf "$work"
mkdir -p "$work"
cd "$work"
run() {  # NAME PROMPT: the answer; fails with the log when there is none
  "$loom" run "$1" "$2" --models store --host http://127.0.0.1:9 --tokenizer "$work/no-such-tokenizer" \
    --threads 1 2>err >answer || { cat err >&2; exit 1; }
  [[ -s answer ]] || { echo "store_tokenizer: $1 gave no answer" >&2; cat err >&2; exit 1; }
}
"$ids" write-llama3 "$gpt2" tok
"$loom" init-model --preset llama-tiny --set vocab_size=50262 --out m >/dev/null
"$loom" convert --to hf --model m --out l3 --tokenizer tok >/dev/null
printf 'FROM ./l3\nPARAMETER temperature 0\nPARAMETER num_predict 6\n' >M1
"$loom" create l3 -f M1 --models store >/dev/null
run l3 '<|start_header_id|>user<|end_header_id|>Hello world'
echo "store_tokenizer: tokenizer.json kept and served"

"$loom" init-model --preset llama-tiny --set vocab_size=1800 --format hf --out sp >/dev/null
cp "$spm" sp/tokenizer.model
printf 'FROM ./sp\nPARAMETER temperature 0\nPARAMETER num_predict 6\n' >M2
"$loom" create sp -f M2 --models store >/dev/null
run sp 'The quick brown fox'
echo "store_tokenizer: tokenizer.model kept and served"

printf '\x0a\xff\xff' >sp/tokenizer.model
if "$loom" create broken -f M2 --models store 2>err; then
  echo "store_tokenizer: a broken tokenizer.model was accepted" >&2; exit 1
fi
grep -o "M2:1: FROM: the model's tokenizer: [^:]*tokenizer.model" err
"$loom" list --models store | grep -q '^broken' && { echo "store_tokenizer: broken was stored" >&2; exit 1; }
echo "store_tokenizer: a broken tokenizer refused at create, nothing stored"
