// Elementwise add, cast and fill over f32 / bf16 / f16 storage (ops.h).
//
// Mixed dtypes go through f32: every f32/bf16/f16 value is exact in f32, so
// a conversion rounds once (RNE, core/dtype.h) and an add rounds as
// store_as<Ty>(float(a) + float(b)): the f32 sum, rounded to y's dtype.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/ops.h"
#include "kernels/validate.h"

namespace loom::kernels {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which threads cost more than they save

// Calls f.template operator()<T>() with T = float, bf16 or f16.
template <typename F>
decltype(auto) dispatch_float16(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
    default: LOOM_CHECK(false, "dtype ", dtype_name(dtype), " reached a float kernel");
  }
}

void require_float16(const char* op, Operand x) {
  if (!dtype_is_float(x.t.dtype()))
    op_fail(op, {x}, x.name, " has dtype ", dtype_name(x.t.dtype()), ", expected f32, bf16 or f16");
}

// An output may be exactly an input (in place) but must not partly overlap it.
void require_no_partial_overlap(const char* op, Operand out, Operand in) {
  const auto* o = static_cast<const unsigned char*>(out.t.data());
  const auto* i = static_cast<const unsigned char*>(in.t.data());
  const bool overlap = o < i + in.t.nbytes() && i < o + out.t.nbytes();
  if (overlap && !(o == i && out.t.dtype() == in.t.dtype()))
    op_fail(op, {out, in}, out.name, " overlaps ", in.name, " (only exact in-place use is allowed)");
}

template <typename Y, typename A, typename B>
void add_loop(Y* y, const A* a, const B* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = store_as<Y>(load_f32(a[i]) + load_f32(b[i]));
}

template <typename D, typename S>
void cast_loop(D* dst, const S* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] = store_as<D>(load_f32(src[i]));
}

template <typename T>
void fill_loop(T* x, int64_t n, T value) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

}  // namespace

void add(Tensor y, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  require_cpu_contiguous(op, {{"y", y}, {"a", a}, {"b", b}});
  require_float16(op, {"y", y});
  require_float16(op, {"a", a});
  require_float16(op, {"b", b});
  require_same_shape(op, {"a", a}, {"b", b});
  require_same_shape(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"b", b});
  dispatch_float16(y.dtype(), [&]<typename Y>() {
    dispatch_float16(a.dtype(), [&]<typename A>() {
      dispatch_float16(b.dtype(), [&]<typename B>() {
        add_loop(y.data_as<Y>(), a.data_as<const A>(), b.data_as<const B>(), y.numel());
      });
    });
  });
}

void cast(Tensor dst, const Tensor& src) {
  constexpr const char* op = "cast";
  require_cpu_contiguous(op, {{"dst", dst}, {"src", src}});
  require_float16(op, {"dst", dst});
  require_float16(op, {"src", src});
  require_same_shape(op, {"dst", dst}, {"src", src});
  require_no_partial_overlap(op, {"dst", dst}, {"src", src});
  if (dst.dtype() == src.dtype()) {
    if (dst.data() != src.data() && src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatch_float16(dst.dtype(), [&]<typename D>() {
    dispatch_float16(src.dtype(),
                     [&]<typename S>() { cast_loop(dst.data_as<D>(), src.data_as<const S>(), src.numel()); });
  });
}

void fill(Tensor t, float value) {
  require_cpu_contiguous("fill", {{"t", t}});
  require_float16("fill", {"t", t});
  dispatch_float16(t.dtype(), [&]<typename T>() { fill_loop(t.data_as<T>(), t.numel(), store_as<T>(value)); });
}

}  // namespace loom::kernels
