#!/usr/bin/env bash
# The serving cost of LoRA adapters served unmerged (issue 40): the same
# throughput workload through the engine with the base alone, with one
# adapter and with four (rank 16 on every linear, requests spread over them
# in turn, so a step's rows carry up to four adapters). Prints one JSON line
# per run (loom bench serve --json).
#   bench/lora_serve.sh [LOOM] [PRESET] [REQUESTS]
set -euo pipefail
loom=${1:-build/loom} preset=${2:-gpt2-124m} n=${3:-64}
lscpu | grep -E "^Model name" || true
for k in 0 1 4; do
  "$loom" bench serve --preset "$preset" --num-requests "$n" --input-len 128 --output-len 64 --max-num-seqs 32 \
    --lora-adapters "$k" --lora-rank 16 --json
done
