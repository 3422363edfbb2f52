// llama.cpp's block formats (kernels/quant.h): known-answer blocks worked out
// by hand from ggml's reference formulas, edge blocks, error bounds, exact
// round trips on the grid, refused inputs, and the dot products against the
// dequantized vectors. test_quant_ggml.cpp compares the bytes with
// llama.cpp's own library.
#include <gtest/gtest.h>

#include <bit>
#include <cstddef>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/quant.h"

namespace loom::kernels {
namespace {

constexpr QuantType kAllTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_K, QuantType::q6_K,
                                   QuantType::q8_K};

std::vector<uint8_t> quantize(QuantType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(quant_row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(QuantType t, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n);
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
  return y;
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

template <typename Block>
const Block& block(const std::vector<uint8_t>& q, size_t i = 0) {
  return reinterpret_cast<const Block*>(q.data())[i];
}

TEST(Quant, BlockSizesAndNamesAreLlamaCpps) {
  const int64_t sizes[] = {32, 32, 256, 256, 256};
  const size_t bytes[] = {34, 18, 144, 210, 292};
  const char* names[] = {"q8_0", "q4_0", "q4_K", "q6_K", "q8_K"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(quant_block_size(kAllTypes[i]), sizes[i]);
    EXPECT_EQ(quant_block_bytes(kAllTypes[i]), bytes[i]);
    EXPECT_EQ(quant_name(kAllTypes[i]), names[i]);
  }
  EXPECT_EQ(quant_row_bytes(QuantType::q4_K, 4096), 16u * 144);
  EXPECT_EQ(quant_dot_type(QuantType::q4_0), QuantType::q8_0);
  EXPECT_EQ(quant_dot_type(QuantType::q6_K), QuantType::q8_K);
  EXPECT_THROW(quant_dot_type(QuantType::q8_K), Error);
}

// The types loom reads from llama.cpp's files (ggml-common.h's sizes), the
// activations each multiplies against (ggml's vec_dot_type), and which of
// them loom writes.
TEST(Quant, TheReadTypesHaveLlamaCppsSizesAndDotTypes) {
  struct Want {
    QuantType t;
    int64_t size;
    size_t bytes;
    const char* name;
    QuantType dot;
  };
  const Want want[] = {{QuantType::q4_1, 32, 20, "q4_1", QuantType::q8_1},
                       {QuantType::q5_0, 32, 22, "q5_0", QuantType::q8_0},
                       {QuantType::q5_1, 32, 24, "q5_1", QuantType::q8_1},
                       {QuantType::q2_K, 256, 84, "q2_K", QuantType::q8_K},
                       {QuantType::q3_K, 256, 110, "q3_K", QuantType::q8_K},
                       {QuantType::q5_K, 256, 176, "q5_K", QuantType::q8_K}};
  for (const Want& w : want) {
    EXPECT_EQ(quant_block_size(w.t), w.size) << w.name;
    EXPECT_EQ(quant_block_bytes(w.t), w.bytes) << w.name;
    EXPECT_EQ(quant_name(w.t), w.name);
    EXPECT_EQ(quant_dot_type(w.t), w.dot) << w.name;
    EXPECT_FALSE(quant_is_activation_type(w.t)) << w.name;
    EXPECT_EQ(quant_can_write(w.t), w.t != QuantType::q3_K) << w.name;
  }
  EXPECT_EQ(quant_block_bytes(QuantType::q8_1), 36u);
  EXPECT_TRUE(quant_is_activation_type(QuantType::q8_1));
  EXPECT_THROW(quant_dot_type(QuantType::q8_1), Error);
  std::vector<float> x(256, 1.f);
  std::vector<uint8_t> q(quant_row_bytes(QuantType::q3_K, 256));
  try {
    quantize_row(QuantType::q3_K, x.data(), q.data(), 256);
    ADD_FAILURE() << "q3_K written";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "quantize_row: loom reads q3_K but does not write it (llama-quantize does)");
  }
}

// Known answers for the five-bit types, worked out from ggml's formulas: the
// ramp 0, 0.5, ..., 15.5 lies on q5_1's grid (d = 0.5, m = 0); q5_0 (d = the
// signed max / -16) keeps both its ends.
TEST(Quant, FiveBitKnownAnswers) {
  std::vector<float> ramp(32);
  for (int i = 0; i < 32; ++i) ramp[i] = 0.5f * i;
  const auto q51 = quantize(QuantType::q5_1, ramp);
  const auto& b51 = block<block_q5_1>(q51);
  EXPECT_EQ(from_f16(b51.d), 0.5f);
  EXPECT_EQ(from_f16(b51.m), 0.f);
  EXPECT_EQ(b51.qs[0], 0x00);  // values 0 and 16: q 0 and 16 (fifth bit set for 16)
  EXPECT_EQ(b51.qs[3], 0x33);  // values 3 and 19
  uint32_t qh;
  std::memcpy(&qh, b51.qh, 4);
  EXPECT_EQ(qh, 0xffff0000u);  // q 16..31 have the fifth bit
  EXPECT_EQ(dequantize(QuantType::q5_1, q51, 32), ramp);
  // q5_0: d = max / -16 with max = 15.5: d = -0.96875, q = trunc(x / d + 16.5);
  // x = 0 gives 16, x = 15.5 gives 0: dequantized (q - 16) d.
  const auto q50 = quantize(QuantType::q5_0, ramp);
  const auto y50 = dequantize(QuantType::q5_0, q50, 32);
  EXPECT_EQ(from_f16(block<block_q5_0>(q50).d), -0.96875f);
  EXPECT_EQ(y50[0], 0.f);
  EXPECT_EQ(y50[31], 15.5f);
}

// ---- known answers ----------------------------------------------------------

// max |x| = 127 gives d = 1; q = roundf(x): halves go away from zero.
TEST(Quant, Q8_0KnownAnswerRoundsHalvesAwayFromZero) {
  std::vector<float> x(32, 0.f);
  const float in[] = {127, -127, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 0.49f, 126.5f};
  const int8_t want[] = {127, -127, 1, -1, 2, 3, -3, 0, 127};
  std::copy(std::begin(in), std::end(in), x.begin());
  const auto q = quantize(QuantType::q8_0, x);
  EXPECT_EQ(block<block_q8_0>(q).d.bits, 0x3c00);  // 1.0
  for (size_t i = 0; i < std::size(want); ++i) EXPECT_EQ(block<block_q8_0>(q).qs[i], want[i]) << i;
  for (size_t i = std::size(want); i < 32; ++i) EXPECT_EQ(block<block_q8_0>(q).qs[i], 0);
}

// Signed max -8 gives d = 1; q = min(15, trunc(x + 8.5)), low nibble value
// j, high nibble value j + 16.
TEST(Quant, Q4_0KnownAnswerRoundsHalvesUp) {
  std::vector<float> x(32, 0.f);
  x[0] = -8, x[1] = 7, x[2] = 3.5f, x[3] = -3.5f, x[4] = 7.6f, x[5] = -0.5f;
  x[16] = 0.49f, x[17] = -7.5f;
  const auto q = quantize(QuantType::q4_0, x);
  const auto& b = block<block_q4_0>(q);
  EXPECT_EQ(b.d.bits, 0x3c00);  // -8 / -8 = 1
  EXPECT_EQ(b.qs[0], 0x80);     // q 0 (-8), q[16] = trunc(8.99) = 8
  EXPECT_EQ(b.qs[1], 0x1f);     // q 15 (7), q[17] = trunc(1.0) = 1
  EXPECT_EQ(b.qs[2], 0x8c);     // trunc(12.0) = 12
  EXPECT_EQ(b.qs[3], 0x85);     // trunc(5.0) = 5
  EXPECT_EQ(b.qs[4], 0x8f);     // trunc(16.1) = 16 -> 15
  EXPECT_EQ(b.qs[5], 0x88);     // trunc(8.0) = 8: -0.5 rounds up to 0
  EXPECT_EQ(b.qs[6], 0x88);
}

// q4_0 maps the value of largest magnitude, with its sign, to q = 0: a
// positive max gives a negative d, and -max itself is clamped to q = 15.
TEST(Quant, Q4_0UsesTheSignedMaxSoTheOppositeExtremeClamps) {
  std::vector<float> x(32, 0.f);
  x[0] = 8, x[1] = -8, x[2] = 4;
  const auto q = quantize(QuantType::q4_0, x);
  EXPECT_EQ(block<block_q4_0>(q).d.bits, 0xbc00);  // 8 / -8 = -1
  const auto y = dequantize(QuantType::q4_0, q, 32);
  EXPECT_EQ(y[0], 8.f);   // q 0: (0 - 8) * -1
  EXPECT_EQ(y[1], -7.f);  // first of equal magnitudes wins: -8 * -1 + 8.5 = 16.5 -> 15
  EXPECT_EQ(y[2], 4.f);
  // All zero: max stays +0 and d = 0 / -8 is -0 (f16 0x8000), as in ggml.
  const auto z = quantize(QuantType::q4_0, std::vector<float>(32, 0.f));
  EXPECT_EQ(block<block_q4_0>(z).d.bits, 0x8000);
  for (uint8_t b : block<block_q4_0>(z).qs) EXPECT_EQ(b, 0x88);
}

// q8_K: d = signed max / -127 in f32, q = nearest-even(x / d), bsums per 16.
TEST(Quant, Q8_KKnownAnswerRoundsToNearestEven) {
  std::vector<float> x(256, 0.f);
  x[0] = 127, x[1] = 0.5f, x[2] = 1.5f, x[3] = 2.5f, x[16] = -3;
  const auto q = quantize(QuantType::q8_K, x);
  const auto& b = block<block_q8_K>(q);
  EXPECT_EQ(b.d, -1.f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], 0);   // -0.5 -> 0 (even)
  EXPECT_EQ(b.qs[2], -2);  // -1.5 -> -2
  EXPECT_EQ(b.qs[3], -2);  // -2.5 -> -2
  EXPECT_EQ(b.qs[16], 3);
  EXPECT_EQ(b.bsums[0], -131);
  EXPECT_EQ(b.bsums[1], 3);
  for (int j = 2; j < 16; ++j) EXPECT_EQ(b.bsums[j], 0);
}

// All equal 1.0: each sub-block's fit is L = 15 with scale 1/15 and min 0
// (every trial has a zero determinant), so sc = 63 for all, m = 0, d =
// f16(1/15/63) = f16(1/945) = 1110 * 2^-20 (0x1456), dmin = 0, and the
// requantized values nearest(1 / (63 d)) are 15.
TEST(Quant, Q4_KKnownAnswerForEqualValues) {
  const auto q = quantize(QuantType::q4_K, std::vector<float>(256, 1.f));
  const auto& b = block<block_q4_K>(q);
  EXPECT_EQ(b.d.bits, 0x1456);
  EXPECT_EQ(b.dmin.bits, 0x0000);
  const uint8_t want_scales[12] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0x0f, 0x0f, 0x0f, 0x0f};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], want_scales[i]) << i;
  for (uint8_t v : b.qs) EXPECT_EQ(v, 0xff);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4_K_scale_min(j, b.scales, &sc, &m);
    EXPECT_EQ(sc, 63);
    EXPECT_EQ(m, 0);
  }
  const auto y = dequantize(QuantType::q4_K, q, 256);
  EXPECT_EQ(y[0], from_f16(b.d) * 63 * 15);
}

// One outlier 1.0 in zeros: sub-block 0 fits scale -1/32 (1 -> L 0), the
// others are all zero (scale 0, L 0). Scales quantize against -1/32: d =
// f16(1/4096) = 0x0c00, scales[0] = -128, the rest 0. Sub-block 0 requantizes
// (zeros -> L 32); the others keep L 0.
TEST(Quant, Q6_KKnownAnswerForOneOutlier) {
  std::vector<float> x(256, 0.f);
  x[0] = 1;
  const auto q = quantize(QuantType::q6_K, x);
  const auto& b = block<block_q6_K>(q);
  EXPECT_EQ(b.d.bits, 0x0c00);
  EXPECT_EQ(b.scales[0], -128);
  for (int j = 1; j < 16; ++j) EXPECT_EQ(b.scales[j], 0);
  for (uint8_t v : b.ql) EXPECT_EQ(v, 0);  // L 0 and 32 have low bits 0
  for (int l = 0; l < 64; ++l) EXPECT_EQ(b.qh[l], l >= 1 && l < 16 ? 2 : 0) << l;  // L 32: high bits 2
  const auto y = dequantize(QuantType::q6_K, q, 256);
  EXPECT_EQ(y[0], 1.f);
  for (int i = 1; i < 256; ++i) EXPECT_EQ(y[i], 0.f) << i;
}

// ---- edge blocks --------------------------------------------------------------

TEST(Quant, AllZeroBlocksHaveZeroScalesAndDequantizeToZero) {
  for (QuantType t : kAllTypes) {
    const std::vector<float> x(512, 0.f);
    const auto y = dequantize(t, quantize(t, x), x.size());
    for (float v : y) ASSERT_EQ(v, 0.f) << quant_name(t);
  }
  const auto q = quantize(QuantType::q6_K, std::vector<float>(256, 0.f));
  for (uint8_t b : q) EXPECT_EQ(b, 0);
}

// Values whose scale is below f16's normal range: the scale rounds to an f16
// subnormal (or to 0) exactly as to_f16 rounds it, and nothing is NaN.
TEST(Quant, TinyValuesGetSubnormalF16ScalesAndNoNaN) {
  for (float amax : {1e-5f, 3e-6f, 1e-7f, 1e-20f, 1e-40f}) {
    std::vector<float> x = gaussian(256, 7);
    for (float& v : x) v = std::clamp(v, -1.f, 1.f) * amax;
    x[3] = amax;
    const auto q8 = quantize(QuantType::q8_0, x);
    float bmax = 0;
    for (int j = 0; j < 32; ++j) bmax = std::max(bmax, std::fabs(x[j]));
    EXPECT_EQ(block<block_q8_0>(q8).d.bits, to_f16(bmax / 127).bits) << amax;
    for (QuantType t : kAllTypes) {
      const auto y = dequantize(t, quantize(t, x), x.size());
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << quant_name(t) << " " << amax;
        ASSERT_LE(std::fabs(y[i]), 2 * amax + 1e-7f) << quant_name(t) << " " << amax;
      }
    }
  }
}

// The largest values whose scales stay finite in f16 (65504): q8_0's max
// 127 * 65504, q4_0's 8 * 65504; both are on the grid and round-trip exactly.
TEST(Quant, LargestValuesWithAFiniteF16ScaleRoundTrip) {
  std::vector<float> x(32, 0.f);
  x[0] = 127.f * 65504, x[1] = -127.f * 65504, x[2] = 65504;
  auto y = dequantize(QuantType::q8_0, quantize(QuantType::q8_0, x), 32);
  EXPECT_EQ(y, x);
  std::fill(x.begin(), x.end(), 0.f);
  x[0] = -8.f * 65504, x[1] = 7.f * 65504, x[2] = -65504;
  y = dequantize(QuantType::q4_0, quantize(QuantType::q4_0, x), 32);
  EXPECT_EQ(y, x);
}

// Sub-blocks of very different ranges in one super-block: each value still
// lands on the nearest point of its own sub-block's grid, unless that
// sub-block's scale rounded to 0 (its values then stay below the others'
// resolution).
TEST(Quant, MixedSubBlockRangesQuantizeToTheNearestGridPoint) {
  std::vector<float> x = gaussian(256 * 8, 11);
  const float ranges[] = {1e-3f, 1.f, 100.f, 0.01f, 5.f, 1e-4f, 30.f, 0.3f};
  for (size_t i = 0; i < x.size(); ++i) x[i] *= ranges[(i / 32 + i / 256) % 8];
  for (size_t i = 512; i < 768; ++i) x[i] = std::fabs(x[i]) + 2.f;  // an all-positive super-block
  const auto q4 = quantize(QuantType::q4_K, x);
  const auto y4 = dequantize(QuantType::q4_K, q4, x.size());
  const auto q6 = quantize(QuantType::q6_K, x);
  const auto y6 = dequantize(QuantType::q6_K, q6, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const auto& b4 = block<block_q4_K>(q4, i / 256);
    uint8_t sc, m;
    q4_K_scale_min(static_cast<int>(i % 256 / 32), b4.scales, &sc, &m);
    const float d4 = from_f16(b4.d) * sc, m4 = from_f16(b4.dmin) * m;
    if (d4 != 0) {
      const float l = std::nearbyint((x[i] + m4) / d4);
      ASSERT_EQ(y4[i], d4 * std::clamp(l, 0.f, 15.f) - m4) << i;
      if (l >= 0 && l <= 15) {
        ASSERT_LE(std::fabs(y4[i] - x[i]), 0.5001f * d4 + 1e-6f * m4) << i;
      }
    }
    const auto& b6 = block<block_q6_K>(q6, i / 256);
    const float d6 = from_f16(b6.d) * b6.scales[i % 256 / 16];
    if (d6 != 0) {
      const float l = std::nearbyint(x[i] / d6);
      ASSERT_EQ(y6[i], d6 * (std::clamp(l, -32.f, 31.f) + 0.f)) << i;
      if (l >= -32 && l <= 31) {
        ASSERT_LE(std::fabs(y6[i] - x[i]), 0.5001f * std::fabs(d6)) << i;
      }
    }
  }
}

// ---- error bounds and exact round trips ---------------------------------------

// q8_0: |x - y| <= d/2 plus 127 times the f16 rounding of d; q4_0: d/2, or d
// for the opposite extreme that clamps to 15; q8_K (f32 d): d/2.
TEST(Quant, ErrorStaysWithinHalfAStepForTheLinearTypes) {
  const auto x = gaussian(4096, 3, 2.f);
  const auto q8 = quantize(QuantType::q8_0, x);
  const auto y8 = dequantize(QuantType::q8_0, q8, x.size());
  const auto q4 = quantize(QuantType::q4_0, x);
  const auto y4 = dequantize(QuantType::q4_0, q4, x.size());
  const auto qk = quantize(QuantType::q8_K, x);
  const auto yk = dequantize(QuantType::q8_K, qk, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float amax = 0;
    for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d32 = amax / 127, d16 = from_f16(block<block_q8_0>(q8, i / 32).d);
    ASSERT_LE(std::fabs(y8[i] - x[i]), d16 / 2 + 127 * std::fabs(d32 - d16) + 1e-6f) << i;
    const float d4 = std::fabs(from_f16(block<block_q4_0>(q4, i / 32).d));
    const bool clamped = x[i] / -from_f16(block<block_q4_0>(q4, i / 32).d) < -7.5f;
    ASSERT_LE(std::fabs(y4[i] - x[i]), (clamped ? 1.f : 0.5f) * d4 * 1.01f) << i;
    ASSERT_LE(std::fabs(yk[i] - x[i]), std::fabs(block<block_q8_K>(qk, i / 256).d) * 0.5001f) << i;
  }
}

// Relative RMS error on Gaussian weights, with margin over what these
// formulas give (q8_0 0.53%, q6_K 1.76%, q4_K 7.1%, q4_0 8.5%), and the
// ordering the perplexity check expects.
TEST(Quant, RelativeRmsErrorOrdersTheTypes) {
  const auto x = gaussian(256 * 64, 5);
  auto rel_rms = [&](QuantType t) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) num += double(y[i] - x[i]) * (y[i] - x[i]), den += double(x[i]) * x[i];
    return std::sqrt(num / den);
  };
  const double e8 = rel_rms(QuantType::q8_0), e6 = rel_rms(QuantType::q6_K);
  const double e4k = rel_rms(QuantType::q4_K), e40 = rel_rms(QuantType::q4_0);
  EXPECT_LT(e8, 0.007);
  EXPECT_LT(e6, 0.022);
  EXPECT_LT(e4k, 0.085);
  EXPECT_LT(e40, 0.10);
  EXPECT_LT(e8, e6);
  EXPECT_LT(e6, e4k);
  EXPECT_LT(e4k, e40);
}

// Values already on a type's grid come back bit for bit: q8_0 and q8_K with
// a power-of-two step, q4_0 with a power-of-two d and the signed max -8d,
// q6_K with every sub-block holding -32 steps, q4_K with d = 2^-6 and dmin =
// 2^-7 (so 63 d and 63 dmin are exact) and every sub-block spanning 0..15.
TEST(Quant, DequantizeOfQuantizeIsExactOnTheGrid) {
  std::mt19937 rng(9);
  auto grid = [&](int lo, int hi, float step, int block, float offset = 0) {
    std::vector<float> x(512);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::uniform_int_distribution<int>(lo, hi)(rng) * step - offset;
    for (size_t b = 0; b < x.size(); b += block) x[b] = lo * step - offset, x[b + 1] = hi * step - offset;
    return x;
  };
  struct Case {
    QuantType t;
    std::vector<float> x;
  };
  const Case cases[] = {
      {QuantType::q8_0, grid(-127, 127, 0.25f, 32)},
      {QuantType::q8_K, grid(-127, 127, 1.f / 64, 16)},
      {QuantType::q4_0, grid(-8, 7, 0.125f, 32)},
      {QuantType::q6_K, grid(-32, 31, 0.5f, 16)},
      {QuantType::q4_K, grid(0, 15, 63.f / 64, 32, 63.f / 128)},
      {QuantType::q4_K, grid(0, 15, 63.f / 256, 32)},
  };
  for (const Case& c : cases) {
    const auto y = dequantize(c.t, quantize(c.t, c.x), c.x.size());
    for (size_t i = 0; i < c.x.size(); ++i) ASSERT_EQ(y[i], c.x[i]) << quant_name(c.t) << " value " << i;
  }
}

// ---- refused input --------------------------------------------------------------

TEST(Quant, NaNAndInfAreRefusedNamingTheIndex) {
  for (QuantType t : kAllTypes) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(256, 1.f);
      x[77] = bad;
      std::vector<uint8_t> q(quant_row_bytes(t, 256));
      try {
        quantize_row(t, x.data(), q.data(), 256);
        ADD_FAILURE() << quant_name(t) << " accepted " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("value 77 is"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(quant_name(t)), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Quant, RowLengthsThatAreNotWholeBlocksAreRefused) {
  std::vector<float> x(300, 1.f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_row(QuantType::q8_0, x.data(), q.data(), 33), Error);
  EXPECT_THROW(quantize_row(QuantType::q4_K, x.data(), q.data(), 288), Error);
  EXPECT_THROW(dequantize_row(QuantType::q6_K, q.data(), x.data(), 32), Error);
  EXPECT_THROW(quant_row_bytes(QuantType::q4_0, 20), Error);
  EXPECT_THROW(vec_dot(QuantType::q4_K, q.data(), q.data(), 32), Error);
  EXPECT_THROW(vec_dot(QuantType::q8_K, q.data(), q.data(), 256), Error);
  try {
    quantize_row(QuantType::q6_K, x.data(), q.data(), 288);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "quantize_row q6_K: 288 values is not a multiple of the block size 256");
  }
}

// ---- dot products ------------------------------------------------------------

TEST(QuantDot, Q8_0TimesQ8_0IsTheIntegerFormulaExactly) {
  const auto a = quantize(QuantType::q8_0, gaussian(4096, 21));
  const auto b = quantize(QuantType::q8_0, gaussian(4096, 22, 3.f));
  float want = 0;
  for (size_t i = 0; i < 4096 / 32; ++i) {
    const auto& x = block<block_q8_0>(a, i);
    const auto& y = block<block_q8_0>(b, i);
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int32_t{x.qs[j]} * y.qs[j];
    want += float(isum) * (from_f16(x.d) * from_f16(y.d));
  }
  const float got = vec_dot_q8_0_q8_0(&block<block_q8_0>(a), &block<block_q8_0>(b), 4096);
  EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want));
}

// Each dot equals the double-precision dot of the two dequantized rows to
// f32 rounding: the integer parts are exact, only the per-block scaling and
// the running sum round.
TEST(QuantDot, EveryDotMatchesTheDotOfTheDequantizedRows) {
  const size_t n = 4096;
  for (QuantType t : {QuantType::q8_0, QuantType::q4_0, QuantType::q4_K, QuantType::q6_K, QuantType::q4_1,
                      QuantType::q5_0, QuantType::q5_1, QuantType::q2_K, QuantType::q3_K, QuantType::q5_K}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      auto w = gaussian(n, seed);
      auto a = gaussian(n, seed + 100, 0.5f);
      if (seed == 3) for (size_t i = 0; i < n; i += 7) w[i] = std::fabs(w[i]) + 1.f;  // mins at work in q4_K
      const QuantType at = quant_dot_type(t);
      // q3_K (not written by loom): q6_K's values re-packed are not at hand,
      // so random bytes with a small finite scale.
      std::vector<uint8_t> qw;
      if (quant_can_write(t)) {
        qw = quantize(t, w);
      } else {
        std::mt19937 rng(seed);
        qw.resize(quant_row_bytes(t, static_cast<int64_t>(n)));
        for (uint8_t& b : qw) b = static_cast<uint8_t>(rng());
        for (size_t off = 0; off < qw.size(); off += sizeof(block_q3_K)) {
          const f16 d = to_f16(0.01f);
          std::memcpy(qw.data() + off + offsetof(block_q3_K, d), &d, sizeof d);
        }
      }
      const auto qa = quantize(at, a);
      const auto yw = dequantize(t, qw, n), ya = dequantize(at, qa, n);
      double want = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) want += double(yw[i]) * ya[i], mag += std::fabs(double(yw[i]) * ya[i]);
      // q8_1's s is d * sum(qs) rounded to f16, and the dot uses it for the
      // weights' minima (as llama.cpp does): the exact product takes it too.
      if (at == QuantType::q8_1)
        for (size_t b = 0; b < n / 32; ++b) {
          const auto& y = block<block_q8_1>(qa, b);
          f16 m;
          std::memcpy(&m, qw.data() + b * quant_block_bytes(t) + 2, sizeof m);
          int sum = 0;
          for (int8_t v : y.qs) sum += v;
          want += double(from_f16(m)) * (double(from_f16(y.s)) - double(from_f16(y.d)) * sum);
        }
      const float got = vec_dot(t, qw.data(), qa.data(), static_cast<int64_t>(n));
      EXPECT_NEAR(got, want, 2e-6 * mag) << quant_name(t) << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace loom::kernels
