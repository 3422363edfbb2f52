// Comparisons and gradient checks shared by the kernel tests.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace loom::test {

// Every element satisfies |actual - expected| <= atol + rtol * |expected|;
// on failure the message names the worst element and the count of misses.
::testing::AssertionResult all_close(std::span<const float> actual, std::span<const float> expected, double rtol,
                                     double atol);
// A tensor's elements (f32, bf16, f16) as floats.
std::vector<float> to_floats(const Tensor& t);

// Central finite differences of a scalar function of x's elements:
// grad[i] ~ (loss(x + h e_i) - loss(x - h e_i)) / 2h, formed in double and
// returned as float to compare with a kernel's gradient. x is restored.
std::vector<float> finite_difference(const std::function<double()>& loss, std::span<float> x, float h);
// sum_i y[i] * w[i] in double: a scalar loss whose gradient wrt y is w, so
// the analytic gradient is the backward with dy = w.
double weighted_sum(std::span<const float> y, std::span<const float> w);

}  // namespace loom::test

// EXPECT_ALL_CLOSE(actual, expected, rtol, atol) on anything convertible to span<const float>.
#define EXPECT_ALL_CLOSE(actual, expected, rtol, atol) \
  EXPECT_TRUE(::loom::test::all_close((actual), (expected), (rtol), (atol)))
