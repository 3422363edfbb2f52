// Row access shared by the CPU kernels that work one (rows, n) row at a time
// or span at a time in f32 whatever the storage dtype. Internal to
// src/kernels/cpu.
#pragma once

#include <cstdint>

#include <type_traits>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/half.h"
#include "kernels/validate.h"

namespace loom::kernels {

// Elements below which an OpenMP parallel region costs more than it saves
// (decode steps, tiny test shapes).
inline constexpr int64_t kMinParallel = 1 << 15;

// Elements [offset, offset + n) of a contiguous f32, bf16 or f16 tensor as
// f32: the tensor's own memory for f32, else converted into buf (n floats).
inline const float* load_span(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::f32) return t.data_as<float>() + offset;
  dispatch_float(t.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) span_to_f32(buf, t.data_as<T>() + offset, n);
  });
  return buf;
}

// Row r of a contiguous (rows, n) tensor as f32 (load_span).
inline const float* load_row(const Tensor& t, int64_t r, int64_t n, float* buf) {
  return load_span(t, r * n, n, buf);
}

// fn.template operator()<T, Y, B>(bias) for the float dtypes of a linear's
// operands x (T), output y (Y) and bias (B; float and nullptr when bias is
// undefined): a linear kernel's three dispatches in one place.
template <typename Fn>
inline void dispatch_linear(const Tensor& y, const Tensor& x, const Tensor& bias, const Fn& fn) {
  dispatch_float(x.dtype(), [&]<typename T>() {
    dispatch_float(y.dtype(), [&]<typename Y>() {
      if (!bias.defined()) return fn.template operator()<T, Y, float>(nullptr);
      dispatch_float(bias.dtype(), [&]<typename B>() { fn.template operator()<T, Y, B>(bias.data_as<const B>()); });
    });
  });
}

enum class Store { write, add };

// t's elements [offset, offset + n) = v, or += v, in t's dtype (f32, bf16,
// f16), rounded once (RNE).
inline void store_span(Tensor t, int64_t offset, int64_t n, const float* v, Store mode) {
  dispatch_float(t.dtype(), [&]<typename T>() {
    T* dst = t.data_as<T>() + offset;
    if (mode == Store::add) span_add_f32(dst, v, n);
    else span_from_f32(dst, v, n);
  });
}

}  // namespace loom::kernels
