// linear_forward_quantized on the CPU (ops.h): y = x @ W^T (+ bias) with W's
// rows stored as llama.cpp blocks (kernels/quant.h), read block by block and
// never dequantized.
//
// Each row of x is quantized once per call into scratch by quantize_row
// (q8_0 or q8_K, the weight type's dot type: the reference's bytes). Then
// every output is vec_dot(W row n, x row m) of kernels/quant.h exactly: per
// block an integer sum, exact in any order, then the block's float steps in
// f32, accumulated in block order. The vector paths compute 8 outputs at a
// time (a tile: 1 row of x by 8 rows of W for decode, 4 by 2 for prefill),
// one output per f32 lane (many rows with AVX512_VNNI:
// quant_prefill.cpp, 16 outputs a vector): per block, the 8 outputs' integer sums are
// reduced into one vector (integer adds) and the float steps run lane by
// lane with the reference's operations in its order (separate multiply and
// add: no FMA). So every level gives the scalar reference's bits, whatever
// the tile, the rows around a row or the thread count (tests/kernels/
// test_quant_linear.cpp checks all levels against the reference).
//
// Integer sums (activation values are in [-127, 127]: quantize_row's range):
//   q8_0 . q8_0: |w| (u8) times y with w's sign (s8), pairs summed in int16
//     (at most 2 * 128 * 127: no saturation) then int32 — or vpdpbusd
//     (AVX512_VNNI), four products straight into int32;
//   q4_0 . q8_0: the nibble q (0..15) times y, minus 8 times y, in int16
//     pairs (|pair| <= 2 * 15 * 127), for (q - 8) y (levels with VNNI
//     decode q4_0 in quant_decode.cpp).
//   q4_K . q8_K: nibbles (0..15) times y, pairs in int16 (<= 3810), times
//     the sub-block's 6-bit scale into int32; the mins against q8_K's bsums.
//   q6_K . q8_K: 6-bit q (0..63) times y (pairs <= 16002), times the signed
//     scale; minus 32 * sum_j scale_j * bsums_j (q - 32 without a signed
//     unpack).
// The generic level calls the reference dot products themselves.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LOOM_QUANT_AVX2 1
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LOOM_QUANT_VNNI 1
#endif
#endif

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_amx.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"
#include "kernels/quant.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

constexpr int kPairs = 8;  // outputs per tile: one per f32 lane

// Per weight type: the blocks, the reference dot product and (vector
// levels) the unpacked weight block, its integer sums against one
// activation block and the block's float step over a tile's 8 lanes.
struct Q8_0 {
  using W = block_q8_0;
  using A = block_q8_0;
  static constexpr int64_t kBlock = kQK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q8_0_q8_0(w, a, n); }
};
struct Q4_0 {
  using W = block_q4_0;
  using A = block_q8_0;
  static constexpr int64_t kBlock = kQK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q4_0_q8_0(w, a, n); }
};
struct Q4_K {
  using W = block_q4_K;
  using A = block_q8_K;
  static constexpr int64_t kBlock = kQKK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q4_K_q8_K(w, a, n); }
};
struct Q6_K {
  using W = block_q6_K;
  using A = block_q8_K;
  static constexpr int64_t kBlock = kQKK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q6_K_q8_K(w, a, n); }
};

#if defined(LOOM_QUANT_AVX2)

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Lane p of the sum of each v[p]'s 8 lanes (integer adds: exact in any
// order). A transposing tree of blends and one shuffle per step (7 shuffles
// where hadd takes 14: the shuffle port is this kernel's bottleneck).
inline __m256i hsum8(const __m256i (&v)[kPairs]) {
  const auto swap32 = [](__m256i x) { return _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)); };
  const auto swap64 = [](__m256i x) { return _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)); };
  // Odd lanes of b, even of a: lanes [a, b, a, b, ...] hold partial sums.
  const auto pair32 = [&](__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xaa), swap32(_mm256_blend_epi32(b, a, 0xaa)));
  };
  const auto pair64 = [&](__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xcc), swap64(_mm256_blend_epi32(b, a, 0xcc)));
  };
  const __m256i lo = pair64(pair32(v[0], v[1]), pair32(v[2], v[3]));  // [v0 v1 v2 v3 | v0 v1 v2 v3]
  const __m256i hi = pair64(pair32(v[4], v[5]), pair32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_blend_epi32(lo, hi, 0xf0), _mm256_permute2x128_si256(lo, hi, 0x21));
}

// Sum of w[i] * y[i] over 32 signed bytes (in 8 int32 lanes), w_abs = |w|.
inline __m256i dot_s8(__m256i w_abs, __m256i w, __m256i y) {
  const __m256i sy = _mm256_sign_epi8(y, w);
#if defined(LOOM_QUANT_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_abs, sy);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, sy), _mm256_set1_epi16(1));
#endif
}

// Lane p = a weight row's f16 (row p % C) widened, an activation row's f16
// (p / C) widened, or its f32.
template <int C, typename Get>
inline __m256 w_lanes(Get get) {
  return _mm256_cvtph_ps(_mm_setr_epi16(get(0 % C).bits, get(1 % C).bits, get(2 % C).bits, get(3 % C).bits,
                                        get(4 % C).bits, get(5 % C).bits, get(6 % C).bits, get(7 % C).bits));
}
template <int C, typename Get>
inline __m256 a_lanes_f16(Get get) {
  return _mm256_cvtph_ps(_mm_setr_epi16(get(0 / C).bits, get(1 / C).bits, get(2 / C).bits, get(3 / C).bits,
                                        get(4 / C).bits, get(5 / C).bits, get(6 / C).bits, get(7 / C).bits));
}
template <int C, typename Get>
inline __m256 a_lanes_f32(Get get) {
  return _mm256_setr_ps(get(0 / C), get(1 / C), get(2 / C), get(3 / C), get(4 / C), get(5 / C), get(6 / C),
                        get(7 / C));
}

// s += isum * (dw * da), lane by lane (q8_0 and q4_0).
template <class Q, int R, int C>
inline __m256 step_d(__m256 s, __m256i isum, const typename Q::W* const* w, const typename Q::A* const* a,
                     int64_t b) {
  const __m256 dw = w_lanes<C>([&](int j) { return w[j][b].d; });
  const __m256 da = a_lanes_f16<C>([&](int i) { return a[i][b].d; });
  return _mm256_add_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da)));
}

struct Q8_0Simd : Q8_0 {
  struct Unpacked {
    __m256i w, w_abs;
  };
  static Unpacked unpack(const W& x) {
    const __m256i w = load256(x.qs);
    return {w, _mm256_abs_epi8(w)};
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) { return dot_s8(u.w_abs, u.w, load256(y.qs)); }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    return step_d<Q8_0Simd, R, C>(s, isum, w, a, b);
  }
};

// q4_0's nibbles q (0..15) as the unsigned side as they are, the offset
// taken back in int16: (q0 y0 + q1 y1) - (8 y0 + 8 y1) per pair, exact (the
// second vpmaddubsw depends on y alone, shared by a tile's rows of W).
struct Q4_0Simd : Q4_0 {
  struct Unpacked {
    __m256i q;
  };
  static Unpacked unpack(const W& x) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs));
    return {_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf))};
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) {
    const __m256i yv = load256(y.qs);
    const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u.q, yv), _mm256_maddubs_epi16(_mm256_set1_epi8(8), yv));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    return step_d<Q4_0Simd, R, C>(s, isum, w, a, b);
  }
};

struct Q4_KSimd : Q4_K {
  struct Unpacked {
    __m256i q[8];      // sub-block j's 32 nibbles
    __m256i mins;      // m[j] at int16 lanes 2j and 2j + 1 (against bsums)
    int16_t sc[8];
  };
  // quant.h's scale and min unpacking, four bytes at a time.
  static Unpacked unpack(const W& x) {
    Unpacked u;
    uint32_t s[3];
    std::memcpy(s, x.scales, sizeof s);
    const uint32_t sc[2] = {s[0] & 0x3f3f3f3fu, (s[2] & 0x0f0f0f0fu) | ((s[0] >> 6) & 0x03030303u) << 4};
    const uint32_t m[2] = {s[1] & 0x3f3f3f3fu, ((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 6) & 0x03030303u) << 4};
    uint8_t scb[8], mb[8];
    std::memcpy(scb, sc, 8);
    std::memcpy(mb, m, 8);
    for (int j = 0; j < 8; ++j) u.sc[j] = scb[j];
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mb));
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    u.mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(m8, dup));
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int r = 0; r < 4; ++r) {
      const __m256i raw = load256(x.qs + 32 * r);
      u.q[2 * r] = _mm256_and_si256(raw, m4);
      u.q[2 * r + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    }
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i* msum) {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i p = _mm256_maddubs_epi16(u.q[j], load256(y.qs + 32 * j));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(u.sc[j])));
    }
    *msum = _mm256_madd_epi16(load256(y.bsums), u.mins);
    return acc;
  }
  // s += (dw * da) * isum - (dminw * da) * msum
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i msum, const W* const* w, const A* const* a, int64_t b) {
    const __m256 dy = a_lanes_f32<C>([&](int i) { return a[i][b].d; });
    const __m256 d = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].d; }), dy);
    const __m256 dm = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].dmin; }), dy);
    const __m256 t = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum)));
    return _mm256_add_ps(s, t);
  }
};

struct Q6_KSimd : Q6_K {
  struct Unpacked {
    __m256i q[8];      // values 32g .. 32g + 31, 0..63
    __m256i sc[8];     // int16: scales[2g] in lanes 0-7, scales[2g + 1] in 8-15
    __m256i sc_all;    // int16: scales[0..15]
  };
  static Unpacked unpack(const W& x) {
    Unpacked u;
    quant_packed::unpack_q6_K_avx2(x, u.q);
    for (int g = 0; g < 8; ++g)
      u.sc[g] = _mm256_set_m128i(_mm_set1_epi16(x.scales[2 * g + 1]), _mm_set1_epi16(x.scales[2 * g]));
    u.sc_all = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) {
    __m256i acc = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g)
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[g], load256(y.qs + 32 * g)), u.sc[g]));
    const __m256i offset = _mm256_madd_epi16(load256(y.bsums), u.sc_all);  // sum_j scale_j * bsums_j
    return _mm256_sub_epi32(acc, _mm256_slli_epi32(offset, 5));
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    const __m256 d = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].d; }),
                                   a_lanes_f32<C>([&](int i) { return a[i][b].d; }));
    return _mm256_add_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)));
  }
};

template <class Q>
struct Simd;
template <> struct Simd<Q8_0> { using T = Q8_0Simd; };
template <> struct Simd<Q4_0> { using T = Q4_0Simd; };
template <> struct Simd<Q4_K> { using T = Q4_KSimd; };
template <> struct Simd<Q6_K> { using T = Q6_KSimd; };

// out[i * C + j] = dot(W row w[j], activation row a[i]) over nb blocks; the
// bytes at `ahead` (the next tile's weight rows, when decoding) asked for
// into L2 meanwhile, lines_ahead lines a block.
template <class Q, int R, int C>
void tile(const typename Q::W* const* w, const typename Q::A* const* a, int64_t nb, float* out, const char* ahead,
          int64_t lines_ahead) {
  static_assert(R * C == kPairs);
  using S = typename Simd<Q>::T;
  __m256 s = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr)
      for (int64_t l = 0; l < lines_ahead; ++l) _mm_prefetch(ahead + (b * lines_ahead + l) * 64, _MM_HINT_T1);
    __m256i isum[kPairs], msum[kPairs];
    for (int j = 0; j < C; ++j) {
      const typename S::Unpacked u = S::unpack(w[j][b]);
      for (int i = 0; i < R; ++i) isum[i * C + j] = S::dot(u, a[i][b], &msum[i * C + j]);
    }
    __m256i msums = _mm256_setzero_si256();
    if constexpr (std::is_same_v<Q, Q4_K>) msums = hsum8(msum);
    s = S::template step<R, C>(s, hsum8(isum), msums, w, a, b);
  }
  _mm256_storeu_ps(out, s);
}

#else  // generic: the reference dot products, one output at a time

template <class Q, int R, int C>
void tile(const typename Q::W* const* w, const typename Q::A* const* a, int64_t nb, float* out, const char*,
          int64_t) {
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) out[i * C + j] = Q::reference(w[j], a[i], nb * Q::kBlock);
}

#endif

using Operands = QuantOperands;  // quant_prefill.h

// Rows m .. m + R of y, columns n0 .. n1, in tiles of R x C: past the last
// row or column a tile repeats the last one (computed, not stored). Below
// fetch_end (decoding), row 0 asks for the next tile's weights meanwhile.
template <class Q, int R, int C>
void tiles(const Operands& o, int64_t m, int64_t n0, int64_t n1, int64_t fetch_end = 0) {
  using W = typename Q::W;
  using A = typename Q::A;
  const A* a[R];
  for (int i = 0; i < R; ++i)
    a[i] = reinterpret_cast<const A*>(o.a + static_cast<size_t>(std::min(m + i, o.N - 1)) * o.a_row);
  for (int64_t n = n0; n < n1; n += C) {
    const W* w[C];
    for (int j = 0; j < C; ++j)
      w[j] = reinterpret_cast<const W*>(o.w + static_cast<size_t>(std::min(n + j, n1 - 1)) * o.w_row);
    // Decoding (the first rows of x), the rows kPairs on -- C rows, one
    // stretch of memory -- are asked for while this tile's are used: C
    // interleaved streams, which the hardware prefetcher followed too late.
    const bool ask = m == 0 && n + C + kPairs <= fetch_end;
    const char* ahead = ask ? reinterpret_cast<const char*>(o.w + static_cast<size_t>(n + kPairs) * o.w_row) : nullptr;
    const int64_t lines = (C * static_cast<int64_t>(o.w_row) / 64 + o.nb - 1) / o.nb;
    float out[kPairs];
    tile<Q, R, C>(w, a, o.nb, out, ahead, lines);
    for (int i = 0; i < R && m + i < o.N; ++i)
      for (int j = 0; j < C && n + j < n1; ++j) {
        float v = out[i * C + j];
        if (o.bias != nullptr) v += o.bias[n + j];
        o.y[(m + i) * o.OC + n + j] = v;
      }
  }
}

// Decoding (fewer than kQuantPrefillRows rows): W's rows split into one
// contiguous run a thread -- one stream of bytes, which the prefetches keep
// ahead of -- 8 rows at a time against every row of x while they are in
// cache: rows of x four at a time in 4 x 2 tiles (a weight block unpacked
// once for 4 rows, not once a row), the last 1-3 in 1 x 8. Which thread
// computes a tile never changes its arithmetic.
template <class Q>
void run_decode(const Operands& o) {
  const int threads = omp_get_max_threads();
  const int64_t per_thread = (o.OC + threads - 1) / threads;
  const int64_t run = std::max<int64_t>(kPairs, (per_thread + kPairs - 1) / kPairs * kPairs);
  const bool parallel = o.N * o.OC * o.nb * Q::kBlock >= kMinParallel;
#pragma omp parallel for schedule(static, 1) if (parallel)
  for (int64_t n0 = 0; n0 < o.OC; n0 += run) {
    const int64_t n1 = std::min(o.OC, n0 + run);
    for (int64_t n = n0; n < n1; n += kPairs) {
      const int64_t n_end = std::min(n1, n + kPairs);
      int64_t m = 0;
      for (; m + 4 <= o.N; m += 4) tiles<Q, 4, 2>(o, m, n, n_end, n1);
      for (; m < o.N; ++m) tiles<Q, 1, kPairs>(o, m, n, n_end, n1);
    }
  }
}

// Every output, in work items of (blocks of x rows) x (panels of W rows),
// handed out one at a time: a thread's items never change any output's
// arithmetic. A panel of W stays in L2 while a block of rows passes it:
// rows in tiles of 4 (4 x 2 outputs), the last 1-3 one at a time (1 x 8).
template <class Q>
void run(const Operands& o) {
  if (o.N < kQuantPrefillRows) return run_decode<Q>(o);
  constexpr int64_t kRowBlock = 64, kPanelBytes = 128 << 10;
  const int threads = omp_get_max_threads();
  int64_t panel = std::max<int64_t>(kPairs, kPanelBytes / static_cast<int64_t>(std::max<size_t>(o.w_row, 1)));
  // At least 4 panels per thread when the rows of x are few.
  if (o.N <= kRowBlock) panel = std::min(panel, (o.OC + 4 * threads - 1) / (4 * threads));
  panel = std::max<int64_t>(kPairs, (panel + kPairs - 1) / kPairs * kPairs);
  const int64_t panels = (o.OC + panel - 1) / panel, row_blocks = (o.N + kRowBlock - 1) / kRowBlock;
  const bool parallel = o.N * o.OC * o.nb * Q::kBlock >= kMinParallel;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t item = 0; item < panels * row_blocks; ++item) {
    const int64_t n0 = item % panels * panel, n1 = std::min(o.OC, n0 + panel);
    const int64_t m0 = item / panels * kRowBlock, m1 = std::min(o.N, m0 + kRowBlock);
    int64_t m = m0;
    for (; m + 4 <= m1; m += 4) tiles<Q, 4, 2>(o, m, n0, n1);
    for (; m < m1; ++m) tiles<Q, 1, 8>(o, m, n0, n1);
  }
}

// x's N rows quantized to `type` into scratch, row_bytes apart. A row
// quantize_row refuses (NaN, Inf) is a loom::Error naming it, thrown after
// the parallel region (none may leave one).
const std::byte* quantize_rows(const float* x, int64_t N, int64_t IC, QuantType type, size_t row_bytes) {
  std::byte* a = thread_scratch<std::byte>(ScratchSlot::a, static_cast<size_t>(N) * row_bytes);
  std::atomic<int64_t> bad{N};
#pragma omp parallel for schedule(static) if (N > 1 && N * IC >= kMinParallel)
  for (int64_t m = 0; m < N; ++m) {
    try {
      std::byte* row = a + static_cast<size_t>(m) * row_bytes;
      if (!quantize_row_fast(type, x + m * IC, row, IC)) quantize_row(type, x + m * IC, row, IC);
    } catch (...) {
      int64_t first = bad.load();
      while (m < first && !bad.compare_exchange_weak(first, m)) {
      }
    }
  }
  if (const int64_t m = bad.load(); m < N) {
    try {
      quantize_row(type, x + m * IC, a + static_cast<size_t>(m) * row_bytes, IC);
    } catch (const Error& e) {
      fail("linear_forward_quantized: row ", m, " of x: ", e.what());
    }
  }
  return a;
}

}  // namespace

namespace {

// linear_forward_quantized with `prefill` as the path for many rows.
void quantized_linear(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias,
                      bool (*prefill)(QuantType, const QuantOperands&)) {
  const int64_t OC = w.size(0), IC = x.size(-1), N = rows(x);
  if (N == 0 || OC == 0) return;
  const QuantType at = quant_dot_type(wtype);
  const size_t a_row = quant_row_bytes(at, IC);
  const QuantOperands o{y.data_as<float>(),
                   quantize_rows(x.data_as<const float>(), N, IC, at, a_row),
                   static_cast<const std::byte*>(w.data()),
                   bias.defined() ? bias.data_as<const float>() : nullptr,
                   a_row,
                   quant_row_bytes(wtype, IC),
                   N,
                   OC,
                   IC / quant_block_size(wtype)};
  if (prefill(wtype, o)) return;  // many rows, where this level has that path
  if (quant_decode16(wtype, o)) return;  // few, likewise
  switch (wtype) {
    case QuantType::q8_0: return run<Q8_0>(o);
    case QuantType::q4_0: return run<Q4_0>(o);
    case QuantType::q4_K: return run<Q4_K>(o);
    case QuantType::q6_K: return run<Q6_K>(o);
    case QuantType::q8_K: break;
  }
  LOOM_CHECK(false, "linear_forward_quantized: weight type ", quant_name(wtype), " reached the CPU kernel");
}

}  // namespace

void linear_forward_quantized(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  quantized_linear(y, x, w, wtype, bias, &quant_prefill);
}

void linear_forward_quantized_amx(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  quantized_linear(y, x, w, wtype, bias, &quant_prefill_amx);
}

}  // namespace loom::kernels::cpu::LOOM_ISA

namespace loom::kernels::cpu::LOOM_ISA {

// dequantize_rows (ops.h): each row as dequantize_row, rows in parallel.
void dequantize_rows(Tensor out, const Tensor& w, QuantType wtype, int64_t first_row) {
  const int64_t R = out.size(0), IC = out.size(1), row_bytes = w.size(1);
  const uint8_t* src = w.data_as<const uint8_t>() + first_row * row_bytes;
  float* dst = out.data_as<float>();
#pragma omp parallel for schedule(static) if (R * IC >= (1 << 15))
  for (int64_t r = 0; r < R; ++r) dequantize_row(wtype, src + r * row_bytes, dst + r * IC, IC);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
