#!/usr/bin/env bash
# Installs every Debian package loom needs (Debian 12 "bookworm"). Idempotent
# and fast when everything is present: apt-get runs only for what is missing.
# Versions are those of Debian 12, itself a pinned release: loom is built and
# tested against oneDNN 2.6.3, OpenBLAS 0.3.21, PyTorch 1.13.1 (references),
# GoogleTest 1.12.1, CLI11 2.3.2, nlohmann-json 3.11.2, toml++ 3.3.0,
# OpenMPI 4.1.4.
set -euo pipefail

packages=(
  g++ cmake make pkg-config   # toolchain (g++ 12, CMake 3.25)
  libdnnl-dev                 # oneDNN: bf16 and f32 GEMMs (AVX-512 BF16)
  libopenblas-openmp-dev      # OpenBLAS: the f32 GEMM loom bench kernels --openblas compares
  nlohmann-json3-dev          # JSON (reports, --json output)
  libcli11-dev                # command-line parsing
  libtomlplusplus-dev         # toml++ 3.3.0: run configs (configs/*.toml)
  libgtest-dev                # tests
  python3-torch               # PyTorch: reference values for kernel tests
  libopenmpi-dev openmpi-bin  # OpenMPI 4.1.4: launch (mpirun) and connect processes
  procps                      # pgrep: the comm watchdog test checks no rank is left running
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all ${#packages[@]} packages present"
