#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test
# (CTest + GoogleTest; kernel references come from PyTorch at test time).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
stage packages bash scripts/setup.sh
stage data bash scripts/fetch-data.sh   # the GPT-2 tokenizer files the text tests read
stage build bash scripts/build.sh
stage tests ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
stage_summary
