// Elementwise add, cast and fill over f32 / bf16 / f16 storage, and the
// data movement ops: copy of any dtype and layout, arange, find_id_outside
// (ops.h).
//
// Mixed dtypes go through f32: every f32/bf16/f16 value is exact in f32, so
// a conversion rounds once (RNE, core/dtype.h) and an add rounds as
// from_f32<Ty>(float(a) + float(b)): the f32 sum, rounded to y's dtype.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// `if (parallel : ...)`, not a bare `if`: on a combined `parallel for simd`
// a bare if clause applies to the simd construct too (OpenMP 5.0), and below
// kMinParallel elements it would run the loop one element at a time.
//
// f16 has no per-element conversion GCC vectorises, so an op with an f16
// operand runs in pieces through f32 buffers (span conversions, half.h):
// the same values, vectorised.
constexpr int64_t kPiece = 512;

template <typename... T>
constexpr bool any_f16 = (std::is_same_v<T, f16> || ...);

// y = f(a, b) in f32, rounded once: add and mul.
template <typename Y, typename A, typename B, typename F>
void binary_loop(Y* y, const A* a, const B* b, int64_t n, F f) {
  if constexpr (any_f16<Y, A, B>) {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n > kMinParallel)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t off = p * kPiece, len = std::min(kPiece, n - off);
      alignas(64) float af[kPiece], bf[kPiece];
      span_to_f32(af, a + off, len);
      span_to_f32(bf, b + off, len);
      for (int64_t i = 0; i < len; ++i) af[i] = f(af[i], bf[i]);
      span_from_f32(y + off, af, len);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : n > kMinParallel)
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<Y>(f(to_f32(a[i]), to_f32(b[i])));
  }
}

template <typename F>
void binary(Tensor y, const Tensor& a, const Tensor& b, F f) {
  dispatch_float(y.dtype(), [&]<typename Y>() {
    dispatch_float(a.dtype(), [&]<typename A>() {
      dispatch_float(b.dtype(), [&]<typename B>() {
        binary_loop(y.data_as<Y>(), a.data_as<const A>(), b.data_as<const B>(), y.numel(), f);
      });
    });
  });
}

template <typename D, typename S>
void cast_loop(D* dst, const S* src, int64_t n) {
  // f16 either way, and to bf16 (half.h's vector rounding), in L1 pieces.
  if constexpr (any_f16<D, S> || std::is_same_v<D, bf16>) {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n > kMinParallel)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t off = p * kPiece, len = std::min(kPiece, n - off);
      alignas(64) float buf[kPiece];
      span_to_f32(buf, src + off, len);
      span_from_f32(dst + off, buf, len);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : n > kMinParallel)
    for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<D>(to_f32(src[i]));
  }
}

template <typename T>
void fill_loop(T* x, int64_t n, T value) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

// A fill this large (the gradients' zeroing each step: 500 MB for
// gpt2-124m) leaves cache long before anything reads it again, so it is
// written with non-temporal stores, which skip reading each line in first:
// 11.4 ms instead of 25.7 for 500 MB on 2 threads of the Xeon of
// BENCHMARKS.md's 37th session (43 against 19 GB/s). Smaller fills (an
// activation gradient the next GEMM accumulates into) stay in cache. Fills
// of activation gradients this large come before passes over still more
// data (the lm head's backward), which would evict them anyway.
constexpr size_t kStreamBytes = size_t{32} << 20;

#if defined(__SSE2__)
#if defined(__AVX512F__)
using Line = __m512i;
inline Line splat(const std::byte* p) { return _mm512_loadu_si512(p); }
inline void stream(std::byte* p, Line v) { _mm512_stream_si512(reinterpret_cast<Line*>(p), v); }
#elif defined(__AVX__)
using Line = __m256i;
inline Line splat(const std::byte* p) { return _mm256_loadu_si256(reinterpret_cast<const Line*>(p)); }
inline void stream(std::byte* p, Line v) { _mm256_stream_si256(reinterpret_cast<Line*>(p), v); }
#else
using Line = __m128i;
inline Line splat(const std::byte* p) { return _mm_loadu_si128(reinterpret_cast<const Line*>(p)); }
inline void stream(std::byte* p, Line v) { _mm_stream_si128(reinterpret_cast<Line*>(p), v); }
#endif

// The elements before the first Line-aligned address and after the last
// whole Line are stored plainly; the Lines between, split over the threads,
// are streamed, then fenced by each thread (streamed stores are weakly
// ordered: the fence makes them visible before the region's barrier).
template <typename T>
void fill_streamed(T* x, int64_t n, T value) {
  constexpr int64_t kLine = sizeof(Line), kPer = kLine / static_cast<int64_t>(sizeof(T));
  const auto addr = reinterpret_cast<uintptr_t>(x);
  int64_t head = static_cast<int64_t>((kLine - addr % kLine) % kLine);
  if (head % static_cast<int64_t>(sizeof(T)) != 0) return fill_loop(x, n, value);  // not element aligned
  head /= static_cast<int64_t>(sizeof(T));
  const int64_t lines = (n - head) / kPer;
  if (lines <= 0) return fill_loop(x, n, value);
  alignas(64) T pattern[kPer];
  std::fill(pattern, pattern + kPer, value);
  const Line v = splat(reinterpret_cast<const std::byte*>(pattern));
  auto* body = reinterpret_cast<std::byte*>(x + head);
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < lines; ++i) stream(body + i * kLine, v);
    _mm_sfence();
  }
  std::fill(x, x + head, value);
  std::fill(x + head + lines * kPer, x + n, value);
}
#else
template <typename T>
void fill_streamed(T* x, int64_t n, T value) {
  fill_loop(x, n, value);
}
#endif

// A strided copy: dst and src share a shape (ndim >= 1, an element at
// least) and dtype. Views are slices, so the last dim has unit stride (or
// extent 1): each row is one memcpy, the outer dims walked with a counter.
void copy_strided(const Tensor& dst, const Tensor& src) {
  const int nd = src.ndim();
  const int64_t es = static_cast<int64_t>(dtype_size(src.dtype())), inner = src.size(-1);
  LOOM_CHECK(inner <= 1 || (src.stride(-1) == 1 && dst.stride(-1) == 1), "copy: rows not unit-stride: ", src.str(),
             " stride ", src.stride(-1), ", ", dst.str(), " stride ", dst.stride(-1));
  auto* d0 = static_cast<std::byte*>(dst.data());
  const auto* s0 = static_cast<const std::byte*>(src.data());
  int64_t index[kMaxDims] = {};  // over dims [0, nd - 1)
  for (int64_t row = 0, n_rows = src.numel() / inner; row < n_rows; ++row) {
    int64_t d_off = 0, s_off = 0;
    for (int d = 0; d + 1 < nd; ++d) d_off += index[d] * dst.stride(d), s_off += index[d] * src.stride(d);
    std::memcpy(d0 + d_off * es, s0 + s_off * es, static_cast<size_t>(inner * es));
    for (int d = nd - 2; d >= 0 && ++index[d] == src.size(d); --d) index[d] = 0;
  }
}

}  // namespace

void add(Tensor y, const Tensor& a, const Tensor& b) {
  binary(y, a, b, [](float u, float v) { return u + v; });
}

void mul(Tensor y, const Tensor& a, const Tensor& b) {
  binary(y, a, b, [](float u, float v) { return u * v; });
}

void cast(Tensor dst, const Tensor& src) {
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
  const bool streamed = t.nbytes() >= kStreamBytes;
  dispatch_float(t.dtype(), [&]<typename T>() {
    if (streamed) fill_streamed(t.data_as<T>(), t.numel(), from_f32<T>(value));
    else fill_loop(t.data_as<T>(), t.numel(), from_f32<T>(value));
  });
}

void copy(Tensor dst, const Tensor& src) {
  // The same data is the same view (ops.h's check refuses any other
  // overlap), and a tensor with no element has nothing to copy.
  if (dst.data() == src.data() || src.numel() == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  copy_strided(dst, src);
}

// dst (R, J) = src (R, S) at columns (J), element by element of any size;
// every column checked first, so a bad one writes nothing.
void gather_columns(Tensor dst, const Tensor& src, const Tensor& columns) {
  const int64_t R = dst.size(0), J = dst.size(1), S = src.size(1);
  const int32_t* col = columns.data_as<const int32_t>();
  for (int64_t j = 0; j < J; ++j)
    if (col[j] < 0 || col[j] >= S)
      fail("gather_columns: columns[", j, "] = ", col[j], " is outside the ", S, " columns of src ", src.str());
  const size_t es = dtype_size(src.dtype());
  auto* d = static_cast<std::byte*>(dst.data());
  const auto* s = static_cast<const std::byte*>(src.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < J; ++j)
      std::memcpy(d + (r * J + j) * es, s + (r * S + col[j]) * es, es);
}

void arange(Tensor t, int64_t start) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::i32) {
    int32_t* p = t.data_as<int32_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(start + i);
  } else {
    int64_t* p = t.data_as<int64_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = start + i;
  }
}

IdOutside find_id_outside(const Tensor& ids, int64_t limit, std::optional<int32_t> ignore_index) {
  const int32_t* p = ids.data_as<const int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const bool allowed = (p[i] >= 0 && p[i] < limit) || (ignore_index && p[i] == *ignore_index);
    if (!allowed) return {i, p[i]};
  }
  return {};
}

}  // namespace loom::kernels::cpu::LOOM_ISA
