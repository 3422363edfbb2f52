// GELU (tanh), SiLU and SwiGLU against PyTorch (tests/ref/ref_activations.py),
// finite differences, the bf16 path and misuse.
//
// Tolerances:
// - f32 vs the float64 reference: rel 1e-5, abs 1e-6 (elementwise, DESIGN.md
//   §6). The abs term covers values near zero: gradients cross zero (GELU'
//   near x = -0.75, SiLU' near x = -1.28) where the result is a difference of
//   O(1) f32 terms, so a few f32 ulps of 1 (~1e-7) is the best possible.
// - bf16 vs the f32 path on the same bf16-rounded inputs: rel 2^-8 (one bf16
//   ulp), abs 1e-6. The math is f32 on both paths, so bf16 differs only by the
//   final rounding (half an ulp); in practice the results are identical.
// - f16 likewise: rel 2^-10, abs 2.5e-7 (the bf16 ones times 1/4; f16
//   rounds to 2^-12 relative, 8x finer than bf16).
// - finite differences: central, h = 1e-2 on f32, rel 1e-2, abs 1e-3: the
//   truncation error h^2 f'''/6 is ~1e-5 and f32 rounding of the loss
//   (~1e-7 / 2h) ~1e-5, both far inside.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom {
namespace {

using namespace loom::test;
using namespace loom::kernels;

constexpr double kRtol = 1e-5, kAtol = 1e-6;
constexpr double kBf16Rtol = 1.0 / 256, kBf16Atol = 1e-6;
const char* const kCases[] = {"btc", "t1", "nf", "tails"};

RefCase load_case(const std::string& name) { return RefCase("activations_" + name + ".ref"); }

// A unary activation and the names of its reference outputs.
struct Unary {
  const char* name;
  void (*forward)(Tensor, const Tensor&);
  void (*backward)(Tensor, const Tensor&, const Tensor&);
  const char* y_key;
  const char* dx_key;
};
const Unary kGelu{"gelu", gelu_forward, gelu_backward, "gelu_y", "gelu_dx"};
const Unary kSilu{"silu", silu_forward, silu_backward, "silu_y", "silu_dx"};

void expect_forward_matches_torch(const Unary& op) {
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    RefCase rc = load_case(c);
    std::vector<float> x = rc["x"].floats(), y(x.size(), NAN);
    op.forward(f32_view(y, rc["x"].shape), f32_view(x, rc["x"].shape));
    EXPECT_ALL_CLOSE(y, rc[op.y_key].floats(), kRtol, kAtol);
  }
}

void expect_forward_in_place(const Unary& op) {
  RefCase rc = load_case("nf");
  std::vector<float> x = rc["x"].floats();
  op.forward(f32_view(x, rc["x"].shape), f32_view(x, rc["x"].shape));
  EXPECT_ALL_CLOSE(x, rc[op.y_key].floats(), kRtol, kAtol);
}

void expect_backward_accumulates_torch_grad(const Unary& op) {
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    RefCase rc = load_case(c);
    const Shape s = rc["x"].shape;
    std::vector<float> x = rc["x"].floats(), dy = rc["dy_x"].floats(), dx = prefill(x.size());
    const std::vector<float> expected = plus(dx, rc[op.dx_key].floats());
    op.backward(f32_view(dx, s), f32_view(dy, s), f32_view(x, s));
    EXPECT_ALL_CLOSE(dx, expected, kRtol, kAtol);
    op.backward(Tensor(), f32_view(dy, s), f32_view(x, s));  // an undefined gradient is skipped
  }
}

void expect_backward_matches_finite_differences(const Unary& op) {
  std::vector<float> x = {-4.f, -2.5f, -1.3f, -0.7f, -0.1f, 0.f, 0.3f, 0.9f, 1.7f, 3.1f, 5.f};
  std::vector<float> w = {0.3f, -1.1f, 0.8f, 1.5f, -0.4f, 0.9f, -0.7f, 1.2f, 0.5f, -0.9f, 0.6f};
  const Shape s{static_cast<int64_t>(x.size())};
  std::vector<float> y(x.size()), dx(x.size(), 0.f);
  auto loss = [&] {
    op.forward(f32_view(y, s), f32_view(x, s));
    return test::weighted_sum(y, w);
  };
  const std::vector<float> fd = test::finite_difference(loss, x, 1e-2f);
  op.backward(f32_view(dx, s), f32_view(w, s), f32_view(x, s));
  EXPECT_ALL_CLOSE(dx, fd, 1e-2, 1e-3);
}

// H (bf16 or f16) x, y, dy, dx against the f32 path fed the same H-rounded
// values; k scales the bf16 tolerances (kF16Tighter for f16).
template <typename H>
void expect_half_matches_f32_path(const Unary& op, double k) {
  RefCase rc = load_case("btc");
  const Shape s = rc["x"].shape;
  std::vector<H> xb = to_half_vec<H>(rc["x"].floats()), dyb = to_half_vec<H>(rc["dy_x"].floats());
  std::vector<float> x = from_half_vec(xb), dy = from_half_vec(dyb);
  std::vector<float> y(x.size()), dx = rounded_to_half<H>(prefill(x.size()));
  std::vector<H> yb(x.size()), dxb = to_half_vec<H>(dx);
  std::vector<float> dx_f32_grad = dx;  // a f32 gradient of the H operand
  op.forward(f32_view(y, s), f32_view(x, s));
  op.backward(f32_view(dx, s), f32_view(dy, s), f32_view(x, s));
  op.forward(half_view(yb, s), half_view(xb, s));
  op.backward(half_view(dxb, s), half_view(dyb, s), half_view(xb, s));
  op.backward(f32_view(dx_f32_grad, s), half_view(dyb, s), half_view(xb, s));
  EXPECT_ALL_CLOSE(from_half_vec(yb), y, k * kBf16Rtol, k * kBf16Atol);
  EXPECT_ALL_CLOSE(from_half_vec(dxb), dx, k * kBf16Rtol, k * kBf16Atol);
  EXPECT_ALL_CLOSE(dx_f32_grad, dx, kRtol, kAtol);
}
void expect_bf16_matches_f32_path(const Unary& op) { expect_half_matches_f32_path<bf16>(op, 1.0); }
void expect_f16_matches_f32_path(const Unary& op) { expect_half_matches_f32_path<f16>(op, kF16Tighter); }

void expect_misuse_errors(const Unary& op) {
  std::vector<float> a(12), b(12), c(12);
  std::vector<bf16> h(12);
  std::vector<int32_t> n(12);
  const Shape s{3, 4};
  const std::string fwd = std::string(op.name) + "_forward", bwd = std::string(op.name) + "_backward";
  expect_error([&] { op.forward(f32_view(a, s), f32_view(b, {4, 3})); }, {fwd, "(4, 3)"});
  expect_error([&] { op.forward(bf16_view(h, s), f32_view(b, s)); }, {fwd, "bf16(3, 4)"});
  expect_error([&] { op.forward(f32_view(a, s), i32_view(n, s)); }, {fwd, "i32(3, 4)"});
  expect_error([&] { op.forward(Tensor(), f32_view(b, s)); }, {fwd, "undefined"});
  expect_error([&] { op.backward(f32_view(a, {12}), f32_view(b, s), f32_view(c, s)); }, {bwd, "f32(12,)"});
  expect_error([&] { op.backward(f32_view(a, s), f32_view(b, {2, 6}), f32_view(c, s)); }, {bwd, "(2, 6)"});
  expect_error([&] { op.backward(f32_view(a, s), bf16_view(h, s), f32_view(c, s)); }, {bwd, "bf16(3, 4)"});
  const Tensor strided = f32_view(a, s).slice(1, 0, 2);
  expect_error([&] { op.forward(f32_view(b, {3, 2}), strided); }, {fwd, "f32(3, 2)"});
  // y may be exactly x (in place) but not shifted against it; gradients never alias inputs.
  std::vector<float> big(13);
  expect_error([&] { op.forward(Tensor(big.data() + 1, DType::f32, s), f32_view(big, s)); }, {fwd, "overlaps x"});
  expect_error([&] { op.backward(f32_view(a, s), f32_view(a, s), f32_view(c, s)); }, {bwd, "must not overlap dy"});
}

TEST(Gelu, ForwardMatchesTorchF32) { expect_forward_matches_torch(kGelu); }
TEST(Gelu, ForwardRunsInPlace) { expect_forward_in_place(kGelu); }
TEST(Gelu, BackwardAccumulatesTorchGradF32) { expect_backward_accumulates_torch_grad(kGelu); }
TEST(Gelu, BackwardMatchesFiniteDifferences) { expect_backward_matches_finite_differences(kGelu); }
TEST(Gelu, Bf16MatchesF32Path) { expect_bf16_matches_f32_path(kGelu); }
TEST(Gelu, F16MatchesF32Path) { expect_f16_matches_f32_path(kGelu); }
TEST(Gelu, MisuseThrowsNamingOpAndShapes) { expect_misuse_errors(kGelu); }

TEST(Silu, ForwardMatchesTorchF32) { expect_forward_matches_torch(kSilu); }
TEST(Silu, ForwardRunsInPlace) { expect_forward_in_place(kSilu); }
TEST(Silu, BackwardAccumulatesTorchGradF32) { expect_backward_accumulates_torch_grad(kSilu); }
TEST(Silu, BackwardMatchesFiniteDifferences) { expect_backward_matches_finite_differences(kSilu); }
TEST(Silu, Bf16MatchesF32Path) { expect_bf16_matches_f32_path(kSilu); }
TEST(Silu, F16MatchesF32Path) { expect_f16_matches_f32_path(kSilu); }
TEST(Silu, MisuseThrowsNamingOpAndShapes) { expect_misuse_errors(kSilu); }

// Extreme inputs give the limits, never NaN: gelu(x) -> x or 0, gelu' -> 1 or 0.
TEST(Gelu, SaturatesWithoutNaNAtExtremes) {
  std::vector<float> x = {-1e30f, -200.f, -89.f, 89.f, 200.f, 1e30f}, y(6), dy(6, 1.f), dx(6, 0.f);
  const Shape s{6};
  gelu_forward(f32_view(y, s), f32_view(x, s));
  gelu_backward(f32_view(dx, s), f32_view(dy, s), f32_view(x, s));
  EXPECT_ALL_CLOSE(y, (std::vector<float>{0.f, 0.f, 0.f, 89.f, 200.f, 1e30f}), 1e-6, 1e-30);
  EXPECT_ALL_CLOSE(dx, (std::vector<float>{0.f, 0.f, 0.f, 1.f, 1.f, 1.f}), 1e-6, 1e-30);
}

TEST(SwiGlu, ForwardMatchesTorchF32) {
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    RefCase rc = load_case(c);
    const Shape s = rc["gate"].shape;
    std::vector<float> gate = rc["gate"].floats(), up = rc["up"].floats(), y(gate.size(), NAN);
    swiglu_forward(f32_view(y, s), f32_view(gate, s), f32_view(up, s));
    EXPECT_ALL_CLOSE(y, rc["swiglu_y"].floats(), kRtol, kAtol);
  }
}

TEST(SwiGlu, ForwardRunsInPlaceOverGateOrUp) {
  RefCase rc = load_case("nf");
  const Shape s = rc["gate"].shape;
  std::vector<float> gate = rc["gate"].floats(), up = rc["up"].floats();
  swiglu_forward(f32_view(gate, s), f32_view(gate, s), f32_view(up, s));
  EXPECT_ALL_CLOSE(gate, rc["swiglu_y"].floats(), kRtol, kAtol);
  gate = rc["gate"].floats();
  swiglu_forward(f32_view(up, s), f32_view(gate, s), f32_view(up, s));
  EXPECT_ALL_CLOSE(up, rc["swiglu_y"].floats(), kRtol, kAtol);
}

TEST(SwiGlu, BackwardAccumulatesTorchGradF32) {
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    RefCase rc = load_case(c);
    const Shape s = rc["gate"].shape;
    std::vector<float> gate = rc["gate"].floats(), up = rc["up"].floats(), dy = rc["dy_glu"].floats();
    std::vector<float> dgate = prefill(gate.size()), dup = dgate;
    const std::vector<float> want_dgate = plus(dgate, rc["swiglu_dgate"].floats());
    const std::vector<float> want_dup = plus(dup, rc["swiglu_dup"].floats());
    swiglu_backward(f32_view(dgate, s), f32_view(dup, s), f32_view(dy, s), f32_view(gate, s), f32_view(up, s));
    EXPECT_ALL_CLOSE(dgate, want_dgate, kRtol, kAtol);
    EXPECT_ALL_CLOSE(dup, want_dup, kRtol, kAtol);
  }
}

TEST(SwiGlu, BackwardSkipsUndefinedGradients) {
  RefCase rc = load_case("btc");
  const Shape s = rc["gate"].shape;
  std::vector<float> gate = rc["gate"].floats(), up = rc["up"].floats(), dy = rc["dy_glu"].floats();
  std::vector<float> dgate(gate.size(), 0.f), dup(gate.size(), 0.f);
  swiglu_backward(f32_view(dgate, s), Tensor(), f32_view(dy, s), f32_view(gate, s), f32_view(up, s));
  swiglu_backward(Tensor(), f32_view(dup, s), f32_view(dy, s), f32_view(gate, s), f32_view(up, s));
  swiglu_backward(Tensor(), Tensor(), f32_view(dy, s), f32_view(gate, s), f32_view(up, s));
  EXPECT_ALL_CLOSE(dgate, rc["swiglu_dgate"].floats(), kRtol, kAtol);
  EXPECT_ALL_CLOSE(dup, rc["swiglu_dup"].floats(), kRtol, kAtol);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  std::vector<float> gate = {-4.f, -1.3f, -0.2f, 0.4f, 1.1f, 3.5f}, up = {0.7f, -1.2f, 2.f, 0.5f, -0.3f, 1.4f};
  std::vector<float> w = {0.3f, -1.1f, 0.8f, 1.5f, -0.4f, 0.9f};
  const Shape s{2, 3};
  std::vector<float> y(6), dgate(6, 0.f), dup(6, 0.f);
  auto loss = [&] {
    swiglu_forward(f32_view(y, s), f32_view(gate, s), f32_view(up, s));
    return test::weighted_sum(y, w);
  };
  const std::vector<float> fd_gate = test::finite_difference(loss, gate, 1e-2f);
  const std::vector<float> fd_up = test::finite_difference(loss, up, 1e-2f);
  swiglu_backward(f32_view(dgate, s), f32_view(dup, s), f32_view(w, s), f32_view(gate, s), f32_view(up, s));
  EXPECT_ALL_CLOSE(dgate, fd_gate, 1e-2, 1e-3);
  EXPECT_ALL_CLOSE(dup, fd_up, 1e-2, 1e-3);
}

// H (bf16 or f16) gate, up, y, dy, dgate (and an f32 dup) against the f32
// path on the same H-rounded values; then the model's combination: f32 dy,
// dgate, dup of H gate, up. k scales the bf16 tolerances.
template <typename H>
void expect_swiglu_half_matches_f32_path(double k) {
  RefCase rc = load_case("btc");
  const Shape s = rc["gate"].shape;
  std::vector<H> gb = to_half_vec<H>(rc["gate"].floats()), ub = to_half_vec<H>(rc["up"].floats());
  std::vector<H> dyb = to_half_vec<H>(rc["dy_glu"].floats());
  std::vector<float> gate = from_half_vec(gb), up = from_half_vec(ub), dy = from_half_vec(dyb);
  const size_t n = gate.size();
  std::vector<float> y(n), dgate = rounded_to_half<H>(prefill(n)), dup = dgate;
  std::vector<H> yb(n), dgate_b = to_half_vec<H>(dgate);
  std::vector<float> dup_f32_grad = dup, dgate_f32 = dgate, dup_f32 = dup;  // f32 gradients of H operands
  swiglu_forward(f32_view(y, s), f32_view(gate, s), f32_view(up, s));
  swiglu_backward(f32_view(dgate, s), f32_view(dup, s), f32_view(dy, s), f32_view(gate, s), f32_view(up, s));
  swiglu_forward(half_view(yb, s), half_view(gb, s), half_view(ub, s));
  swiglu_backward(half_view(dgate_b, s), f32_view(dup_f32_grad, s), half_view(dyb, s), half_view(gb, s),
                  half_view(ub, s));
  swiglu_backward(f32_view(dgate_f32, s), f32_view(dup_f32, s), f32_view(dy, s), half_view(gb, s), half_view(ub, s));
  EXPECT_ALL_CLOSE(from_half_vec(yb), y, k * kBf16Rtol, k * kBf16Atol);
  EXPECT_ALL_CLOSE(from_half_vec(dgate_b), dgate, k * kBf16Rtol, k * kBf16Atol);
  EXPECT_ALL_CLOSE(dup_f32_grad, dup, kRtol, kAtol);
  EXPECT_ALL_CLOSE(dgate_f32, dgate, kRtol, kAtol);
  EXPECT_ALL_CLOSE(dup_f32, dup, kRtol, kAtol);
}

TEST(SwiGlu, Bf16MatchesF32Path) { expect_swiglu_half_matches_f32_path<bf16>(1.0); }
TEST(SwiGlu, F16MatchesF32Path) { expect_swiglu_half_matches_f32_path<f16>(kF16Tighter); }

TEST(SwiGlu, MisuseThrowsNamingOpAndShapes) {
  std::vector<float> a(12), b(12), c(12), d(12), e(12);
  std::vector<bf16> h(12);
  const Shape s{3, 4};
  const char* fwd = "swiglu_forward";
  const char* bwd = "swiglu_backward";
  expect_error([&] { swiglu_forward(f32_view(a, s), f32_view(b, s), f32_view(c, {4, 3})); }, {fwd, "(4, 3)"});
  expect_error([&] { swiglu_forward(f32_view(a, s), f32_view(b, s), bf16_view(h, s)); }, {fwd, "bf16(3, 4)"});
  expect_error([&] { swiglu_forward(f32_view(a, {2, 6}), f32_view(b, s), f32_view(c, s)); }, {fwd, "f32(2, 6)"});
  const Tensor dgate = f32_view(a, s), gate = f32_view(d, s), up = f32_view(e, s);
  expect_error([&] { swiglu_backward(dgate, f32_view(b, {12}), f32_view(c, s), gate, up); }, {bwd, "f32(12,)"});
  expect_error([&] { swiglu_backward(dgate, f32_view(b, s), f32_view(c, {4, 3}), gate, up); }, {bwd, "(4, 3)"});
  expect_error([&] { swiglu_backward(Tensor(), Tensor(), bf16_view(h, s), gate, up); }, {bwd, "bf16(3, 4)"});
  expect_error([&] { swiglu_backward(dgate, dgate, f32_view(c, s), gate, up); }, {bwd, "dgate must not overlap dup"});
  expect_error([&] { swiglu_backward(Tensor(), up, f32_view(c, s), gate, up); }, {bwd, "dup must not overlap up"});
  std::vector<float> big(13);
  expect_error([&] { swiglu_forward(Tensor(big.data() + 1, DType::f32, s), f32_view(big, s), up); },
               {"swiglu_forward", "overlaps gate"});
}

}  // namespace
}  // namespace loom
