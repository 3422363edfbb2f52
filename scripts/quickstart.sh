#!/usr/bin/env bash
# loom's main job on a fresh Debian 12 machine: install, build, then measure
# the CPU kernels (GFLOP/s of matmul f32/bf16, attention tokens/s).
# The training issue turns this into fetch-data, train, generate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
build/loom bench kernels "$@"
