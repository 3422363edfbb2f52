// cross_entropy_forward_backward against PyTorch (tests/ref/ref_cross_entropy.py).
//
// Tolerances:
// - f32 vs torch float64: loss and per-row losses rel 1e-5 (atol 1e-6);
//   dlogits rel 1e-5 with atol 1e-12 (softmax entries below e^-87 are
//   flushed to 0 by design; torch's are < 1e-38 there).
// - bf16 logits vs the f32 path on the same bf16-rounded logits: the loss is
//   the same arithmetic (rel 1e-6); bf16 dlogits carry one RNE rounding,
//   at most 2^-9 relative: rel 4e-3.
// - f16 logits likewise: loss rel 1e-6; f16 dlogits rel 1e-3 (4x tighter:
//   one f16 rounding is at most 2^-12 relative), atol 3e-8 for the f16
//   subnormals (spacing 2^-24) that small probabilities become.
// - finite differences: f32 central differences with h = 1e-2 on a (3, 7)
//   problem; truncation error ~h^2 |f'''| / 6 < 1e-5 and rounding error
//   ~eps |loss| / h ~ 3e-5, against gradients of order 1e-2..1e-1: rel 1e-2,
//   atol 2e-4.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/threads.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom {
namespace {

using namespace loom::test;
using namespace loom::kernels;

const char* const kCases[] = {"gpt2", "v100", "n1", "rescale"};

TEST(CrossEntropy, ForwardBackwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    std::vector<float> logits = rc["logits"].floats();
    const Shape shape = rc["logits"].shape;
    // Prefilled with garbage: dlogits and losses are written, not accumulated.
    std::vector<float> dlogits(logits.size(), 7.f), losses(shape[0], 7.f);
    const float loss = cross_entropy_forward_backward(f32_view(dlogits, shape), f32_view(losses, {shape[0]}),
                                                      f32_view(logits, shape), rc["targets"].view(), -100,
                                                      rc["dloss"].scalar());
    EXPECT_NEAR(loss, rc["loss"].scalar(), 1e-5 * std::abs(rc["loss"].scalar()));
    EXPECT_ALL_CLOSE(losses, rc["losses"].floats(), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(dlogits, rc["dlogits"].floats(), 1e-5, 1e-12);
    EXPECT_EQ(logits, rc["logits"].floats()) << "logits must be left untouched when dlogits is separate";
  }
}

TEST(CrossEntropy, InPlaceMatchesSeparateBitwise) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    const Shape shape = rc["logits"].shape;
    std::vector<float> logits = rc["logits"].floats(), separate(logits.size());
    const float dloss = rc["dloss"].scalar();
    const float loss_sep = cross_entropy_forward_backward(f32_view(separate, shape), Tensor(),
                                                          f32_view(logits, shape), rc["targets"].view(), -100, dloss);
    const float loss_in = cross_entropy_forward_backward(f32_view(logits, shape), Tensor(), f32_view(logits, shape),
                                                         rc["targets"].view(), -100, dloss);
    EXPECT_EQ(loss_in, loss_sep);
    EXPECT_EQ(logits, separate);
    EXPECT_ALL_CLOSE(logits, rc["dlogits"].floats(), 1e-5, 1e-12);
  }
}

TEST(CrossEntropy, LossOnlyMatchesTorchAndLeavesLogitsUntouched) {
  RefCase rc("cross_entropy_gpt2.ref");
  std::vector<float> logits = rc["logits"].floats();
  const float loss = cross_entropy_forward_backward(Tensor(), Tensor(), f32_view(logits, rc["logits"].shape),
                                                    rc["targets"].view());
  EXPECT_NEAR(loss, rc["loss"].scalar(), 1e-5 * std::abs(rc["loss"].scalar()));
  EXPECT_EQ(logits, rc["logits"].floats());
}

// H (bf16 or f16) logits against the f32 path on the same H-rounded logits:
// H dlogits to rtol / atol, f32 dlogits of H logits to 1e-6, H in place
// bitwise equal to H separate (the model's use: dlogits overwrite logits).
template <typename H>
void expect_half_matches_f32_path(double rtol, double atol) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    const Shape shape = rc["logits"].shape;
    const float dloss = rc["dloss"].scalar();
    Tensor targets = rc["targets"].view();
    std::vector<H> x16 = to_half_vec<H>(rc["logits"].floats());
    std::vector<float> x32 = from_half_vec(x16), d32(x32.size()), l32(shape[0]);
    const float loss32 =
        cross_entropy_forward_backward(f32_view(d32, shape), f32_view(l32, {shape[0]}), f32_view(x32, shape), targets,
                                       -100, dloss);
    // H logits, H dlogits (separate)
    std::vector<H> d16(x16.size());
    std::vector<float> l16(shape[0]);
    const float loss16 = cross_entropy_forward_backward(half_view(d16, shape), f32_view(l16, {shape[0]}),
                                                        half_view(x16, shape), targets, -100, dloss);
    EXPECT_NEAR(loss16, loss32, 1e-6 * std::abs(loss32));
    EXPECT_ALL_CLOSE(l16, l32, 1e-6, 0);
    EXPECT_ALL_CLOSE(from_half_vec(d16), d32, rtol, atol);
    // H logits, f32 dlogits: no rounding of the result at all.
    std::vector<float> d16_32(x16.size());
    cross_entropy_forward_backward(f32_view(d16_32, shape), Tensor(), half_view(x16, shape), targets, -100, dloss);
    EXPECT_ALL_CLOSE(d16_32, d32, 1e-6, 1e-15);
    // H in place equals H separate.
    const float loss_in = cross_entropy_forward_backward(half_view(x16, shape), Tensor(), half_view(x16, shape),
                                                         targets, -100, dloss);
    EXPECT_EQ(loss_in, loss16);
    EXPECT_EQ(0, std::memcmp(x16.data(), d16.data(), d16.size() * sizeof(H)));
  }
}

TEST(CrossEntropy, Bf16MatchesF32PathOnRoundedLogits) { expect_half_matches_f32_path<bf16>(4e-3, 1e-12); }
// f16 dlogits below 2^-14 are subnormal, spaced 2^-24 apart: their rounding
// error is up to 2^-25 ~ 3e-8 absolute (dlogits of the V = 50257 case are
// ~1e-6, so this is real, and why fp16 training scales its loss).
TEST(CrossEntropy, F16MatchesF32PathOnRoundedLogits) { expect_half_matches_f32_path<f16>(1e-3, 3e-8); }

TEST(CrossEntropy, IgnoredRowsHaveZeroLossAndGradientAndLeaveTheMean) {
  // Rows 0 and 2 ignored with a custom ignore_index: the loss is the mean of rows 1 and 3.
  const int64_t N = 4, V = 10;
  std::vector<float> logits(N * V);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7f * static_cast<float>(i));
  std::vector<int32_t> targets = {-1, 3, -1, 9};
  std::vector<float> dlogits(N * V, 5.f), losses(N, 5.f);
  const float loss = cross_entropy_forward_backward(f32_view(dlogits, {N, V}), f32_view(losses, {N}),
                                                    f32_view(logits, {N, V}), i32_view(targets, {N}), -1);
  EXPECT_EQ(losses[0], 0.f);
  EXPECT_EQ(losses[2], 0.f);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dlogits[0 * V + j], 0.f) << j;
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dlogits[2 * V + j], 0.f) << j;
  EXPECT_NEAR(loss, (losses[1] + losses[3]) / 2, 1e-6);
  // Valid rows are scaled by 1 / n_valid = 1/2: each row of dlogits sums to 0, the target entry is (p - 1) / 2.
  double row_sum = 0;
  for (int64_t j = 0; j < V; ++j) row_sum += dlogits[1 * V + j];
  EXPECT_NEAR(row_sum, 0.0, 1e-6);
  EXPECT_NEAR(dlogits[1 * V + 3], (std::exp(-losses[1]) - 1.f) / 2.f, 1e-6);
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndZeroGradient) {
  const int64_t N = 3, V = 100;
  std::vector<float> logits(N * V, 1.5f), dlogits(N * V, 5.f), losses(N, 5.f);
  std::vector<int32_t> targets(N, -100);
  const float loss = cross_entropy_forward_backward(f32_view(dlogits, {N, V}), f32_view(losses, {N}),
                                                    f32_view(logits, {N, V}), i32_view(targets, {N}));
  EXPECT_EQ(loss, 0.f);
  EXPECT_EQ(losses, std::vector<float>(N, 0.f));
  EXPECT_EQ(dlogits, std::vector<float>(N * V, 0.f));
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t N = 3, V = 7;
  std::vector<float> logits(N * V);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 1.5f * std::cos(1.3f * static_cast<float>(i) + 0.2f);
  std::vector<int32_t> targets = {2, -100, 6};
  const float dloss = 1.7f;
  std::vector<float> dlogits(N * V);
  cross_entropy_forward_backward(f32_view(dlogits, {N, V}), Tensor(), f32_view(logits, {N, V}),
                                 i32_view(targets, {N}), -100, dloss);
  auto loss = [&] {
    return dloss * static_cast<double>(cross_entropy_forward_backward(Tensor(), Tensor(), f32_view(logits, {N, V}),
                                                                      i32_view(targets, {N})));
  };
  const std::vector<float> fd = test::finite_difference(loss, logits, 1e-2f);
  EXPECT_ALL_CLOSE(dlogits, fd, 1e-2, 2e-4);
}

TEST(CrossEntropy, ResultDoesNotDependOnThreadCount) {
  RefCase rc("cross_entropy_gpt2.ref");
  const Shape shape = rc["logits"].shape;
  std::vector<float> logits = rc["logits"].floats();
  std::vector<float> d1(logits.size()), d2(logits.size()), l1(shape[0]), l2(shape[0]);
  const int saved = num_threads();
  set_num_threads(1);
  const float loss1 = cross_entropy_forward_backward(f32_view(d1, shape), f32_view(l1, {shape[0]}),
                                                     f32_view(logits, shape), rc["targets"].view());
  set_num_threads(3);
  const float loss2 = cross_entropy_forward_backward(f32_view(d2, shape), f32_view(l2, {shape[0]}),
                                                     f32_view(logits, shape), rc["targets"].view());
  set_num_threads(saved);
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(d1, d2);
}

TEST(CrossEntropy, NanLogitGivesNanLossForThatRow) {
  const int64_t N = 2, V = 3000;
  std::vector<float> logits(N * V, 0.25f), losses(N);
  logits[V + 2500] = NAN;
  std::vector<int32_t> targets = {1, 2};
  const float loss = cross_entropy_forward_backward(Tensor(), f32_view(losses, {N}), f32_view(logits, {N, V}),
                                                    i32_view(targets, {N}));
  EXPECT_NEAR(losses[0], std::log(static_cast<float>(V)), 1e-5);
  EXPECT_TRUE(std::isnan(losses[1]));
  EXPECT_TRUE(std::isnan(loss));
}

// ---- misuse -------------------------------------------------------------------

TEST(CrossEntropy, TargetOutOfRangeThrowsNamingRowAndValueAndWritesNothing) {
  const int64_t N = 3, V = 100;
  std::vector<float> logits(N * V, 0.5f), losses(N, 9.f);
  for (int32_t bad : {100, -1, 1 << 30}) {
    std::vector<int32_t> targets = {4, -100, bad};
    expect_error(
        [&] {
          cross_entropy_forward_backward(f32_view(logits, {N, V}), f32_view(losses, {N}), f32_view(logits, {N, V}),
                                         i32_view(targets, {N}));
        },
        {"cross_entropy_forward_backward", "target " + std::to_string(bad) + " at row 2", "[0, 100)"});
  }
  EXPECT_EQ(logits, std::vector<float>(N * V, 0.5f)) << "in place, a bad target must leave logits intact";
  EXPECT_EQ(losses, std::vector<float>(N, 9.f));
}

TEST(CrossEntropy, MisuseThrowsNamingTheOpAndShapes) {
  const int64_t N = 4, V = 10;
  std::vector<float> logits(N * V), dl(N * V), losses(N), wide(N * V * 2);
  std::vector<int32_t> targets(N, 1), targets3(3, 1);
  std::vector<bf16> dl16(N * V);  // bf16 scratch for wrong-dtype operands
  const Tensor x = f32_view(logits, {N, V}), tgt = i32_view(targets, {N});
  const char* op = "cross_entropy_forward_backward";
  expect_error([&] { cross_entropy_forward_backward(Tensor(), Tensor(), x, i32_view(targets3, {3})); },
               {op, "i32(3,)"});
  expect_error([&] { cross_entropy_forward_backward(Tensor(), Tensor(), x, f32_view(losses, {N})); },
               {op, "expected i32"});
  expect_error([&] { cross_entropy_forward_backward(Tensor(), Tensor(), tgt, tgt); }, {op, "logits has dtype i32"});
  expect_error([&] { cross_entropy_forward_backward(f32_view(dl, {V, N}), Tensor(), x, tgt); }, {op, "f32(10, 4)"});
  expect_error([&] { cross_entropy_forward_backward(Tensor(), f32_view(losses, {N - 1}), x, tgt); }, {op, "f32(3,)"});
  expect_error([&] { cross_entropy_forward_backward(Tensor(), bf16_view(dl16, {N}), x, tgt); },
               {op, "losses has dtype bf16"});
  // A bf16 gradient of f32 logits is refused (f32 or the logits' dtype), in place or not.
  expect_error([&] { cross_entropy_forward_backward(Tensor(logits.data(), DType::bf16, {N, V}), Tensor(), x, tgt); },
               {op, "dlogits has dtype bf16, expected f32"});
  expect_error([&] { cross_entropy_forward_backward(bf16_view(dl16, {N, V}), Tensor(), x, tgt); },
               {op, "dlogits has dtype bf16, expected f32"});
  // losses must not share memory with dlogits.
  expect_error([&] { cross_entropy_forward_backward(f32_view(dl, {N, V}), f32_view(dl, {N}), x, tgt); },
               {op, "losses must not overlap dlogits"});
  expect_error(
      [&] {
        cross_entropy_forward_backward(f32_view(wide, {N, V}).reshape({N, V}), Tensor(),
                                       Tensor(wide.data() + 1, DType::f32, {N, V}), tgt);
      },
      {op, "overlaps"});
  const Tensor flat = f32_view(logits, {N * V});
  expect_error([&] { cross_entropy_forward_backward(Tensor(), Tensor(), flat, i32_view(targets, {1})); },
               {op, "at least 2 dims"});
}

}  // namespace
}  // namespace loom
