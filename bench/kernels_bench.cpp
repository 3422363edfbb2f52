#include "bench/kernels_bench.h"

#include <chrono>
#include <cstdio>

#include "core/memory.h"
#include "kernels/ops.h"

namespace loom::bench {

int run_kernel_bench(const KernelBenchOptions& opts) {
  Pools pools;
  const int64_t n = 1024;
  OwnedTensor a = pools[MemTag::workspace].zeros(DType::f32, {n, n});
  OwnedTensor b = pools[MemTag::workspace].zeros(DType::f32, {n, n});
  OwnedTensor c = pools[MemTag::workspace].zeros(DType::f32, {n, n});
  const auto t0 = std::chrono::steady_clock::now();
  kernels::matmul(c, a, b);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("matmul f32 %lld^3: %.1f GFLOP/s\n", static_cast<long long>(n), 2.0 * n * n * n / s / 1e9);
  return 0;
}

}  // namespace loom::bench
