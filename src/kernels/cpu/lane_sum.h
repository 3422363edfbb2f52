// The sum of 16 f32 lanes by one fixed tree, the same bits on every path:
// lane i + lane i+8, then i + i+4, i + i+2, i + i+1 (halves, quarters,
// pairs, the last two). The batch-invariant kernels (linear_invariant.cpp,
// paged_attention.cpp) end every dot product with it. Internal to
// src/kernels/cpu.
#pragma once

#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

// 16 floats in a GCC vector (a zmm register with AVX-512).
typedef float Lanes16 __attribute__((vector_size(64)));

inline float lane_sum(Lanes16 v) {
#if defined(__AVX512F__)
  // The zero-masked extracts: GCC 12's unmasked ones trip -Wuninitialized.
  const __m512d d = _mm512_castps_pd(reinterpret_cast<__m512>(v));
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, d, 1));
  const __m256 a = _mm256_add_ps(lo, hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
#else
  float a[16];
  std::memcpy(a, &v, sizeof a);
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
#endif
}

}  // namespace loom::kernels::cpu
