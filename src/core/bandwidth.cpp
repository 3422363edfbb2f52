#include "core/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"
#include "core/memory.h"

namespace loom {

double measure_read_bandwidth(int64_t bytes, int passes) {
  LOOM_REQUIRE(bytes >= 8 && passes >= 1, "measure_read_bandwidth: needs at least 8 bytes and one pass, got ",
               bytes, " bytes and ", passes, " passes");
  using Clock = std::chrono::steady_clock;
  Pools pools;
  const int64_t n = bytes / static_cast<int64_t>(sizeof(uint64_t));
  const OwnedTensor buffer = pools[MemTag::workspace].empty(DType::i64, {n});
  auto* v = static_cast<uint64_t*>(buffer.data());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint64_t>(i);
  double best = std::numeric_limits<double>::infinity();
  volatile uint64_t sink = 0;  // keeps the sums
  for (int pass = 0; pass < passes; ++pass) {
    const Clock::time_point t0 = Clock::now();
    uint64_t sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += v[i];
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    sink = sink + sum;
  }
  return static_cast<double>(n * static_cast<int64_t>(sizeof(uint64_t))) / best;
}

}  // namespace loom
