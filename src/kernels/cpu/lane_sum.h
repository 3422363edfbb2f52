// The sum of 16 f32 lanes by one fixed tree, the same bits on every path:
// lane i + lane i+8, then i + i+4, i + i+2, i + i+1 (halves, quarters,
// pairs, the last two). The batch-invariant kernels (linear_invariant.cpp,
// paged_attention.cpp) end every dot product with it. Internal to
// src/kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

// 16 floats in a GCC vector (a zmm register with AVX-512, two ymm with AVX2).
typedef float Lanes16 __attribute__((vector_size(64)));

#if defined(__AVX__)
// The tree on 16 lanes held as two 8-lane halves (lo: lanes 0-7, hi: 8-15):
// the first round is lo + hi.
inline float lane_sum(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
#endif

inline float lane_sum(Lanes16 v) {
#if defined(__AVX512F__)
  // The zero-masked extracts: GCC 12's unmasked ones trip -Wuninitialized.
  const __m512d d = _mm512_castps_pd(reinterpret_cast<__m512>(v));
  return lane_sum(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 0)),
                  _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 1)));
#elif defined(__AVX__)
  __m256 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return lane_sum(lo, hi);
#else
  float a[16];
  std::memcpy(a, &v, sizeof a);
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
#endif
}

// The sum over i < n of term(x[i]) with the arithmetic of every width: term
// of element i is added into lane i mod 16 in increasing i (a 16-lane GCC
// vector: one zmm, two ymm or four xmm, the same additions), the last
// partial step adds only the elements that exist, and lane_sum ends it. So
// the result's bits do not depend on the instruction set (DESIGN.md §8: the
// serving path's norms), where `omp simd reduction` sums in as many lanes as
// the vector has. term is applied to a Lanes16 and to a float alike (a
// generic lambda); nothing is contracted into an FMA (-ffp-contract=off).
//
// With AVX2 the 16 lanes are two 8-lane vectors, each in a register: GCC
// keeps one 16-lane vector that spans two registers in memory, a store and
// reloads per step (5x slower); the additions are the same.
template <typename Term>
inline float lanes_sum(const float* x, int64_t n, const Term& term) {
  float lanes[16];
  int64_t i = 0;
#if defined(__AVX__) && !defined(__AVX512F__)
  typedef float Lanes8 __attribute__((vector_size(32)));
  Lanes8 lo = {}, hi = {};  // lanes 0-7, 8-15
  for (; i + 16 <= n; i += 16) {
    Lanes8 a, b;
    std::memcpy(&a, x + i, sizeof a);
    std::memcpy(&b, x + i + 8, sizeof b);
    lo += term(a);
    hi += term(b);
  }
  std::memcpy(lanes, &lo, sizeof lo);
  std::memcpy(lanes + 8, &hi, sizeof hi);
#else
  Lanes16 acc = {};
  for (; i + 16 <= n; i += 16) {
    Lanes16 v;
    std::memcpy(&v, x + i, sizeof v);
    acc += term(v);
  }
  std::memcpy(lanes, &acc, sizeof lanes);
#endif
  for (int64_t j = 0; i + j < n; ++j) lanes[j] += term(x[i + j]);
  Lanes16 sums;
  std::memcpy(&sums, lanes, sizeof sums);
  return lane_sum(sums);
}

}  // namespace loom::kernels::cpu
