// matmul and linear against PyTorch (tests/ref/ref_matmul.py), the +=
// convention, finite differences, the bf16 and f16 paths against the f32 path, the
// thread safety of the primitive cache, and misuse.
//
// Tolerances (|a - e| <= atol + rtol |e|):
// - f32 vs torch (float64 from the same f32 inputs): rtol 1e-5 atol 1e-5 for
//   K <= 100 (sums of <= 100 products of O(1) values: f32 round-off ~1e-6);
//   the LM-head dx sums K = 50257 products: a long reduction, rtol 1e-4 atol 1e-4.
// - bf16 vs the f32 path on the SAME bf16-rounded inputs: a product of two
//   bf16 values is exact in f32 and both paths accumulate in f32, so with an
//   f32 output only the summation order differs: rtol 1e-5 atol 1e-5. With a
//   bf16 output (or bf16 gradient), add one rounding to bf16 (<= 2^-9
//   relative): rtol 4e-3 (2^-8) atol 1e-5.
// - f16 likewise (f16 operands run as an f32 GEMM on widened copies): f32
//   outputs 1e-5; f16 outputs or gradients rtol 1e-3 (4x tighter; one f16
//   rounding is <= 2^-12 relative) atol 1e-5.
// - finite differences (f32, central, h = 1e-2): the loss is linear in each
//   single element, so the difference quotient has no truncation error; only
//   the f32 round-off of the loss (~1e-6 / 2h = 5e-5): rtol 1e-3 atol 1e-3.
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/error.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace loom::test;

const char* const kMatmulCases[] = {"nn",       "nt",          "tn",       "tt",          "alpha_beta",
                                    "beta_neg", "m1",          "batched",  "batched_tt",  "shared_a",
                                    "shared_a_tt", "shared_b", "shared_b_ta", "shared_b_tt", "shared_b_4d"};
const char* const kLinearCases[] = {"bias", "nobias", "row1", "lmhead"};

MatmulOpts opts_of(RefCase& rc) {
  return {rc["trans_a"].scalar() != 0.f, rc["trans_b"].scalar() != 0.f, rc["alpha"].scalar(), rc["beta"].scalar()};
}

TEST(Matmul, ForwardMatchesTorchF32ForEveryTransposeBatchAndAlphaBeta) {
  for (const char* name : kMatmulCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("matmul_") + name + ".ref");
    const MatmulOpts o = opts_of(rc);
    // With beta = 0, c's old contents must be ignored: start from NaN.
    Buffer c(DType::f32, rc["c0"].shape, o.beta != 0.f ? rc["c0"].floats() : Floats(rc["c0"].shape.numel(), NAN));
    matmul(c.view(), rc["a"].view(), rc["b"].view(), o);
    EXPECT_ALL_CLOSE(c.floats(), rc["c"].floats(), 1e-5, 1e-5);
  }
}

TEST(Matmul, BackwardMatchesTorchAndAccumulates) {
  uint32_t seed = 1;
  for (const char* name : kMatmulCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("matmul_") + name + ".ref");
    const Floats da0 = random_floats(rc["a"].shape.numel(), seed++), db0 = random_floats(rc["b"].shape.numel(), seed++);
    Buffer da(DType::f32, rc["a"].shape, da0), db(DType::f32, rc["b"].shape, db0);
    matmul_backward(da.view(), db.view(), rc["dc"].view(), rc["a"].view(), rc["b"].view(), opts_of(rc));
    EXPECT_ALL_CLOSE(da.floats(), plus(da0, rc["da"].floats()), 1e-5, 1e-5);
    EXPECT_ALL_CLOSE(db.floats(), plus(db0, rc["db"].floats()), 1e-5, 1e-5);
  }
}

TEST(Matmul, BackwardSkipsUndefinedGradients) {
  RefCase rc("matmul_shared_a.ref");
  Buffer da(DType::f32, rc["a"].shape);
  matmul_backward(da.view(), Tensor(), rc["dc"].view(), rc["a"].view(), rc["b"].view(), opts_of(rc));
  EXPECT_ALL_CLOSE(da.floats(), rc["da"].floats(), 1e-5, 1e-5);
  Buffer db(DType::f32, rc["b"].shape);
  matmul_backward(Tensor(), db.view(), rc["dc"].view(), rc["a"].view(), rc["b"].view(), opts_of(rc));
  EXPECT_ALL_CLOSE(db.floats(), rc["db"].floats(), 1e-5, 1e-5);
}

TEST(Matmul, EmptyInnerDimGivesBetaTimesC) {
  std::vector<float> a, b;
  Buffer c(DType::f32, {3, 4}, Floats(12, 1.5f));
  matmul(c.view(), Tensor(a.data(), DType::f32, {3, 0}), Tensor(b.data(), DType::f32, {0, 4}), {.beta = 2.f});
  EXPECT_ALL_CLOSE(c.floats(), Floats(12, 3.f), 0, 0);
}

// A 16-bit GEMM with no products: the empty operands are widened like any
// other (they once stayed f16 and sent the GEMM back to widening forever).
TEST(Matmul, EmptyInnerDimInF16AndBf16GivesTheBias) {
  for (DType dt : {DType::f16, DType::bf16}) {
    std::vector<uint16_t> x, w;
    Buffer y(dt, {3, 5}, Floats(15, NAN));
    const Floats bias_values = {1.f, 2.f, -3.f, 0.5f, 4.f};
    Buffer bias(dt, {5}, bias_values);
    linear_forward(y.view(), Tensor(x.data(), dt, {3, 0}), Tensor(w.data(), dt, {5, 0}), bias.view());
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 5; ++c) EXPECT_EQ(y.floats()[r * 5 + c], bias_values[c]) << dtype_name(dt);
  }
}

TEST(Linear, ForwardMatchesTorchF32WithAndWithoutBias) {
  for (const char* name : kLinearCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("linear_") + name + ".ref");
    Buffer y(DType::f32, rc["y"].shape, Floats(rc["y"].shape.numel(), NAN));
    linear_forward(y.view(), rc["x"].view(), rc["w"].view(), rc.has("bias") ? rc["bias"].view() : Tensor());
    EXPECT_ALL_CLOSE(y.floats(), rc["y"].floats(), 1e-5, 1e-5);
  }
}

TEST(Linear, BackwardMatchesTorchAndAccumulates) {
  uint32_t seed = 100;
  for (const char* name : kLinearCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("linear_") + name + ".ref");
    const Shape oc_shape{rc["w"].shape[0]};
    const Floats dx0 = random_floats(rc["x"].shape.numel(), seed++), dw0 = random_floats(rc["w"].shape.numel(), seed++);
    const Floats db0 = random_floats(oc_shape.numel(), seed++);
    Buffer dx(DType::f32, rc["x"].shape, dx0), dw(DType::f32, rc["w"].shape, dw0), db(DType::f32, oc_shape, db0);
    const bool has_bias = rc.has("bias");
    linear_backward(dx.view(), dw.view(), has_bias ? db.view() : Tensor(), rc["dy"].view(), rc["x"].view(),
                    rc["w"].view());
    // dx of the LM head sums 50257 products per element: the reduction tolerance.
    const double tol = std::string(name) == "lmhead" ? 1e-4 : 1e-5;
    EXPECT_ALL_CLOSE(dx.floats(), plus(dx0, rc["dx"].floats()), tol, tol);
    EXPECT_ALL_CLOSE(dw.floats(), plus(dw0, rc["dw"].floats()), 1e-5, 1e-5);
    EXPECT_ALL_CLOSE(db.floats(), has_bias ? plus(db0, rc["dbias"].floats()) : db0, 1e-5, 1e-5);
  }
}

TEST(Linear, BackwardSkipsUndefinedGradients) {
  RefCase rc("linear_bias.ref");
  const Shape oc_shape{rc["w"].shape[0]};
  Buffer db(DType::f32, oc_shape);
  linear_backward(Tensor(), Tensor(), db.view(), rc["dy"].view(), rc["x"].view(), rc["w"].view());
  EXPECT_ALL_CLOSE(db.floats(), rc["dbias"].floats(), 1e-5, 1e-5);
  Buffer dw(DType::f32, rc["w"].shape);
  linear_backward(Tensor(), dw.view(), Tensor(), rc["dy"].view(), rc["x"].view(), rc["w"].view());
  EXPECT_ALL_CLOSE(dw.floats(), rc["dw"].floats(), 1e-5, 1e-5);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  Floats x = random_floats(6, 1), w = random_floats(12, 2), bias = random_floats(4, 3);
  const Floats r = random_floats(8, 4);  // dloss/dy
  Floats y(8);
  const Tensor yt(y.data(), DType::f32, {2, 4});
  auto loss = [&] {
    linear_forward(yt, Tensor(x.data(), DType::f32, {2, 3}), Tensor(w.data(), DType::f32, {4, 3}),
                   Tensor(bias.data(), DType::f32, {4}));
    return weighted_sum(y, r);
  };
  Buffer dx(DType::f32, {2, 3}), dw(DType::f32, {4, 3}), db(DType::f32, {4});
  linear_backward(dx.view(), dw.view(), db.view(), Tensor(const_cast<float*>(r.data()), DType::f32, {2, 4}),
                  Tensor(x.data(), DType::f32, {2, 3}), Tensor(w.data(), DType::f32, {4, 3}));
  EXPECT_ALL_CLOSE(dx.floats(), test::finite_difference(loss, x, 1e-2f), 1e-3, 1e-3);
  EXPECT_ALL_CLOSE(dw.floats(), test::finite_difference(loss, w, 1e-2f), 1e-3, 1e-3);
  EXPECT_ALL_CLOSE(db.floats(), test::finite_difference(loss, bias, 1e-2f), 1e-3, 1e-3);
}

TEST(Matmul, GradientsMatchFiniteDifferencesWithTransposesAndSharedOperand) {
  // c (2, 4, 5) = 0.5 * op(a) @ op(b): a (2, 3, 4) read transposed, b (5, 3) shared and transposed.
  Floats a = random_floats(24, 5), b = random_floats(15, 6);
  const Floats r = random_floats(40, 7);
  const MatmulOpts o{.trans_a = true, .trans_b = true, .alpha = 0.5f};
  Floats c(40);
  const Tensor ct(c.data(), DType::f32, {2, 4, 5});
  auto loss = [&] {
    matmul(ct, Tensor(a.data(), DType::f32, {2, 3, 4}), Tensor(b.data(), DType::f32, {5, 3}), o);
    return weighted_sum(c, r);
  };
  Buffer da(DType::f32, {2, 3, 4}), db(DType::f32, {5, 3});
  matmul_backward(da.view(), db.view(), Tensor(const_cast<float*>(r.data()), DType::f32, {2, 4, 5}),
                  Tensor(a.data(), DType::f32, {2, 3, 4}), Tensor(b.data(), DType::f32, {5, 3}), o);
  EXPECT_ALL_CLOSE(da.floats(), test::finite_difference(loss, a, 1e-2f), 1e-3, 1e-3);
  EXPECT_ALL_CLOSE(db.floats(), test::finite_difference(loss, b, 1e-2f), 1e-3, 1e-3);
}

// Tolerance of a half-path (bf16 or f16) result against the f32 path on
// rounded inputs: f32 outputs differ only in summation order; a half output
// adds one rounding (bf16 2^-8 with margin, f16 4x tighter: 1e-3).
double half_rtol(DType half, DType out) {
  if (out == DType::f32) return 1e-5;
  return half == DType::bf16 ? 4e-3 : 4e-3 * kF16Tighter;
}

void expect_matmul_forward_half_matches_f32(DType half) {
  for (const char* name : {"nn", "nt", "tn", "tt", "alpha_beta", "shared_b", "shared_a_tt", "batched"}) {
    RefCase rc(std::string("matmul_") + name + ".ref");
    const MatmulOpts o = opts_of(rc);
    const Floats a = rounded_to(half, rc["a"].floats()), b = rounded_to(half, rc["b"].floats());
    const Floats c0 = rounded_to(half, rc["c0"].floats());
    Buffer a32(DType::f32, rc["a"].shape, a), b32(DType::f32, rc["b"].shape, b), c32(DType::f32, rc["c0"].shape, c0);
    matmul(c32.view(), a32.view(), b32.view(), o);
    Buffer a16(half, rc["a"].shape, a), b16(half, rc["b"].shape, b);
    for (DType out : {DType::f32, half}) {
      SCOPED_TRACE(std::string(name) + " c=" + std::string(dtype_name(out)));
      Buffer c(out, rc["c0"].shape, c0);
      matmul(c.view(), a16.view(), b16.view(), o);
      EXPECT_ALL_CLOSE(c.floats(), c32.floats(), half_rtol(half, out), 1e-5);
    }
  }
}

void expect_matmul_backward_half_matches_f32(DType half) {
  for (const char* name : {"nn", "nt", "tn", "tt", "alpha_beta", "shared_b", "shared_a", "batched_tt"}) {
    RefCase rc(std::string("matmul_") + name + ".ref");
    const MatmulOpts o = opts_of(rc);
    const Floats a = rounded_to(half, rc["a"].floats()), b = rounded_to(half, rc["b"].floats());
    const Floats dc = rounded_to(half, rc["dc"].floats());
    const Floats da0 = rounded_to(half, random_floats(a.size(), 11)), db0 = rounded_to(half, random_floats(b.size(), 12));
    const Shape as = rc["a"].shape, bs = rc["b"].shape, cs = rc["dc"].shape;
    Buffer a32(DType::f32, as, a), b32(DType::f32, bs, b), dc32(DType::f32, cs, dc);
    Buffer da32(DType::f32, as, da0), db32(DType::f32, bs, db0);
    matmul_backward(da32.view(), db32.view(), dc32.view(), a32.view(), b32.view(), o);
    Buffer a16(half, as, a), b16(half, bs, b);
    // dc in f32 (an f32 c from half inputs): rounded to bf16 by the kernel for
    // bf16 operands, used as is for f16 (f32 GEMM); it holds half values here.
    for (DType dc_dtype : {half, DType::f32}) {
      for (DType grad : {DType::f32, half}) {
        SCOPED_TRACE(concat(name, " dc=", dtype_name(dc_dtype), " grads=", dtype_name(grad)));
        Buffer dct(dc_dtype, cs, dc), da(grad, as, da0), db(grad, bs, db0);
        matmul_backward(da.view(), db.view(), dct.view(), a16.view(), b16.view(), o);
        EXPECT_ALL_CLOSE(da.floats(), da32.floats(), half_rtol(half, grad), 1e-5);
        EXPECT_ALL_CLOSE(db.floats(), db32.floats(), half_rtol(half, grad), 1e-5);
      }
    }
  }
}

void expect_linear_half_matches_f32(DType half) {
  for (const char* name : {"bias", "row1"}) {
    RefCase rc(std::string("linear_") + name + ".ref");
    const Shape xs = rc["x"].shape, ws = rc["w"].shape, ys = rc["y"].shape, bs{ws[0]};
    const Floats x = rounded_to(half, rc["x"].floats()), w = rounded_to(half, rc["w"].floats());
    const Floats bias = rounded_to(half, rc["bias"].floats()), dy = rounded_to(half, rc["dy"].floats());
    Buffer x32(DType::f32, xs, x), w32(DType::f32, ws, w), b32(DType::f32, bs, bias), dy32(DType::f32, ys, dy);
    Buffer y32(DType::f32, ys), dx32(DType::f32, xs), dw32(DType::f32, ws), db32(DType::f32, bs);
    linear_forward(y32.view(), x32.view(), w32.view(), b32.view());
    linear_backward(dx32.view(), dw32.view(), db32.view(), dy32.view(), x32.view(), w32.view());
    Buffer x16(half, xs, x), w16(half, ws, w), dy16(half, ys, dy);
    for (DType out : {DType::f32, half}) {
      SCOPED_TRACE(concat(name, " y, bias and gradients in ", dtype_name(out)));
      Buffer y(out, ys), b(out, bs, bias);
      linear_forward(y.view(), x16.view(), w16.view(), b.view());
      EXPECT_ALL_CLOSE(y.floats(), y32.floats(), half_rtol(half, out), 1e-5);
      Buffer dx(out, xs), dw(out, ws), db(out, bs);
      linear_backward(dx.view(), dw.view(), db.view(), dy16.view(), x16.view(), w16.view());
      EXPECT_ALL_CLOSE(dx.floats(), dx32.floats(), half_rtol(half, out), 1e-5);
      EXPECT_ALL_CLOSE(dw.floats(), dw32.floats(), half_rtol(half, out), 1e-5);
      EXPECT_ALL_CLOSE(db.floats(), db32.floats(), half_rtol(half, out), 1e-5);
    }
    // The model's other combination: f32 dy (a residual-stream gradient) and
    // f32 gradients of half x, w.
    Buffer dx(DType::f32, xs), dw(DType::f32, ws), db(DType::f32, bs);
    linear_backward(dx.view(), dw.view(), db.view(), dy32.view(), x16.view(), w16.view());
    EXPECT_ALL_CLOSE(dx.floats(), dx32.floats(), 1e-5, 1e-5);
    EXPECT_ALL_CLOSE(dw.floats(), dw32.floats(), 1e-5, 1e-5);
    EXPECT_ALL_CLOSE(db.floats(), db32.floats(), 1e-5, 1e-5);
  }
}

// An f32 dc with bf16 a, b is rounded to bf16 for the GEMM at every level
// (ops.h), with or without a bf16 GEMM: the gradients equal, bit for bit,
// those of a dc that already held bf16 values.
TEST(MatmulBf16, F32GradientBesideBf16OperandsIsRoundedAtEveryLevel) {
  for (const char* name : {"nn", "tt", "batched_tt"}) {
    RefCase rc(std::string("matmul_") + name + ".ref");
    const MatmulOpts o = opts_of(rc);
    const Shape as = rc["a"].shape, bs = rc["b"].shape, cs = rc["dc"].shape;
    const Floats dc = rc["dc"].floats();  // not bf16 values
    Buffer a16(DType::bf16, as, rc["a"].floats()), b16(DType::bf16, bs, rc["b"].floats());
    Buffer raw(DType::f32, cs, dc), pre(DType::f32, cs, rounded_to(DType::bf16, dc));
    Buffer da1(DType::f32, as), db1(DType::f32, bs), da2(DType::f32, as), db2(DType::f32, bs);
    matmul_backward(da1.view(), db1.view(), raw.view(), a16.view(), b16.view(), o);
    matmul_backward(da2.view(), db2.view(), pre.view(), a16.view(), b16.view(), o);
    EXPECT_EQ(da1.floats(), da2.floats()) << name;
    EXPECT_EQ(db1.floats(), db2.floats()) << name;
  }
}

TEST(MatmulBf16, ForwardMatchesF32OnRoundedInputs) { expect_matmul_forward_half_matches_f32(DType::bf16); }
TEST(MatmulBf16, BackwardMatchesF32OnRoundedInputs) { expect_matmul_backward_half_matches_f32(DType::bf16); }
TEST(LinearBf16, ForwardAndBackwardMatchF32OnRoundedInputs) { expect_linear_half_matches_f32(DType::bf16); }
TEST(MatmulF16, ForwardMatchesF32OnRoundedInputs) { expect_matmul_forward_half_matches_f32(DType::f16); }
TEST(MatmulF16, BackwardMatchesF32OnRoundedInputs) { expect_matmul_backward_half_matches_f32(DType::f16); }
TEST(LinearF16, ForwardAndBackwardMatchF32OnRoundedInputs) { expect_linear_half_matches_f32(DType::f16); }



// c = a @ b in double, row-major (M, K) @ (K, N).
Floats naive_matmul(const Floats& a, const Floats& b, int64_t m, int64_t n, int64_t k) {
  Floats c(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[p * n + j];
      c[i * n + j] = static_cast<float>(s);
    }
  return c;
}

TEST(Matmul, ConcurrentCallsFromManyThreadsAreCorrect) {
  // Each thread runs its own shapes (creating primitives) and shared ones
  // (reusing them) at the same time as the others.
  const int64_t shapes[][3] = {{17, 9, 33}, {8, 8, 8}, {31, 5, 64}, {4, 40, 12}};
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 20; ++iter) {
        const auto& s = shapes[(t + iter) % 4];
        const int64_t m = s[0] + (iter % 2) * t, n = s[1], k = s[2];
        const Floats a = random_floats(m * k, 1000 * t + iter), b = random_floats(k * n, 2000 * t + iter);
        Floats c(m * n);
        matmul(Tensor(c.data(), DType::f32, {m, n}), Tensor(const_cast<float*>(a.data()), DType::f32, {m, k}),
               Tensor(const_cast<float*>(b.data()), DType::f32, {k, n}));
        if (!all_close(c, naive_matmul(a, b, m, n, k), 1e-5, 1e-5)) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

TEST(MatmulMisuse, ErrorsNameTheOpAndShapes) {
  std::vector<float> f(4096);
  std::vector<bf16> h(4096);
  auto t = [&](Shape s) { return Tensor(f.data(), DType::f32, s); };
  auto t2 = [&](Shape s) { return Tensor(f.data() + 2048, DType::f32, s); };
  Floats cbuf(256);
  const Tensor c(cbuf.data(), DType::f32, {5, 3});
  expect_error([&] { matmul(c, t({5, 7}), t2({6, 3})); }, {"matmul: ", "(5, 7)", "(6, 3)", "inner dims"});
  expect_error([&] { matmul(c, t({5, 7}), Tensor(h.data(), DType::bf16, {7, 3})); },
               {"matmul: ", "share a dtype", "bf16(7, 3)"});
  expect_error([&] { matmul(Tensor(h.data(), DType::bf16, {5, 3}), t({5, 7}), t2({7, 3})); },
               {"matmul: ", "c has dtype bf16", "f32(5, 7)"});
  expect_error([&] { matmul(c, t({5, 7}), t2({7, 4})); }, {"matmul: ", "c must end in (5, 4)", "f32(5, 3)"});
  expect_error([&] { matmul(Tensor(cbuf.data(), DType::f32, {3, 5, 4}), t({3, 5, 7}), t2({2, 7, 4})); },
               {"matmul: ", "batch dims", "f32(2, 7, 4)"});
  expect_error([&] { matmul(c, t({5, 8}).slice(1, 0, 7), t2({7, 3})); }, {"matmul: ", "contiguous"});
  expect_error([&] { matmul(c, Tensor(cbuf.data(), DType::f32, {5, 7}), t2({7, 3})); }, {"matmul: ", "overlap"});
  expect_error([&] { matmul_backward(t({5, 7}), Tensor(), Tensor(cbuf.data(), DType::f32, {5, 4}), t({5, 7}), t2({7, 3})); },
               {"matmul_backward: ", "dc must end in (5, 3)"});
}

// linear_gelu_forward on the CPU is linear_forward then gelu_forward: their
// bits, in every float dtype the GEMM takes, with and without a bias.
TEST(LinearGelu, EqualsTheLinearThenTheGeluBitForBit) {
  std::vector<DType> dtypes = {DType::f32, DType::f16};
  if (bf16_matmul_unsupported_reason().empty()) dtypes.push_back(DType::bf16);
  Floats xv(6 * 96), wv(200 * 96), bv(200);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i)) * 2.f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::cos(0.11f * static_cast<float>(i)) * 0.2f;
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = 0.01f * static_cast<float>(i) - 1.f;
  for (DType dt : dtypes)
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(concat(dtype_name(dt), with_bias ? " with bias" : ""));
      Buffer x(dt, {2, 3, 96}, xv), w(dt, {200, 96}, wv), b(dt, {200}, bv);
      Buffer pre1(dt, {2, 3, 200}), y1(dt, {2, 3, 200}), pre2(dt, {2, 3, 200}), y2(dt, {2, 3, 200});
      const Tensor bias = with_bias ? b.view() : Tensor();
      linear_forward(pre1.view(), x.view(), w.view(), bias);
      gelu_forward(y1.view(), pre1.view());
      linear_gelu_forward(y2.view(), pre2.view(), x.view(), w.view(), bias);
      EXPECT_EQ(pre2.bytes, pre1.bytes);
      EXPECT_EQ(y2.bytes, y1.bytes);
    }
}

TEST(LinearGelu, MisuseThrowsNamingTheOp) {
  std::vector<float> f(8192), g(8192), k(8192);
  const Tensor x(f.data(), DType::f32, {4, 100}), w(f.data() + 400, DType::f32, {32, 100});
  const Tensor pre(g.data(), DType::f32, {4, 32}), y(k.data(), DType::f32, {4, 32});
  expect_error([&] { linear_gelu_forward(y, pre, x, Tensor(f.data() + 400, DType::f32, {32, 96}), Tensor()); },
               {"linear_gelu_forward: x has 100 features but w expects 96"});
  expect_error([&] { linear_gelu_forward(Tensor(k.data(), DType::f32, {4, 31}), pre, x, w, Tensor()); },
               {"linear_gelu_forward: ", "y", "(4, 31)"});
  expect_error([&] { linear_gelu_forward(pre, pre, x, w, Tensor()); },
               {"linear_gelu_forward: ", "y must not overlap pre"});
}

TEST(LinearMisuse, ErrorsNameTheOpAndShapes) {
  std::vector<float> f(8192), g(8192);
  std::vector<bf16> h(4096);
  const Tensor x(f.data(), DType::f32, {4, 100}), w(f.data() + 400, DType::f32, {32, 96});
  const Tensor y(g.data(), DType::f32, {4, 32});
  expect_error([&] { linear_forward(y, x, w, Tensor()); },
               {"linear_forward: x has 100 features but w expects 96 (x=f32(4, 100), w=f32(32, 96))"});
  const Tensor w100(f.data() + 400, DType::f32, {32, 100});
  expect_error([&] { linear_forward(y, x, w100, Tensor(f.data() + 4000, DType::f32, {31})); },
               {"linear_forward: ", "bias must have shape (32,)", "bias=f32(31,)"});
  expect_error([&] { linear_forward(y, x, Tensor(h.data(), DType::bf16, {32, 100}), Tensor()); },
               {"linear_forward: ", "share a dtype", "w=bf16(32, 100)"});
  expect_error([&] { linear_forward(Tensor(g.data(), DType::f32, {4, 31}), x, w100, Tensor()); },
               {"linear_forward: ", "y must have shape (4, 32)"});
  expect_error([&] { linear_backward(Tensor(), Tensor(h.data(), DType::bf16, {32, 100}), Tensor(), y, x, w100); },
               {"linear_backward: ", "dw has dtype bf16, expected f32"});
  expect_error([&] { linear_backward(Tensor(), Tensor(), Tensor(g.data() + 1000, DType::f32, {33}), y, x, w100); },
               {"linear_backward: ", "dbias must have shape (32,)"});
}

}  // namespace
}  // namespace loom::kernels
