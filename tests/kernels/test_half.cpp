// The kernels' f16 conversions (src/kernels/cpu/half.h: F16C / AVX-512F
// instructions) give the same bits as core/dtype.h's portable to_f16 /
// from_f16: every f16 value, and f32 values around every f16 rounding
// boundary (RNE ties, subnormals, overflow to Inf, NaN), through the scalar,
// span and accumulate forms (span lengths that exercise the vector loop and
// its scalar tail).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "kernels/cpu/half.h"

namespace loom::kernels {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// f16 bits h is a signalling NaN: exponent all ones, mantissa non-zero, quiet bit clear.
bool is_signalling_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0 && !(h & 0x200u); }

// The f32 that from_f16 gives, with a signalling NaN quieted where half.h
// uses the hardware conversion (which quiets it; both are NaN with the same
// payload). This file is compiled for the baseline, without F16C: the
// kernels' own copies of half.h, per instruction-set level, are exercised by
// their f16 cases at every level (tests/isa_levels.cmake).
uint32_t expected_widen(uint16_t h) {
  const uint32_t e = bits(from_f16(f16{h}));
#if defined(__F16C__)
  return is_signalling_nan(h) ? (e | 0x00400000u) : e;
#else
  return e;
#endif
}

TEST(HalfConversion, EveryF16WidensToTheBitsOfFromF16) {
  std::vector<f16> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = f16{static_cast<uint16_t>(h)};
  std::vector<float> wide(all.size());
  span_to_f32(wide.data(), all.data(), static_cast<int64_t>(all.size()));
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(bits(wide[h]), expected_widen(b)) << "f16 bits " << std::hex << h;
    ASSERT_EQ(bits(half_to_float(all[h])), expected_widen(b)) << "f16 bits " << std::hex << h;
  }
}

// f32 values around every f16 value: the value, its midpoints to the
// neighbours (ties: RNE), one f32 ulp either side of those, plus the f32
// edge cases. Covers normals, subnormals, zero, overflow and NaN payloads.
std::vector<float> narrowing_cases() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float x = from_f16(f16{static_cast<uint16_t>(h)});
    const float next = h + 1 < 0x7c00u ? from_f16(f16{static_cast<uint16_t>(h + 1)}) : 65536.f;
    const float mid = x + (next - x) / 2;  // exact in f32
    for (float y : {x, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f)}) {
      v.push_back(y);
      v.push_back(-y);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float y : {65504.f, 65519.99f, 65520.f, 1e5f, 3.4e38f, inf, 1e-45f, 1e-38f, 2.98e-8f, 2.9802322e-8f,
                  2.9802326e-8f, 5.96e-8f}) {
    v.push_back(y);
    v.push_back(-y);
  }
  for (uint32_t payload : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0x7f802000u, 0xffc12345u})
    v.push_back(std::bit_cast<float>(payload));
  std::mt19937 rng(1);
  for (int i = 0; i < 100000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return v;
}

TEST(HalfConversion, F32NarrowsToTheBitsOfToF16) {
  const std::vector<float> v = narrowing_cases();
  std::vector<f16> narrow(v.size());
  span_from_f32(narrow.data(), v.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t want = to_f16(v[i]).bits;
    ASSERT_EQ(narrow[i].bits, want) << "f32 bits " << std::hex << bits(v[i]);
    ASSERT_EQ(float_to_half(v[i]).bits, want) << "f32 bits " << std::hex << bits(v[i]);
    ASSERT_EQ(from_f32<f16>(v[i]).bits, want);
  }
}

TEST(HalfConversion, AccumulateIsOneRoundingOfTheF32Sum) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (int64_t n : {0, 1, 7, 15, 16, 17, 33, 1000}) {
    SCOPED_TRACE(n);
    std::vector<f16> dst(n);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) dst[i] = to_f16(normal(rng) * 1000.f), v[i] = normal(rng) * 1e4f;
    if (n > 3) v[3] = 1e6f;  // overflows to Inf
    std::vector<f16> before = dst;
    span_add_f32(dst.data(), v.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dst[i].bits, to_f16(from_f16(before[i]) + v[i]).bits) << i;
  }
}

TEST(HalfConversion, SpanTailsMatchTheScalarPath) {
  // Lengths around the 16-wide vector loop: every element must be converted,
  // none past n touched.
  for (int64_t n : {1, 5, 15, 16, 17, 31, 32, 33}) {
    SCOPED_TRACE(n);
    std::vector<float> src(n + 1), back(n + 1, -7.f);
    for (int64_t i = 0; i <= n; ++i) src[i] = 0.1f * static_cast<float>(i) - 1.f;
    std::vector<f16> h(n + 1, f16{0x1234});
    span_from_f32(h.data(), src.data(), n);
    span_to_f32(back.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(bits(back[i]), bits(from_f16(to_f16(src[i])))) << i;
    EXPECT_EQ(h[n].bits, 0x1234);
    EXPECT_EQ(back[n], -7.f);
  }
}

}  // namespace
}  // namespace loom::kernels
