// Test helpers for the 16-bit storage paths (bf16 and f16) of the kernel
// tests: the same rounding and views for either type, so one test body
// checks both against the f32 path.
#pragma once

#include <vector>

#include "common/tensors.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace loom::test {

// v rounded to dtype (RNE, core/dtype.h) and back to float.
inline Floats rounded_to(DType dtype, const Floats& v) {
  return Buffer(dtype, Shape{static_cast<int64_t>(v.size())}, v).floats();
}

// Elementwise RNE to H (bf16 or f16) and back.
template <typename H>
std::vector<H> to_half_vec(const Floats& v) {
  std::vector<H> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = store_as<H>(v[i]);
  return out;
}
template <typename H>
Floats from_half_vec(const std::vector<H>& v) {
  Floats out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = load_f32(v[i]);
  return out;
}
template <typename H>
Floats rounded_to_half(const Floats& v) {
  return from_half_vec(to_half_vec<H>(v));
}
template <typename H>
Tensor half_view(std::vector<H>& v, Shape s) {
  return Tensor(v.data(), dtype_of<H>::value, s);
}

// Tolerance of a 16-bit storage path against the f32 path: bf16 keeps 8
// significand bits (one rounding: relative error <= 2^-9), f16 keeps 11
// (<= 2^-12). Tests scale their bf16 tolerances by kF16Tighter for f16: 4x
// tighter, leaving 2x headroom over the 8x ratio of the rounding errors for
// errors that are not a single rounding (sums of rounded terms).
inline constexpr double kF16Tighter = 0.25;

}  // namespace loom::test
