#!/usr/bin/env bash
# Configures and builds loom (Release) into build/. With no argument it builds
# everything: build/loom, the tests and the benchmarks. With target names it
# builds only those and what they link: `bash scripts/build.sh loom` builds
# the executable alone (what the quickstart needs, in well under half the time).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
