// The batch-invariant linear for many rows (linear_prefill.h): the bits of
// linear_invariant.cpp's dot-product tiles, computed in the form of a GEMM
// library's micro-kernel.
//
// linear_invariant.cpp fixes one output's arithmetic: 16 lanes, lane l
// fusing x[k] w[k] for k = l, l + 16, l + 32, ... in increasing k (0 x 0
// where the last step passes K), then one fixed tree over the lanes. Each
// lane is a chain of its own: the chains may run in any order relative to
// each other, as long as each runs in its own. So here a vector register
// holds lane l of 8 (AVX2) or 16 (AVX-512) outputs of one column and
// neighbouring rows, instead of the 16 lanes of one output, and a tile of
// kNR columns x 2 vectors of rows grows by outer products, one lane at a
// time: w broadcast straight from its rows, x loaded from a copy, no
// horizontal sum inside the loop over k. The 16 sums of each output wait in
// memory between blocks of K and lanes, and the tree adds them across
// outputs, a vector of rows at a time. Each output sees the fused
// multiply-adds of the dot-product path, in its order, and its tree: the
// same bits (test_linear_invariant compares rows of both paths bit for bit).
//
// Layout. This path takes the rows of whole tiles (kMC each); the
// dot-product tiles take the rest. x is copied once per call to f32,
// lane-major: for each group of kMC rows and each lane l, the steps s of
// k = 16 s + l, kMC values each, zeros past K (a zero fused into a lane is
// the dot-product path's step past K). w is read in place: a broadcast
// needs no contiguity. A thread takes panels of w's rows (L2) in turn; for
// each block of x rows and K block, the panel's tiles pass the block, and
// each K block's lines of w stay in L1 across the 16 lanes. Measured
// against oneDNN in BENCHMARKS.md (issue 34).
#include "kernels/cpu/linear_prefill.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOOM_PREFILL_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LOOM_PREFILL_AVX2 1
#include <immintrin.h>
#endif

#include "kernels/cpu/half.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_PREFILL_AVX512) || defined(LOOM_PREFILL_AVX2)
namespace {

constexpr int64_t kLanes = 16;  // the dot-product path's lanes (linear_invariant.cpp)

#if defined(LOOM_PREFILL_AVX512)
using V = __m512;
constexpr int64_t kVL = 16;
constexpr int kNR = 12;  // 24 zmm accumulators
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vzero() { return _mm512_setzero_ps(); }
#else
using V = __m256;
constexpr int64_t kVL = 8;
constexpr int kNR = 6;  // 12 ymm accumulators
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vzero() { return _mm256_setzero_ps(); }
#endif
constexpr int64_t kMC = 2 * kVL;  // rows of a tile: two vectors

// From this many rows (below, the dot-product tiles are as fast) and this K:
// the dot-product tile's rows of x and w (3 + 2 of K floats with AVX2, 4 + 4
// with AVX-512) outgrow L1 near K = 1024-1600. Measured with `loom bench
// kernels` (BENCHMARKS.md): this path 1.2-1.3x the tiles at K = 3072, equal
// or slower at K = 768.
constexpr int64_t kPrefillRows = 32;
constexpr int64_t kPrefillMinK = 1536;
// Bytes of w rows a thread's panel spans (L2), the steps of a K block, and
// the bytes of packed x a block of rows holds per K block (L1).
constexpr int64_t kPanelBytes = 512 << 10;
constexpr int64_t kBlockSteps = 48;
constexpr int64_t kRowBlockBytes = 128 << 10;

// One element of w in every lane, as f32 (16-bit ones widened exactly).
inline V broadcast(const float* p) { return vbroadcast(p); }
template <typename T>
inline V broadcast(const T* p) {
  const float f = to_f32(*p);
  return vbroadcast(&f);
}

// Lane l of a tile of kMC rows x NR columns over steps [s0, s1) of the
// lane's steps inside K. xp: the lane's packed rows (kMC values per step);
// w: column 0's row of w at lane l (column j's ldw elements on, a step 16
// elements on); sums (column j's kMC rows at sums + j * stride) start at +0
// when s0 = 0, else go on from memory as the dot-product path's register
// would. (The unroll pragmas let GCC keep acc in registers: without them
// its -O3 pipeline keeps the array in memory and stores it every step.)
template <int NR, typename T>
__attribute__((noinline)) void lane_tile(const float* xp, const T* w, int64_t ldw, int64_t s0, int64_t s1, float* sums,
                                         int64_t stride) {
  V acc[NR][2];
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) acc[j][0] = acc[j][1] = vzero();
  if (s0 > 0) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[j][0] = vload(sums + j * stride), acc[j][1] = vload(sums + j * stride + kVL);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const V x0 = vload(xp + s * kMC), x1 = vload(xp + s * kMC + kVL);
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const V wb = broadcast(w + j * ldw + s * kLanes);
      acc[j][0] = vfma(x0, wb, acc[j][0]);
      acc[j][1] = vfma(x1, wb, acc[j][1]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    vstore(sums + j * stride, acc[j][0]);
    vstore(sums + j * stride + kVL, acc[j][1]);
  }
}

// lane_tile for nr (1 .. kNR) columns.
template <typename T, int NR = kNR>
inline void lane_tile_cols(int nr, const float* xp, const T* w, int64_t ldw, int64_t s0, int64_t s1, float* sums,
                           int64_t stride) {
  if constexpr (NR > 1) {
    if (nr < NR) return lane_tile_cols<T, NR - 1>(nr, xp, w, ldw, s0, s1, sums, stride);
  }
  lane_tile<NR>(xp, w, ldw, s0, s1, sums, stride);
}

// The dot-product path's step past K, fma(0, 0, lane), on a tile's sums in
// memory: + 0 (a -0 becomes +0).
inline void past_k(int nr, float* sums, int64_t stride) {
  for (int j = 0; j < nr; ++j)
    for (int64_t v = 0; v < kMC; v += kVL) vstore(sums + j * stride + v, vadd(vload(sums + j * stride + v), vzero()));
}

// x's M rows (a multiple of kMC) into groups of kMC, lane-major:
// dst[g][l][s][i] = x[g kMC + i][16 s + l] as f32, 0 past K.
template <typename T>
void pack_rows(float* dst, const T* x, int64_t M, int64_t K, int64_t steps) {
  const int64_t groups = M / kMC;
#pragma omp parallel for schedule(static) if (M * K >= kMinParallel)
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t l = 0; l < kLanes; ++l) {
        float* d = dst + ((g * kLanes + l) * steps + s) * kMC;
        const int64_t k = s * kLanes + l;
        for (int64_t i = 0; i < kMC; ++i) {
          const int64_t m = g * kMC + i;
          d[i] = k < K ? to_f32(x[m * K + k]) : 0.f;
        }
      }
}

// The tree of lane_sum.h over the 16 lane sums of kMC outputs at once:
// lane[i] += lane[i + h] for h = 8, 4, 2, 1; the sum ends in lane 0. The
// lanes lie `stride` floats apart.
inline void lane_tree(float* sums, int64_t stride) {
  for (int64_t h = kLanes / 2; h > 0; h /= 2)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t v = 0; v < kMC; v += kVL)
        vstore(sums + i * stride + v, vadd(vload(sums + i * stride + v), vload(sums + (i + h) * stride + v)));
}

// The columns [p0, p1) of y (a panel of w's rows) from x packed in xp: per
// block of mb rows and K block, each lane of every tile, the sums waiting
// in `sums` (lane l, column j, row r at (l * cols + j) * mb + r); then the
// tree, the bias and y's rounding.
template <typename T, typename Y, typename B>
void linear_panel(Y* y, const float* xp, const T* w, const B* bias, int64_t M, int64_t N, int64_t K, int64_t p0,
                  int64_t p1, int64_t mb, float* sums) {
  const int64_t steps = (K + kLanes - 1) / kLanes, n = p1 - p0, cols = (n + kNR - 1) / kNR * kNR;
  for (int64_t m0 = 0; m0 < M; m0 += mb) {
    const int64_t rows = std::min(mb, M - m0), tiles = rows / kMC;
    for (int64_t s0 = 0; s0 < steps; s0 += kBlockSteps) {
      const int64_t s1 = std::min(steps, s0 + kBlockSteps);
      for (int64_t j0 = 0; j0 < n; j0 += kNR)
        for (int64_t l = 0; l < kLanes; ++l) {
          const int64_t valid = l < K ? (K - l + kLanes - 1) / kLanes : 0;  // lane l's steps inside K
          const int nr = static_cast<int>(std::min<int64_t>(kNR, n - j0));
          for (int64_t t = 0; t < tiles; ++t) {
            float* out = sums + (l * cols + j0) * rows + t * kMC;
            lane_tile_cols(nr, xp + ((m0 / kMC + t) * kLanes + l) * steps * kMC, w + (p0 + j0) * K + l, K, s0,
                           std::max(s0, std::min(s1, valid)), out, rows);
            if (s1 == steps && valid < steps) past_k(nr, out, rows);
          }
        }
    }
    for (int64_t j = 0; j < n; ++j) {
      const float b = bias != nullptr ? to_f32(bias[p0 + j]) : 0.f;
      for (int64_t t = 0; t < tiles; ++t) {
        float* out = sums + j * rows + t * kMC;
        lane_tree(out, cols * rows);
        for (int64_t i = 0; i < kMC; ++i)
          y[(m0 + t * kMC + i) * N + p0 + j] = from_f32<Y>(out[i] + b);
      }
    }
  }
}

template <typename T, typename Y, typename B>
void linear_panels(Y* y, const T* x, const T* w, const B* bias, int64_t M, int64_t N, int64_t K) {
  const int64_t steps = (K + kLanes - 1) / kLanes;
  const int64_t panel = std::max<int64_t>(kNR, kPanelBytes / (K * int64_t{sizeof(T)}) / kNR * kNR);
  const int64_t block_row_bytes = kBlockSteps * kLanes * int64_t{sizeof(float)};
  const int64_t mb = std::min(M, std::max(kMC, kRowBlockBytes / block_row_bytes / kMC * kMC));
  float* xp = thread_scratch<float>(ScratchSlot::a, static_cast<size_t>(M * kLanes * steps));
  pack_rows(xp, x, M, K, steps);
  const ThreadSlices<float> sums(ScratchSlot::b, static_cast<size_t>(kLanes * panel * mb));
  const int64_t panels = (N + panel - 1) / panel;
  // Panels are handed out one at a time (as linear_invariant.cpp's): which
  // thread computes one never changes its arithmetic.
#pragma omp parallel for schedule(dynamic, 1) if (M * N * K >= kMinParallel)
  for (int64_t pi = 0; pi < panels; ++pi)
    linear_panel(y, xp, w, bias, M, N, K, pi * panel, std::min(N, (pi + 1) * panel), mb,
                 sums.slice(omp_get_thread_num()));
}

}  // namespace
#endif

int64_t linear_prefill(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
#if defined(LOOM_PREFILL_AVX512) || defined(LOOM_PREFILL_AVX2)
#if defined(__AVX512BF16__)
  if (x.dtype() == DType::bf16) return 0;  // vdpbf16ps pairs: linear_invariant.cpp
#endif
  const int64_t N = w.size(0), K = w.size(1), M = x.numel() / K / kMC * kMC;
  if (M < kPrefillRows || K < kPrefillMinK) return 0;
  dispatch_linear(y, x, bias, [&]<typename T, typename Y, typename B>(const B* b) {
    linear_panels<T, Y, B>(y.data_as<Y>(), x.data_as<const T>(), w.data_as<const T>(), b, M, N, K);
  });
  return M;
#else
  (void)y, (void)x, (void)w, (void)bias;
  return 0;
#endif
}

}  // namespace loom::kernels::cpu::LOOM_ISA
