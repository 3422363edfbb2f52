// The tiles of linear_forward_quantized (quant_linear.cpp): per weight type
// its blocks, its reference dot product (kernels/quant.h) and, at levels with
// AVX2, its vector version -- the unpacked weight block, its integer sums
// against one activation block and the block's float step over a tile's 8
// lanes (quant_linear.cpp's header comment gives the arithmetic). Internal to
// src/kernels/cpu; compiled per instruction-set level like cpu_ops.h.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LOOM_QUANT_AVX2 1
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LOOM_QUANT_VNNI 1
#endif
#endif

#include "kernels/cpu/half.h"
#include "kernels/cpu/quant_prefill_run.h"
#include "kernels/quant.h"

#ifndef LOOM_ISA
#error "kernels/cpu/quant_tile.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA::quant_tile {

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
struct Q5_0 {
  using W = block_q5_0;
  using A = block_q8_0;
  static constexpr int64_t kBlock = kQK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q5_0_q8_0(w, a, n); }
};
struct Q4_1 {
  using W = block_q4_1;
  using A = block_q8_1;
  static constexpr int64_t kBlock = kQK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q4_1_q8_1(w, a, n); }
};
struct Q5_1 {
  using W = block_q5_1;
  using A = block_q8_1;
  static constexpr int64_t kBlock = kQK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q5_1_q8_1(w, a, n); }
};
struct Q2_K {
  using W = block_q2_K;
  using A = block_q8_K;
  static constexpr int64_t kBlock = kQKK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q2_K_q8_K(w, a, n); }
};
struct Q3_K {
  using W = block_q3_K;
  using A = block_q8_K;
  static constexpr int64_t kBlock = kQKK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q3_K_q8_K(w, a, n); }
};
struct Q5_K {
  using W = block_q5_K;
  using A = block_q8_K;
  static constexpr int64_t kBlock = kQKK;
  static float reference(const W* w, const A* a, int64_t n) { return vec_dot_q5_K_q8_K(w, a, n); }
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

// s += isum * (dw * da), lane by lane (q8_0, q4_0 and q5_0).
template <class Q, int R, int C>
inline __m256 step_d(__m256 s, __m256i isum, const typename Q::W* const* w, const typename Q::A* const* a,
                     int64_t b) {
  const __m256 dw = w_lanes<C>([&](int j) { return w[j][b].d; });
  const __m256 da = a_lanes_f16<C>([&](int i) { return a[i][b].d; });
  return _mm256_add_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da)));
}

struct Q8_0Simd : Q8_0 {
  static constexpr bool kMins = false;
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
  static constexpr bool kMins = false;
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

// q4_K and q5_K's 6-bit scales and mins (quant.h's unpacking, four bytes at
// a time): sc[j] for the sub-block sums, m[j] at int16 lanes 2j and 2j + 1
// (against q8_K's bsums).
struct KScales {
  __m256i mins;
  int16_t sc[8];
};
inline KScales unpack_k_scales(const uint8_t* scales) {
  KScales k;
  uint32_t s[3];
  std::memcpy(s, scales, sizeof s);
  const uint32_t sc[2] = {s[0] & 0x3f3f3f3fu, (s[2] & 0x0f0f0f0fu) | ((s[0] >> 6) & 0x03030303u) << 4};
  const uint32_t m[2] = {s[1] & 0x3f3f3f3fu, ((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 6) & 0x03030303u) << 4};
  uint8_t scb[8], mb[8];
  std::memcpy(scb, sc, 8);
  std::memcpy(mb, m, 8);
  for (int j = 0; j < 8; ++j) k.sc[j] = scb[j];
  const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mb));
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  k.mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(m8, dup));
  return k;
}

// Sub-block j's 32 values q[j] (unsigned, at most 31) times y, scaled;
// the mins against bsums into *msum.
struct KUnpacked {
  __m256i q[8];
  KScales k;
};
inline __m256i k_dot(const KUnpacked& u, const block_q8_K& y, __m256i* msum) {
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i p = _mm256_maddubs_epi16(u.q[j], load256(y.qs + 32 * j));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(u.k.sc[j])));
  }
  *msum = _mm256_madd_epi16(load256(y.bsums), u.k.mins);
  return acc;
}

// s += (dw * da) * isum - (dminw * da) * msum (q4_K, q5_K, q2_K)
template <class W, int C>
inline __m256 k_step(__m256 s, __m256i isum, __m256i msum, const W* const* w, const block_q8_K* const* a, int64_t b) {
  const __m256 dy = a_lanes_f32<C>([&](int i) { return a[i][b].d; });
  const __m256 d = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].d; }), dy);
  const __m256 dm = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].dmin; }), dy);
  const __m256 t = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum)));
  return _mm256_add_ps(s, t);
}

// s += (dw * da) * isum, lane by lane (q6_K, q3_K).
template <class W, int C>
inline __m256 d_step(__m256 s, __m256i isum, const W* const* w, const block_q8_K* const* a, int64_t b) {
  const __m256 d = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].d; }),
                                 a_lanes_f32<C>([&](int i) { return a[i][b].d; }));
  return _mm256_add_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)));
}

struct Q4_KSimd : Q4_K {
  using Unpacked = KUnpacked;
  static constexpr bool kMins = true;
  static Unpacked unpack(const W& x) {
    Unpacked u;
    u.k = unpack_k_scales(x.scales);
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int r = 0; r < 4; ++r) {
      const __m256i raw = load256(x.qs + 32 * r);
      u.q[2 * r] = _mm256_and_si256(raw, m4);
      u.q[2 * r + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    }
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i* msum) { return k_dot(u, y, msum); }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i msum, const W* const* w, const A* const* a, int64_t b) {
    return k_step<W, C>(s, isum, msum, w, a, b);
  }
};

// q5_K: q4_K's nibbles with bit 2r (low nibbles of run r) or 2r + 1 (high)
// of qh[l] as the fifth: (qh >> bit) & 1 in each byte, moved to bit 4.
struct Q5_KSimd : Q5_K {
  using Unpacked = KUnpacked;
  static constexpr bool kMins = true;
  static Unpacked unpack(const W& x) {
    Unpacked u;
    u.k = unpack_k_scales(x.scales);
    const __m256i m4 = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
    const __m256i qh = load256(x.qh);
    for (int r = 0; r < 4; ++r) {
      const __m256i raw = load256(x.qs + 32 * r);
      const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r + 1), one);
      u.q[2 * r] = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_slli_epi16(h0, 4));
      u.q[2 * r + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), _mm256_slli_epi16(h1, 4));
    }
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i* msum) { return k_dot(u, y, msum); }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i msum, const W* const* w, const A* const* a, int64_t b) {
    return k_step<W, C>(s, isum, msum, w, a, b);
  }
};

// A 32-value block's nibbles (values 0..15 low, 16..31 high) and, for the
// q5 types, bit j of the 32-bit qh as 16 in byte j.
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf));
}
inline __m256i fifth_bits32(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof bits);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}
// Block b of a q4_0 / q5_0 / q4_1 / q5_1 row: its 32 stored values in order
// (0..15, or 0..31 with the fifth bits) as bytes; *d its scale widened and,
// for q4_1 / q5_1, *m its min.
template <QuantType T>
__m256i nibble_block32(const std::byte* row, int64_t b, float* d, float* m) {
  const auto& blk = reinterpret_cast<const quant_packed::WeightBlock32<T>*>(row)[b];
  *d = half_to_float(blk.d);
  if constexpr (quant_packed::kHasMin<T>) *m = half_to_float(blk.m);
  const __m256i v = nibbles32(blk.qs);
  if constexpr (T == QuantType::q5_0 || T == QuantType::q5_1) return _mm256_or_si256(v, fifth_bits32(blk.qh));
  return v;
}

// q5_0: values 0..31 as the unsigned side, 16 y taken back per pair, as q4_0.
struct Q5_0Simd : Q5_0 {
  struct Unpacked {
    __m256i q;
  };
  static constexpr bool kMins = false;
  static Unpacked unpack(const W& x) { return {_mm256_or_si256(nibbles32(x.qs), fifth_bits32(x.qh))}; }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) {
    const __m256i yv = load256(y.qs);
    const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u.q, yv), _mm256_maddubs_epi16(_mm256_set1_epi8(16), yv));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    return step_d<Q5_0Simd, R, C>(s, isum, w, a, b);
  }
};

// q4_1, q5_1 against q8_1: s += (dw * da) * isum + mw * sa, lane by lane.
template <class Q, bool kFive>
struct MinSimd : Q {
  using W = typename Q::W;
  using A = typename Q::A;
  struct Unpacked {
    __m256i q;
  };
  static constexpr bool kMins = false;
  static Unpacked unpack(const W& x) {
    if constexpr (kFive) return {_mm256_or_si256(nibbles32(x.qs), fifth_bits32(x.qh))};
    return {nibbles32(x.qs)};
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u.q, load256(y.qs)), _mm256_set1_epi16(1));
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    const __m256 d = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].d; }),
                                   a_lanes_f16<C>([&](int i) { return a[i][b].d; }));
    const __m256 m = _mm256_mul_ps(w_lanes<C>([&](int j) { return w[j][b].m; }),
                                   a_lanes_f16<C>([&](int i) { return a[i][b].s; }));
    return _mm256_add_ps(s, _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)), m));
  }
};

struct Q6_KSimd : Q6_K {
  static constexpr bool kMins = false;
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
    return d_step<W, C>(s, isum, w, a, b);
  }
};

// q2_K and q3_K: 16 sub-blocks of 16 values; run (h, k) -- values 128h +
// 32k .. + 31, sub-blocks 8h + 2k and 8h + 2k + 1 -- is bits 2k of the 32
// bytes qs[32h ..], so one vector holds two sub-blocks, their int16 pair
// sums scaled by two scales (lanes 0-7, 8-15) as q6_K's.
inline __m256i two_scales(int lo, int hi) { return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(hi)),
                                                                     _mm_set1_epi16(static_cast<int16_t>(lo))); }
inline __m256i low_bits2(const uint8_t* qs, int h, int k) {
  return _mm256_and_si256(_mm256_srli_epi16(load256(qs + 32 * h), 2 * k), _mm256_set1_epi8(3));
}

// q2_K: q (0..3) times y, times the sub-block's 4-bit scale; the 4-bit mins
// against bsums as q4_K's, and q4_K's float step.
struct Q2_KSimd : Q2_K {
  static constexpr bool kMins = true;
  struct Unpacked {
    __m256i q[8], sc[8], mins;
  };
  static Unpacked unpack(const W& x) {
    Unpacked u;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    // The 4-bit scales in both halves; scale 2g widened to int16 lanes 0-7
    // and 2g + 1 to lanes 8-15 by one byte shuffle each (0x80: a zero byte).
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(raw, _mm_set1_epi8(0xf)));
    for (int g = 0; g < 8; ++g) {
      u.q[g] = low_bits2(x.qs, g / 4, g % 4);
      const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x8000 | (2 * g + 1))),
                                            _mm_set1_epi16(static_cast<int16_t>(0x8000 | (2 * g))));
      u.sc[g] = _mm256_shuffle_epi8(scales, pick);
    }
    u.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xf)));
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i* msum) {
    __m256i acc = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g)
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[g], load256(y.qs + 32 * g)), u.sc[g]));
    *msum = _mm256_madd_epi16(load256(y.bsums), u.mins);
    return acc;
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i msum, const W* const* w, const A* const* a, int64_t b) {
    return k_step<W, C>(s, isum, msum, w, a, b);
  }
};

// q3_K: q + 4 (0..7: the two low bits and hmask's bit 4h + k as 4) times y,
// times the signed scale (sc - 32); minus 4 * sum_j scale_j * bsums_j.
struct Q3_KSimd : Q3_K {
  static constexpr bool kMins = false;
  struct Unpacked {
    __m256i q[8], sc[8], sc_all;
  };
  static Unpacked unpack(const W& x) {
    Unpacked u;
    uint8_t sc[16];
    q3_K_scales(x.scales, sc);
    const __m256i hm = load256(x.hmask), one = _mm256_set1_epi8(1);
    for (int g = 0; g < 8; ++g) {
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, g), one);  // bit 4h + k = g
      u.q[g] = _mm256_or_si256(low_bits2(x.qs, g / 4, g % 4), _mm256_slli_epi16(high, 2));
      u.sc[g] = two_scales(sc[2 * g] - 32, sc[2 * g + 1] - 32);
    }
    u.sc_all = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))),
                                _mm256_set1_epi16(32));
    return u;
  }
  static __m256i dot(const Unpacked& u, const A& y, __m256i*) {
    __m256i acc = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g)
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[g], load256(y.qs + 32 * g)), u.sc[g]));
    const __m256i offset = _mm256_madd_epi16(load256(y.bsums), u.sc_all);
    return _mm256_sub_epi32(acc, _mm256_slli_epi32(offset, 2));
  }
  template <int R, int C>
  static __m256 step(__m256 s, __m256i isum, __m256i, const W* const* w, const A* const* a, int64_t b) {
    return d_step<W, C>(s, isum, w, a, b);
  }
};

// The vector version of each type.
template <class Q>
struct Simd {
  using T = void;
};
template <> struct Simd<Q8_0> { using T = Q8_0Simd; };
template <> struct Simd<Q4_0> { using T = Q4_0Simd; };
template <> struct Simd<Q4_K> { using T = Q4_KSimd; };
template <> struct Simd<Q6_K> { using T = Q6_KSimd; };
template <> struct Simd<Q5_K> { using T = Q5_KSimd; };
template <> struct Simd<Q5_0> { using T = Q5_0Simd; };
template <> struct Simd<Q4_1> { using T = MinSimd<Q4_1, false>; };
template <> struct Simd<Q5_1> { using T = MinSimd<Q5_1, true>; };
template <> struct Simd<Q2_K> { using T = Q2_KSimd; };
template <> struct Simd<Q3_K> { using T = Q3_KSimd; };

#endif  // LOOM_QUANT_AVX2

}  // namespace loom::kernels::cpu::LOOM_ISA::quant_tile
