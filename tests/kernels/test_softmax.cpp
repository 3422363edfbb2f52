// Softmax over the last dim against PyTorch (tests/ref/ref_softmax.py), finite
// differences, the bf16 and f16 paths against the f32 path, in-place use and misuse.
//
// Tolerances (|a - e| <= atol + rtol |e|):
// - f32 vs torch (float64 from the same f32 inputs): y rtol 1e-5 atol 1e-7
//   (y lies in [0, 1]; tiny probabilities are held to the relative bound);
//   dx rtol 1e-5 atol 1e-6 (its sum over D is accumulated in double; the
//   worst error seen is 1.2e-7 absolute, 6e-7 relative).
// - bf16 storage with f32 gradients vs the f32 path: the backward reads the
//   bf16-stored y (relative error 2^-9), so dx rtol 1e-2 atol 1e-3.
// - bf16 storage and bf16 gradients: one more bf16 rounding of each stored
//   result (2^-9 relative): y rtol 1e-2 atol 1e-6, dx rtol 1e-2 atol 1e-2.
// - f16: every bf16 tolerance times 1/4 (f16 rounds to 2^-12 relative, 8x
//   finer; probabilities below 2^-14 are f16 subnormals, within atol).
// - finite differences (f32, central, h = 1e-2): truncation ~h^2 times third
//   derivatives of order 1, round-off ~1e-7 / h: rtol 1e-2 atol 1e-3.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace loom::test;

const char* const kCases[] = {"c100", "n1", "large", "vocab"};

struct SoftmaxInputs {
  Shape shape;
  Floats x, dy, dx0;
};

SoftmaxInputs load_inputs(RefCase& rc) {
  return {rc["x"].shape, rc["x"].floats(), rc["dy"].floats(), rc["dx_prefill"].floats()};
}

struct SoftmaxOutputs {
  Floats y, dx;
};

// Forward, then backward (from this y) into the pre-filled dx.
// act: dtype of x and y; grad: dtype of dy and dx.
SoftmaxOutputs run_softmax(const SoftmaxInputs& in, DType act, DType grad) {
  Buffer x(act, in.shape, in.x), y(act, in.shape);
  Buffer dy(grad, in.shape, in.dy), dx(grad, in.shape, in.dx0);
  softmax_forward(y.view(), x.view());
  softmax_backward(dx.view(), dy.view(), y.view());
  return {y.floats(), dx.floats()};
}

TEST(Softmax, ForwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("softmax_") + name + ".ref");
    EXPECT_TRUE(all_close(run_softmax(load_inputs(rc), DType::f32, DType::f32).y, rc["y"].floats(), 1e-5, 1e-7));
  }
}

TEST(Softmax, BackwardAccumulatesTorchGradientsF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("softmax_") + name + ".ref");
    const SoftmaxInputs in = load_inputs(rc);
    const Floats dx = run_softmax(in, DType::f32, DType::f32).dx;
    EXPECT_TRUE(all_close(dx, plus(in.dx0, rc["dx"].floats()), 1e-5, 1e-6));
  }
}

// Offsets of +-1000 would overflow exp in f32 without the max subtraction.
TEST(Softmax, LargeInputsGiveFiniteRowsThatSumToOne) {
  RefCase rc("softmax_large.ref");
  const SoftmaxInputs in = load_inputs(rc);
  const Floats y = run_softmax(in, DType::f32, DType::f32).y;
  const int64_t D = in.shape[1];
  for (int64_t r = 0; r < in.shape[0]; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < D; ++i) {
      ASSERT_TRUE(std::isfinite(y[r * D + i])) << "row " << r << " col " << i;
      sum += y[r * D + i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
  }
}

TEST(Softmax, InPlaceForwardMatchesOutOfPlace) {
  RefCase rc("softmax_c100.ref");
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const SoftmaxInputs in = load_inputs(rc);
    Buffer x(dtype, in.shape, in.x), y(dtype, in.shape);
    softmax_forward(y.view(), x.view());
    softmax_forward(x.view(), x.view());
    EXPECT_EQ(x.floats(), y.floats()) << dtype_name(dtype);
  }
}

// half (bf16 or f16) storage against the f32 path on the same rounded
// inputs; k scales the bf16 tolerances (kF16Tighter for f16).
void expect_half_matches_f32(DType half, double k) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("softmax_") + name + ".ref");
    SoftmaxInputs in = load_inputs(rc);
    for (Floats* v : {&in.x, &in.dy, &in.dx0}) *v = rounded_to(half, *v);
    const SoftmaxOutputs ref = run_softmax(in, DType::f32, DType::f32);
    const SoftmaxOutputs f32_grads = run_softmax(in, half, DType::f32);
    EXPECT_TRUE(all_close(f32_grads.y, ref.y, k * 1e-2, k * 1e-6)) << "y";
    EXPECT_TRUE(all_close(f32_grads.dx, ref.dx, k * 1e-2, k * 1e-3)) << "dx, f32 gradients";
    const SoftmaxOutputs half_grads = run_softmax(in, half, half);
    EXPECT_TRUE(all_close(half_grads.y, ref.y, k * 1e-2, k * 1e-6)) << "y";
    EXPECT_TRUE(all_close(half_grads.dx, ref.dx, k * 1e-2, k * 1e-2)) << "dx, half gradients";
  }
}

TEST(Softmax, Bf16MatchesF32PathOnRoundedInputs) { expect_half_matches_f32(DType::bf16, 1.0); }
TEST(Softmax, F16MatchesF32PathOnRoundedInputs) { expect_half_matches_f32(DType::f16, kF16Tighter); }

// loss = sum(y * r) for random r; the analytic gradient is the backward with dy = r.
TEST(Softmax, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  SoftmaxInputs in{Shape{3, 7}, Floats(21), Floats(21), Floats(21)};
  for (size_t i = 0; i < 21; ++i) in.x[i] = 2.f * normal(rng), in.dy[i] = normal(rng);
  const Floats analytic = run_softmax(in, DType::f32, DType::f32).dx;
  SoftmaxInputs probe = in;
  const auto loss = [&] { return test::weighted_sum(run_softmax(probe, DType::f32, DType::f32).y, in.dy); };
  EXPECT_TRUE(all_close(analytic, test::finite_difference(loss, probe.x, 1e-2f), 1e-2, 1e-3));
}

TEST(Softmax, UndefinedGradientIsSkipped) {
  Floats ys(8, 0.125f), dys(8, 1.f);
  Tensor y(ys.data(), DType::f32, Shape{1, 8}), dy(dys.data(), DType::f32, Shape{1, 8});
  EXPECT_NO_THROW(softmax_backward(Tensor(), dy, y));
}

TEST(Softmax, MisuseThrowsErrorsNamingTheOpAndShapes) {
  Floats a(4 * 100), b(4 * 100);
  Tensor x(a.data(), DType::f32, Shape{4, 100}), y(b.data(), DType::f32, Shape{4, 100});
  Tensor y_t(b.data(), DType::f32, Shape{100, 4}), y_bf16(b.data(), DType::bf16, Shape{4, 100});
  Tensor x_i32(a.data(), DType::i32, Shape{4, 100});
  expect_error([&] { softmax_forward(y_t, x); }, {"softmax_forward", "f32(100, 4)", "f32(4, 100)"});
  expect_error([&] { softmax_forward(y_bf16, x); }, {"softmax_forward", "y", "bf16(4, 100)"});
  expect_error([&] { softmax_forward(x_i32, x_i32); }, {"softmax_forward", "i32(4, 100)"});
  expect_error([&] { softmax_forward(Tensor(), x); }, {"softmax_forward", "y is required"});
  expect_error([&] { softmax_backward(x, y_t, y); }, {"softmax_backward", "dy", "f32(100, 4)"});
  expect_error([&] { softmax_backward(y_t, x, y); }, {"softmax_backward", "dx", "f32(100, 4)"});
  expect_error([&] { softmax_backward(x, x_i32, y); }, {"softmax_backward", "dy", "i32(4, 100)"});
}

}  // namespace
}  // namespace loom::kernels
