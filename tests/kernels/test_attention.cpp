// attention_forward / attention_backward (ops.h) against PyTorch float64
// (tests/ref/ref_attention.py), with strided views, finite differences, the
// bf16 and f16 paths, determinism across thread counts and misuse.
//
// Tolerances, f32 vs PyTorch float64: every output is a reduction (over HS
// for the scores, over up to Tk keys for out, dq, dk, dv), so DESIGN.md §6's
// reduction tolerance applies: rtol 1e-4, with atol 1e-5 for elements that
// cancel to near zero (inputs and outputs are O(1)). lse: rtol 1e-5.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/threads.h"
#include "kernels/half_util.h"
#include "kernels/ops.h"

namespace loom::test {
namespace {

using kernels::attention_backward;
using kernels::attention_forward;

constexpr double kRtol = 1e-4, kAtol = 1e-5;
constexpr double kLseRtol = 1e-5;

// An owned buffer and a contiguous view of it.
template <typename T = float>
struct Buf {
  std::vector<T> data;
  Shape shape;
  explicit Buf(Shape s, std::vector<T> d = {}) : data(std::move(d)), shape(s) { data.resize(s.numel()); }
  Tensor t() { return Tensor(data.data(), dtype_of<T>::value, shape); }
};

std::vector<float> iota_pattern(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * std::sin(0.7f * static_cast<float>(i));
  return v;
}

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward then backward on (possibly strided) f32 views q, k, v with the
// case's dout. Gradients start from `prefill` (a known pattern, to check
// accumulation) unless zero_grads.
Outputs run_f32(RefCase& c, const Tensor& q, const Tensor& k, const Tensor& v, bool zero_grads = false) {
  const Shape qs = q.shape(), ks = k.shape();
  const int64_t q_pos = c.has("q_pos") ? static_cast<int64_t>(c["q_pos"].floats()[0]) : kernels::kQueriesLast;
  Buf out(qs), lse({qs[0], qs[2], qs[1]});
  attention_forward(out.t(), lse.t(), q, k, v, q_pos);
  Buf dq(qs, zero_grads ? std::vector<float>{} : iota_pattern(qs.numel()));
  Buf dk(ks, zero_grads ? std::vector<float>{} : iota_pattern(ks.numel()));
  Buf dv(ks, zero_grads ? std::vector<float>{} : iota_pattern(ks.numel()));
  attention_backward(dq.t(), dk.t(), dv.t(), c["dout"].view(), q, k, v, out.t(), lse.t(), q_pos);
  return {out.data, lse.data, dq.data, dk.data, dv.data};
}

void expect_matches_ref(RefCase& c, const Outputs& o, bool prefilled) {
  auto expected_grad = [&](const char* name) {
    std::vector<float> e = c[name].floats();
    return prefilled ? plus(e, iota_pattern(e.size())) : e;
  };
  EXPECT_ALL_CLOSE(o.out, c["out"].floats(), kRtol, kAtol) << "out";
  EXPECT_ALL_CLOSE(o.lse, c["lse"].floats(), kLseRtol, kAtol) << "lse";
  EXPECT_ALL_CLOSE(o.dq, expected_grad("dq"), kRtol, kAtol) << "dq";
  EXPECT_ALL_CLOSE(o.dk, expected_grad("dk"), kRtol, kAtol) << "dk";
  EXPECT_ALL_CLOSE(o.dv, expected_grad("dv"), kRtol, kAtol) << "dv";
}

// ---- against PyTorch -------------------------------------------------------

class AttentionVsTorch : public ::testing::TestWithParam<const char*> {};

// Forward writes out and lse; backward adds the gradients onto a prefilled
// pattern (ops.h: backward accumulates).
TEST_P(AttentionVsTorch, ForwardMatchesAndBackwardAccumulatesGradientsF32) {
  RefCase c(std::string(GetParam()) + ".ref");
  const Outputs o = run_f32(c, c["q"].view(), c["k"].view(), c["v"].view());
  expect_matches_ref(c, o, true);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionVsTorch,
                         ::testing::Values("attention_basic", "attention_gqa", "attention_nh12", "attention_t1",
                                           "attention_decode1", "attention_decode4", "attention_t130",
                                           "attention_prefix", "attention_past_block", "attention_past_block_edge",
                                           "attention_more_queries_than_keys", "attention_mid_offset",
                                           "attention_keys_run_out"),
                         [](const auto& test_info) { return std::string(test_info.param).substr(10); });

// k, v as the first Tk positions of a (B, Tmax, NKV, HS) cache whose later
// positions are NaN: strided along B, and nothing past Tk is read.
void expect_cache_view_matches(const char* file) {
  RefCase c(file);
  const Shape ks = c["k"].shape;
  const int64_t B = ks[0], Tk = ks[1], row = ks[2] * ks[3], Tmax = Tk + 7;
  Buf kc({B, Tmax, ks[2], ks[3]}, std::vector<float>(B * Tmax * row, NAN));
  Buf vc({B, Tmax, ks[2], ks[3]}, std::vector<float>(B * Tmax * row, NAN));
  const std::vector<float> k = c["k"].floats(), v = c["v"].floats();
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(k.begin() + b * Tk * row, Tk * row, kc.data.begin() + b * Tmax * row);
    std::copy_n(v.begin() + b * Tk * row, Tk * row, vc.data.begin() + b * Tmax * row);
  }
  const Outputs o = run_f32(c, c["q"].view(), kc.t().slice(1, 0, Tk), vc.t().slice(1, 0, Tk));
  expect_matches_ref(c, o, true);
}

TEST(Attention, KvCacheViewStridedAlongBatchMatchesTorch) {
  expect_cache_view_matches("attention_decode1.ref");
  expect_cache_view_matches("attention_gqa.ref");
}

// q, k, v as head slices of one fused (B, T, NH + 2 NKV, HS) projection
// output: strided along T.
TEST(Attention, FusedQkvViewsStridedAlongTMatchesTorch) {
  RefCase c("attention_gqa.ref");
  const Shape qs = c["q"].shape, ks = c["k"].shape;
  const int64_t B = qs[0], T = qs[1], NH = qs[2], NKV = ks[2], HS = qs[3], W = NH + 2 * NKV;
  Buf qkv({B, T, W, HS});
  const std::vector<float> q = c["q"].floats(), k = c["k"].floats(), v = c["v"].floats();
  for (int64_t bt = 0; bt < B * T; ++bt) {
    std::copy_n(q.begin() + bt * NH * HS, NH * HS, qkv.data.begin() + bt * W * HS);
    std::copy_n(k.begin() + bt * NKV * HS, NKV * HS, qkv.data.begin() + (bt * W + NH) * HS);
    std::copy_n(v.begin() + bt * NKV * HS, NKV * HS, qkv.data.begin() + (bt * W + NH + NKV) * HS);
  }
  const Tensor all = qkv.t();
  const Outputs o = run_f32(c, all.slice(2, 0, NH), all.slice(2, NH, NKV), all.slice(2, NH + NKV, NKV));
  expect_matches_ref(c, o, true);
}

// lse may be undefined in inference; an undefined gradient is skipped.
TEST(Attention, ForwardWithoutLseAndBackwardWithOnlyDkMatchTorch) {
  RefCase c("attention_gqa.ref");
  Buf out(c["q"].shape), lse({c["q"].shape[0], c["q"].shape[2], c["q"].shape[1]});
  attention_forward(out.t(), Tensor(), c["q"].view(), c["k"].view(), c["v"].view());
  EXPECT_ALL_CLOSE(out.data, c["out"].floats(), kRtol, kAtol);
  attention_forward(out.t(), lse.t(), c["q"].view(), c["k"].view(), c["v"].view());
  Buf dk(c["k"].shape);
  attention_backward(Tensor(), dk.t(), Tensor(), c["dout"].view(), c["q"].view(), c["k"].view(), c["v"].view(),
                     out.t(), lse.t());
  EXPECT_ALL_CLOSE(dk.data, c["dk"].floats(), kRtol, kAtol);
}

// ---- finite differences ----------------------------------------------------

// loss = sum(out * w), so d loss / d out = w is the backward's dout. f32
// central differences with h = 1e-2: truncation error O(h^2) ~ 1e-4 relative,
// f32 rounding of the loss (~1e-6) / 2h ~ 5e-5 absolute; hence rtol 1e-2,
// atol 1e-3. One thread: ~800 tiny forwards, where fork/join would dominate.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  const int saved = num_threads();
  set_num_threads(1);
  const int64_t B = 1, Tq = 5, Tk = 7, NH = 4, NKV = 2, HS = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](Shape s) {
    Buf b(s);
    for (float& x : b.data) x = normal(rng);
    return b;
  };
  Buf q = random({B, Tq, NH, HS}), k = random({B, Tk, NKV, HS}), v = random({B, Tk, NKV, HS});
  Buf w = random({B, Tq, NH, HS}), out({B, Tq, NH, HS}), lse({B, NH, Tq});
  auto loss = [&] {
    attention_forward(out.t(), lse.t(), q.t(), k.t(), v.t());
    return weighted_sum(out.data, w.data);
  };
  loss();
  Buf dq(q.shape), dk(k.shape), dv(v.shape);
  attention_backward(dq.t(), dk.t(), dv.t(), w.t(), q.t(), k.t(), v.t(), out.t(), lse.t());
  for (auto [x, dx, name] : {std::tuple{&q, &dq, "dq"}, std::tuple{&k, &dk, "dk"}, std::tuple{&v, &dv, "dv"}}) {
    const std::vector<float> fd = finite_difference(loss, x->data, 1e-2f);
    EXPECT_ALL_CLOSE(dx->data, fd, 1e-2, 1e-3) << name;
  }
  set_num_threads(saved);
}

// ---- bf16 ------------------------------------------------------------------

// bf16 storage vs the f32 path on the same (bf16-rounded) inputs. Arithmetic
// is f32 in both, so lse is bitwise equal and out differs by its bf16
// rounding (<= 2^-9 relative): rtol 1e-2, atol 1e-2. The gradients add the
// rounding of out inside D = rowsum(dout * out), which P and K spread over a
// whole row, then their own rounding: rtol 2e-2, atol 2e-2 (values are O(1);
// the worst seen is 7.5e-3 absolute on dq of magnitude 0.2). f16: the same
// times 1/4 (out 2.5e-3, gradients 5e-3).
// H = bf16 or f16; k scales the bf16 tolerances (kF16Tighter for f16: f16
// rounds to 2^-12 relative, 8x finer than bf16).
template <typename H>
void expect_half_matches_f32_on_rounded_inputs(double k) {
  RefCase c("attention_t130.ref");
  auto rounded = [&](const char* name) {
    const std::vector<H> h = to_half_vec<H>(c[name].floats());
    return std::pair{Buf<float>(c[name].shape, from_half_vec(h)), Buf<H>(c[name].shape, h)};
  };
  auto [q, qh] = rounded("q");
  auto [k_, kh] = rounded("k");
  auto [v, vh] = rounded("v");
  auto [dout, douth] = rounded("dout");
  const Shape qs = q.shape, ks = k_.shape, ls{qs[0], qs[2], qs[1]};

  Buf out(qs), lse(ls), dq(qs), dk(ks), dv(ks);
  attention_forward(out.t(), lse.t(), q.t(), k_.t(), v.t());
  attention_backward(dq.t(), dk.t(), dv.t(), dout.t(), q.t(), k_.t(), v.t(), out.t(), lse.t());

  Buf<H> outh(qs), dqh(qs), dkh(ks), dvh(ks);
  Buf lseh(ls);
  attention_forward(outh.t(), lseh.t(), qh.t(), kh.t(), vh.t());
  attention_backward(dqh.t(), dkh.t(), dvh.t(), douth.t(), qh.t(), kh.t(), vh.t(), outh.t(), lseh.t());

  EXPECT_EQ(lseh.data, lse.data);
  EXPECT_ALL_CLOSE(to_floats(outh.t()), out.data, k * 1e-2, k * 1e-2) << "out";
  EXPECT_ALL_CLOSE(to_floats(dqh.t()), dq.data, k * 2e-2, k * 2e-2) << "dq";
  EXPECT_ALL_CLOSE(to_floats(dkh.t()), dk.data, k * 2e-2, k * 2e-2) << "dk";
  EXPECT_ALL_CLOSE(to_floats(dvh.t()), dv.data, k * 2e-2, k * 2e-2) << "dv";

  // f32 gradients of H operands (ops.h allows either): no rounding of their own.
  Buf dqf(qs), dkf(ks), dvf(ks);
  attention_backward(dqf.t(), dkf.t(), dvf.t(), douth.t(), qh.t(), kh.t(), vh.t(), outh.t(), lseh.t());
  EXPECT_ALL_CLOSE(dqf.data, dq.data, k * 2e-2, k * 2e-2) << "dq f32";
  EXPECT_ALL_CLOSE(dkf.data, dk.data, k * 2e-2, k * 2e-2) << "dk f32";
  EXPECT_ALL_CLOSE(dvf.data, dv.data, k * 2e-2, k * 2e-2) << "dv f32";
  // The model's combination: f32 dout (the f32 gradient of out) and f32 gradients.
  Buf dqm(qs), dkm(ks), dvm(ks);
  attention_backward(dqm.t(), dkm.t(), dvm.t(), dout.t(), qh.t(), kh.t(), vh.t(), outh.t(), lseh.t());
  EXPECT_EQ(dqm.data, dqf.data) << "dout holds the same values in f32 and H";
  EXPECT_EQ(dkm.data, dkf.data);
  EXPECT_EQ(dvm.data, dvf.data);
}

TEST(Attention, Bf16MatchesF32OnRoundedInputs) { expect_half_matches_f32_on_rounded_inputs<bf16>(1.0); }
TEST(Attention, F16MatchesF32OnRoundedInputs) { expect_half_matches_f32_on_rounded_inputs<f16>(kF16Tighter); }

// ---- determinism -----------------------------------------------------------

// Each backward task owns a (b, kv head) and sums in a fixed order, so the
// thread count cannot change a bit (DESIGN.md §6: same config twice is
// bitwise identical).
TEST(Attention, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  RefCase c("attention_t130.ref");
  const int saved = num_threads();
  std::vector<Outputs> runs;
  for (int n : {1, 2, 3}) {
    set_num_threads(n);
    runs.push_back(run_f32(c, c["q"].view(), c["k"].view(), c["v"].view(), true));
  }
  set_num_threads(saved);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].out, runs[0].out);
    EXPECT_EQ(runs[i].lse, runs[0].lse);
    EXPECT_EQ(runs[i].dq, runs[0].dq);
    EXPECT_EQ(runs[i].dk, runs[0].dk);
    EXPECT_EQ(runs[i].dv, runs[0].dv);
  }
}

// ---- the ring merge ----------------------------------------------------------

// Ring attention's step (attention_merge, ops.h): 8 queries at positions
// 8..15 over 16 keys, as two blocks of 8 keys, merged by log-sum-exp, equal
// the attention over all 16 keys at once. Block 0: every query sees all its
// keys (q_pos 8); block 1: query t sees keys 8..8+t (q_pos 0). A running
// result with no keys yet (lse -inf) takes the block it meets whole.
TEST(Attention, MergeOfTwoKeyBlocksEqualsAttentionOverAllKeys) {
  constexpr int64_t B = 2, Tq = 8, Tk = 16, NH = 4, NKV = 2, HS = 16;
  Buf<> q({B, Tq, NH, HS}, iota_pattern(B * Tq * NH * HS)), k({B, Tk, NKV, HS}), v({B, Tk, NKV, HS});
  for (size_t i = 0; i < k.data.size(); ++i) {
    k.data[i] = 0.3f * std::cos(0.37f * static_cast<float>(i));
    v.data[i] = 0.5f * std::sin(0.11f * static_cast<float>(i) + 1.f);
  }
  Buf<> whole({B, Tq, NH, HS}), whole_lse({B, NH, Tq});
  attention_forward(whole.t(), whole_lse.t(), q.t(), k.t(), v.t(), Tk - Tq);
  Buf<> acc({B, Tq, NH, HS}), acc_lse({B, NH, Tq}, std::vector<float>(B * NH * Tq, -INFINITY));
  for (int64_t blk = 0; blk < 2; ++blk) {
    Buf<> out({B, Tq, NH, HS}), lse({B, NH, Tq});
    attention_forward(out.t(), lse.t(), q.t(), k.t().slice(1, blk * 8, 8), v.t().slice(1, blk * 8, 8),
                      blk == 0 ? 8 : 0);
    kernels::attention_merge(acc.t(), acc_lse.t(), out.t(), lse.t());
    if (blk == 0) {
      EXPECT_EQ(acc.data, out.data) << "the first block, merged into nothing, is taken whole";
      EXPECT_EQ(acc_lse.data, lse.data);
    }
  }
  EXPECT_ALL_CLOSE(acc.data, whole.data, kRtol, kAtol);
  EXPECT_ALL_CLOSE(acc_lse.data, whole_lse.data, kLseRtol, 0.0);
}

TEST(Attention, MergeRejectsMismatchedShapesAndDtypes) {
  Buf<> acc({1, 2, 2, 4}), acc_lse({1, 2, 2}), out({1, 2, 2, 4}), lse({1, 2, 2}), wrong({1, 2, 3});
  test::expect_error([&] { kernels::attention_merge(acc.t(), acc_lse.t(), out.t(), wrong.t()); },
                     {"attention_merge", "lse"});
  Buf<bf16> half({1, 2, 2, 4});
  test::expect_error([&] { kernels::attention_merge(acc.t(), acc_lse.t(), half.t(), lse.t()); },
                     {"attention_merge", "out", "f32"});
}

// ---- misuse ------------------------------------------------------------------

struct Misuse {
  Buf<> q, k, v, out, lse;
  Misuse(Shape qs, Shape ks) : q(qs), k(ks), v(ks), out(qs), lse({qs[0], qs[2], qs[1]}) {}
  void forward() { attention_forward(out.t(), lse.t(), q.t(), k.t(), v.t()); }
};

TEST(Attention, RejectsHeadsNotAMultipleOfKvHeads) {
  Misuse m({1, 4, 6, 8}, {1, 4, 4, 8});
  expect_error([&] { m.forward(); }, {"attention_forward", "6 heads", "4 kv heads", "q=f32(1, 4, 6, 8)"});
}

TEST(Attention, RejectsHeadSizeMismatch) {
  Misuse m({1, 4, 2, 8}, {1, 4, 2, 16});
  expect_error([&] { m.forward(); }, {"attention_forward", "head size 8", "k=f32(1, 4, 2, 16)"});
}

TEST(Attention, RejectsFewerKeysThanQueries) {
  Misuse m({1, 5, 2, 8}, {1, 3, 2, 8});
  expect_error([&] { m.forward(); }, {"attention_forward", "3 positions", "5 queries", "k=f32(1, 3, 2, 8)"});
}

TEST(Attention, RejectsANegativeFirstQueryPosition) {
  Misuse m({1, 4, 2, 8}, {1, 4, 2, 8});
  expect_error([&] { kernels::attention_forward(m.out.t(), m.lse.t(), m.q.t(), m.k.t(), m.v.t(), -2); },
               {"attention_forward", "q_pos = -2", "at least 0"});
}

TEST(Attention, RejectsMixedDtypesAndBadOutputShapes) {
  Misuse m({1, 4, 2, 8}, {1, 4, 2, 8});
  Buf<bf16> kh({1, 4, 2, 8});
  expect_error([&] { attention_forward(m.out.t(), m.lse.t(), m.q.t(), kh.t(), m.v.t()); },
               {"attention_forward", "k has dtype bf16", "expected f32"});
  Buf lse_bad({1, 4, 2});
  expect_error([&] { attention_forward(m.out.t(), lse_bad.t(), m.q.t(), m.k.t(), m.v.t()); },
               {"attention_forward", "lse must have shape (1, 2, 4)", "lse=f32(1, 4, 2)"});
}

// A slice along HS leaves heads HS_full apart: rows of heads not contiguous.
TEST(Attention, RejectsHeadRowsThatAreNotContiguous) {
  Misuse m({1, 4, 2, 8}, {1, 4, 2, 8});
  Buf wide({1, 4, 2, 16});
  const Tensor q = wide.t().slice(3, 0, 8);
  expect_error([&] { attention_forward(m.out.t(), m.lse.t(), q, m.k.t(), m.v.t()); },
               {"attention_forward", "q's rows of heads must be contiguous", "(8, 1), got (16, 1)"});
}

TEST(Attention, BackwardRejectsMissingLseAndBadGradientShapes) {
  Misuse m({1, 4, 2, 8}, {1, 4, 2, 8});
  m.forward();
  Buf dout(m.q.shape), dq(m.q.shape), dk_bad({1, 4, 1, 8});
  expect_error(
      [&] { attention_backward(dq.t(), Tensor(), Tensor(), dout.t(), m.q.t(), m.k.t(), m.v.t(), m.out.t(), Tensor()); },
      {"attention_backward", "lse is required"});
  expect_error(
      [&] {
        attention_backward(dq.t(), dk_bad.t(), Tensor(), dout.t(), m.q.t(), m.k.t(), m.v.t(), m.out.t(), m.lse.t());
      },
      {"attention_backward", "dk and k must have the same shape", "dk=f32(1, 4, 1, 8)"});
}

}  // namespace
}  // namespace loom::test
