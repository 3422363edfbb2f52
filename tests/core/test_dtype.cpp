#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"

using namespace loom;

namespace {
float bits_f32(uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
}

TEST(DType, UnknownNameIsAnErrorListingAllowedNames) {
  try {
    dtype_from_name("fp8");
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}

TEST(BF16, ExactValuesRoundTrip) {
  for (float v : {0.f, -0.f, 1.f, -2.f, 0.5f, 3.140625f, 65536.f, bits_f32(0x00010000u) /* smallest subnormal */}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(from_bf16(to_bf16(v))), std::bit_cast<uint32_t>(v)) << v;
  }
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1).
  EXPECT_EQ(to_bf16(1.f + 0x1.0p-8f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(to_bf16(1.f + 3 * 0x1.0p-8f).bits, 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(to_bf16(bits_f32(0x3f808001u)).bits, 0x3f81);
  // Just below rounds down.
  EXPECT_EQ(to_bf16(bits_f32(0x3f807fffu)).bits, 0x3f80);
  // Negative values mirror.
  EXPECT_EQ(to_bf16(-(1.f + 3 * 0x1.0p-8f)).bits, 0xbf82);
}

TEST(BF16, OverflowGoesToInfinityAndInfNaNPreserved) {
  // The largest finite float rounds up past bf16's largest finite value.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  // A NaN whose payload lives only in the low 16 bits must not become Inf.
  const float nan_low_payload = bits_f32(0x7f800001u);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(nan_low_payload))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST(F16, ExactValuesRoundTrip) {
  for (float v : {0.f, -0.f, 1.f, -2.f, 0.5f, 65504.f, -65504.f, 0x1.0p-14f /* smallest normal */,
                  0x1.0p-24f /* smallest subnormal */, 0x1.ff8p-15f /* largest subnormal */, 1.5f + 0x1.0p-10f}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(from_f16(to_f16(v))), std::bit_cast<uint32_t>(v)) << v;
  }
  EXPECT_EQ(to_f16(1.f).bits, 0x3c00);
  EXPECT_EQ(to_f16(65504.f).bits, 0x7bff);
  EXPECT_EQ(to_f16(0x1.0p-24f).bits, 0x0001);
  EXPECT_EQ(to_f16(-0.f).bits, 0x8000);
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(to_f16(1.f + 0x1.0p-11f).bits, 0x3c00);      // tie -> even (down)
  EXPECT_EQ(to_f16(1.f + 3 * 0x1.0p-11f).bits, 0x3c02);  // tie -> even (up)
  EXPECT_EQ(to_f16(1.f + 0x1.2p-11f).bits, 0x3c01);      // above tie -> up
  // Subnormal ties: 2^-25 is halfway between 0 and 2^-24 -> 0 (even).
  EXPECT_EQ(to_f16(0x1.0p-25f).bits, 0x0000);
  EXPECT_EQ(to_f16(0x1.8p-24f).bits, 0x0002);  // 1.5 * 2^-24 -> tie between 1 and 2 -> 2
  EXPECT_EQ(to_f16(0x1.1p-25f).bits, 0x0001);  // just above half -> 1
  // Rounding carries from the largest subnormal into the smallest normal.
  EXPECT_EQ(to_f16(0x1.ffcp-15f).bits, 0x0400);
}

TEST(F16, OverflowAndSpecials) {
  EXPECT_EQ(to_f16(65519.f).bits, 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(to_f16(65520.f).bits, 0x7c00);  // halfway ties to even: Inf
  EXPECT_EQ(to_f16(1e10f).bits, 0x7c00);
  EXPECT_EQ(to_f16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(to_f16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isinf(from_f16(f16{0x7c00})));
  EXPECT_TRUE(std::isnan(from_f16(to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(from_f16(to_f16(bits_f32(0x7f800001u)))));  // payload in low bits only
  EXPECT_EQ(to_f16(1e-9f).bits, 0x0000);
}

TEST(F16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const f16 h{static_cast<uint16_t>(b)};
    const float f = from_f16(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(from_f16(to_f16(f))));
      continue;
    }
    ASSERT_EQ(to_f16(f).bits, h.bits) << "bits " << b;
  }
}

TEST(BF16, EveryBF16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const bf16 h{static_cast<uint16_t>(b)};
    const float f = from_bf16(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_bf16(f).bits, h.bits) << "bits " << b;
  }
}
