#!/usr/bin/env bash
# loom serve --lora: three PEFT adapters (written by peft_adapter.py, as peft
# saves them) served unmerged beside the base, driven by lora_client.mjs
# under with_server.sh; first, each --lora mistake is one clear error at start.
#   lora_serve.sh LOOM WORK TOKENIZER NODE CLIENTS_DIR DATA_DIR
set -uo pipefail
loom=$1 work=$2 tok=$3 node=$4 clients=$5 data=$6
here=$(dirname "$0")
ad="$work.adapters"
rm -rf "$ad" && mkdir -p "$ad"
# The model with_server.sh serves (the same command), to shape the adapters.
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set max_seq_len=128 --seed 7 --out "$ad/base" \
  >/dev/null || exit 1
mk() { /usr/bin/python3 "$here/peft_adapter.py" "$ad/$1" "$ad/base" "$2" "$3" "$4" "$5" || exit 1; }
mk a1 4 8 1 attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj
mk a2 2 8 2 attn.c_attn
mk a3 8 4 3 mlp.c_fc,mlp.c_proj
"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --set n_embd=32 --out "$ad/narrow" >/dev/null || exit 1
/usr/bin/python3 "$here/peft_adapter.py" "$ad/other" "$ad/narrow" 4 8 4 attn.c_attn || exit 1  # another model's
sed 's/"bias": "none"/"bias": "all"/' "$ad/a2/adapter_config.json" > "$ad/bias.json"
mkdir -p "$ad/bias" && cp "$ad/bias.json" "$ad/bias/adapter_config.json" && cp "$ad/a2/adapter_model.safetensors" "$ad/bias/"
refused() {
  out=$(timeout 60 "$loom" serve --port 0 --threads 1 --tokenizer "$tok" "$@" 2>&1); code=$?
  printf '%s\n' "$out" | grep -v "listening on" | tail -1; echo "exit=$code"
}
refused --model "$ad/base" --lora a1
refused --model "$ad/base" --lora "a1=$ad/nowhere"
refused --model "$ad/base" --lora "a1=$ad/other"
refused --model "$ad/base" --lora "a1=$ad/bias"
refused --model "$ad/base" --lora "a1=$ad/a1" --lora "a1:latest=$ad/a2"
refused --model "$ad/base" --lora "base=$ad/a1"
refused --lora "a1=$ad/a1"
bash "$here/with_server.sh" "$loom" "$work" --tokenizer "$tok" --lora "a1=$ad/a1" --lora "a2=$ad/a2" \
  --lora "a3=$ad/a3" -- "$node" "$clients/lora_client.mjs" "$data"
