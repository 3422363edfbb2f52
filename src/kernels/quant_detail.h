// Helpers shared by quant.cpp and quant_more.cpp: ggml-quants.c's rounding
// and the fits its reference quantizers share. Internal to kernels/.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/quant.h"

namespace loom::kernels::quant_detail {

// Round to nearest, ties to even, for |f| <= 2^22: adding 1.5 * 2^23 leaves
// the rounded value in the low mantissa bits (ggml-quants.c nearest_int).
inline int nearest_int(float f) {
  const float v = f + 12582912.f;
  return static_cast<int>(std::bit_cast<uint32_t>(v) & 0x7fffffu) - 0x400000;
}

// ggml's C converts a float to int8_t with x86's cvttss2si and keeps the low
// byte: truncation, modulo 256, and 0 for NaN or out of the int32 range
// (0x80000000). Only a block whose scale's inverse overflows (max |x| below
// about 1e-36) gets there, and then its f16 scale is 0 anyway.
inline int8_t to_int8_as_x86(float v) {
  if (!(std::fabs(v) < 2147483648.f)) return 0;
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

// to_int8_as_x86(roundf(v)) without the libm call: truncate, then step away
// from zero when the (exact) remainder is at least one half.
inline int8_t round_to_int8_as_x86(float v) {
  if (!(std::fabs(v) < 2147483648.f)) return 0;
  int32_t i = static_cast<int32_t>(v);
  const float frac = v - static_cast<float>(i);
  i += (frac >= 0.5f) - (frac <= -0.5f);
  return static_cast<int8_t>(i);
}

inline int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// ggml-quants.c make_qkx2_quants' search: nmax, the trial inverse scales
// (rmin + rdelta * is + nmax) / (max - min) for is in 0..nstep, and whether
// the error is absolute (else squared).
struct Qkx2Search {
  int nmax;
  float rmin, rdelta;
  int nstep;
  bool use_mad;
};

float make_qkx2_quants(int n, const Qkx2Search& s, const float* x, const float* w, uint8_t* L, float* the_min);
// q4_K's and q5_K's fit of one super-block of x (ggml quantize_row_q4_K_ref,
// _q5_K_ref): each sub-block of 32 fitted (weights av_x + |x|), its scale
// and min rounded to 6 bits against their maxima into scales[12], *d and
// *dmin, then every value requantized against the rounded ones into L
// (0..search.nmax).
void fit_k_super_block(const float* x, const Qkx2Search& search, uint8_t* L, f16* d, f16* dmin, uint8_t* scales);

// quant_more.cpp's types: nb blocks of t written (quantize) or read
// (dequantize); false for a type it does not handle (the caller's).
bool quantize_more(QuantType t, const float* x, void* blocks, int64_t nb);
bool dequantize_more(QuantType t, const void* blocks, float* y, int64_t nb);

}  // namespace loom::kernels::quant_detail
