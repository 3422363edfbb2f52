// Elementwise add, cast and fill over f32 / bf16 / f16 storage (ops.h).
//
// Mixed dtypes go through f32: every f32/bf16/f16 value is exact in f32, so
// a conversion rounds once (RNE, core/dtype.h) and an add rounds as
// store_as<Ty>(float(a) + float(b)): the f32 sum, rounded to y's dtype.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/rows.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace loom::kernels {
namespace {


template <typename Y, typename A, typename B>
void add_loop(Y* y, const A* a, const B* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = store_as<Y>(load_f32(a[i]) + load_f32(b[i]));
}

template <typename D, typename S>
void cast_loop(D* dst, const S* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) dst[i] = store_as<D>(load_f32(src[i]));
}

template <typename T>
void fill_loop(T* x, int64_t n, T value) {
#pragma omp parallel for simd schedule(static) if (n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

}  // namespace

void add(Tensor y, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  require_cpu_contiguous(op, {{"y", y}, {"a", a}, {"b", b}});
  require_any_float(op, {"y", y});
  require_any_float(op, {"a", a});
  require_any_float(op, {"b", b});
  require_same_shape(op, {"a", a}, {"b", b});
  require_same_shape(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"b", b});
  dispatch_any_float(y.dtype(), [&]<typename Y>() {
    dispatch_any_float(a.dtype(), [&]<typename A>() {
      dispatch_any_float(b.dtype(), [&]<typename B>() {
        add_loop(y.data_as<Y>(), a.data_as<const A>(), b.data_as<const B>(), y.numel());
      });
    });
  });
}

void cast(Tensor dst, const Tensor& src) {
  constexpr const char* op = "cast";
  require_cpu_contiguous(op, {{"dst", dst}, {"src", src}});
  require_any_float(op, {"dst", dst});
  require_any_float(op, {"src", src});
  require_same_shape(op, {"dst", dst}, {"src", src});
  require_no_partial_overlap(op, {"dst", dst}, {"src", src});
  if (dst.dtype() == src.dtype()) {
    if (dst.data() != src.data() && src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatch_any_float(dst.dtype(), [&]<typename D>() {
    dispatch_any_float(src.dtype(),
                     [&]<typename S>() { cast_loop(dst.data_as<D>(), src.data_as<const S>(), src.numel()); });
  });
}

void fill(Tensor t, float value) {
  require_cpu_contiguous("fill", {{"t", t}});
  require_any_float("fill", {"t", t});
  dispatch_any_float(t.dtype(), [&]<typename T>() { fill_loop(t.data_as<T>(), t.numel(), store_as<T>(value)); });
}

}  // namespace loom::kernels
