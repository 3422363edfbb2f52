// Rotary position embedding against Hugging Face's rotate_half formula in
// float64 (tests/ref/ref_rope.py), finite differences, the bf16 and f16 paths and misuse.
//
// Tolerances:
// - f32 vs the float64 reference: rel 1e-5, abs 1e-6, at every position
//   including 8191 .. 1000000. The kernel forms and reduces angles in double,
//   so cos/sin carry only f32 rounding (~6e-8); the abs term covers outputs
//   near zero, which are differences of O(|x|) products. (An f32 angle, as in
//   HF's float32 path, would be off by up to ~5e-4 rad at pos 8192 and fail.)
// - bf16 vs the f32 path on the same bf16-rounded inputs: rel 2^-8 (one bf16
//   ulp), abs 1e-6: the math is f32 on both paths, only the store rounds.
// - f16 likewise: rel 2^-10, abs 2.5e-7 (the bf16 ones times 1/4; f16
//   rounds to 2^-12 relative, 8x finer).
// - finite differences: rope is linear in x, so central differences with
//   h = 1e-2 are exact up to f32 rounding of the loss (~1e-6 / 2h): rel 1e-2,
//   abs 1e-3.
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
const char* const kCases[] = {"basic",     "batch_pos",          "t1",       "hs2",
                              "large_pos", "large_pos_theta5e5", "threaded", "threaded_batch_pos"};

// One reference case, with its inputs as mutable buffers.
struct Case {
  RefCase rc;
  Shape shape, pos_shape;
  std::vector<float> x, dy;
  std::vector<int32_t> pos;
  float theta;

  explicit Case(const std::string& name)
      : rc("rope_" + name + ".ref"), shape(rc["x"].shape), pos_shape(rc["pos"].shape), x(rc["x"].floats()),
        dy(rc["dy"].floats()), theta(rc["theta"].scalar()) {
    const std::vector<float> p = rc["pos"].floats();
    pos.assign(p.begin(), p.end());
  }
  Tensor pos_t() { return i32_view(pos, pos_shape); }
};

TEST(Rope, ForwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    Case c(name);
    std::vector<float> y(c.x.size(), NAN);
    rope_forward(f32_view(y, c.shape), f32_view(c.x, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(y, c.rc["y"].floats(), kRtol, kAtol);
  }
}

// Positions 8191 .. 1000000 (angles up to 1e6 rad) at f32 accuracy.
TEST(Rope, LargePositionsMatchFloat64Reference) {
  for (const char* name : {"large_pos", "large_pos_theta5e5", "batch_pos"}) {
    SCOPED_TRACE(name);
    Case c(name);
    std::vector<float> y(c.x.size(), NAN), dx(c.x.size(), 0.f);
    rope_forward(f32_view(y, c.shape), f32_view(c.x, c.shape), c.pos_t(), c.theta);
    rope_backward(f32_view(dx, c.shape), f32_view(c.dy, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(y, c.rc["y"].floats(), kRtol, kAtol);
    EXPECT_ALL_CLOSE(dx, c.rc["dx"].floats(), kRtol, kAtol);
  }
}

TEST(Rope, ForwardRunsInPlace) {
  for (const char* name : {"threaded", "threaded_batch_pos", "hs2"}) {
    SCOPED_TRACE(name);
    Case c(name);
    rope_forward(f32_view(c.x, c.shape), f32_view(c.x, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(c.x, c.rc["y"].floats(), kRtol, kAtol);
  }
}

TEST(Rope, BackwardAccumulatesTorchGradF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    Case c(name);
    std::vector<float> dx = prefill(c.x.size());
    const std::vector<float> expected = plus(dx, c.rc["dx"].floats());
    rope_backward(f32_view(dx, c.shape), f32_view(c.dy, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(dx, expected, kRtol, kAtol);
    rope_backward(Tensor(), f32_view(c.dy, c.shape), c.pos_t(), c.theta);  // an undefined gradient is skipped
  }
}

// R is a rotation: backward of forward's output gives the input back.
TEST(Rope, BackwardUndoesForward) {
  Case c("batch_pos");
  std::vector<float> y(c.x.size()), back(c.x.size(), 0.f);
  rope_forward(f32_view(y, c.shape), f32_view(c.x, c.shape), c.pos_t(), c.theta);
  rope_backward(f32_view(back, c.shape), f32_view(y, c.shape), c.pos_t(), c.theta);
  EXPECT_ALL_CLOSE(back, c.x, kRtol, kAtol);
}

// pos (B, T) with every row equal to a (T) pos gives the (T) result.
TEST(Rope, BatchPositionsMatchSharedPositions) {
  Case c("threaded");
  const int64_t B = c.shape[0], T = c.shape[1];
  std::vector<int32_t> pos_bt;
  for (int64_t b = 0; b < B; ++b) pos_bt.insert(pos_bt.end(), c.pos.begin(), c.pos.end());
  std::vector<float> y(c.x.size()), dx = prefill(c.x.size());
  rope_forward(f32_view(y, c.shape), f32_view(c.x, c.shape), i32_view(pos_bt, {B, T}), c.theta);
  EXPECT_ALL_CLOSE(y, c.rc["y"].floats(), kRtol, kAtol);
  const std::vector<float> expected = plus(dx, c.rc["dx"].floats());
  rope_backward(f32_view(dx, c.shape), f32_view(c.dy, c.shape), i32_view(pos_bt, {B, T}), c.theta);
  EXPECT_ALL_CLOSE(dx, expected, kRtol, kAtol);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 2, 3, 4};  // B = 2, T = 2, NH = 3, HS = 4
  std::vector<float> x(s.numel()), w(s.numel()), y(s.numel()), dx(s.numel(), 0.f);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
    w[i] = std::cos(1.3f * static_cast<float>(i));
  }
  std::vector<int32_t> pos = {3, 17, 250, 4001};  // (B, T)
  auto loss = [&] {
    rope_forward(f32_view(y, s), f32_view(x, s), i32_view(pos, {2, 2}), 10000.f);
    return test::weighted_sum(y, w);
  };
  const std::vector<float> fd = test::finite_difference(loss, x, 1e-2f);
  rope_backward(f32_view(dx, s), f32_view(w, s), i32_view(pos, {2, 2}), 10000.f);
  EXPECT_ALL_CLOSE(dx, fd, 1e-2, 1e-3);
}

// H (bf16 or f16) x, y, dy, dx (and an f32 dx of an H dy) against the f32
// path fed the same H-rounded values; k scales the bf16 tolerances.
template <typename H>
void expect_half_matches_f32(double k) {
  for (const char* name : {"basic", "threaded_batch_pos"}) {
    SCOPED_TRACE(name);
    Case c(name);
    std::vector<H> xb = to_half_vec<H>(c.x), dyb = to_half_vec<H>(c.dy), yb(c.x.size());
    std::vector<float> x = from_half_vec(xb), dy = from_half_vec(dyb), y(c.x.size());
    std::vector<float> dx = rounded_to_half<H>(prefill(c.x.size()));
    std::vector<H> dxb = to_half_vec<H>(dx);
    std::vector<float> dx_f32_grad = dx;
    rope_forward(f32_view(y, c.shape), f32_view(x, c.shape), c.pos_t(), c.theta);
    rope_backward(f32_view(dx, c.shape), f32_view(dy, c.shape), c.pos_t(), c.theta);
    rope_forward(half_view(yb, c.shape), half_view(xb, c.shape), c.pos_t(), c.theta);
    rope_backward(half_view(dxb, c.shape), half_view(dyb, c.shape), c.pos_t(), c.theta);
    rope_backward(f32_view(dx_f32_grad, c.shape), half_view(dyb, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(from_half_vec(yb), y, k * kBf16Rtol, k * kBf16Atol);
    EXPECT_ALL_CLOSE(from_half_vec(dxb), dx, k * kBf16Rtol, k * kBf16Atol);
    EXPECT_ALL_CLOSE(dx_f32_grad, dx, kRtol, kAtol);
    // In place.
    rope_forward(half_view(xb, c.shape), half_view(xb, c.shape), c.pos_t(), c.theta);
    EXPECT_ALL_CLOSE(from_half_vec(xb), from_half_vec(yb), 0, 0);
  }
}

TEST(Rope, Bf16MatchesF32Path) { expect_half_matches_f32<bf16>(1.0); }
TEST(Rope, F16MatchesF32Path) { expect_half_matches_f32<f16>(kF16Tighter); }

TEST(Rope, MisuseThrowsNamingOpAndShapes) {
  std::vector<float> a(2 * 3 * 2 * 6), b(a.size());
  std::vector<int32_t> p(8, 1);
  std::vector<int64_t> p64(3, 1);
  std::vector<bf16> h(a.size());
  const char* fwd = "rope_forward";
  const char* bwd = "rope_backward";
  const Shape s{2, 3, 2, 6};
  // Valid operands: out (y or dx) and in (x or dy) (B, T, NH, HS), pos (T).
  const Tensor out = f32_view(a, s), in = f32_view(b, s), pos = i32_view(p, {3});
  expect_error([&] { rope_forward(f32_view(a, {2, 3, 3, 4}), f32_view(b, {2, 3, 4, 3}), pos, 1e4f); },
               {fwd, "x=f32(2, 3, 4, 3)"});  // odd HS
  expect_error([&] { rope_forward(out, in, i32_view(p, {4}), 1e4f); }, {fwd, "pos=i32(4,)"});
  expect_error([&] { rope_forward(out, in, i32_view(p, {3, 2}), 1e4f); }, {fwd, "pos=i32(3, 2)"});
  expect_error([&] { rope_forward(out, in, i32_view(p, {2, 3, 1}), 1e4f); }, {fwd, "(2, 3)"});
  expect_error([&] { rope_forward(out, in, Tensor(p64.data(), DType::i64, {3}), 1e4f); }, {fwd, "pos=i64(3,)"});
  expect_error([&] { rope_forward(out, in, f32_view(b, {3}), 1e4f); }, {fwd, "pos=f32(3,)"});
  expect_error([&] { rope_forward(f32_view(a, {2, 3, 12}), f32_view(b, {2, 3, 12}), pos, 1e4f); },
               {fwd, "x=f32(2, 3, 12)"});
  expect_error([&] { rope_forward(f32_view(a, {2, 3, 6, 2}), in, pos, 1e4f); }, {fwd, "y=f32(2, 3, 6, 2)"});
  expect_error([&] { rope_forward(bf16_view(h, s), in, pos, 1e4f); }, {fwd, "y=bf16(2, 3, 2, 6)"});
  expect_error([&] { rope_forward(out, in, pos, 0.f); }, {fwd, "theta"});
  // y partly overlapping x (here shifted by one head) would read rotated
  // values; only exact in-place use (y == x) is allowed.
  std::vector<float> wide(a.size() + 6);
  expect_error([&] { rope_forward(f32_view(wide, s), Tensor(wide.data() + 6, DType::f32, s), pos, 1e4f); },
               {fwd, "y", "overlaps", "x"});
  expect_error([&] { rope_forward(Tensor(wide.data() + 6, DType::f32, s), f32_view(wide, s), pos, 1e4f); },
               {fwd, "y", "overlaps", "x"});
  EXPECT_NO_THROW(rope_forward(f32_view(a, s), f32_view(a, s), pos, 1e4f));  // in place
  expect_error([&] { rope_backward(f32_view(a, {2, 3, 6, 2}), in, pos, 1e4f); }, {bwd, "dx=f32(2, 3, 6, 2)"});
  expect_error([&] { rope_backward(out, in, i32_view(p, {2, 2}), 1e4f); }, {bwd, "pos=i32(2, 2)"});
  expect_error([&] { rope_backward(Tensor(), in, i32_view(p, {5}), 1e4f); }, {bwd, "pos=i32(5,)"});
}

}  // namespace
}  // namespace loom
