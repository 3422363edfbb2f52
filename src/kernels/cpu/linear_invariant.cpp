// The batch-invariant linear on the CPU (ops.h: linear_forward_invariant),
// the serving path's GEMM: y = x @ w^T + bias, w (N, K) as every loom weight.
//
// The arithmetic of one output y[m][n] is fixed by K alone. 16 f32 lanes
// accumulate the products of x[m][k] and w[n][k] for k in increasing order,
// lane k mod 16, each product fused into its lane (one rounding: an FMA);
// the elements past K of the last step are 0 (and still multiply-added); the
// lanes are summed by one fixed tree (lane_sum.h); then the bias is added
// and the sum rounded to y's dtype. The ISA levels hold the lanes
// differently and give the same bits: one zmm register (AVX-512), two ymm
// registers, lanes 0-7 and 8-15 (AVX2 + FMA, f16 widened by F16C), a loop
// of std::fma (generic, for correctness). The one exception is bf16
// operands with AVX512_BF16 (vdpbf16ps: below) and at the amx level (AMX
// tiles, linear_amx.cpp), each level's bits of its own. Every output is
// computed whole by one thread, and the register tiles only choose which
// outputs share the loads of a step, never the order of any output's sums.
// So a row's bits do not depend on how many rows the call has, which rows
// surround it, or the thread count; K is never split. (oneDNN's GEMM, which
// training uses, picks its blocking and K splits from M and the threads: its
// rows can change with the batch.)
//
// Speed. Decode (M = 1, the bandwidth-bound case) streams w once, one row
// after another, prefetching ahead: it runs near memory bandwidth, where a
// general GEMM library's M = 1 path does not (BENCHMARKS.md). Prefill
// (M large) reuses each loaded x vector for kNR rows of w and each w vector
// for kMR rows of x (6 x 4 with 32 zmm registers, 3 x 2 with 16 ymm); a
// thread walks its columns in panels of w that stay in L2
// while every row of x passes them. The dot-product form pays a horizontal
// sum per output (K / 16 FMAs per sum) and loads a vector per two FMAs or
// so: from 64 rows (AVX2, bf16 pairs) or 64-128 (AVX-512), whole tiles of rows go to
// linear_prefill.cpp, which computes the same sums as outer products (a
// lane of many outputs per register, both operands packed) at a GEMM's
// rate; the rows left over come here. Measured against oneDNN in BENCHMARKS.md.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// The explicit AVX-512 path needs F, BW (16-bit masked loads) and VL.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOOM_LINEAR_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LOOM_LINEAR_AVX2 1
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/cpu/linear_prefill.h"
#include "kernels/cpu/rows.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// Bytes of w a thread keeps hot (L2) while all rows of x pass it.
constexpr int64_t kPanelBytes = 256 << 10;

// Per path: the accumulator of a part of the 16 lanes, and per element type
// the k elements one step consumes (kStep), in kParts vectors of
// kStep / kParts elements each; a load of a part's elements (the first
// `valid`, the rest 0; valid may be <= 0 or past the part); the
// multiply-add of a part.
template <typename T>
struct Lanes;

#if defined(LOOM_LINEAR_AVX512)

// Rows of x and of w per register tile: 24 zmm accumulators, 6 x vectors
// and 1 w vector. A step loads 10 vectors for 24 FMAs, where 4 x 4 loaded 8
// for 16: at K = 3072 the operands come from L2, whose bandwidth bounded
// 4 x 4. Measured (bench kernels, 64 rows, ratio to oneDNN, one thread /
// two): 4 x 4 0.75-0.97 / 0.75-0.88, 5 x 5 0.88-0.95 / 0.76-0.98, 6 x 4
// 0.84-1.00 / 0.80-0.94.
constexpr int kMR = 6;
constexpr int kNR = 4;
// The panel is the only level of blocking: rows of x pass it whole.
constexpr int64_t kSubPanelBytes = kPanelBytes;
constexpr int64_t kRowBlockBytes = int64_t{1} << 62;
constexpr bool kDecodeTiles = false;  // decode: one w row at a time (linear_tiles)

using Acc = __m512;

inline __mmask16 first16(int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : valid <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << valid) - 1);
}

template <>
struct Lanes<float> {
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 1;
  using V = __m512;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p, int64_t valid) { return _mm512_maskz_loadu_ps(first16(valid), p); }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};

template <>
struct Lanes<f16> {
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 1;
  using V = __m512;
  static V load(const f16* p) { return _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const f16* p, int64_t valid) {
    return _mm512_maskz_cvtph_ps(kAll16, _mm256_maskz_loadu_epi16(first16(valid), p));
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};

#if defined(__AVX512BF16__)
// vdpbf16ps: lane l takes the pair k, k+1 (k = 2l mod 32) per instruction,
// both products added to the lane with one rounding (and denormals read
// and written as 0), where every other path fuses one product per lane
// and step, lane k mod 16. So bf16 operands give other bits at this level
// than at the avx512 / avx2 / generic levels, which agree with each other
// (f32 and f16 operands agree at all four). Measured on gpt2-like shapes
// (bf16 x and w in [-2, 2), f32 y): 0 of 37 outputs differ at K = 1, 151 of
// 203 at K = 768, 3305 of 4288 at K = 3072; the largest difference 1.5e-5 at
// K = 768 and 6.1e-5 at K = 3072, 1-2.3e-7 of the largest |y| (a few ulps of
// it; more ulps of the small, cancelling sums). A request's bits are then a
// function of the level too: batch invariance holds within one level.
template <>
struct Lanes<bf16> {
  static constexpr int64_t kStep = 32;
  static constexpr int kParts = 1;
  using V = __m512bh;
  static V load(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static V load(const bf16* p, int64_t valid) {
    const __mmask32 m = valid >= 32  ? ~__mmask32{0}
                        : valid <= 0 ? __mmask32{0}
                                     : static_cast<__mmask32>((uint64_t{1} << valid) - 1);
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static Acc madd(Acc acc, V a, V b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#else
template <>
struct Lanes<bf16> {  // widened to f32 (a bf16 is the top half of an f32)
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 1;
  using V = __m512;
  static V widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, _mm512_maskz_cvtepu16_epi32(kAll16, h), 16));
  }
  static V load(const bf16* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const bf16* p, int64_t valid) { return widen(_mm256_maskz_loadu_epi16(first16(valid), p)); }
  static Acc madd(Acc acc, V a, V b) { return _mm512_fmadd_ps(a, b, acc); }
};
#endif

inline Acc zero_acc() { return _mm512_setzero_ps(); }
inline float hsum(const Acc (&a)[1]) { return lane_sum(reinterpret_cast<Lanes16>(a[0])); }

#elif defined(LOOM_LINEAR_AVX2)

// The 16 lanes as two ymm halves: lanes 0-7 take k mod 16 in [0, 8), lanes
// 8-15 the rest, each the same fused multiply-add as the zmm lane would do.
// Two accumulators per output and 16 ymm registers: a tile of 3 x 2 outputs
// (12 accumulators, 3 x vectors, 1 w vector); measured against 2 x 3, 2 x 2
// and 4 x 1 in the commit that chose it.
constexpr int kMR = 3;
constexpr int kNR = 2;
// A step reads more lines of x and w per FMA than the zmm tile: sub-panels
// of w stay in L1 while blocks of x rows (in L2 with the panel) pass them
// (measured on a loaded host, 1 thread, qkv: M = 64 68 -> 74 GFLOP/s,
// M = 512 38 -> 42).
constexpr int64_t kSubPanelBytes = 24 << 10;
constexpr int64_t kRowBlockBytes = 1 << 20;
// One row of x (decode) takes w's rows two at a time: an output's two
// halves are two chains of dependent FMAs (5 cycles each on AMD Zen 3), so
// one output a time ran at 2 FMAs per 5 cycles, ~45 GB/s of f32 weights a
// thread; two outputs double the chains (Zen 3, 2 threads: M = 1 from L3
// +12-24% f32, +27-38% bf16; gpt2-124m decode from DRAM 6-10% faster).
constexpr bool kDecodeTiles = true;

using Acc = __m256;

// Lanes [0, valid) of 8 on, as a mask of int32 sign bits.
inline __m256i first8(int64_t valid) {
  const int v = static_cast<int>(std::clamp<int64_t>(valid, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first `valid` of 8 16-bit elements, the rest 0 (the tail: one per
// output, so a copy is cheap).
inline __m128i first8_16(const void* p, int64_t valid) {
  uint16_t h[8] = {};
  std::memcpy(h, p, static_cast<size_t>(std::clamp<int64_t>(valid, 0, 8)) * 2);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
}

template <>
struct Lanes<float> {
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 2;
  using V = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const float* p, int64_t valid) { return _mm256_maskload_ps(p, first8(valid)); }
  static Acc madd(Acc acc, V a, V b) { return _mm256_fmadd_ps(a, b, acc); }
};

template <>
struct Lanes<f16> {  // widened by F16C: exact
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 2;
  using V = __m256;
  static V load(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const f16* p, int64_t valid) { return _mm256_cvtph_ps(first8_16(p, valid)); }
  static Acc madd(Acc acc, V a, V b) { return _mm256_fmadd_ps(a, b, acc); }
};

template <>
struct Lanes<bf16> {  // widened to f32 (a bf16 is the top half of an f32)
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 2;
  using V = __m256;
  static V widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static V load(const bf16* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const bf16* p, int64_t valid) { return widen(first8_16(p, valid)); }
  static Acc madd(Acc acc, V a, V b) { return _mm256_fmadd_ps(a, b, acc); }
};

inline Acc zero_acc() { return _mm256_setzero_ps(); }
inline float hsum(const Acc (&a)[2]) { return lane_sum(a[0], a[1]); }

#else  // portable, for correctness: 16 lanes, each an exact fused multiply-add (std::fma), in the same order

constexpr int kMR = 4;
constexpr int kNR = 4;
constexpr int64_t kSubPanelBytes = kPanelBytes;
constexpr int64_t kRowBlockBytes = int64_t{1} << 62;
constexpr bool kDecodeTiles = false;

using Acc = Lanes16;

template <typename T>
struct Lanes {
  static constexpr int64_t kStep = 16;
  static constexpr int kParts = 1;
  using V = Acc;
  static V load(const T* p) { return load(p, 16); }
  static V load(const T* p, int64_t valid) {
    V v = {};
    for (int64_t i = 0; i < std::min<int64_t>(valid, 16); ++i) v[i] = to_f32(p[i]);
    return v;
  }
  static Acc madd(Acc acc, V a, V b) {
    for (int i = 0; i < 16; ++i) acc[i] = std::fma(a[i], b[i], acc[i]);
    return acc;
  }
};

inline Acc zero_acc() { return Acc{}; }
inline float hsum(const Acc (&a)[1]) { return lane_sum(a[0]); }

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
#if defined(LOOM_LINEAR_AVX512) || defined(LOOM_LINEAR_AVX2)
  asm("" : "+v"(v));
#endif
}

// out[i][j] = sum over k of x[i][k] w[j][k] for an MR x NR tile: the fixed
// sequence of the top for each of its outputs. A step's parts (the two
// halves of 16 lanes with AVX2) go one after the other: each lane's sum is
// its own, so the order of the parts changes no bits.
template <typename T, int MR, int NR>
inline void tile(const T* x, const T* w, int64_t K, bool fetch, float (&out)[kMR][kNR]) {
  using L = Lanes<T>;
  constexpr int P = L::kParts;
  constexpr int64_t W = L::kStep / P;  // elements of a part
  Acc acc[MR][NR][P];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      for (int p = 0; p < P; ++p) acc[i][j][p] = zero_acc();
  int64_t k = 0;
  // fetch: w comes from memory (the first rows of x to pass a panel). The
  // next tile's rows of w follow these NR rows: fetched one line per row and
  // step ahead, so the stream does not wait for the hardware prefetcher to
  // ramp up on rows of a few KB.
  const int64_t ahead = 2 * NR * K;
  for (; k + L::kStep <= K; k += L::kStep) {
    for (int p = 0; p < P; ++p) {
      typename L::V xv[MR];
      for (int i = 0; i < MR; ++i) {
        xv[i] = L::load(x + i * K + k + p * W);
        in_register(xv[i]);
      }
      for (int j = 0; j < NR; ++j) {
        if (fetch && p == 0) prefetch(w + j * K + k + ahead);
        typename L::V wv = L::load(w + j * K + k + p * W);
        in_register(wv);
        for (int i = 0; i < MR; ++i) acc[i][j][p] = L::madd(acc[i][j][p], xv[i], wv);
      }
    }
  }
  // Every part of the last step is multiply-added, zeros included: a lane
  // holding -0 becomes +0 as the one-vector path's masked lanes do.
  if (k < K) {
    for (int p = 0; p < P; ++p) {
      const int64_t valid = K - k - p * W;
      typename L::V xv[MR];
      for (int i = 0; i < MR; ++i) xv[i] = L::load(x + i * K + k + p * W, valid);
      for (int j = 0; j < NR; ++j) {
        const typename L::V wv = L::load(w + j * K + k + p * W, valid);
        for (int i = 0; i < MR; ++i) acc[i][j][p] = L::madd(acc[i][j][p], xv[i], wv);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i][j] = hsum(acc[i][j]);
}

// The tile of mr (<= MR) rows of x.
template <typename T, int NR, int MR = kMR>
inline void tile_rows(int mr, const T* x, const T* w, int64_t K, bool fetch, float (&out)[kMR][kNR]) {
  if constexpr (MR > 1) {
    if (mr == MR) return tile<T, MR, NR>(x, w, K, fetch, out);
    return tile_rows<T, NR, MR - 1>(mr, x, w, K, fetch, out);
  } else {
    return tile<T, 1, NR>(x, w, K, fetch, out);
  }
}

// y[m .. m + mr) x [n0, n1): the row tiles of x from m against the tiles
// of w rows n0 .. n1.
template <typename T, typename Y, typename B>
void linear_tiles(Y* y, const T* x, const T* w, const B* bias, int64_t M, int64_t N, int64_t K, int64_t m, int64_t n0,
                  int64_t n1) {
  const int mr = static_cast<int>(std::min<int64_t>(kMR, M - m));
  for (int64_t n = n0; n < n1; n += kNR) {
    const int nr = static_cast<int>(std::min<int64_t>(kNR, n1 - n));
    float out[kMR][kNR];
    if (nr == kNR && (mr > 1 || kDecodeTiles)) {
      tile_rows<T, kNR>(mr, x + m * K, w + n * K, K, m == 0, out);
    } else {
      // One row of x (decode), or the last columns: one w row at a
      // time, the same sums. A single row streams w best this way with
      // AVX-512: one sequential stream per thread instead of four
      // interleaved ones (AVX2 decodes in tiles of two rows: kDecodeTiles).
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

template <typename T, typename Y, typename B>
void linear_rows(Y* y, const T* x, const T* w, const B* bias, int64_t M, int64_t N, int64_t K) {
  // The rows of K elements that fit in `bytes`, a multiple of `mult` (at least mult).
  const auto rows_in = [K](int64_t bytes, int64_t mult) {
    return std::max<int64_t>(mult, bytes / std::max<int64_t>(1, K * int64_t{sizeof(T)}) / mult * mult);
  };
  const int64_t panel = rows_in(kPanelBytes, kNR);
  // Panels of w are the unit of work, handed out one at a time: a thread
  // that streams w slower than the other (memory is shared, and so is this
  // host) takes fewer, instead of the other waiting for it at the end (a
  // static half each left ~10% of decode in the barrier). Which thread
  // computes a panel never changes its arithmetic.
  // That many panels, w's tiles of kNR rows dealt out evenly (they differ by
  // a tile at most: N = 768 in 10 panels of 76-80 rows, where panels of 84
  // left the last one 12 and one of two threads a panel more work).
  const int64_t panels = (N + panel - 1) / panel, w_tiles = (N + kNR - 1) / kNR;
  const auto panel_start = [&](int64_t pi) { return std::min(N, w_tiles * pi / panels * kNR); };
  const int64_t sub = rows_in(kSubPanelBytes, kNR), m_block = rows_in(kRowBlockBytes, kMR);
  const bool parallel = M * N * K >= kMinParallel;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t pi = 0; pi < panels; ++pi) {
    const int64_t p0 = panel_start(pi), p1 = panel_start(pi + 1);
    // Within the panel (L2): blocks of rows of x that stay in L2 with it,
    // each passing sub-panels of w that stay in L1.
    for (int64_t m0 = 0; m0 < M; m0 += m_block)
      for (int64_t s0 = p0; s0 < p1; s0 += sub)
        for (int64_t m = m0; m < std::min(M, m0 + m_block); m += kMR)
          linear_tiles(y, x, w, bias, M, N, K, m, s0, std::min(p1, s0 + sub));
  }
}

}  // namespace

void linear_forward_invariant(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t M = K > 0 ? x.numel() / K : y.numel() / std::max<int64_t>(N, 1);
  // Many rows: whole tiles of them by outer products (linear_prefill.cpp),
  // the rest here; both give every row the same bits.
  const int64_t done = K > 0 && N > 0 ? linear_prefill(y, x, w, bias) : 0;
  if (done == M) return;
  dispatch_linear(y, x, bias, [&]<typename T, typename Y, typename B>(const B* b) {
    linear_rows<T, Y, B>(y.data_as<Y>() + done * N, x.data_as<const T>() + done * K, w.data_as<const T>(), b,
                         M - done, N, K);
  });
}

}  // namespace loom::kernels::cpu::LOOM_ISA
