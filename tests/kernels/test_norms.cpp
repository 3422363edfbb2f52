// LayerNorm and RMSNorm against PyTorch (tests/ref/ref_norms.py), finite
// differences, the bf16 and f16 paths against the f32 path, determinism of the dw/db
// reduction, and misuse.
//
// Tolerances (|a - e| <= atol + rtol |e|):
// - f32 vs torch (float64 from the same f32 inputs): y, dx rtol 1e-5 atol 1e-5;
//   mean, rstd, dw, db (reductions over C or N) rtol 1e-4 atol 1e-4.
// - bf16 storage with f32 gradients vs the f32 path on the same (rounded)
//   inputs: identical arithmetic, so rtol 1e-6 atol 1e-6 (only summation
//   order inside a vector lane may differ).
// - bf16 storage and bf16 gradients vs the f32 path: one bf16 rounding of each
//   stored result (relative 2^-9 = 0.002), plus the rounding of the prefill sum:
//   rtol 1e-2 atol 1e-2.
// - f16 likewise: f32 gradients 1e-6; f16 gradients 2.5e-3 / 2.5e-3 (4x
//   tighter: f16 rounds to 2^-12 relative, 8x finer than bf16).
// - finite differences (f32, central, h = 1e-2): truncation error ~h^2 = 1e-4
//   times third derivatives of order 1-10, round-off ~1e-7 / h: rtol 1e-2 atol 2e-3.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace loom::test;

const char* const kCases[] = {"c100", "n1", "c768"};

// One case's inputs and pre-filled gradients (b unused by RMSNorm).
struct NormInputs {
  Shape shape;
  float eps = 1e-5f;
  Floats x, w, b, dy, dx0, dw0, db0;
  int64_t C() const { return shape[shape.ndim() - 1]; }
  int64_t N() const { return shape.numel() / C(); }
};

NormInputs load_inputs(RefCase& rc, bool layernorm) {
  NormInputs in;
  in.shape = rc["x"].shape;
  in.eps = rc["eps"].scalar();
  in.x = rc["x"].floats(), in.w = rc["w"].floats(), in.dy = rc["dy"].floats();
  in.dx0 = rc["dx_prefill"].floats(), in.dw0 = rc["dw_prefill"].floats();
  if (layernorm) in.b = rc["b"].floats(), in.db0 = rc["db_prefill"].floats();
  return in;
}

NormInputs rounded(NormInputs in, DType half) {
  for (Floats* v : {&in.x, &in.w, &in.b, &in.dy, &in.dx0, &in.dw0, &in.db0}) *v = rounded_to(half, *v);
  return in;
}

struct NormOutputs {
  Floats y, mean, rstd, dx, dw, db;
};

// Forward, then backward into the pre-filled gradients. act: dtype of x, w,
// b, y; grad: dtype of dy, dx, dw, db.
NormOutputs run_layernorm(const NormInputs& in, DType act, DType grad) {
  const Shape cs{in.C()}, ns{in.N()};
  Buffer x(act, in.shape, in.x), w(act, cs, in.w), b(act, cs, in.b), y(act, in.shape);
  Buffer mean(DType::f32, ns), rstd(DType::f32, ns);
  Buffer dy(grad, in.shape, in.dy), dx(grad, in.shape, in.dx0), dw(grad, cs, in.dw0), db(grad, cs, in.db0);
  layernorm_forward(y.view(), mean.view(), rstd.view(), x.view(), w.view(), b.view(), in.eps);
  layernorm_backward(dx.view(), dw.view(), db.view(), dy.view(), x.view(), w.view(), mean.view(), rstd.view());
  return {y.floats(), mean.floats(), rstd.floats(), dx.floats(), dw.floats(), db.floats()};
}

NormOutputs run_rmsnorm(const NormInputs& in, DType act, DType grad) {
  const Shape cs{in.C()};
  Buffer x(act, in.shape, in.x), w(act, cs, in.w), y(act, in.shape);
  Buffer rstd(DType::f32, Shape{in.N()});
  Buffer dy(grad, in.shape, in.dy), dx(grad, in.shape, in.dx0), dw(grad, cs, in.dw0);
  rmsnorm_forward(y.view(), rstd.view(), x.view(), w.view(), in.eps);
  rmsnorm_backward(dx.view(), dw.view(), dy.view(), x.view(), w.view(), rstd.view());
  return {y.floats(), {}, rstd.floats(), dx.floats(), dw.floats(), {}};
}

// ---- against PyTorch -----------------------------------------------------------------

TEST(LayerNorm, ForwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("layernorm_") + name + ".ref");
    const NormOutputs out = run_layernorm(load_inputs(rc, true), DType::f32, DType::f32);
    EXPECT_TRUE(all_close(out.y, rc["y"].floats(), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(out.mean, rc["mean"].floats(), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(out.rstd, rc["rstd"].floats(), 1e-4, 1e-4));
  }
}

TEST(LayerNorm, BackwardAccumulatesTorchGradientsF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("layernorm_") + name + ".ref");
    const NormInputs in = load_inputs(rc, true);
    const NormOutputs out = run_layernorm(in, DType::f32, DType::f32);
    EXPECT_TRUE(all_close(out.dx, plus(in.dx0, rc["dx"].floats()), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(out.dw, plus(in.dw0, rc["dw"].floats()), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(out.db, plus(in.db0, rc["db"].floats()), 1e-4, 1e-4));
  }
}

TEST(RMSNorm, ForwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("rmsnorm_") + name + ".ref");
    const NormOutputs out = run_rmsnorm(load_inputs(rc, false), DType::f32, DType::f32);
    EXPECT_TRUE(all_close(out.y, rc["y"].floats(), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(out.rstd, rc["rstd"].floats(), 1e-4, 1e-4));
  }
}

TEST(RMSNorm, BackwardAccumulatesTorchGradientsF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("rmsnorm_") + name + ".ref");
    const NormInputs in = load_inputs(rc, false);
    const NormOutputs out = run_rmsnorm(in, DType::f32, DType::f32);
    EXPECT_TRUE(all_close(out.dx, plus(in.dx0, rc["dx"].floats()), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(out.dw, plus(in.dw0, rc["dw"].floats()), 1e-4, 1e-4));
  }
}

// ---- bf16 against f32 ------------------------------------------------------------------

void expect_outputs_close(const NormOutputs& a, const NormOutputs& e, double rtol, double atol) {
  EXPECT_TRUE(all_close(a.y, e.y, rtol, atol)) << "y";
  EXPECT_TRUE(all_close(a.mean, e.mean, 1e-6, 1e-6)) << "mean (always f32)";
  EXPECT_TRUE(all_close(a.rstd, e.rstd, 1e-6, 1e-6)) << "rstd (always f32)";
  EXPECT_TRUE(all_close(a.dx, e.dx, rtol, atol)) << "dx";
  EXPECT_TRUE(all_close(a.dw, e.dw, rtol, atol)) << "dw";
  EXPECT_TRUE(all_close(a.db, e.db, rtol, atol)) << "db";
}

// half (bf16 or f16) storage against the f32 path on the same rounded
// inputs: f32 gradients of half inputs to 1e-6, half gradients to tol.
void expect_layernorm_half_matches_f32(DType half, double tol) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("layernorm_") + name + ".ref");
    const NormInputs in = rounded(load_inputs(rc, true), half);
    const NormOutputs ref = run_layernorm(in, DType::f32, DType::f32);
    NormOutputs f32_grads = run_layernorm(in, half, DType::f32);
    f32_grads.y = ref.y;  // y is stored in the half dtype here; checked below
    expect_outputs_close(f32_grads, ref, 1e-6, 1e-6);
    expect_outputs_close(run_layernorm(in, half, half), ref, tol, tol);
  }
}

void expect_rmsnorm_half_matches_f32(DType half, double tol) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("rmsnorm_") + name + ".ref");
    const NormInputs in = rounded(load_inputs(rc, false), half);
    const NormOutputs ref = run_rmsnorm(in, DType::f32, DType::f32);
    NormOutputs f32_grads = run_rmsnorm(in, half, DType::f32);
    f32_grads.y = ref.y;
    expect_outputs_close(f32_grads, ref, 1e-6, 1e-6);
    expect_outputs_close(run_rmsnorm(in, half, half), ref, tol, tol);
  }
}

TEST(LayerNorm, Bf16MatchesF32PathOnRoundedInputs) { expect_layernorm_half_matches_f32(DType::bf16, 1e-2); }
TEST(LayerNorm, F16MatchesF32PathOnRoundedInputs) {
  expect_layernorm_half_matches_f32(DType::f16, 1e-2 * kF16Tighter);
}
TEST(RMSNorm, Bf16MatchesF32PathOnRoundedInputs) { expect_rmsnorm_half_matches_f32(DType::bf16, 1e-2); }
TEST(RMSNorm, F16MatchesF32PathOnRoundedInputs) { expect_rmsnorm_half_matches_f32(DType::f16, 1e-2 * kF16Tighter); }

// ---- finite differences ----------------------------------------------------------------

// loss = sum(y * r) for random r; the analytic gradient is the backward with dy = r.
void expect_gradients_match_finite_differences(bool layernorm) {
  std::mt19937 rng(7);
  NormInputs in;
  in.shape = Shape{3, 5};
  in.eps = 1e-5f;
  in.x = random_floats(15, rng, 1.5f, 0.3f), in.w = random_floats(5, rng, 0.5f, 1.f);
  in.b = random_floats(5, rng, 0.1f), in.dy = random_floats(15, rng);
  in.dx0 = Floats(15), in.dw0 = Floats(5), in.db0 = Floats(5);
  const NormOutputs analytic = layernorm ? run_layernorm(in, DType::f32, DType::f32) : run_rmsnorm(in, DType::f32, DType::f32);
  NormInputs probe = in;
  const auto loss = [&] {
    const Floats y = layernorm ? run_layernorm(probe, DType::f32, DType::f32).y : run_rmsnorm(probe, DType::f32, DType::f32).y;
    return test::weighted_sum(y, in.dy);
  };
  const auto fd = [&](Floats& v) { return test::finite_difference(loss, v, 1e-2f); };
  EXPECT_TRUE(all_close(analytic.dx, fd(probe.x), 1e-2, 2e-3)) << "dx";
  EXPECT_TRUE(all_close(analytic.dw, fd(probe.w), 1e-2, 2e-3)) << "dw";
  if (layernorm) {
    EXPECT_TRUE(all_close(analytic.db, fd(probe.b), 1e-2, 2e-3)) << "db";
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) { expect_gradients_match_finite_differences(true); }
TEST(RMSNorm, GradientsMatchFiniteDifferences) { expect_gradients_match_finite_differences(false); }

// ---- determinism -------------------------------------------------------------------------

// The dw/db reduction uses fixed row blocks, so its bits do not depend on the thread count.
TEST(LayerNorm, WeightGradientsAreBitwiseIdenticalAcrossThreadCounts) {
  std::mt19937 rng(11);
  NormInputs in;
  in.shape = Shape{1000, 96};
  in.x = random_floats(96000, rng, 3.f, 1.f), in.w = random_floats(96, rng), in.b = random_floats(96, rng);
  in.dy = random_floats(96000, rng), in.dx0 = Floats(96000), in.dw0 = Floats(96), in.db0 = Floats(96);
  const int saved = num_threads();
  std::vector<NormOutputs> ln, rms;
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    ln.push_back(run_layernorm(in, DType::f32, DType::f32));
    rms.push_back(run_rmsnorm(in, DType::f32, DType::f32));
  }
  set_num_threads(saved);
  for (size_t i = 1; i < ln.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(ln[i].dw.data(), ln[0].dw.data(), 96 * sizeof(float))) << "layernorm dw, run " << i;
    EXPECT_EQ(0, std::memcmp(ln[i].db.data(), ln[0].db.data(), 96 * sizeof(float))) << "layernorm db, run " << i;
    EXPECT_EQ(0, std::memcmp(rms[i].dw.data(), rms[0].dw.data(), 96 * sizeof(float))) << "rmsnorm dw, run " << i;
  }
}

// ---- optional operands -------------------------------------------------------------------

TEST(LayerNorm, UndefinedStatisticsAndGradientsAreSkipped) {
  RefCase rc("layernorm_c100.ref");
  NormInputs in = load_inputs(rc, true);
  Buffer x(DType::f32, in.shape, in.x), w(DType::f32, Shape{in.C()}, in.w), b(DType::f32, Shape{in.C()}, in.b);
  Buffer y(DType::f32, in.shape);
  layernorm_forward(y.view(), Tensor(), Tensor(), x.view(), w.view(), b.view(), in.eps);
  EXPECT_TRUE(all_close(y.floats(), rc["y"].floats(), 1e-5, 1e-5));
  const NormOutputs full = run_layernorm(in, DType::f32, DType::f32);
  Buffer mean(DType::f32, Shape{in.N()}, full.mean), rstd(DType::f32, Shape{in.N()}, full.rstd);
  Buffer dy(DType::f32, in.shape, in.dy), dw(DType::f32, Shape{in.C()}, in.dw0);
  layernorm_backward(Tensor(), dw.view(), Tensor(), dy.view(), x.view(), w.view(), mean.view(), rstd.view());
  EXPECT_EQ(dw.floats(), full.dw);
}

// ---- the fused residual -------------------------------------------------------------------

// add_layernorm_forward / add_rmsnorm_forward equal add then the norm, bit
// for bit: every float dtype, sum apart and in place of a, with and without
// LayerNorm's bias, rows wide enough for the threads to split them.
TEST(FusedResidual, EqualsTheAddThenTheNormBitForBit) {
  const int64_t N = 67, C = 768;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.5f, 2.f);
  auto values = [&](int64_t n) {
    Floats v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng);
    return v;
  };
  const Floats av = values(N * C), bv = values(N * C), wv = values(C), biasv = values(C);
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (bool in_place : {false, true})
      for (bool rms : {false, true}) {
        SCOPED_TRACE(concat(dtype_name(dt), in_place ? " in place" : "", rms ? " rmsnorm" : " layernorm"));
        Buffer a1(dt, {N, C}, av), b(dt, {N, C}, bv), w(dt, {C}, wv), bias(dt, {C}, biasv);
        Buffer a2 = a1, sum1(dt, {N, C}), sum2(dt, {N, C}), y1(dt, {N, C}), y2(dt, {N, C});
        Buffer m1(DType::f32, {N}), m2(DType::f32, {N}), r1(DType::f32, {N}), r2(DType::f32, {N});
        const Tensor s1 = in_place ? a1.view() : sum1.view(), s2 = in_place ? a2.view() : sum2.view();
        add(s1, a1.view(), b.view());
        if (rms) {
          rmsnorm_forward(y1.view(), r1.view(), s1, w.view(), 1e-6f);
          add_rmsnorm_forward(s2, y2.view(), r2.view(), a2.view(), b.view(), w.view(), 1e-6f);
        } else {
          layernorm_forward(y1.view(), m1.view(), r1.view(), s1, w.view(), bias.view(), 1e-5f);
          add_layernorm_forward(s2, y2.view(), m2.view(), r2.view(), a2.view(), b.view(), w.view(), bias.view(), 1e-5f);
        }
        EXPECT_EQ(in_place ? a2.bytes : sum2.bytes, in_place ? a1.bytes : sum1.bytes);
        EXPECT_EQ(y2.bytes, y1.bytes);
        EXPECT_EQ(m2.bytes, m1.bytes);
        EXPECT_EQ(r2.bytes, r1.bytes);
      }
}

TEST(FusedResidual, MisuseThrowsErrorsNamingTheOp) {
  Floats xs(4 * 100), ys(4 * 100), ws(100), ms(4);
  Tensor x(xs.data(), DType::f32, Shape{4, 100}), y(ys.data(), DType::f32, Shape{4, 100});
  Tensor w(ws.data(), DType::f32, Shape{100}), mean(ms.data(), DType::f32, Shape{4});
  Tensor x_bf16(xs.data(), DType::bf16, Shape{4, 100}), x_short(xs.data(), DType::f32, Shape{2, 100});
  expect_error([&] { add_layernorm_forward(x, y, mean, mean, x, x_bf16, w, Tensor(), 1e-5f); },
               {"add_layernorm_forward", "b", "bf16(4, 100)"});
  expect_error([&] { add_layernorm_forward(x, y, mean, mean, x, x_short, w, Tensor(), 1e-5f); },
               {"add_layernorm_forward", "b", "f32(2, 100)"});
  expect_error([&] { add_layernorm_forward(x, x, mean, mean, x, y, w, Tensor(), 1e-5f); },
               {"add_layernorm_forward", "y must not overlap sum"});
  expect_error([&] { add_rmsnorm_forward(x, y, mean, x, y, w, 1e-6f); }, {"add_rmsnorm_forward", "y must not overlap b"});
  Tensor mean_short(ms.data(), DType::f32, Shape{2});  // the ops' input is `sum`, and the messages say so
  expect_error([&] { add_rmsnorm_forward(x, y, mean_short, x, x, w, 1e-6f); },
               {"add_rmsnorm_forward", "rstd must have one element per row of sum (4)"});
  expect_error([&] { add_layernorm_forward(x, y, mean, mean, x, x, Tensor(ws.data(), DType::bf16, Shape{100}),
                                           Tensor(), 1e-5f); },
               {"add_layernorm_forward", "w has dtype bf16 but sum has f32"});
}

// ---- misuse --------------------------------------------------------------------------------

TEST(LayerNorm, MisuseThrowsErrorsNamingTheOpAndShapes) {
  Floats xs(4 * 100), ws(101), ms(4);
  Tensor x(xs.data(), DType::f32, Shape{4, 100}), y = x;
  Tensor w_bad(ws.data(), DType::f32, Shape{101}), w(ws.data(), DType::f32, Shape{100});
  Tensor mean(ms.data(), DType::f32, Shape{4}), mean_bf16(ms.data(), DType::bf16, Shape{4});
  Tensor x_i32(xs.data(), DType::i32, Shape{4, 100}), y_bf16(xs.data(), DType::bf16, Shape{4, 100});
  expect_error([&] { layernorm_forward(y, mean, mean, x, w_bad, Tensor(), 1e-5f); },
               {"layernorm_forward", "w", "(100,)", "f32(101,)"});
  expect_error([&] { layernorm_forward(y_bf16, mean, mean, x, w, Tensor(), 1e-5f); },
               {"layernorm_forward", "y", "bf16(4, 100)"});
  expect_error([&] { layernorm_forward(x_i32, mean, mean, x_i32, w, Tensor(), 1e-5f); },
               {"layernorm_forward", "i32(4, 100)"});
  expect_error([&] { layernorm_forward(y, mean_bf16, mean, x, w, Tensor(), 1e-5f); },
               {"layernorm_forward", "mean", "bf16(4,)"});
  expect_error([&] { layernorm_backward(x, w, Tensor(), x, x, w, mean, Tensor()); },
               {"layernorm_backward", "rstd is required"});
  expect_error([&] { layernorm_backward(x, w_bad, Tensor(), x, x, w, mean, mean); },
               {"layernorm_backward", "dw", "f32(101,)"});
  expect_error([&] { layernorm_backward(x, Tensor(), Tensor(), x.reshape({100, 4}), x, w, mean, mean); },
               {"layernorm_backward", "dy", "f32(100, 4)", "f32(4, 100)"});
  expect_error([&] { layernorm_backward(x, Tensor(), Tensor(), x, x, w, mean, mean); },
               {"layernorm_backward", "dx must not overlap dy"});
}

TEST(RMSNorm, MisuseThrowsErrorsNamingTheOpAndShapes) {
  Floats xs(4 * 100), ws(101), rs(5);
  Tensor x(xs.data(), DType::f32, Shape{4, 100}), y = x;
  Tensor w_bad(ws.data(), DType::f32, Shape{101}), w(ws.data(), DType::f32, Shape{100});
  Tensor rstd(rs.data(), DType::f32, Shape{4}), rstd_bad(rs.data(), DType::f32, Shape{5});
  Tensor w_bf16(ws.data(), DType::bf16, Shape{100});
  expect_error([&] { rmsnorm_forward(y, rstd, x, w_bad, 1e-6f); }, {"rmsnorm_forward", "w", "f32(101,)"});
  expect_error([&] { rmsnorm_forward(y, rstd, x, w_bf16, 1e-6f); }, {"rmsnorm_forward", "w", "bf16(100,)"});
  expect_error([&] { rmsnorm_forward(y, rstd_bad, x, w, 1e-6f); }, {"rmsnorm_forward", "rstd", "f32(5,)"});
  expect_error([&] { rmsnorm_backward(x, w_bad, x, x, w, rstd); }, {"rmsnorm_backward", "dw", "f32(101,)"});
  expect_error([&] { rmsnorm_backward(x, w, x, x, w, Tensor()); }, {"rmsnorm_backward", "rstd is required"});
  expect_error([&] { rmsnorm_backward(x, Tensor(), x, x, w, rstd); }, {"rmsnorm_backward", "dx must not overlap dy"});
}

}  // namespace
}  // namespace loom::kernels
