// The 16-lane vectors of the batch-invariant paged attention
// (paged_attention.cpp): loads from f32 / bf16 / f16, products and sums in
// one fixed order whatever the level, the horizontal sums (lane_sum.h's
// tree), max and exp over a block's scores. Internal to src/kernels/cpu;
// compiled per instruction-set level like cpu_ops.h.
//
// Every multiply and add is its own IEEE operation (loom compiles with
// -ffp-contract=off, CMakeLists.txt): an FMA would give a level with FMA
// other bits than one without, and the serving path's bits are the same at
// every level.
#pragma once

#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/cpu/vec_math.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef LOOM_ISA
#error "kernels/cpu/paged_vec.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA::paged {

using attention::kLanes;
using attention::load_vec;
using attention::round_up;
using attention::store_vec;
using attention::Vec;

// 16 f32 lanes, the unit of every loop below. Each lane's arithmetic is
// IEEE multiplies and adds, one rounding each (never contracted: the pragma
// above), so the bits do not depend on how wide the registers are. With
// AVX-512 the GCC vector Vec is one zmm register; without it GCC keeps a
// 64-byte Vec in memory and every operation is a store and a reload (the
// AVX2 build's dot products and sums), so AVX2 holds the 16 lanes in two
// ymm registers, lanes 0-7 and 8-15.
#if defined(__AVX2__) && !defined(__AVX512F__)
#define LOOM_PAGED_AVX2 1
struct V16 {
  __m256 lo, hi;
};
inline V16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store16(float* p, V16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline V16 operator+(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 operator*(float s, V16 b) { return V16{_mm256_set1_ps(s), _mm256_set1_ps(s)} * b; }
inline V16 operator*(V16 a, float s) { return a * V16{_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline V16& operator+=(V16& a, V16 b) { return a = a + b; }
inline float hsum(V16 v) { return lane_sum(v.lo, v.hi); }
#else
using V16 = Vec;
inline V16 load16(const float* p) { return load_vec(p); }
inline void store16(float* p, V16 v) { store_vec(p, v); }
// The lanes of v summed pairwise, halving the width each round: a fixed
// tree (lane_sum.h; with AVX-512 in registers, the same bits).
inline float hsum(Vec v) { return lane_sum(v); }
#endif

// 16 cache elements as f32 lanes, converted in registers (both conversions
// are exact: f16 by F16C, bf16 is the top half of an f32).
inline V16 load16(const bf16* p) {
#if defined(__AVX512F__)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i u = _mm512_maskz_slli_epi32(kAll16, _mm512_maskz_cvtepu16_epi32(kAll16, h), 16);
  return reinterpret_cast<V16>(_mm512_castsi512_ps(u));
#elif defined(LOOM_PAGED_AVX2)
  const auto widen = [](const bf16* q) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  };
  return {widen(p), widen(p + 8)};
#else
  V16 v;
  for (int i = 0; i < 16; ++i) v[i] = to_f32(p[i]);
  return v;
#endif
}
inline V16 load16(const f16* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(_mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(LOOM_PAGED_AVX2)
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
#else
  V16 v;
  for (int i = 0; i < 16; ++i) v[i] = to_f32(p[i]);
  return v;
#endif
}

#if defined(LOOM_PAGED_AVX2)
inline V16 splat16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
// Lane-wise max(run, x) as `x > run ? x : run` (MAXPS returns its second
// operand when either is NaN): a NaN score never wins, as in a scalar loop.
inline V16 max16(V16 run, V16 x) { return {_mm256_max_ps(x.lo, run.lo), _mm256_max_ps(x.hi, run.hi)}; }
#else
inline V16 splat16(float x) { return Vec{} + x; }
inline V16 max16(V16 run, V16 x) { return x > run ? x : run; }
#endif

// The largest of 16 lanes (none NaN), pairwise by halves. A max is exact,
// so any order gives the same value.
inline float hmax(V16 v) {
  alignas(64) float t[kLanes];
  store16(t, v);
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) t[i] = t[i + w] > t[i] ? t[i + w] : t[i];
  return t[0];
}

// p[i] = exp(p[i] - mx) for 16 lanes: a loop of known length, which GCC
// vectorises (a loop to cnt it left scalar).
inline void exp_minus16(float* __restrict p, float mx) {
  for (int64_t i = 0; i < kLanes; ++i) p[i] = exp_f32(p[i] - mx);
}

// The 16 lane partials of a . b over HSp (a multiple of kLanes) elements:
// lane l holds the products of elements d = l mod kLanes, in d order.
template <typename T>
inline V16 dot_lanes(const float* a, const T* b, int64_t HSp) {
  V16 s = load16(a) * load16(b);
  for (int64_t d = kLanes; d < HSp; d += kLanes) s += load16(a + d) * load16(b + d);
  return s;
}

#if defined(LOOM_PAGED_AVX2)
// Round W of hsum16 below on two ymm halves, written out as in-lane
// shuffles (GCC lowers the generic two-vector shuffle of 64-byte vectors
// element by element): the same lanes added in the same order.
template <int W>
inline V16 hsum16_round(V16 a, V16 b) {
  const auto half = [](__m256 x, __m256 y) {  // one 8-lane half of the result
    if constexpr (W == 4) {
      return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    } else if constexpr (W == 2) {
      return _mm256_add_ps(_mm256_shuffle_ps(x, y, 0x44), _mm256_shuffle_ps(x, y, 0xee));
    } else {
      return _mm256_add_ps(_mm256_blend_ps(x, _mm256_moveldup_ps(y), 0xaa),
                           _mm256_blend_ps(_mm256_movehdup_ps(x), y, 0xaa));
    }
  };
  if constexpr (W == 8) return {_mm256_add_ps(a.lo, a.hi), _mm256_add_ps(b.lo, b.hi)};
  else return {half(a.lo, b.lo), half(a.hi, b.hi)};
}
#else
typedef int32_t Lanes16i __attribute__((vector_size(kLanes * sizeof(int32_t))));

// Round W of hsum16: a's and b's groups of 2W lanes -> groups of W lanes,
// a's and b's alternating: out[g W + i] = x[2 (g/2) W + i] + x[2 (g/2) W + W + i],
// x = a for even g, b for odd.
template <int W, int Half, int... I>
constexpr Lanes16i hsum16_mask(std::integer_sequence<int, I...>) {
  return Lanes16i{((I / W / 2) * 2 * W + I % W + (I / W % 2 ? 16 : 0) + Half * W)...};
}

template <int W>
inline Vec hsum16_round(Vec a, Vec b) {
  constexpr Lanes16i lo = hsum16_mask<W, 0>(std::make_integer_sequence<int, 16>{});
  constexpr Lanes16i hi = hsum16_mask<W, 1>(std::make_integer_sequence<int, 16>{});
  return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}
#endif

// Lane j of the result = hsum(v[j]) for 16 vectors at once, by the same tree
// (lane i + lane i+8, then +4, +2, +1): each round adds the halves of two
// vectors' groups side by side, so two shuffles and an add do for two keys
// what hsum does for one, and 15 vector adds sum 16 keys (hsum pays a
// dependent chain of shuffles per key, which bounded decode).
inline V16 hsum16(V16 (&v)[16]) {
  V16 t[8];
  for (int j = 0; j < 8; ++j) t[j] = hsum16_round<8>(v[j], v[j + 8]);  // keys j | j+8
  for (int j = 0; j < 4; ++j) t[j] = hsum16_round<4>(t[j], t[j + 4]);  // keys j, j+4, j+8, j+12
  for (int j = 0; j < 2; ++j) t[j] = hsum16_round<2>(t[j], t[j + 2]);  // keys j, j+2, ..., j+14
  return hsum16_round<1>(t[0], t[1]);                                  // keys 0 .. 15 in order
}

}  // namespace loom::kernels::cpu::LOOM_ISA::paged
