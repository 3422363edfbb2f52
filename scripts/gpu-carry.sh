#!/usr/bin/env bash
# Packs the GPU test and benchmark executables and loom of build-gpu/ (stripped) and
# every shared library they load that is not the C library, the driver or
# CUDA's own (which the GPU machine has) into DIR/bundle.tar.xz (~12 MB),
# for `scripts/gpu-check.sh OUT --prebuilt DIR` on a machine without loom's
# build dependencies (oneDNN, OpenMP), with Open MPI's launcher and runtime
# (scripts/ompi-carry.sh) for its runs under mpirun. Build first:
#   cmake -S . -B build-gpu -DLOOM_CUDA=ON -DLOOM_CUDA_ARCHITECTURES=90
#   cmake --build build-gpu --target test_backend_ops_cuda gpu_ops_large gpu_ops_edges gpu_train bench_cuda_kernels \
#     mpi_test_nccl loom
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: gpu-carry.sh DIR}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
bins=(build-gpu/tests/test_backend_ops_cuda build-gpu/tests/gpu_ops_large build-gpu/tests/gpu_ops_edges
      build-gpu/tests/gpu_train build-gpu/tests/mpi_test_nccl
      build-gpu/bench/cuda/bench_cuda_kernels build-gpu/loom)
cp "${bins[@]}" "$stage/"
for b in "${bins[@]}"; do strip "$stage/$(basename "$b")"; done
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libnccl*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
bash scripts/ompi-carry.sh "$stage" >/dev/null
rm -rf "$dir"
mkdir -p "$dir"
tar -C "$stage" -cJf "$dir/bundle.tar.xz" .
du -sh "$dir/bundle.tar.xz"
