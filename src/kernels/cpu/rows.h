// Row access shared by the CPU kernels that work one (rows, n) row at a time
// or span at a time in f32 whatever the storage dtype. Internal to
// src/kernels/cpu.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/validate.h"

namespace loom::kernels {

// Elements below which an OpenMP parallel region costs more than it saves
// (decode steps, tiny test shapes).
inline constexpr int64_t kMinParallel = 1 << 15;

// Elements [offset, offset + n) of a contiguous f32 or bf16 tensor as f32:
// the tensor's own memory for f32, else converted into buf (n floats).
inline const float* load_span(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::f32) return t.data_as<float>() + offset;
  const bf16* src = t.data_as<bf16>() + offset;
  for (int64_t i = 0; i < n; ++i) buf[i] = from_bf16(src[i]);
  return buf;
}

// Row r of a contiguous (rows, n) tensor as f32 (load_span).
inline const float* load_row(const Tensor& t, int64_t r, int64_t n, float* buf) {
  return load_span(t, r * n, n, buf);
}

enum class Store { write, add };

// t's elements [offset, offset + n) = v, or += v, in t's dtype (f32, bf16).
inline void store_span(Tensor t, int64_t offset, int64_t n, const float* v, Store mode) {
  dispatch_float(t.dtype(), [&]<typename T>() {
    T* dst = t.data_as<T>() + offset;
    if (mode == Store::add) {
      for (int64_t i = 0; i < n; ++i) dst[i] = store_as<T>(load_f32(dst[i]) + v[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = store_as<T>(v[i]);
    }
  });
}

}  // namespace loom::kernels
