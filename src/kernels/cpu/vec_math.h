// Elementwise math that GCC vectorises: glibc's expf is a scalar call unless
// built with -ffast-math, which would loosen every other float in loom.
// Internal to src/kernels/cpu.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace loom::kernels {

// exp(x) within ~1 ulp of expf, branch-free (Cephes expf): x = n ln2 + r with
// |r| <= ln2 / 2, e^r by a degree-6 polynomial, times 2^n built in the
// exponent bits as 2^(n/2) * 2^(n - n/2) so that both factors stay normal for
// every n in [-126, 128]. Results below 2^-126 (x < -87.34) are flushed to 0,
// so -inf (a masked score) gives exactly 0; x > 88.72 gives +inf; NaN stays NaN.
inline float exp_f32(float x) {
  constexpr float kMin = -87.33654f;  // ln(2^-126)
  constexpr float kMax = 88.72283f;   // ln(FLT_MAX)
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  // NaN fails both comparisons and is clamped to kMin, so the int conversion
  // below is always defined; the NaN itself is returned at the end.
  const float xc = x >= kMin ? (x <= kMax ? x : kMax) : kMin;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;  // ln 2 in two parts: n * the first is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float y = p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  return x < kMin ? 0.f : (x > kMax ? std::numeric_limits<float>::infinity() : (x == x ? y : x));
}

}  // namespace loom::kernels
