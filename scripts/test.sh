#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test
# (CTest + GoogleTest; kernel references come from PyTorch at test time).
# Tests run in two passes by label (tests/properties.cmake): first the unit
# tests and the PyTorch reference fixtures (minutes, so a broken build or
# kernel shows up early), then everything else (mpi, cli). The second pass
# runs even when the first fails; the script fails if either did. Each pass
# ends with CTest's time per label.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
stage packages bash scripts/setup.sh --launchers   # and Slurm and MPICH's mpiexec for the launcher tests
stage data bash scripts/fetch-data.sh   # the GPT-2 tokenizer files the text tests read
stage build bash scripts/build.sh

failed=()
# run_tests NAME CTEST-ARGS...: one pass; a failure is recorded, not fatal.
run_tests() {
  local name=$1
  shift
  ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 "$@" || failed+=("$name")
}
# The second pass takes every test the first leaves out (-LE), labelled or
# not, so together they run the whole suite once.
stage "unit tests" run_tests unit -L '^(unit|ref)$'
stage "mpi and cli tests" run_tests "mpi and cli" -LE '^(unit|ref)$'
stage_summary
if ((${#failed[@]})); then
  echo "$(basename "$0"): failed: $(printf '%s, ' "${failed[@]}" | sed 's/, $//')" >&2
  exit 1
fi
