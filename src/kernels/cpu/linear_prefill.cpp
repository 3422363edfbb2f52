// The batch-invariant linear for many rows (linear_prefill.h): the bits of
// linear_invariant.cpp's dot-product tiles, computed in the form of a GEMM
// library's micro-kernel.
//
// linear_invariant.cpp fixes one output's arithmetic: 16 lanes, lane l
// fusing x[k] w[k] for k = l, l + 16, l + 32, ... in increasing k (0 x 0
// where the last step passes K), then one fixed tree over the lanes. Each
// lane is a chain of its own, so the product is 16 independent GEMMs of
// depth K / 16, one per lane (x's and w's columns l, l + 16, ...), whose
// results the tree adds. Here each is computed as a GEMM library would: a
// vector register holds lane l of 8 (AVX2) or 16 (AVX-512) rows of one
// output column, and a tile of kNR columns x 2 vectors of rows grows by
// outer products, w broadcast, x loaded, no horizontal sum inside the loop
// over k. Each output sees the fused multiply-adds of the dot-product path,
// in its order, and its tree: the same bits (test_linear_invariant compares
// rows of both paths bit for bit).
//
// Layout (BLIS's, per lane). Both operands are copied to f32, lane-major:
// for each group of R rows and each lane l, the steps s of k = 16 s + l, R
// values a step, zeros past K (a zero fused into a lane is the dot-product
// path's step past K); the copy transposes blocks of vectors in registers.
// x is copied once per call (R = kMC rows, the tiles; the rows left over go
// to the dot-product tiles). A thread takes panels of w's rows in turn and
// copies each (R = kNR, L2); then for each tile of x rows, lane and K block,
// the lane's x (L1) passes every column tile of the panel, its w streamed
// from L2. A lane's sums wait in memory between K blocks, and the tree's
// sums are added as the lanes finish (linear_panel). Packing w costs about
// half a cycle per element per call, against M / 32 (AVX-512) cycles of
// FMAs per element: hence the threshold in rows. Measured against oneDNN
// in BENCHMARKS.md (issue 34).
#include "kernels/cpu/linear_prefill.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
#include "kernels/cpu/transpose16.h"

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

// bf16 operands with AVX512_BF16: linear_invariant.cpp's lane l takes the
// pair k, k + 1 (k = 32 s + 2 l) per vdpbf16ps. Here that pair is one
// 32-bit element of the packed operands, copied as it is (not widened), and
// a step multiply-adds by vdpbf16ps too: the instruction works lane by lane
// and pairs the same elements of x and w in either form, so each output
// gets the dot-product path's bits. Elements of T a lane takes per step:
#if defined(__AVX512BF16__)
template <typename T>
constexpr int64_t kPerLane = std::is_same_v<T, bf16> ? 2 : 1;
#else
template <typename T>
constexpr int64_t kPerLane = 1;
#endif

// From this many rows: below, packing w (about half a cycle per element,
// per call) costs more than the dot-product tiles lose. Measured with `loom
// bench kernels` (BENCHMARKS.md, issue 34): at 64 rows this path is
// 1.05-1.2x the tiles with AVX2. With AVX-512 the tiles are 6 x 4 and
// load a vector per 2.4 FMAs: at K = 768 they match this path at 64 rows
// and lose from 128; at K = 3072 their operands come from L2 and this path
// is 1.18x them at 64 rows (AMD Zen 5, 2 threads, x packed per thread).
// bf16 pairs: from 64 rows (AVX512_BF16's dot-product tiles pay a
// horizontal sum per 16 pairs a lane).
template <typename T>
int64_t prefill_rows(int64_t K) {
#if defined(LOOM_PREFILL_AVX512)
  if (kPerLane<T> == 2) return 64;
  return K >= 1536 ? 64 : 128;
#else
  (void)K;
  return 64;
#endif
}
// Bytes of a panel's packed w (L2, beside the x passing it: 1-2 MiB on
// AVX-512 CPUs, 512 KiB on Zen 2/3), and of one lane's packed x over a K
// block (L1).
#if defined(LOOM_PREFILL_AVX512)
constexpr int64_t kPanelBytes = 512 << 10;
#else
constexpr int64_t kPanelBytes = 384 << 10;
#endif
constexpr int64_t kLaneBlockBytes = 16 << 10;
// Bytes of packed x a thread holds: more rows go in chunks of tiles (each
// chunk packs w's panels again: 3-5% at K = 14336 f32, 288 rows a chunk).
constexpr int64_t kPackedXBytes = 16 << 20;

// Lane l of a tile of kMC rows x NR columns over `steps` steps: xp, the
// lane's packed rows (kMC floats a step), wp, the lane's packed columns
// (kNR floats a step); sums (column j's kMC rows at sums + j * kMC) start
// at +0, or with `resume` go on from memory as the dot-product path's
// register would. At the lane's end (its last K block) the tree's sums that
// complete with it are added as they finish, adds[0] first (see
// linear_panel), before the one store. (The unroll pragmas let GCC keep acc
// in registers: without them its -O3 pipeline keeps the array in memory and
// stores it every step.)
// acc + x w: one FMA per lane, or with pairs vdpbf16ps.
template <bool Pairs>
inline V vmadd(V x, V w, V acc) {
#if defined(__AVX512BF16__)
  if constexpr (Pairs) return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
#endif
  return vfma(x, w, acc);
}

template <int NR, bool Pairs>
__attribute__((noinline)) void lane_tile(const float* xp, const float* wp, int64_t steps, bool resume, float* sums,
                                         const float* const* adds, int nadd) {
  V acc[NR][2];
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) acc[j][0] = acc[j][1] = vzero();
  if (resume) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[j][0] = vload(sums + j * kMC), acc[j][1] = vload(sums + j * kMC + kVL);
  }
  for (int64_t s = 0; s < steps; ++s) {
    const V x0 = vload(xp + s * kMC), x1 = vload(xp + s * kMC + kVL);
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const V wb = vbroadcast(wp + s * kNR + j);
      acc[j][0] = vmadd<Pairs>(x0, wb, acc[j][0]);
      acc[j][1] = vmadd<Pairs>(x1, wb, acc[j][1]);
    }
  }
  for (int a = 0; a < nadd; ++a) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      acc[j][0] = vadd(vload(adds[a] + j * kMC), acc[j][0]);
      acc[j][1] = vadd(vload(adds[a] + j * kMC + kVL), acc[j][1]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    vstore(sums + j * kMC, acc[j][0]);
    vstore(sums + j * kMC + kVL, acc[j][1]);
  }
}

// lane_tile for nr (1 .. kNR) columns.
template <bool Pairs, int NR = kNR>
inline void lane_tile_cols(int nr, const float* xp, const float* wp, int64_t steps, bool resume, float* sums,
                           const float* const* adds, int nadd) {
  if constexpr (NR > 1) {
    if (nr < NR) return lane_tile_cols<Pairs, NR - 1>(nr, xp, wp, steps, resume, sums, adds, nadd);
  }
  lane_tile<NR, Pairs>(xp, wp, steps, resume, sums, adds, nadd);
}

#if defined(LOOM_PREFILL_AVX512)
inline __mmask16 first16(int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : valid <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << valid) - 1);
}
// The first `valid` of 16 elements as f32, the rest 0.
inline V load_f32(const float* p, int64_t valid) { return _mm512_maskz_loadu_ps(first16(valid), p); }
inline V load_f32(const f16* p, int64_t valid) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_maskz_loadu_epi16(first16(valid), p));
}
inline V load_f32(const bf16* p, int64_t valid) {
  const __m512i h = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(first16(valid), p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, h, 16));
}

#if defined(__AVX512BF16__)
// The first `valid` of 32 bf16 as they are (16 pairs), the rest 0.
inline V load_pairs(const bf16* p, int64_t valid) {
  const __mmask32 m = valid >= 32 ? ~__mmask32(0) : valid <= 0 ? __mmask32(0) : (__mmask32(1) << valid) - 1;
  return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, p));
}
#endif

// a[i][l] = a[l][i]: transpose16.h.
inline void transpose(V (&a)[16]) { transpose16(a); }
// The first n (<= 16) floats of v at p.
inline void store_first(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, first16(n), v); }
#else
inline __m256i first8(int64_t valid) {
  const int v = static_cast<int>(std::clamp<int64_t>(valid, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// The first `valid` of 8 elements as f32, the rest 0.
inline V load_f32(const float* p, int64_t valid) {
  return valid >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first8(valid));
}
inline __m128i load_16bit(const void* p, int64_t valid) {
  if (valid >= 8) return _mm_loadu_si128(static_cast<const __m128i*>(p));
  uint16_t h[8] = {};
  std::memcpy(h, p, static_cast<size_t>(std::max<int64_t>(valid, 0)) * 2);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
}
inline V load_f32(const f16* p, int64_t valid) { return _mm256_cvtph_ps(load_16bit(p, valid)); }
inline V load_f32(const bf16* p, int64_t valid) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_16bit(p, valid)), 16));
}

// a[i][l] = a[l][i]: an 8 x 8 transpose.
inline void transpose(V (&a)[8]) {
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]), t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
  for (int g = 0; g < 2; ++g) {  // u[4g + e]: rows 4g .. 4g+3 of element 4q + e in half q
    u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
  for (int e = 0; e < 4; ++e) {
    a[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
    a[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
  }
}
// The first n (<= 8) floats of v at p.
inline void store_first(float* p, V v, int64_t n) {
  if (n >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, first8(n), v);
}
#endif

// R rows of a (rows, K) operand, lane-major, as f32:
// dst[(l * steps + s) * R + r] = src[r * K + 16 s + l], 0 past K and for
// r >= rows (a zero multiply-added is the dot-product path's step past K:
// + 0); with pairs, the pair of elements 32 s + 2 l and the next in place
// of one f32. Per step, blocks of kVL rows x kVL lanes are transposed in
// registers.
template <int64_t R, typename T>
void pack_lanes(float* dst, const T* src, int64_t rows, int64_t K, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t l0 = 0; l0 < kLanes; l0 += kVL) {
      const int64_t k0 = (s * kLanes + l0) * kPerLane<T>, valid = K - k0;
      const auto load = [&](const T* p) {
#if defined(__AVX512BF16__)
        if constexpr (kPerLane<T> == 2) return load_pairs(p, valid);
#endif
        return load_f32(p, valid);
      };
      for (int64_t r0 = 0; r0 < R; r0 += kVL) {
        V a[kVL];
        for (int64_t i = 0; i < kVL; ++i) a[i] = r0 + i < std::min(R, rows) ? load(src + (r0 + i) * K + k0) : vzero();
        transpose(a);
        // A tile narrower than a vector (w's kNR rows) is stored whole where
        // the spill lands on the next step of the same lane, which is written
        // after it: masked stores cost ~10x a store on AMD Zen 2/3 (vmaskmovps),
        // which made packing w most of a 64-row call there.
        const bool whole = R - r0 >= kVL || s + 1 < steps;
        for (int64_t l = 0; l < kVL; ++l) {
          float* at = dst + ((l0 + l) * steps + s) * R + r0;
          if (whole) vstore(at, a[l]);
          else store_first(at, a[l], R - r0);
        }
      }
    }
}

// lane_sum.h's tree (lane i + lane i+8, then i + i+4, i + i+2, i + i+1)
// walked depth first: the lanes in this order complete its sums as a binary
// counter does. Lane kTreeOrder[q] ends the q-th leaf; the number of
// trailing ones of q is the number of sums it completes (0 + 8, then
// (0 + 8) + (4 + 12), ...), each the pending sum of one level plus the new
// one. Adding two floats is commutative bit for bit, so the sums are the
// tree's. Five buffers of a tile's sums replace sixteen.
constexpr int kTreeOrder[kLanes] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
constexpr int kTreeLevels = 5;  // pending sums at levels 0 .. 3, the root at 4

// The columns [p0, p1) of y (a panel of w's rows) for the row tiles
// [t0, t1), from x's tiles packed in xp from t0: the panel packed into wp, then per tile,
// lane (in kTreeOrder) and K block, every column tile of the panel while the
// lane's x stays in L1. A lane's sums go on in level[c] of `sums` (c: the
// level its tree sum ends at, free until then) across K blocks, and at its
// end take in the pending sums below c. level[4] ends with the root: the
// outputs, kMC rows of column j at j * kMC, which go to y a block of kVL
// rows x kVL columns at a time, transposed in registers, bias added, as
// rows (rows of y may lie a multiple of 4 KiB apart, N = 3072 f32: a
// column's stores down the rows would all fall in one L1 set).
template <typename T, typename Y, typename B>
void linear_panel(Y* y, const float* xp, const T* w, const B* bias, int64_t N, int64_t K, int64_t steps,
                  int64_t block, int64_t p0, int64_t p1, int64_t t0, int64_t t1, float* wp, float* sums) {
  const int64_t n = p1 - p0, jts = (n + kNR - 1) / kNR, cols = jts * kNR;
  for (int64_t jt = 0; jt < jts; ++jt)
    pack_lanes<kNR>(wp + jt * kLanes * steps * kNR, w + (p0 + jt * kNR) * K, n - jt * kNR, K, steps);
  float* level[kTreeLevels];
  for (int c = 0; c < kTreeLevels; ++c) level[c] = sums + c * cols * kMC;
  float* rows = sums + kTreeLevels * cols * kMC;  // kVL rows of y's panel, (cols + kVL) floats apart
  const int64_t row_stride = cols + kVL;
  float bias_f32[kVL];
  for (int64_t t = t0; t < t1; ++t) {
    for (int q = 0; q < kLanes; ++q) {
      const int64_t l = kTreeOrder[q];
      const int c = std::countr_one(static_cast<unsigned>(q));
      for (int64_t s0 = 0; s0 < steps; s0 += block) {
        const int64_t len = std::min(block, steps - s0);
        const bool last = s0 + len == steps;
        const float* xl = xp + (((t - t0) * kLanes + l) * steps + s0) * kMC;
        for (int64_t jt = 0; jt < jts; ++jt) {
          const int nr = static_cast<int>(std::min<int64_t>(kNR, n - jt * kNR));
          const float* adds[kTreeLevels - 1];
          for (int a = 0; a < c; ++a) adds[a] = level[a] + jt * kNR * kMC;
          lane_tile_cols<kPerLane<T> == 2>(nr, xl, wp + ((jt * kLanes + l) * steps + s0) * kNR, len, s0 > 0,
                         level[c] + jt * kNR * kMC, adds, last ? c : 0);
        }
      }
    }
    const float* out = level[kTreeLevels - 1];
    for (int64_t i0 = 0; i0 < kMC; i0 += kVL) {
      for (int64_t j0 = 0; j0 < n; j0 += kVL) {
        for (int64_t j = 0; j < kVL; ++j)
          bias_f32[j] = bias != nullptr && j0 + j < n ? to_f32(bias[p0 + j0 + j]) : 0.f;
        V a[kVL];
        for (int64_t j = 0; j < kVL; ++j) a[j] = j0 + j < n ? vload(out + (j0 + j) * kMC + i0) : vzero();
        transpose(a);
        const V b = vload(bias_f32);  // + 0 without a bias, as the dot-product path adds
        for (int64_t i = 0; i < kVL; ++i) vstore(rows + i * row_stride + j0, vadd(a[i], b));
      }
      for (int64_t i = 0; i < kVL; ++i) span_from_f32(y + (t * kMC + i0 + i) * N + p0, rows + i * row_stride, n);
    }
  }
}

// Parts of x's rows the threads split the work into, beside panels of w's
// columns. A thread packs the rows of its part and the panels it takes, so
// per thread about rows / parts + N parts / threads rows of packing (x's
// and w's): least near parts = sqrt(rows threads / N); 1 for most shapes at
// a few threads.
inline int64_t row_parts(int64_t rows, int64_t N, int64_t threads, int64_t tiles) {
  int64_t best = 1;
  for (int64_t q = 2; q <= std::min(threads, tiles); ++q)
    if (rows * threads / q + N * q < rows * threads / best + N * best) best = q;
  return best;
}

template <typename T, typename Y, typename B>
void linear_panels(Y* y, const T* x, const T* w, const B* bias, int64_t M, int64_t N, int64_t K) {
  const int64_t step = kLanes * kPerLane<T>, steps = (K + step - 1) / step, tiles = M / kMC;
  const int threads = omp_get_max_threads();
  // Each thread packs the tiles of x it multiplies into its own buffer. (A
  // copy packed once and shared was slower: with two threads on AMD Zen 5,
  // 0.70-0.87x oneDNN where one thread alone ran at 0.80-0.94x, each
  // thread reading the tiles the other had packed from the other core's
  // caches; packed per thread, 0.83-0.99x: BENCHMARKS.md.) Rows go in
  // chunks, a thread's packed rows within kPackedXBytes.
  const int64_t tile_floats = kLanes * steps * kMC;
  const int64_t chunk = std::max<int64_t>(1, kPackedXBytes / (tile_floats * int64_t{sizeof(float)}));
  const int64_t parts = row_parts(std::min(chunk, tiles) * kMC, N, threads, std::min(chunk, tiles));
  // Columns a panel: its packed w within kPanelBytes, and the panels of a
  // part a multiple of its threads (each the same work) where N allows.
  const int64_t by_bytes = std::max<int64_t>(kNR, kPanelBytes / (steps * kLanes * int64_t{sizeof(float)}));
  const int64_t per_part = (threads + parts - 1) / parts;
  const int64_t want = ((N + by_bytes - 1) / by_bytes + per_part - 1) / per_part * per_part;
  const int64_t panel = ((N + want - 1) / want + kNR - 1) / kNR * kNR;
  // That many panels, the column tiles dealt out evenly: they differ by one
  // tile at most (768 columns in 6 panels: 11, 11, 11, 11, 10, 10 tiles of
  // 12, where panels of 132 columns left the last one 108).
  const int64_t col_tiles = (N + kNR - 1) / kNR, panels = (N + panel - 1) / panel;
  const auto panel_start = [&](int64_t pi) { return std::min(N, col_tiles * pi / panels * kNR); };
  // K blocks of equal steps, one lane's packed x of a block within L1.
  const int64_t max_block = std::max<int64_t>(1, kLaneBlockBytes / (kMC * int64_t{sizeof(float)}));
  const int64_t nblocks = (steps + max_block - 1) / max_block, block = (steps + nblocks - 1) / nblocks;
  const int64_t cols = (col_tiles + panels - 1) / panels * kNR;
  const ThreadSlices<float> xps(ScratchSlot::a, static_cast<size_t>(std::min(chunk, tiles) * tile_floats));
  const ThreadSlices<float> wps(ScratchSlot::b, static_cast<size_t>(cols * kLanes * steps));
  const ThreadSlices<float> sums(ScratchSlot::c, static_cast<size_t>(kTreeLevels * cols * kMC + kVL * (cols + kVL)));
  for (int64_t c0 = 0; c0 < tiles; c0 += chunk) {
    const int64_t ct = std::min(chunk, tiles - c0), cparts = std::min(parts, ct);
    // Items in blocks, a part's panels in a row, so that a thread keeps its
    // rows (handed out one at a time, a thread's next item was as likely of
    // another part); which thread computes one never changes its arithmetic.
#pragma omp parallel if (M * N * K >= kMinParallel)
    {
      float* xp = xps.mine();
      int64_t packed = -1;  // the part whose rows xp holds
#pragma omp for schedule(static)
      for (int64_t item = 0; item < panels * cparts; ++item) {
        const int64_t part = item / panels, pi = item % panels;
        const int64_t t0 = c0 + ct * part / cparts, t1 = c0 + ct * (part + 1) / cparts;
        if (part != packed) {
          for (int64_t t = t0; t < t1; ++t) pack_lanes<kMC>(xp + (t - t0) * tile_floats, x + t * kMC * K, kMC, K, steps);
          packed = part;
        }
        linear_panel(y, xp, w, bias, N, K, steps, block, panel_start(pi), panel_start(pi + 1), t0, t1, wps.mine(),
                     sums.mine());
      }
    }
  }
}

}  // namespace
#endif

int64_t linear_prefill(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
#if defined(LOOM_PREFILL_AVX512) || defined(LOOM_PREFILL_AVX2)
  const int64_t N = w.size(0), K = w.size(1), M = x.numel() / K / kMC * kMC;
  bool done = false;
  dispatch_linear(y, x, bias, [&]<typename T, typename Y, typename B>(const B* b) {
    if (M < prefill_rows<T>(K)) return;
    linear_panels<T, Y, B>(y.data_as<Y>(), x.data_as<const T>(), w.data_as<const T>(), b, M, N, K);
    done = true;
  });
  return done ? M : 0;
#else
  (void)y, (void)x, (void)w, (void)bias;
  return 0;
#endif
}

}  // namespace loom::kernels::cpu::LOOM_ISA
