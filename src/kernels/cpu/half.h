// Element and span conversions between f32 and the 16-bit storage types for
// the CPU kernels. Internal to src/kernels/cpu.
//
// f16 <-> f32 uses F16C / AVX-512F instructions when compiled for them
// (vcvtph2ps, vcvtps2ph with the rounding mode in the immediate: RNE whatever
// MXCSR says), else core/dtype.h's portable to_f16 / from_f16. Both give the
// same bits (tests/kernels/test_half.cpp checks every f16 value and the f32
// edge cases: RNE ties, subnormals, overflow to Inf, NaN), with one
// exception: a signalling f16 NaN comes back as the quiet f32 NaN with the
// same payload, where from_f16 keeps it signalling. Kernels never produce
// signalling NaNs (to_f16 quiets them), and both are NaN.
//
// bf16 needs no special instructions: its conversions are shifts and adds
// that GCC vectorises in the plain loops below.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/dtype.h"

namespace loom::kernels {

#if defined(__AVX512F__)
// The zero-masked forms with every lane on: GCC 12's unmasked
// _mm512_cvtph_ps / _mm512_cvtps_ph trip -Wmaybe-uninitialized.
inline constexpr __mmask16 kAll16 = 0xffff;
#endif

inline float half_to_float(f16 h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return from_f16(h);
#endif
}

inline f16 float_to_half(float x) {
#if defined(__F16C__)
  return f16{static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT))};
#else
  return to_f16(x);
#endif
}

// One element as f32 / from f32 (RNE), inline for every storage type: the
// kernels' per-element loads and stores (core/dtype.h's load_f32(f16) is an
// out-of-line call).
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return from_bf16(x); }
inline float to_f32(f16 x) { return half_to_float(x); }
template <typename T> T from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
template <> inline bf16 from_f32<bf16>(float x) { return to_bf16(x); }
template <> inline f16 from_f32<f16>(float x) { return float_to_half(x); }

// dst[i] = src[i] as f32, i < n.
template <typename T>
inline void span_to_f32(float* __restrict dst, const T* __restrict src, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, f16>) {
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  }
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

// dst[i] = src[i] rounded to T (RNE), i < n.
template <typename T>
inline void span_from_f32(T* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, f16>) {
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm512_maskz_cvtps_ph(kAll16, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  }
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bf16>) {
    // to_bf16 (core/dtype.h) on 16 floats: NaN quieted, else RNE by integer
    // adds (vcvtneps2bf16 would flush subnormals).
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
      const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
      // (The zero-masked forms with every lane on: GCC 12's unmasked ones
      // trip -Wmaybe-uninitialized.)
      const __m512i top = _mm512_maskz_srli_epi32(kAll16, u, 16);
      const __m512i odd = _mm512_and_si512(top, one);
      __m512i r = _mm512_maskz_srli_epi32(kAll16, _mm512_add_epi32(u, _mm512_add_epi32(half, odd)), 16);
      r = _mm512_mask_or_epi32(r, nan, top, quiet);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_maskz_cvtepi32_epi16(kAll16, r));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = from_f32<T>(src[i]);
}

// dst[i] = T(f32(dst[i]) + v[i]) (RNE), i < n: a gradient accumulation.
template <typename T>
inline void span_add_f32(T* __restrict dst, const float* __restrict v, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, f16>) {
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
      __m256i* p = reinterpret_cast<__m256i*>(dst + i);
      const __m512 sum = _mm512_add_ps(_mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(p)), _mm512_loadu_ps(v + i));
      _mm256_storeu_si256(p, _mm512_maskz_cvtps_ph(kAll16, sum, _MM_FROUND_TO_NEAREST_INT));
    }
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      __m128i* p = reinterpret_cast<__m128i*>(dst + i);
      const __m256 sum = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_loadu_ps(v + i));
      _mm_storeu_si128(p, _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
  }
  for (; i < n; ++i) dst[i] = from_f32<T>(to_f32(dst[i]) + v[i]);
}

}  // namespace loom::kernels
