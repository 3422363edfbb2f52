// adamw_step, sum_squares, sum_squares_blocks, global_norm, all_finite and scale
// (reference values: tests/ref/ref_optim.py).
//
// Tolerances:
// - AdamW vs torch.optim.AdamW run in float32 with the same formulas, after
//   each of 5 steps: exp_avg_sq rel 2e-6; param and exp_avg within 1e-6 of
//   the magnitude of the terms summed into them (|p| + |update|,
//   b1 |m| + (1 - b1) |g|), since where those cancel a rounding difference
//   (e.g. FMA contraction) is relative to the terms, not to the result.
// - bf16 and f16 gradients: bitwise equal to the f32 path given the same
//   rounded gradients (a bf16 or f16 value is exact in f32); the bf16 / f16
//   param copy is bitwise the rounded f32 param.
// - sum of squares / global norm vs float64 torch: rel 1e-10 (double
//   accumulation of squares that are exact in double; only the summation
//   order differs).
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/ops.h"

namespace loom {
namespace {

using namespace loom::test;

kernels::AdamWConfig config_of(RefCase& rc) {
  kernels::AdamWConfig c;
  c.lr = rc["lr"].scalar();
  c.beta1 = rc["beta1"].scalar();
  c.beta2 = rc["beta2"].scalar();
  c.eps = rc["eps"].scalar();
  c.weight_decay = rc["weight_decay"].scalar();
  c.grad_scale = rc["grad_scale"].scalar();
  return c;
}

// ---- adamw ------------------------------------------------------------------

// |actual - expected| <= tol * magnitude elementwise, where magnitude is the
// size of the terms summed into the element: where they cancel, the rounding
// error is relative to them, not to the (small) result.
::testing::AssertionResult close_to_magnitude(const std::vector<float>& actual, const std::vector<float>& expected,
                                              const std::vector<double>& magnitude, double tol) {
  size_t misses = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double ratio = std::abs(static_cast<double>(actual[i]) - expected[i]) / (tol * magnitude[i]);
    if (!(ratio <= 1)) ++misses;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << actual.size() << " differ; worst at " << worst
                                       << ": actual " << actual[worst] << " expected " << expected[worst]
                                       << " magnitude " << magnitude[worst] << " (tol " << tol << ")";
}

TEST(AdamW, MatchesTorchOverFiveStepsWithWeightDecayAndGradScale) {
  RefCase rc("optim_adamw.ref");
  kernels::AdamWConfig cfg = config_of(rc);
  std::vector<float> p = rc["param0"].floats(), m(p.size(), 0.f), v(p.size(), 0.f), copy(p.size());
  const size_t n = p.size();
  const Shape s{static_cast<int64_t>(n)};
  // Running magnitudes of the terms summed into p and m over all steps so far
  // (errors of earlier steps carry over): M = b1 M + (1 - b1) |g|,
  // P = decay P + step_size M / denom.
  std::vector<double> mag_p(n), mag_m(n, 0.0);
  for (size_t i = 0; i < n; ++i) mag_p[i] = std::abs(p[i]);
  for (int k = 1; k <= 5; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    const std::string ks = std::to_string(k);
    const std::vector<float> g = rc["grad_" + ks].floats(), v_ref = rc["exp_avg_sq_" + ks].floats();
    const double bc1 = 1 - std::pow(double{cfg.beta1}, k), bc2 = 1 - std::pow(double{cfg.beta2}, k);
    for (size_t i = 0; i < n; ++i) {
      mag_m[i] = cfg.beta1 * mag_m[i] + (1 - cfg.beta1) * std::abs(g[i] * cfg.grad_scale);
      mag_p[i] = (1 - double{cfg.lr} * cfg.weight_decay) * mag_p[i] +
                 cfg.lr / bc1 * mag_m[i] / (std::sqrt(v_ref[i] / bc2) + cfg.eps);
    }
    cfg.step = k;
    kernels::adamw_step(Tensor(p.data(), DType::f32, s), Tensor(m.data(), DType::f32, s),
                        Tensor(v.data(), DType::f32, s), rc["grad_" + ks].view(), Tensor(copy.data(), DType::f32, s),
                        cfg);
    EXPECT_TRUE(close_to_magnitude(p, rc["param_" + ks].floats(), mag_p, 1e-6));
    EXPECT_TRUE(close_to_magnitude(m, rc["exp_avg_" + ks].floats(), mag_m, 1e-6));
    EXPECT_ALL_CLOSE(v, v_ref, 2e-6, 0);  // a sum of non-negative terms: plain relative error
    EXPECT_EQ(copy, p) << "an f32 param_copy is the param";
  }
}

// A half (bf16 or f16) gradient gives the f32 path's bits on the rounded
// gradient (a half value is exact in f32), and the half param copy is the
// updated f32 param rounded once; also with an f32 gradient (the model's
// combination: f32 gradients, half compute weights).
void expect_half_grad_and_copy_exact(DType half) {
  RefCase rc("optim_adamw.ref");
  kernels::AdamWConfig cfg = config_of(rc);
  const std::vector<float> p0 = rc["param0"].floats();
  const Shape s{static_cast<int64_t>(p0.size())};
  std::vector<float> p32 = p0, m32(p0.size()), v32(p0.size()), p16 = p0, m16(p0.size()), v16(p0.size());
  Buffer copy(half, s), copy2(half, s);
  std::vector<float> p2 = p0, m2(p0.size()), v2(p0.size());
  for (int k = 1; k <= 3; ++k) {
    cfg.step = k;
    Buffer g16(half, s, rc["grad_" + std::to_string(k)].floats());
    Buffer g32(DType::f32, s, g16.floats());
    kernels::adamw_step(Tensor(p32.data(), DType::f32, s), Tensor(m32.data(), DType::f32, s),
                        Tensor(v32.data(), DType::f32, s), g32.view(), Tensor(), cfg);
    kernels::adamw_step(Tensor(p16.data(), DType::f32, s), Tensor(m16.data(), DType::f32, s),
                        Tensor(v16.data(), DType::f32, s), g16.view(), copy.view(), cfg);
    kernels::adamw_step(Tensor(p2.data(), DType::f32, s), Tensor(m2.data(), DType::f32, s),
                        Tensor(v2.data(), DType::f32, s), g32.view(), copy2.view(), cfg);
  }
  EXPECT_EQ(p16, p32);
  EXPECT_EQ(m16, m32);
  EXPECT_EQ(v16, v32);
  EXPECT_EQ(p2, p32);
  Buffer expected_copy(half, s, p16);
  EXPECT_EQ(copy.bytes, expected_copy.bytes);
  EXPECT_EQ(copy2.bytes, expected_copy.bytes);
}

TEST(AdamW, Bf16GradMatchesF32PathOnRoundedGradAndBf16CopyIsRoundedParam) {
  expect_half_grad_and_copy_exact(DType::bf16);
}
TEST(AdamW, F16GradMatchesF32PathOnRoundedGradAndF16CopyIsRoundedParam) {
  expect_half_grad_and_copy_exact(DType::f16);
}

TEST(AdamW, FirstStepFromZeroStateMovesEachParamByLr) {
  // With m = v = 0 and wd = 0, step 1 gives m_hat / sqrt(v_hat) = sign(g) (eps aside): |dp| = lr.
  std::vector<float> p = {1.f, -2.f, 0.5f}, m(3), v(3), g = {0.3f, -4.f, 1e-3f};
  kernels::AdamWConfig cfg;
  cfg.lr = 0.01f;
  kernels::adamw_step(Tensor(p.data(), DType::f32, {3}), Tensor(m.data(), DType::f32, {3}),
                      Tensor(v.data(), DType::f32, {3}), Tensor(g.data(), DType::f32, {3}), Tensor(), cfg);
  EXPECT_NEAR(p[0], 1.f - 0.01f, 1e-6);
  EXPECT_NEAR(p[1], -2.f + 0.01f, 1e-6);
  EXPECT_NEAR(p[2], 0.5f - 0.01f, 1e-6);
}

TEST(AdamW, MisuseThrowsNamingTheOpAndOperand) {
  const int64_t n = 8;
  Buffer p(DType::f32, {n}), m(DType::f32, {n}), v(DType::f32, {n}), g(DType::f32, {n});
  Buffer m16(DType::bf16, {n}), p16(DType::bf16, {n}), g_short(DType::f32, {n - 1}), gi(DType::i32, {n});
  Buffer copy_short(DType::bf16, {n + 1});
  kernels::AdamWConfig cfg;
  const char* op = "adamw_step";
  expect_error([&] { kernels::adamw_step(p.view(), m16.view(), v.view(), g.view(), Tensor(), cfg); },
               {op, "m has dtype bf16"});
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), m16.view(), g.view(), Tensor(), cfg); },
               {op, "v has dtype bf16"});
  expect_error([&] { kernels::adamw_step(p16.view(), m.view(), v.view(), g.view(), Tensor(), cfg); },
               {op, "param has dtype bf16"});
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), g_short.view(), Tensor(), cfg); },
               {op, "f32(7,)"});
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), gi.view(), Tensor(), cfg); },
               {op, "grad has dtype i32"});
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), g.view(), copy_short.view(), cfg); },
               {op, "bf16(9,)"});
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), Tensor(), Tensor(), cfg); },
               {op, "grad is required"});
  cfg.step = 0;
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), g.view(), Tensor(), cfg); },
               {op, "step must be >= 1"});
  cfg.step = 1;
  cfg.beta2 = 1.f;
  expect_error([&] { kernels::adamw_step(p.view(), m.view(), v.view(), g.view(), Tensor(), cfg); }, {op, "betas"});
}

// ---- reductions ---------------------------------------------------------------

double hi_lo(RefCase& rc, const std::string& name) {
  return static_cast<double>(rc[name + "_hi"].scalar()) + static_cast<double>(rc[name + "_lo"].scalar());
}

TEST(SumSquares, MatchesTorchFloat64ForF32AndBf16) {
  RefCase rc("optim_norms.ref");
  for (int i = 0; i < 4; ++i) {
    const std::string t = concat("t", i);
    SCOPED_TRACE(t + " " + rc[t].view().str());
    const double expected = hi_lo(rc, concat("sumsq", i));
    EXPECT_NEAR(kernels::sum_squares(rc[t].view()), expected, 1e-10 * expected);
  }
  EXPECT_EQ(rc["t3"].dtype, DType::bf16);
}

TEST(GlobalNorm, MatchesTorchVectorNormOverMixedTensors) {
  RefCase rc("optim_norms.ref");
  std::vector<Tensor> ts;
  for (int i = 0; i < 4; ++i) ts.push_back(rc[concat("t", i)].view());
  const double expected = hi_lo(rc, "norm");
  EXPECT_NEAR(kernels::global_norm(ts), expected, 1e-10 * expected);
  EXPECT_EQ(kernels::global_norm({}), 0.0);
}

TEST(SumSquares, F16AndEmptyTensors) {
  std::vector<float> x(70001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i)) * 300.f;
  Buffer h(DType::f16, {static_cast<int64_t>(x.size())}, x);
  double expected = 0;
  for (float f : h.floats()) expected += static_cast<double>(f) * f;
  EXPECT_NEAR(kernels::sum_squares(h.view()), expected, 1e-12 * expected);
  Buffer empty(DType::f32, {0});
  EXPECT_EQ(kernels::sum_squares(empty.view()), 0.0);
}

TEST(SumSquares, DoesNotDependOnThreadCount) {
  RefCase rc("optim_norms.ref");
  const int saved = num_threads();
  set_num_threads(1);
  const double one = kernels::sum_squares(rc["t2"].view());
  set_num_threads(3);
  const double three = kernels::sum_squares(rc["t2"].view());
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(&one, &three, sizeof(double)), 0) << one << " vs " << three;
}

// Each block's sum is sum_squares of that slice alone, bit for bit: blocks
// smaller than the parallel threshold (one thread each), larger ones (every
// thread on each), a last block cut short, at 1 and 3 threads.
TEST(SumSquaresBlocks, EachBlockIsSumSquaresOfItsSliceBitForBit) {
  std::vector<float> x(300007);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.013f * static_cast<float>(i)) * 7.f + 1e-3f;
  const int saved = num_threads();
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    for (int64_t block : {int64_t{1}, int64_t{4096}, int64_t{5000}, int64_t{40000}, int64_t{300007}})
      for (int threads : {1, 3}) {
        SCOPED_TRACE(concat(dtype_name(d), " block ", block, ", ", threads, " threads"));
        set_num_threads(threads);
        const int64_t n = block == 1 ? 1001 : static_cast<int64_t>(x.size());
        Buffer h(d, {n}, std::vector<float>(x.begin(), x.begin() + n));
        std::vector<double> sums(static_cast<size_t>((n + block - 1) / block), -1.0);
        const Tensor t = h.view();
        kernels::sum_squares_blocks(sums, {&t, 1}, block);
        for (size_t i = 0; i < sums.size(); ++i) {
          const int64_t at = static_cast<int64_t>(i) * block;
          const double alone = kernels::sum_squares(h.view().slice(0, at, std::min(block, n - at)));
          ASSERT_EQ(std::memcmp(&sums[i], &alone, sizeof(double)), 0) << "block " << i << ": " << sums[i] << " vs "
                                                                      << alone;
        }
      }
  set_num_threads(saved);
  std::vector<double> none;
  Buffer empty(DType::f32, {0});
  const Tensor e = empty.view();
  kernels::sum_squares_blocks(none, {&e, 1}, 4096);  // no blocks: nothing to do
  kernels::sum_squares_blocks(none, {}, 4096);
  // A block as large as int64 allows is one block (counting must not overflow).
  Buffer small(DType::f32, {5}, {1.f, 2.f, 3.f, 4.f, 5.f});
  const Tensor s5 = small.view();
  std::vector<double> one(1, -1.0);
  kernels::sum_squares_blocks(one, {&s5, 1}, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(one[0], 55.0);
}

// Several tensors' blocks in one call: each tensor's, in order, as alone.
TEST(SumSquaresBlocks, SeveralTensorsGiveEachTensorsBlocksInOrder) {
  Buffer a(DType::f32, {10000}, std::vector<float>(10000, 0.5f)), b(DType::bf16, {7}, std::vector<float>(7, 3.f));
  Buffer c(DType::f32, {0}), d(DType::f16, {4097}, std::vector<float>(4097, -2.f));
  const std::vector<Tensor> ts = {a.view(), b.view(), c.view(), d.view()};
  std::vector<double> all(3 + 1 + 0 + 2);
  kernels::sum_squares_blocks(all, ts, 4096);
  EXPECT_EQ(all, (std::vector<double>{4096 * 0.25, 4096 * 0.25, 1808 * 0.25, 7 * 9.0, 4096 * 4.0, 4.0}));
}

TEST(SumSquaresBlocks, MisuseThrowsNamingTheOp) {
  Buffer h(DType::f32, {10}), i32(DType::i32, {4});
  const std::vector<Tensor> two_tensors = {h.view(), h.view()}, with_ints = {h.view(), i32.view()};
  std::vector<double> five(5), six(6);
  expect_error([&] { kernels::sum_squares_blocks(five, two_tensors, 4); },
               {"sum_squares_blocks", "sums has 5 elements but the 2 tensors make 6 blocks of 4"});
  expect_error([&] { kernels::sum_squares_blocks(six, two_tensors, 0); }, {"sum_squares_blocks", "block = 0"});
  expect_error([&] { kernels::sum_squares_blocks(six, with_ints, 4); },
               {"sum_squares_blocks", "tensors[1] has dtype i32"});
}

TEST(AllFinite, DetectsNanAndInfAnywhereInEveryFloatDtype) {
  const int64_t n = 100000;  // large enough for the parallel path
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    Buffer h(d, {n}, std::vector<float>(n, 1.5f));
    EXPECT_TRUE(kernels::all_finite(h.view()));
    for (int64_t pos : {int64_t{0}, n / 2 + 3, n - 1}) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        h.set(pos, bad);
        EXPECT_FALSE(kernels::all_finite(h.view())) << bad << " at " << pos;
        h.set(pos, 1.5f);
      }
    }
  }
}

TEST(AllFinite, LargestFiniteValuesAndSubnormalsAreFinite) {
  Buffer f32(DType::f32, {4}, {FLT_MAX, -FLT_MAX, 1e-45f, -0.f});
  EXPECT_TRUE(kernels::all_finite(f32.view()));
  // 3.38e38 is the largest finite bf16 (0x7f7f); FLT_MAX rounds up to Inf in bf16.
  Buffer b(DType::bf16, {3}, {3.38e38f, -3.38e38f, 1e-40f});
  EXPECT_TRUE(kernels::all_finite(b.view()));
  b.set(1, FLT_MAX);
  EXPECT_FALSE(kernels::all_finite(b.view()));
  // 65504 is the largest finite f16; 65520 rounds to Inf.
  Buffer h(DType::f16, {3}, {65504.f, -65504.f, 6e-8f});
  EXPECT_TRUE(kernels::all_finite(h.view()));
  h.set(2, 65520.f);
  EXPECT_FALSE(kernels::all_finite(h.view()));
}

TEST(Scale, EqualsRoundedProductInEveryFloatDtype) {
  std::vector<float> x(50001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.37f * static_cast<float>(i)) * 1000.f;
  x[7] = INFINITY;
  x[8] = NAN;
  const float s = 0.3f;
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    const int64_t n = static_cast<int64_t>(x.size());
    Buffer h(d, {n}, x);
    std::vector<float> before = h.floats(), expected(before.size());
    for (size_t i = 0; i < before.size(); ++i) expected[i] = before[i] * s;
    Buffer want(d, {n}, expected);  // rounded to d like the kernel must
    kernels::scale(h.view(), s);
    EXPECT_ALL_CLOSE(h.floats(), want.floats(), 0, 0);
  }
}

TEST(Reductions, MisuseThrowsNamingTheOp) {
  Buffer i32(DType::i32, {4});
  std::vector<float> buf(24);
  Tensor strided = Tensor(buf.data(), DType::f32, {4, 6}).slice(1, 0, 3);
  expect_error([&] { kernels::sum_squares(i32.view()); }, {"sum_squares", "t has dtype i32"});
  expect_error([&] { kernels::all_finite(i32.view()); }, {"all_finite", "t has dtype i32"});
  expect_error([&] { kernels::scale(i32.view(), 2.f); }, {"scale", "t has dtype i32"});
  expect_error([&] { kernels::sum_squares(strided); }, {"sum_squares", "must be contiguous"});
  expect_error([&] { kernels::sum_squares(Tensor()); }, {"sum_squares", "t is required"});
  std::vector<Tensor> ts = {Tensor(buf.data(), DType::f32, {24}), i32.view()};
  expect_error([&] { kernels::global_norm(ts); }, {"global_norm", "tensors[1] has dtype i32"});
}

}  // namespace
}  // namespace loom
