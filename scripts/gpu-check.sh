#!/usr/bin/env bash
# The GPU proof (issue 42): builds loom's CUDA code for sm_90 (H100 / H200),
# runs the gpu-labelled tests (and loom train under mpirun), the kernel
# benchmark next to PyTorch's, and gpt2-124m training (`loom train --device
# cuda`, bf16 and fp32) next to PyTorch's on the same GPU, and writes everything to OUT (a folder;
# created). Meant to finish in under 10 minutes on a Hopper machine; the
# training runs read data/brown (scripts/fetch-data.sh and loom data prepare,
# or carried).
#
#   bash scripts/gpu-check.sh OUT                  # configure + build build-gpu/, then run
#   bash scripts/gpu-check.sh OUT --prebuilt DIR   # run the binaries of DIR (scripts/gpu-carry.sh
#                                                  # made it on a machine with loom's build
#                                                  # dependencies; this one needs only the driver,
#                                                  # CUDA's libraries and python3 with torch)
#
# OUT gets: gpu.txt (nvidia-smi), <test>.log and <test>.xml per GPU test,
# bench_loom.jsonl, bench_torch.jsonl, train_<dtype>.jsonl / .log (loom's
# metrics), torch_train_<dtype>.json, trace_ops_bf16.json / .log (a bf16 run's
# kernel ops timed on the GPU), summary.txt. Exit status: 0 when every
# test passed (a benchmark failure is reported in summary.txt, not fatal).
# Limits, in seconds: LOOM_GPU_TEST_TIMEOUT (each test, 300), LOOM_GPU_MPI_TIMEOUT
# (mpi_test_nccl under mpirun, 150), LOOM_GPU_MPI_TIMEOUT_LAYOUTS (each case of
# train_mpi.py, 300; LOOM_GPU_RUN_TIMEOUT each mpirun in it, 120),
# LOOM_GPU_BENCH_TIMEOUT (each kernel bench, 200), LOOM_GPU_TRAIN_TIMEOUT
# (each training run, 150); LOOM_GPU_TRAIN_DTYPES: the training runs'
# dtypes ("bf16 fp32").
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: gpu-check.sh OUT [--prebuilt DIR]}
shift
prebuilt=""
if [[ ${1:-} == --prebuilt ]]; then prebuilt=${2:?--prebuilt needs a folder}; fi
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi >"$out/gpu.txt" 2>&1 || note "nvidia-smi failed (see gpu.txt)"
note "gpu-check on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

if [[ -z $prebuilt ]]; then
  bin=build-gpu
  cmake -S . -B "$bin" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_CUDA_ARCHITECTURES=90 >"$out/configure.log" 2>&1 \
    || { note "configure failed (configure.log)"; exit 1; }
  cmake --build "$bin" -j "$(nproc)" --target test_backend_ops_cuda gpu_ops_large gpu_ops_edges gpu_train \
    mpi_test_nccl bench_cuda_kernels loom >"$out/build.log" 2>&1 || { note "build failed (build.log)"; exit 1; }
  tests=("$bin/tests/test_backend_ops_cuda" "$bin/tests/gpu_ops_large" "$bin/tests/gpu_ops_edges" "$bin/tests/gpu_train")
  nccl_test="$bin/tests/mpi_test_nccl"
  bench="$bin/bench/cuda/bench_cuda_kernels"
  loom="$bin/loom"
else
  # The carried binaries and the shared libraries they need beside them.
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf "$prebuilt/bundle.tar.xz" || { note "cannot unpack $prebuilt/bundle.tar.xz"; exit 1; }
  prebuilt=$unpacked
  cuda_libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && cuda_libs+="$d:"; done
  for pkg in cublas cuda_runtime nccl; do
    d=$(python3 -c "import nvidia.$pkg as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null) \
      && cuda_libs+="$d:"
  done
  export LD_LIBRARY_PATH="$prebuilt/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
  tests=("$prebuilt/test_backend_ops_cuda" "$prebuilt/gpu_ops_large" "$prebuilt/gpu_ops_edges" "$prebuilt/gpu_train")
  nccl_test="$prebuilt/mpi_test_nccl"
  bench="$prebuilt/bench_cuda_kernels"
  loom="$prebuilt/loom"
fi

status=0
for t in "${tests[@]}"; do
  name=$(basename "$t")
  start=$(date +%s)
  timeout "${LOOM_GPU_TEST_TIMEOUT:-300}" "$t" --gtest_output="xml:$out/$name.xml" >"$out/$name.log" 2>&1
  rc=$?
  passed=$(grep -c "^\[       OK \]" "$out/$name.log")
  failed=$(grep -c "^\[  FAILED  \]" "$out/$name.log")
  note "$name: exit $rc, $passed passed, $failed failed lines, $(($(date +%s) - start)) s"
  grep -E "^\[  FAILED  \]|Failure|threw|error|warning" "$out/$name.log" | head -40 >>"$summary"
  ((rc != 0)) && status=1
done

timeout "${LOOM_GPU_BENCH_TIMEOUT:-200}" "$bench" --reps 20 >"$out/bench_loom.jsonl" 2>"$out/bench_loom.err" \
  || note "bench_cuda_kernels failed: $(tail -3 "$out/bench_loom.err")"
timeout "${LOOM_GPU_BENCH_TIMEOUT:-200}" python3 bench/cuda/torch_kernels_bench.py --reps 20 >"$out/bench_torch.jsonl" 2>"$out/bench_torch.err" \
  || note "torch reference failed: $(tail -3 "$out/bench_torch.err")"
note "benchmarks: $(grep -c '^{' "$out/bench_loom.jsonl" 2>/dev/null) loom lines, $(grep -c '^{' "$out/bench_torch.jsonl" 2>/dev/null) torch lines"

# gpt2-124m training, B 8 x T 1024: loom's steps (metrics: tokens_per_s, mfu
# against the GEMM peak it measures) and PyTorch's on the same shape.
for dt in ${LOOM_GPU_TRAIN_DTYPES:-bf16 fp32}; do
  timeout "${LOOM_GPU_TRAIN_TIMEOUT:-150}" "$loom" train --config configs/gpt2-124m-gpu.toml --device cuda \
    --set train.dtype="$dt" --metrics "$out/train_$dt.jsonl" >"$out/train_$dt.log" 2>&1 \
    || note "loom train $dt failed: $(tail -3 "$out/train_$dt.log")"
  note "loom train $dt: $(tail -1 "$out/train_$dt.jsonl" 2>/dev/null)"
  grep -m 3 -i "warning" "$out/train_$dt.log" >>"$summary"  # e.g. a fused op that fell back
  timeout "${LOOM_GPU_TRAIN_TIMEOUT:-150}" python3 bench/cuda/torch_train_bench.py --model gpt2-124m --batch 8 \
    --seq 1024 --dtype "$dt" --steps 10 >"$out/torch_train_$dt.json" 2>"$out/torch_train_$dt.err" \
    || note "torch train $dt failed: $(tail -3 "$out/torch_train_$dt.err")"
  note "torch train $dt: $(cut -c1-400 "$out/torch_train_$dt.json" 2>/dev/null)"
done
# Where a bf16 step's time goes: 6 steps with every kernel op timed on the
# GPU (log.trace_ops: CUDA events around each op; trace_ops_bf16.json opens in
# Perfetto) and the ops' table, most time first, in summary.txt.
timeout "${LOOM_GPU_TRAIN_TIMEOUT:-150}" "$loom" train --config configs/gpt2-124m-gpu.toml --device cuda \
  --set train.steps=6 --set log.peak_tflops=1 --set log.trace="$out/trace_ops_bf16.json" --set log.trace_ops=true \
  >"$out/trace_ops_bf16.log" 2>&1 || note "loom train with log.trace_ops failed: $(tail -3 "$out/trace_ops_bf16.log")"
sed -n '/kernel ops so far/,$p' "$out/trace_ops_bf16.log" | head -40 >>"$summary"
# Last, so that a hang in NCCL's set-up costs no other result: the NCCL
# backend's tests under mpirun, 2 ranks, and loom train's layouts over NCCL
# (tests/gpu/train_mpi.py: more ranks than GPUs refused; dp / tp against the
# same layouts on CPUs). On one GPU the 2 ranks share it (LOOM_NCCL_SHARE_GPU=1,
# comm/nccl/nccl_backend.h: NCCL over loopback sockets; unbound, so NCCL's
# threads are not pinned to one core a rank). The carried Open MPI is the one
# loom's binaries were linked with: in --prebuilt mode it is used, and only here.
(
  if [[ -n $prebuilt && -f $prebuilt/ompi/env.sh ]]; then
    source "$prebuilt/ompi/env.sh"
    note "mpirun: Open MPI carried in the bundle"
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
  share=$((gpus < 2 ? 1 : 0))
  note "GPU compute mode: $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)"
  command -v mpirun >/dev/null || { note "mpi runs: not run: no mpirun here and none carried"; exit 1; }
  mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
  rc_all=0
  start=$(date +%s)
  LOOM_NCCL_SHARE_GPU=$share NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout "${LOOM_GPU_MPI_TIMEOUT:-150}" \
    "${mpi[@]}" -np 2 -x LOOM_NCCL_SHARE_GPU -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS "$nccl_test" \
    >"$out/mpi_test_nccl.log" 2>&1
  rc=$?
  ok=$(grep -c "OK \]" "$out/mpi_test_nccl.log")
  skipped=$(grep -c "SKIPPED \]" "$out/mpi_test_nccl.log")
  note "mpi_test_nccl (2 ranks, $gpus GPU(s), sharing $share): exit $rc, $ok OK lines, $skipped skipped lines," \
    "$(($(date +%s) - start)) s"
  grep -E "FAILED|Failure|error|WARN|SKIPPED" "$out/mpi_test_nccl.log" | head -20 >>"$summary"
  # A proof that skipped is no proof: on a GPU every test but the 3-rank ones must run.
  ((rc != 0 || ok == 0)) && rc_all=1
  grep -qE "no CUDA device|needs one CUDA device per rank" "$out/mpi_test_nccl.log" && rc_all=1
  for case in refusal layouts; do
    start=$(date +%s)
    LOOM_NCCL_SHARE_GPU=$share LOOM_GPU_RUN_TIMEOUT=${LOOM_GPU_RUN_TIMEOUT:-120} \
      timeout "${LOOM_GPU_MPI_TIMEOUT_LAYOUTS:-300}" python3 -u tests/gpu/train_mpi.py "$loom" \
      "$(IFS=';'; echo "${mpi[*]}")" "$(mktemp -d)/$case" "$case" >"$out/train_mpi_$case.log" 2>&1
    rc=$?
    note "train_mpi $case: exit $rc, $(($(date +%s) - start)) s: $(tail -1 "$out/train_mpi_$case.log")"
    ((rc != 0)) && rc_all=1  # 77 (skipped) included: this machine has the GPU and the launcher
  done
  exit $rc_all
) || status=1
# One archive of everything, for machines that hand back few files.
tar -C "$out" -czf "$out.tar.gz" . && mv "$out.tar.gz" "$out/all.tar.gz"
exit $status
