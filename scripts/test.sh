#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test
# (CTest + GoogleTest; kernel references come from PyTorch at test time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch-data.sh   # the GPT-2 tokenizer files the text tests read
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900
