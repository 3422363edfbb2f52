// The batch-invariant linear on the CPU (ops.h: linear_forward_invariant),
// the serving path's GEMM: y = x @ w^T + bias, w (N, K) as every loom weight.
//
// The arithmetic of one output y[m][n] is fixed by K alone. 16 f32 lanes
// accumulate the products of x[m][k] and w[n][k] for k in increasing order,
// lane k mod 16 (bf16 with AVX512_BF16: vdpbf16ps, lane (k mod 32) / 2 takes
// the pair k, k+1 in one instruction); the elements past K of the last step
// are masked to 0; the lanes are summed by one fixed tree (lane_sum.h); then the
// bias is added and the sum rounded to y's dtype. Every output is computed
// whole by one thread, and the register tiles (up to 4 rows of x by 4 rows of
// w, 16 accumulators) only choose which outputs share the loads of a step,
// never the order of any output's sums. So a row's bits do not depend on how
// many rows the call has, which rows surround it, or the thread count; K is
// never split. (oneDNN's GEMM, which training uses, picks its blocking and
// K splits from M and the threads: its rows can change with the batch.)
//
// Speed. Decode (M = 1, the bandwidth-bound case) streams w once, one row
// after another, prefetching ahead: it runs near memory bandwidth, where a
// general GEMM library's M = 1 path does not (BENCHMARKS.md). Prefill
// (M large) reuses each loaded x vector for 4 rows of w and each w vector for
// 4 rows of x; a thread walks its columns in panels of w that stay in L2
// while every row of x passes them. The dot-product form pays a horizontal
// sum per output (K / 16 FMAs per sum), and is slower than oneDNN at large
// M: measured in BENCHMARKS.md.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

// The explicit AVX-512 path needs F, BW (16-bit masked loads) and VL.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOOM_LINEAR_AVX512 1
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/cpu/rows.h"

namespace loom::kernels::cpu {
namespace {

constexpr int kMR = 4;  // rows of x per register tile
constexpr int kNR = 4;  // rows of w per register tile
// Bytes of w a thread keeps hot (L2) while all rows of x pass it.
constexpr int64_t kPanelBytes = 256 << 10;

#if defined(LOOM_LINEAR_AVX512)

using Acc = __m512;

inline float hsum(__m512 v) { return lane_sum(reinterpret_cast<Lanes16>(v)); }

// Per element type: the k elements one step consumes, a load of a step's
// elements (the first `valid`, the rest 0), and the step's multiply-add.
template <typename T>
struct Lanes;

template <>
struct Lanes<float> {
  static constexpr int64_t kStep = 16;
  using V = __m512;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p, int64_t valid) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), p);
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};

template <>
struct Lanes<f16> {
  static constexpr int64_t kStep = 16;
  using V = __m512;
  static V load(const f16* p) { return _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const f16* p, int64_t valid) {
    const __m256i h = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << valid) - 1), p);
    return _mm512_maskz_cvtph_ps(kAll16, h);
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};

#if defined(__AVX512BF16__)
template <>
struct Lanes<bf16> {
  static constexpr int64_t kStep = 32;
  using V = __m512bh;
  static V load(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static V load(const bf16* p, int64_t valid) {
    const __mmask32 m = valid >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << valid) - 1);
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#else
template <>
struct Lanes<bf16> {  // widened to f32 (a bf16 is the top half of an f32)
  static constexpr int64_t kStep = 16;
  using V = __m512;
  static V widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static V load(const bf16* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const bf16* p, int64_t valid) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << valid) - 1), p));
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};
#endif

inline Acc zero_acc() { return _mm512_setzero_ps(); }

#else  // portable: 16 lanes in a GCC vector, multiply then add (ISO C++ mode: never contracted)

using Acc = Lanes16;

inline float hsum(Acc v) { return lane_sum(v); }

template <typename T>
struct Lanes {
  static constexpr int64_t kStep = 16;
  using V = Acc;
  static V load(const T* p) { return load(p, 16); }
  static V load(const T* p, int64_t valid) {
    float f[16] = {};
    for (int64_t i = 0; i < valid; ++i) f[i] = to_f32(p[i]);
    V v;
    std::memcpy(&v, f, sizeof v);
    return v;
  }
  static Acc madd(Acc acc, V a, V b) { return acc + a * b; }
};

inline Acc zero_acc() { return Acc{}; }

#endif

// Into L2 (locality 1): w is read once per panel pass, and L1 prefetches
// stall on L1's few miss buffers (the LM head's M = 1 stream, bf16: 37-40
// GB/s against 30).
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 1); }

// Keeps v in a register: without it GCC folds the load of an x or w vector
// into each of the multiply-adds that use it (4 loads instead of one), and
// the tile becomes bound by loads (measured: half the FMA rate).
template <typename V>
inline void in_register(V& v) {
#if defined(LOOM_LINEAR_AVX512)
  asm("" : "+v"(v));
#endif
}

// out[i][j] = sum over k of x[i][k] w[j][k] for an MR x NR tile: the fixed
// sequence of the top for each of its outputs.
template <typename T, int MR, int NR>
inline void tile(const T* x, const T* w, int64_t K, bool fetch, float (&out)[kMR][kNR]) {
  using L = Lanes<T>;
  Acc acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = zero_acc();
  int64_t k = 0;
  // fetch: w comes from memory (the first rows of x to pass a panel). The
  // next tile's rows of w follow these NR rows: fetched one line per row and
  // step ahead, so the stream does not wait for the hardware prefetcher to
  // ramp up on rows of a few KB.
  const int64_t ahead = 2 * NR * K;
  for (; k + L::kStep <= K; k += L::kStep) {
    typename L::V xv[MR];
    for (int i = 0; i < MR; ++i) {
      xv[i] = L::load(x + i * K + k);
      in_register(xv[i]);
    }
    for (int j = 0; j < NR; ++j) {
      if (fetch) prefetch(w + j * K + k + ahead);
      typename L::V wv = L::load(w + j * K + k);
      in_register(wv);
      for (int i = 0; i < MR; ++i) acc[i][j] = L::madd(acc[i][j], xv[i], wv);
    }
  }
  if (k < K) {
    const int64_t valid = K - k;
    typename L::V xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = L::load(x + i * K + k, valid);
    for (int j = 0; j < NR; ++j) {
      const typename L::V wv = L::load(w + j * K + k, valid);
      for (int i = 0; i < MR; ++i) acc[i][j] = L::madd(acc[i][j], xv[i], wv);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i][j] = hsum(acc[i][j]);
}

template <typename T, int NR>
inline void tile_rows(int mr, const T* x, const T* w, int64_t K, bool fetch, float (&out)[kMR][kNR]) {
  switch (mr) {
    case 4: return tile<T, 4, NR>(x, w, K, fetch, out);
    case 3: return tile<T, 3, NR>(x, w, K, fetch, out);
    case 2: return tile<T, 2, NR>(x, w, K, fetch, out);
    default: return tile<T, 1, NR>(x, w, K, fetch, out);
  }
}

template <typename T, typename Y, typename B>
void linear_rows(Y* y, const T* x, const T* w, const B* bias, int64_t M, int64_t N, int64_t K) {
  const int64_t panel = std::max<int64_t>(kNR, kPanelBytes / std::max<int64_t>(1, K * int64_t{sizeof(T)}) / kNR * kNR);
  // Panels of w are the unit of work, handed out one at a time: a thread
  // that streams w slower than the other (memory is shared, and so is this
  // host) takes fewer, instead of the other waiting for it at the end (a
  // static half each left ~10% of decode in the barrier). Which thread
  // computes a panel never changes its arithmetic.
  const int64_t panels = (N + panel - 1) / panel;
  const bool parallel = M * N * K >= kMinParallel;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t pi = 0; pi < panels; ++pi) {
    const int64_t p0 = pi * panel, p1 = std::min(N, p0 + panel);
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, M - m));
      for (int64_t n = p0; n < p1; n += kNR) {
        const int nr = static_cast<int>(std::min<int64_t>(kNR, p1 - n));
        float out[kMR][kNR];
        if (nr == kNR && mr > 1) {
          tile_rows<T, kNR>(mr, x + m * K, w + n * K, K, m == 0, out);
        } else {
          // One row of x (decode), or the last columns: one w row at a
          // time, the same sums. A single row streams w best this way: one
          // sequential stream per thread instead of four interleaved ones.
          for (int j = 0; j < nr; ++j) {
            float one[kMR][kNR] = {};
            tile_rows<T, 1>(mr, x + m * K, w + (n + j) * K, K, m == 0, one);
            for (int i = 0; i < mr; ++i) out[i][j] = one[i][0];
          }
        }
        for (int i = 0; i < mr; ++i)
          for (int j = 0; j < nr; ++j) {
            const float b = bias != nullptr ? to_f32(bias[n + j]) : 0.f;
            y[(m + i) * N + n + j] = from_f32<Y>(out[i][j] + b);
          }
      }
    }
  }
}

}  // namespace

void linear_forward_invariant(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t M = K > 0 ? x.numel() / K : y.numel() / std::max<int64_t>(N, 1);
  dispatch_float(x.dtype(), [&]<typename T>() {
    dispatch_float(y.dtype(), [&]<typename Y>() {
      if (!bias.defined())
        return linear_rows<T, Y, float>(y.data_as<Y>(), x.data_as<const T>(), w.data_as<const T>(), nullptr, M, N, K);
      dispatch_float(bias.dtype(), [&]<typename B>() {
        linear_rows<T, Y, B>(y.data_as<Y>(), x.data_as<const T>(), w.data_as<const T>(), bias.data_as<const B>(), M,
                             N, K);
      });
    });
  });
}

}  // namespace loom::kernels::cpu
