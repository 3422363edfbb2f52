#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/vec_math.h"

using loom::kernels::exp_f32;

TEST(VecMath, ExpIsWithinTwoUlpOfLibmOverItsRange) {
  double worst = 0;
  for (float x = -87.3f; x <= 88.7f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_f32(x) - want) / want);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of f32 is 2.4e-7 relative
}

TEST(VecMath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(0.f), 1.f);
  EXPECT_EQ(exp_f32(-inf), 0.f);  // a masked score contributes exactly 0
  EXPECT_EQ(exp_f32(-87.4f), 0.f);
  EXPECT_EQ(exp_f32(-1e30f), 0.f);
  EXPECT_EQ(exp_f32(88.8f), inf);
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_f32(-std::numeric_limits<float>::quiet_NaN())));
  // Both 2^n factors stay normal at the ends of the range.
  EXPECT_NEAR(exp_f32(88.7f) / std::exp(double{88.7f}), 1.0, 3e-7);
  EXPECT_NEAR(exp_f32(-87.3f) / std::exp(double{-87.3f}), 1.0, 3e-7);
}
