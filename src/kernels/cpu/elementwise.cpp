// Elementwise add, cast and fill over f32 / bf16 / f16 storage (ops.h).
//
// Mixed dtypes go through f32: every f32/bf16/f16 value is exact in f32, so
// a conversion rounds once (RNE, core/dtype.h) and an add rounds as
// from_f32<Ty>(float(a) + float(b)): the f32 sum, rounded to y's dtype.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/rows.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace loom::kernels {
namespace {


// f16 has no per-element conversion GCC vectorises, so an op with an f16
// operand runs in pieces through f32 buffers (span conversions, half.h):
// the same values, vectorised.
constexpr int64_t kPiece = 512;

template <typename... T>
constexpr bool any_f16 = (std::is_same_v<T, f16> || ...);

template <typename Y, typename A, typename B>
void add_loop(Y* y, const A* a, const B* b, int64_t n) {
  if constexpr (any_f16<Y, A, B>) {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n > kMinParallel)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t off = p * kPiece, len = std::min(kPiece, n - off);
      alignas(64) float af[kPiece], bf[kPiece];
      span_to_f32(af, a + off, len);
      span_to_f32(bf, b + off, len);
      for (int64_t i = 0; i < len; ++i) af[i] += bf[i];
      span_from_f32(y + off, af, len);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kMinParallel)
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<Y>(to_f32(a[i]) + to_f32(b[i]));
  }
}

template <typename D, typename S>
void cast_loop(D* dst, const S* src, int64_t n) {
  if constexpr (any_f16<D, S>) {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n > kMinParallel)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t off = p * kPiece, len = std::min(kPiece, n - off);
      alignas(64) float buf[kPiece];
      span_to_f32(buf, src + off, len);
      span_from_f32(dst + off, buf, len);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kMinParallel)
    for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<D>(to_f32(src[i]));
  }
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
  require_float(op, {"y", y});
  require_float(op, {"a", a});
  require_float(op, {"b", b});
  require_same_shape(op, {"a", a}, {"b", b});
  require_same_shape(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"b", b});
  dispatch_float(y.dtype(), [&]<typename Y>() {
    dispatch_float(a.dtype(), [&]<typename A>() {
      dispatch_float(b.dtype(), [&]<typename B>() {
        add_loop(y.data_as<Y>(), a.data_as<const A>(), b.data_as<const B>(), y.numel());
      });
    });
  });
}

void cast(Tensor dst, const Tensor& src) {
  constexpr const char* op = "cast";
  require_cpu_contiguous(op, {{"dst", dst}, {"src", src}});
  require_float(op, {"dst", dst});
  require_float(op, {"src", src});
  require_same_shape(op, {"dst", dst}, {"src", src});
  require_no_partial_overlap(op, {"dst", dst}, {"src", src});
  if (dst.dtype() == src.dtype()) {
    if (dst.data() != src.data() && src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatch_float(dst.dtype(), [&]<typename D>() {
    dispatch_float(src.dtype(),
                     [&]<typename S>() { cast_loop(dst.data_as<D>(), src.data_as<const S>(), src.numel()); });
  });
}

void fill(Tensor t, float value) {
  require_cpu_contiguous("fill", {{"t", t}});
  require_float("fill", {"t", t});
  dispatch_float(t.dtype(), [&]<typename T>() { fill_loop(t.data_as<T>(), t.numel(), from_f32<T>(value)); });
}

}  // namespace loom::kernels
