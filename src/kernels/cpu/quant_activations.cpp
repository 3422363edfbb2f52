// The activations' quantizers of linear_forward_quantized in vector form
// (quant_prefill.h): q8_0 and q8_K with AVX-512 or AVX2, the bytes of quant.cpp's
// reference quantizers, which are ggml's:
//   q8_0: d = max|x| / 127, id = 1 / d (0 when d is), q = the low byte of
//         x * id truncated, plus one when the fraction is >= 0.5, minus one
//         when <= -0.5 (round_to_int8_as_x86);
//   q8_K: max = the first x of largest |x|, iscale = -127 / max, q = min(127,
//         nearest_int(iscale * x)) (f + 12582912 and the mantissa bits),
//         bsums of 16, d = 1 / iscale.
// Every step is the same IEEE operation per element as the reference's (a
// maximum is exact in any order; the first index of the largest |x| is found
// after the maximum). A row with a non-finite value (the reference's error)
// or a block whose scale is below 2^-100 (where 1 / d can overflow and the
// reference's out-of-range conversions matter) is left to the reference:
// false. tests/kernels/test_quant_linear.cpp compares the bytes.
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_prefill.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LOOM_QUANT_ACTIVATIONS 1
#include <immintrin.h>
// GCC 12 takes the intrinsics' undefined pass-through operands for
// uninitialized variables here (a false positive: every lane is written).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#elif defined(__AVX2__) && defined(__FMA__)
#define LOOM_QUANT_ACTIVATIONS_AVX2 1
#include <immintrin.h>
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_ACTIVATIONS) || defined(LOOM_QUANT_ACTIVATIONS_AVX2)
namespace {

constexpr float kTiny = 0x1p-100f;

// How the vector forms start a block of largest |x| amax: all zero (the
// block written here), a scale left to the reference, or scaled.
enum class BlockStart { zero, tiny, scaled };

// q8_0: scaled by *id = 1 / d, d = amax / 127 (its f16 written).
BlockStart q8_0_start(float amax, block_q8_0& y, float* id) {
  const float d = amax / 127;
  if (amax == 0.f) {  // id 0: every q 0
    y.d = to_f16(d);
    std::memset(y.qs, 0, sizeof y.qs);
    return BlockStart::zero;
  }
  if (d < kTiny) return BlockStart::tiny;
  *id = 1.f / d;
  y.d = to_f16(d);
  return BlockStart::scaled;
}

// q8_K: scaled by *iscale = -127 / (the first x of largest |x|).
BlockStart q8_K_start(const float* x, float amax, block_q8_K& y, float* iscale) {
  if (amax == 0.f) {
    std::memset(&y, 0, sizeof(y));
    return BlockStart::zero;
  }
  if (amax < kTiny) return BlockStart::tiny;
  int first = 0;
  while (std::fabs(x[first]) != amax) ++first;
  *iscale = -127.f / x[first];
  return BlockStart::scaled;
}

}  // namespace
#endif

#if defined(LOOM_QUANT_ACTIVATIONS)
namespace {

// Horizontal max and sum through memory, and maskz forms below: GCC 12 warns
// that the plain intrinsics' undefined operands may be uninitialized.
float max16(__m512 v) {
  alignas(64) float f[16];
  _mm512_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < 16; ++i) m = std::fmax(m, f[i]);
  return m;
}
int32_t sum16(__m512i v) {
  alignas(64) int32_t a[16];
  _mm512_store_si512(a, v);
  int32_t t = 0;
  for (int i = 0; i < 16; ++i) t += a[i];
  return t;
}

bool all_finite(const float* x, int64_t n) {
  __mmask16 bad = 0;
  const __m512 inf = _mm512_set1_ps(INFINITY);
  for (int64_t i = 0; i < n; i += 16)  // n is a multiple of 32
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), inf, _CMP_NLT_UQ);
  return bad == 0;
}

// round_to_int8_as_x86 of v's 16 lanes (|v| < 2^31: the caller's blocks).
__m128i round_to_int8(__m512 v) {
  __m512i i = _mm512_maskz_cvttps_epi32(0xffff, v);
  const __m512 frac = _mm512_sub_ps(v, _mm512_maskz_cvtepi32_ps(0xffff, i));
  const __m512i one = _mm512_set1_epi32(1);
  i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), i, one);
  i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), i, one);
  return _mm512_maskz_cvtepi32_epi8(0xffff, i);
}

bool quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = max16(_mm512_maskz_max_ps(0xffff, _mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    float id = 0.f;
    const BlockStart start = q8_0_start(amax, y[b], &id);
    if (start == BlockStart::tiny) return false;
    if (start == BlockStart::zero) continue;
    const __m512 s = _mm512_set1_ps(id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs), round_to_int8(_mm512_mul_ps(lo, s)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16), round_to_int8(_mm512_mul_ps(hi, s)));
  }
  return true;
}

bool quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQKK) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < kQKK; i += 16) m = _mm512_maskz_max_ps(0xffff, m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    float iscale = 0.f;
    const BlockStart start = q8_K_start(x, max16(m), y[b], &iscale);
    if (start == BlockStart::tiny) return false;
    if (start == BlockStart::zero) continue;
    const __m512 s = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.f);
    for (int i = 0; i < kQKK; i += 16) {
      const __m512i bits = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(s, _mm512_loadu_ps(x + i)), magic));
      __m512i q = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x400000));
      q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + i), _mm512_maskz_cvtepi32_epi8(0xffff, q));
      y[b].bsums[i / 16] = static_cast<int16_t>(sum16(q));
    }
    y[b].d = 1 / iscale;
  }
  return true;
}

}  // namespace
#endif

#if defined(LOOM_QUANT_ACTIVATIONS_AVX2)
namespace {

// The same steps as the AVX-512 form above, 8 lanes a vector.

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }

float max8(__m256 v) {
  alignas(32) float f[8];
  _mm256_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < 8; ++i) m = std::fmax(m, f[i]);
  return m;
}

bool all_finite(const float* x, int64_t n) {
  int bad = 0;
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (int64_t i = 0; i < n; i += 8)  // n is a multiple of 32
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + i)), inf, _CMP_NLT_UQ));
  return bad == 0;
}

// 32 int32 in [-128, 127] (four vectors of 8, in order) as 32 bytes.
__m256i bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// round_to_int8_as_x86 of v's 8 lanes, as int32 (|v| < 2^31).
__m256i round_to_int(__m256 v) {
  __m256i i = _mm256_cvttps_epi32(v);
  const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
  i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));  // -1: add one
  return _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
}

bool quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i), m = _mm256_max_ps(m, abs8(v[i]));
    float id = 0.f;
    const BlockStart start = q8_0_start(max8(m), y[b], &id);
    if (start == BlockStart::tiny) return false;
    if (start == BlockStart::zero) continue;
    const __m256 s = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = round_to_int(_mm256_mul_ps(v[i], s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), bytes32(q[0], q[1], q[2], q[3]));
  }
  return true;
}

int32_t sum8(__m256i v) {
  alignas(32) int32_t a[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), v);
  int32_t t = 0;
  for (int i = 0; i < 8; ++i) t += a[i];
  return t;
}

bool quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQKK) {
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < kQKK; i += 8) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + i)));
    float iscale = 0.f;
    const BlockStart start = q8_K_start(x, max8(m), y[b], &iscale);
    if (start == BlockStart::tiny) return false;
    if (start == BlockStart::zero) continue;
    const __m256 s = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
    for (int i = 0; i < kQKK; i += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i bits = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(s, _mm256_loadu_ps(x + i + 8 * k)), magic));
        q[k] = _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(0x400000));
        q[k] = _mm256_min_epi32(q[k], _mm256_set1_epi32(127));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + i), bytes32(q[0], q[1], q[2], q[3]));
      y[b].bsums[i / 16] = static_cast<int16_t>(sum8(_mm256_add_epi32(q[0], q[1])));
      y[b].bsums[i / 16 + 1] = static_cast<int16_t>(sum8(_mm256_add_epi32(q[2], q[3])));
    }
    y[b].d = 1 / iscale;
  }
  return true;
}

}  // namespace
#endif

bool quantize_row_fast(QuantType t, const float* x, void* blocks, int64_t n) {
#if defined(LOOM_QUANT_ACTIVATIONS) || defined(LOOM_QUANT_ACTIVATIONS_AVX2)
  if (n % quant_block_size(t) != 0 || !all_finite(x, n)) return false;
  if (t == QuantType::q8_0) return quantize_q8_0(x, static_cast<block_q8_0*>(blocks), n / kQK);
  if (t == QuantType::q8_K) return quantize_q8_K(x, static_cast<block_q8_K*>(blocks), n / kQKK);
#else
  (void)t, (void)x, (void)blocks, (void)n;
#endif
  return false;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
