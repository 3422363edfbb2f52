// The inputs of the multi-rank comm tests (MPI and NCCL backends): each rank
// fills its buffers from a formula of (rank, index), so every rank can
// compute any other rank's data, and so the expected result, locally.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

namespace loom::comm::test_values {

// Storage of each dtype, converted through double.
template <typename T> T store(double x) { return static_cast<T>(x); }
template <> inline bf16 store<bf16>(double x) { return to_bf16(static_cast<float>(x)); }
template <typename T> double load(T x) { return static_cast<double>(x); }
template <> inline double load<bf16>(bf16 x) { return from_bf16(x); }

// Halves in [-7.5, 7.5] (floats) or integers (with a high bit for i64):
// every partial sum over up to 8 ranks is exact in every dtype, even bf16,
// in any order, so sums and maxima compare exactly.
template <typename T>
double value(int rank, int64_t i) {
  const double v = static_cast<double>((rank * 7 + i * 13) % 31 - 15);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) return v * 0.5;
  if constexpr (std::is_same_v<T, int64_t>) return v + static_cast<double>(int64_t{rank} << 33);
  return v;
}

// value(rank, begin + i) for i in [0, n).
template <typename T>
std::vector<T> filled(int rank, int64_t n, int64_t begin = 0) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = store<T>(value<T>(rank, begin + i));
  return v;
}

}  // namespace loom::comm::test_values
