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
#include <algorithm>
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

// ---- vocab-parallel shards ----------------------------------------------------
//
// The full (N, V) logits of a reference case are padded to a multiple of tp
// columns and split over tp simulated ranks; the ranks' stats are combined as
// the tp all-reduces will (lse by log-sum-exp, target logits by sum), and each
// rank's backward gets the combined lse. Tolerances: as above for f32 against
// torch; the shard's lse is stored in f32 (rel error <= 2^-24 |lse| ~ 1e-6
// for these rows), well inside rel 1e-5 on the softmax.

const char* const kShardCases[] = {"gpt2", "shard_v4099", "shard_v5", "shard_low"};

// Padded columns hold this: were they not masked, they would dominate every
// row's softmax (logits here are below ~15).
constexpr float kPadGarbage = 30.f;

// Columns of rank r of tp over a vocabulary of V padded to a multiple of tp.
struct ShardColumns {
  int64_t V_local, begin, valid;
};
ShardColumns shard_columns(int64_t V, int tp, int r) {
  const int64_t V_local = (V + tp - 1) / tp;
  const int64_t begin = r * V_local;
  return {V_local, begin, std::clamp<int64_t>(V - begin, 0, V_local)};
}

struct ShardRun {
  DType act = DType::f32;   // dtype of the shards' logits
  DType grad = DType::f32;  // dtype of their dlogits (ignored in place)
  bool in_place = false;
};

struct ShardedCe {
  double loss = 0;
  Floats dlogits;               // (N, V): the shards' valid columns side by side
  int64_t nonzero_padding = 0;  // padded dlogits that are not exactly 0
  std::vector<Floats> lse, target_logit;  // per rank, (N)
};

// Rank r's logits: its columns of `full` (N, V), padding set to kPadGarbage.
Floats shard_logits(const Floats& full, int64_t N, int64_t V, const ShardColumns& s) {
  Floats x(N * s.V_local, kPadGarbage);
  for (int64_t n = 0; n < N; ++n)
    std::copy_n(full.begin() + n * V + s.begin, s.valid, x.begin() + n * s.V_local);
  return x;
}

// Stats on each of tp ranks, packed as the tp all-gather leaves them and
// combined by cross_entropy_shard_combine; the mean loss and the count of
// non-ignored rows by their kernels; backward with scale = dloss / n_valid on
// each rank.
ShardedCe run_sharded_ce(const Floats& logits, const Shape& shape, std::vector<int32_t> targets, float dloss, int tp,
                         const ShardRun& run) {
  const int64_t N = shape[0], V = shape[1];
  const Tensor tgt = i32_view(targets, {N});
  ShardedCe out;
  std::vector<Buffer> x;
  Floats gathered(static_cast<size_t>(tp * 2 * N), 9.f);  // (tp, 2, N): each rank's lse, then its target logits
  const Tensor stats = f32_view(gathered, {tp, 2, N});
  for (int r = 0; r < tp; ++r) {
    const ShardColumns s = shard_columns(V, tp, r);
    x.emplace_back(run.act, Shape{N, s.V_local}, shard_logits(logits, N, V, s));
    out.lse.emplace_back(N, 5.f), out.target_logit.emplace_back(N, 5.f);  // written, not accumulated
    const Tensor lse_r = f32_view(out.lse[r], {N}), target_r = f32_view(out.target_logit[r], {N});
    cross_entropy_shard_stats(lse_r, target_r, x[r].view(), tgt, s.begin, s.valid);
    copy(stats.slice(0, r, 1).slice(1, 0, 1).reshape({N}), lse_r);
    copy(stats.slice(0, r, 1).slice(1, 1, 1).reshape({N}), target_r);
  }
  Floats lse(N, 5.f), target(N, 5.f);
  cross_entropy_shard_combine(f32_view(lse, {N}), f32_view(target, {N}), stats);
  out.loss = cross_entropy_shard_loss(f32_view(lse, {N}), f32_view(target, {N}), tgt);
  const int64_t n_valid = cross_entropy_count_valid(tgt);
  const float scale = n_valid ? static_cast<float>(static_cast<double>(dloss) / static_cast<double>(n_valid)) : 0.f;
  out.dlogits.assign(N * V, NAN);
  for (int r = 0; r < tp; ++r) {
    const ShardColumns s = shard_columns(V, tp, r);
    Buffer d(run.grad, Shape{N, s.V_local}, Floats(N * s.V_local, 7.f));
    const Tensor dv = run.in_place ? x[r].view() : d.view();
    cross_entropy_shard_backward(dv, x[r].view(), f32_view(lse, {N}), tgt, s.begin, s.valid, scale);
    const Floats df = to_floats(dv);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < s.V_local; ++j) {
        const float v = df[n * s.V_local + j];
        if (j < s.valid) out.dlogits[n * V + s.begin + j] = v;
        else out.nonzero_padding += v != 0.f;
      }
    }
  }
  return out;
}

std::vector<int32_t> targets_of(RefCase& rc) {
  const Tensor t = rc["targets"].view();
  return {t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel()};
}

TEST(CrossEntropyShard, ShardsCombineToTorchLossAndGradientWithPaddingMaskedF32) {
  for (const char* name : kShardCases) {
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    const Floats logits = rc["logits"].floats();
    for (int tp : {2, 3, 4}) {
      SCOPED_TRACE(std::string(name) + " tp=" + std::to_string(tp));
      const ShardedCe got = run_sharded_ce(logits, rc["logits"].shape, targets_of(rc), rc["dloss"].scalar(), tp, {});
      EXPECT_NEAR(got.loss, rc["loss"].scalar(), 1e-5 * std::abs(rc["loss"].scalar()));
      EXPECT_ALL_CLOSE(got.dlogits, rc["dlogits"].floats(), 1e-5, 1e-12);
      EXPECT_EQ(got.nonzero_padding, 0) << "padded columns' dlogits must be exactly 0";
    }
  }
}

TEST(CrossEntropyShard, InPlaceMatchesSeparateBitwise) {
  for (const char* name : kShardCases) {
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    const Floats logits = rc["logits"].floats();
    for (DType act : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(act)));
      const ShardedCe sep =
          run_sharded_ce(logits, rc["logits"].shape, targets_of(rc), 1.f, 3, {act, act, /*in_place=*/false});
      const ShardedCe in =
          run_sharded_ce(logits, rc["logits"].shape, targets_of(rc), 1.f, 3, {act, act, /*in_place=*/true});
      EXPECT_EQ(0, std::memcmp(sep.dlogits.data(), in.dlogits.data(), sep.dlogits.size() * sizeof(float)));
      EXPECT_EQ(in.nonzero_padding, 0);
    }
  }
}

// H (bf16 or f16) logits: the shards against cross_entropy_forward_backward
// on the same H logits. f32 dlogits differ only by the f32 rounding of lse
// (rel 1e-5, as against torch); H dlogits are each rounded once from values
// that close, so they may differ by one H ulp (2^-7 relative for bf16, 2^-10
// for f16; atol 6e-8 = one f16 subnormal step). The loss: rel 1e-6 (the
// shards' lse in f32 against the full kernel's double, |lse| < 20).
template <typename H>
void expect_shards_match_full_kernel(double rtol_h, double atol_h) {
  constexpr DType h = dtype_of<H>::value;
  for (const char* name : kShardCases) {
    RefCase rc(std::string("cross_entropy_") + name + ".ref");
    const Shape shape = rc["logits"].shape;
    std::vector<H> x16 = to_half_vec<H>(rc["logits"].floats());
    const Floats rounded = from_half_vec(x16);
    std::vector<int32_t> targets = targets_of(rc);
    std::vector<H> d16(x16.size());
    Floats d32(x16.size());
    const float loss = cross_entropy_forward_backward(half_view(d16, shape), Tensor(), half_view(x16, shape),
                                                      i32_view(targets, {shape[0]}));
    cross_entropy_forward_backward(f32_view(d32, shape), Tensor(), half_view(x16, shape),
                                   i32_view(targets, {shape[0]}));
    for (int tp : {2, 3, 4}) {
      SCOPED_TRACE(std::string(name) + " tp=" + std::to_string(tp));
      const ShardedCe f32_grads = run_sharded_ce(rounded, shape, targets, 1.f, tp, {h, DType::f32, false});
      EXPECT_NEAR(f32_grads.loss, loss, 1e-6 * std::abs(loss));
      EXPECT_ALL_CLOSE(f32_grads.dlogits, d32, 1e-5, 1e-12);
      EXPECT_EQ(f32_grads.nonzero_padding, 0);
      const ShardedCe h_grads = run_sharded_ce(rounded, shape, targets, 1.f, tp, {h, h, false});
      EXPECT_ALL_CLOSE(h_grads.dlogits, from_half_vec(d16), rtol_h, atol_h);
      EXPECT_EQ(h_grads.nonzero_padding, 0);
    }
  }
}

TEST(CrossEntropyShard, Bf16LogitsMatchFullKernelOnSameLogits) { expect_shards_match_full_kernel<bf16>(8e-3, 1e-12); }
TEST(CrossEntropyShard, F16LogitsMatchFullKernelOnSameLogits) { expect_shards_match_full_kernel<f16>(1e-3, 6e-8); }

// V = 5 over tp = 4: columns padded to 8, the last rank's two are both padding.
TEST(CrossEntropyShard, AllPaddingShardHasMinusInfLseZeroTargetAndZeroGradient) {
  RefCase rc("cross_entropy_shard_v5.ref");
  const Shape shape = rc["logits"].shape;
  const int64_t N = shape[0];
  const ShardColumns s = shard_columns(shape[1], 4, 3);
  ASSERT_EQ(s.valid, 0);
  std::vector<int32_t> targets = targets_of(rc);
  Floats x = shard_logits(rc["logits"].floats(), N, shape[1], s), lse(N, 5.f), tl(N, 5.f), d(x.size(), 7.f);
  const Shape local{N, s.V_local};
  cross_entropy_shard_stats(f32_view(lse, {N}), f32_view(tl, {N}), f32_view(x, local), i32_view(targets, {N}),
                            s.begin, s.valid);
  EXPECT_EQ(lse, Floats(N, -INFINITY));
  EXPECT_EQ(tl, Floats(N, 0.f));
  Floats full_lse(N, 3.f);  // any finite lse: the columns are all masked
  cross_entropy_shard_backward(f32_view(d, local), f32_view(x, local), f32_view(full_lse, {N}),
                               i32_view(targets, {N}), s.begin, s.valid, 0.25f);
  EXPECT_EQ(d, Floats(x.size(), 0.f));
}

// shard_low's targets are all below 200 of 1003: over tp = 4 (251 columns
// each) ranks 1..3 hold none.
TEST(CrossEntropyShard, ShardWithoutTargetsHasZeroTargetLogitsAndNoOneHot) {
  RefCase rc("cross_entropy_shard_low.ref");
  const Shape shape = rc["logits"].shape;
  const int64_t N = shape[0], V = shape[1];
  const Floats logits = rc["logits"].floats();
  std::vector<int32_t> targets = targets_of(rc);
  const ShardedCe got = run_sharded_ce(logits, shape, targets, 1.f, 4, {});
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(r);
    for (int64_t n = 0; n < N; ++n) {
      const bool ignored = targets[n] == -100;
      EXPECT_EQ(got.lse[r][n] == -INFINITY, ignored) << "row " << n;
      // The rank holding the target gives its logit exactly; the others 0.
      const float expected = !ignored && r == 0 ? logits[n * V + targets[n]] : 0.f;
      EXPECT_EQ(got.target_logit[r][n], expected) << "row " << n;
    }
  }
  // No one-hot term outside rank 0: every gradient there is a positive softmax entry.
  const int64_t begin1 = shard_columns(V, 4, 1).begin;
  int64_t negative = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = begin1; j < V; ++j) negative += got.dlogits[n * V + j] < 0.f;
  EXPECT_EQ(negative, 0);
  EXPECT_ALL_CLOSE(got.dlogits, rc["dlogits"].floats(), 1e-5, 1e-12);
}

TEST(CrossEntropyShard, MisuseThrowsNamingTheOpAndOperands) {
  const int64_t N = 4, V = 10;
  Floats logits(N * V), dl(N * V), lse(N), tl(N);
  std::vector<int32_t> targets(N, 1), targets3(3, 1);
  std::vector<bf16> dl16(N * V);
  const Tensor x = f32_view(logits, {N, V}), tgt = i32_view(targets, {N}), l = f32_view(lse, {N}),
               t = f32_view(tl, {N});
  const char* stats = "cross_entropy_shard_stats";
  const char* back = "cross_entropy_shard_backward";
  expect_error([&] { cross_entropy_shard_stats(l, t, x, tgt, 0, V + 1); }, {stats, "valid 11", "[0, V_local = 10]"});
  expect_error([&] { cross_entropy_shard_stats(l, t, x, tgt, 0, -1); }, {stats, "valid -1"});
  expect_error([&] { cross_entropy_shard_stats(l, t, x, tgt, -5, V); }, {stats, "vocab_begin -5"});
  expect_error([&] { cross_entropy_shard_stats(l, t, x, i32_view(targets3, {3}), 0, V); }, {stats, "i32(3,)"});
  expect_error([&] { cross_entropy_shard_stats(f32_view(lse, {N - 1}), t, x, tgt, 0, V); },
               {stats, "lse has 3 elements", "f32(3,)"});
  expect_error([&] { cross_entropy_shard_stats(l, bf16_view(dl16, {N}), x, tgt, 0, V); },
               {stats, "target_logit has dtype bf16"});
  expect_error([&] { cross_entropy_shard_stats(f32_view(logits, {N}), t, x, tgt, 0, V); },
               {stats, "lse must not overlap logits"});
  expect_error([&] { cross_entropy_shard_stats(l, l, x, tgt, 0, V); }, {stats, "overlap"});
  expect_error([&] { cross_entropy_shard_stats(Tensor(), t, x, tgt, 0, V); }, {stats, "lse"});
  targets[2] = -7;  // negative and not ignore_index
  expect_error([&] { cross_entropy_shard_stats(l, t, x, tgt, 0, V); }, {stats, "target -7 at row 2", "-100"});
  expect_error([&] { cross_entropy_shard_backward(f32_view(dl, {N, V}), x, l, tgt, 0, V, 1.f); },
               {back, "target -7 at row 2"});
  targets[2] = 1;
  expect_error([&] { cross_entropy_shard_backward(Tensor(), x, l, tgt, 0, V, 1.f); }, {back, "dlogits"});
  expect_error([&] { cross_entropy_shard_backward(bf16_view(dl16, {N, V}), x, l, tgt, 0, V, 1.f); },
               {back, "dlogits has dtype bf16, expected f32"});
  expect_error([&] { cross_entropy_shard_backward(f32_view(dl, {V, N}), x, l, tgt, 0, V, 1.f); },
               {back, "f32(10, 4)"});
  expect_error([&] { cross_entropy_shard_backward(f32_view(dl, {N, V}), x, f32_view(lse, {N - 1}), tgt, 0, V, 1.f); },
               {back, "lse has 3 elements"});
  expect_error([&] { cross_entropy_shard_backward(f32_view(dl, {N, V}), x, f32_view(dl, {N}), tgt, 0, V, 1.f); },
               {back, "dlogits must not overlap lse"});
  expect_error([&] { cross_entropy_shard_backward(f32_view(dl, {N, V}), x, l, tgt, 0, V + 1, 1.f); },
               {back, "valid 11"});
}

}  // namespace
}  // namespace loom
