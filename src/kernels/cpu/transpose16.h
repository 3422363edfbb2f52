// A 16 x 16 transpose of 32-bit elements in zmm registers, for the CPU
// kernels compiled with AVX-512 (linear_prefill.cpp's packing, linear_amx.cpp's
// tiles). Internal to src/kernels/cpu; compiled per instruction-set level.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#ifndef LOOM_ISA
#error "kernels/cpu/transpose16.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// a[i][l] = a[l][i] (interleave 32-bit, then 64-bit
// elements within 128-bit chunks, then a 4 x 4 transpose of the chunks).
// The zero-masked forms with every lane on: GCC 12's unmasked ones trip
// -Wuninitialized.
inline void transpose16(__m512 (&a)[16]) {
  using V = __m512;
  V t[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_maskz_unpacklo_ps(0xffff, a[i], a[i + 1]), t[i + 1] = _mm512_maskz_unpackhi_ps(0xffff, a[i], a[i + 1]);
  V u[16];  // u[4g + e]: rows 4g .. 4g+3 of element 4q + e in chunk q
  for (int g = 0; g < 4; ++g) {
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, t1, t3));
  }
  for (int e = 0; e < 4; ++e) {
    const V v0 = _mm512_maskz_shuffle_f32x4(0xffff, u[e], u[4 + e], 0x44), v1 = _mm512_maskz_shuffle_f32x4(0xffff, u[e], u[4 + e], 0xee);
    const V v2 = _mm512_maskz_shuffle_f32x4(0xffff, u[8 + e], u[12 + e], 0x44), v3 = _mm512_maskz_shuffle_f32x4(0xffff, u[8 + e], u[12 + e], 0xee);
    a[e] = _mm512_maskz_shuffle_f32x4(0xffff, v0, v2, 0x88);
    a[4 + e] = _mm512_maskz_shuffle_f32x4(0xffff, v0, v2, 0xdd);
    a[8 + e] = _mm512_maskz_shuffle_f32x4(0xffff, v1, v3, 0x88);
    a[12 + e] = _mm512_maskz_shuffle_f32x4(0xffff, v1, v3, 0xdd);
  }
}
}  // namespace
}  // namespace loom::kernels::cpu::LOOM_ISA
#endif
