// The ops that replace host loops above the kernels (ops.h): copy, arange,
// find_id_outside, and the vocab-parallel loss's combine, mean and count.
// Pure data movement is checked exactly against the values it must move;
// the loss pieces bit for bit against the host loops they replace in
// model.cpp and parallel/tp.cpp. (Their PyTorch check is the vocab-parallel
// cross-entropy of test_cross_entropy.cpp, which runs through them.)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace loom::test;

template <typename T>
Tensor view_of(std::vector<T>& v, DType dtype, Shape s) {
  return Tensor(v.data(), dtype, s);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---- copy ----

TEST(Copy, ContiguousCopiesEveryByteOfEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    const size_t n = 5 * 7 * dtype_size(dt);
    std::vector<unsigned char> src(n), dst(n, 0xab);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
    copy(Tensor(dst.data(), dt, {5, 7}), Tensor(src.data(), dt, {5, 7}));
    EXPECT_EQ(dst, src) << dtype_name(dt);
  }
}

TEST(Copy, StridedViewsMoveExactlyTheirElementsAndNothingElse) {
  // src (4, 6) columns [2, 5) -> dst (5, 4) rows [1, 5), columns [1, 4)
  std::vector<int32_t> src(24), dst(20, -1);
  for (int i = 0; i < 24; ++i) src[i] = i;
  copy(view_of(dst, DType::i32, {5, 4}).slice(0, 1, 4).slice(1, 1, 3), view_of(src, DType::i32, {4, 6}).slice(1, 2, 3));
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 4; ++c) {
      const bool inside = r >= 1 && c >= 1;
      EXPECT_EQ(dst[r * 4 + c], inside ? (r - 1) * 6 + (c - 1) + 2 : -1) << "dst[" << r << ", " << c << "]";
    }
  }
}

TEST(Copy, ThreeDimViewWithStridedMiddleDim) {
  // Every other pair of a (3, 4, 2) tensor: (3, 4, 1) with strides (8, 2, 1), into a contiguous (3, 4, 1).
  Floats src(24), dst(12, -1.f);
  for (int i = 0; i < 24; ++i) src[i] = static_cast<float>(i) + 0.5f;
  copy(f32_view(dst, {3, 4, 1}), f32_view(src, {3, 4, 2}).slice(2, 1, 1));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(dst[i], src[2 * i + 1]) << i;
}

TEST(Copy, OntoItselfChangesNothingAndEmptyIsANoOp) {
  Floats x = {1.f, 2.f, 3.f};
  copy(f32_view(x, {3}), f32_view(x, {3}));
  EXPECT_EQ(x, (Floats{1.f, 2.f, 3.f}));
  copy(Tensor(x.data(), DType::f32, {0}), Tensor(x.data() + 1, DType::f32, {0}));
}

TEST(Copy, MisuseThrowsNamingTheOpAndOperands) {
  Floats a(8), b(8);
  std::vector<bf16> h(8);
  expect_error([&] { copy(f32_view(a, {8}), bf16_view(h, {8})); }, {"copy: dst has dtype f32 but src has bf16"});
  expect_error([&] { copy(f32_view(a, {2, 4}), f32_view(b, {4, 2})); },
               {"copy: dst and src must have the same shape", "dst=f32(2, 4), src=f32(4, 2)"});
  expect_error([&] { copy(f32_view(a, {4}), Tensor(a.data() + 2, DType::f32, {4})); },
               {"copy: dst overlaps src"});
  expect_error([&] { copy(Tensor(), f32_view(a, {8})); }, {"copy: dst is required"});
}

// ---- arange ----

TEST(Arange, WritesStartPlusIndexInI32AndI64) {
  std::vector<int32_t> a(5, 99);
  arange(view_of(a, DType::i32, {5}), -2);
  EXPECT_EQ(a, (std::vector<int32_t>{-2, -1, 0, 1, 2}));
  std::vector<int64_t> b(3, 99);
  arange(view_of(b, DType::i64, {3}), int64_t{1} << 40);
  EXPECT_EQ(b, (std::vector<int64_t>{int64_t{1} << 40, (int64_t{1} << 40) + 1, (int64_t{1} << 40) + 2}));
}

TEST(Arange, ValuesPastTheDtypeOrAFloatDtypeAreErrors) {
  std::vector<int32_t> a(4);
  Floats f(4);
  expect_error([&] { arange(view_of(a, DType::i32, {4}), std::numeric_limits<int32_t>::max() - 2); },
               {"arange: values 2147483645 + [0, 4) do not fit i32"});
  expect_error([&] { arange(f32_view(f, {4}), 0); }, {"arange: t has dtype f32, expected i32 or i64"});
  expect_error([&] { arange(view_of(a, DType::i32, {2, 2}), 0); }, {"arange: t must have 1 dims"});
}

// ---- find_id_outside ----

TEST(FindIdOutside, GivesTheFirstIdOutsideTheRangeThatIsNotIgnored) {
  std::vector<int32_t> ids = {0, 4, -100, 9, 10, -1, 3};
  const Tensor t = view_of(ids, DType::i32, {7});
  const IdOutside with_ignore = find_id_outside(t, 10, -100);
  EXPECT_EQ(with_ignore.index, 4);
  EXPECT_EQ(with_ignore.id, 10);
  const IdOutside without = find_id_outside(t, 10);
  EXPECT_EQ(without.index, 2);
  EXPECT_EQ(without.id, -100);
  ids[4] = 1, ids[5] = 2;
  EXPECT_EQ(find_id_outside(t, 10, -100).index, -1);
  expect_error([&] { find_id_outside(t, -1); }, {"find_id_outside: limit -1 is negative"});
}

// ---- the vocab-parallel loss ----

// The combine formerly written inline in TensorParallel::combine_cross_entropy.
void combine_by_host_loop(float* out_lse, float* out_target, const std::vector<float>& stats, int64_t P, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    float m = -INFINITY;
    for (int64_t r = 0; r < P; ++r) m = std::max(m, stats[static_cast<size_t>(2 * N * r + i)]);
    double s = 0, t = 0;
    for (int64_t r = 0; r < P; ++r) {
      const float* pair = stats.data() + 2 * N * r;
      if (m != -INFINITY) s += std::exp(static_cast<double>(pair[i]) - m);
      t += pair[N + i];
    }
    out_lse[i] = m == -INFINITY ? m : static_cast<float>(m + std::log(s));
    out_target[i] = static_cast<float>(t);
  }
}

TEST(CrossEntropyShardCombine, EqualsTheTensorParallelHostLoopBitwiseWithPaddedRanks) {
  constexpr int64_t P = 3, N = 9;
  std::vector<float> stats = random_floats(2 * N * P, 7u);
  for (float& x : stats) x *= 4.f;
  for (int64_t n = 0; n < N; ++n) stats[2 * N * 2 + n] = -INFINITY;  // rank 2 holds only padding
  for (int64_t r = 0; r < P; ++r) stats[2 * N * r + 4] = -INFINITY;   // row 4 ignored on every rank
  Floats lse(N, 5.f), target(N, 5.f), want_lse(N), want_target(N);
  cross_entropy_shard_combine(f32_view(lse, {N}), f32_view(target, {N}), f32_view(stats, {P, 2, N}));
  combine_by_host_loop(want_lse.data(), want_target.data(), stats, P, N);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_TRUE(same_bits(lse[n], want_lse[n])) << n << ": " << lse[n] << " vs " << want_lse[n];
    EXPECT_TRUE(same_bits(target[n], want_target[n])) << n;
  }
  EXPECT_EQ(lse[4], -INFINITY);
}

TEST(CrossEntropyShardLoss, EqualsTheModelsHostLoopBitwiseAndIsZeroWithoutValidRows) {
  constexpr int64_t N = 11;
  Floats lse = random_floats(N, 3u), tl = random_floats(N, 4u);
  std::vector<int32_t> targets = {1, -100, 5, 7, -100, 0, 2, 2, -100, 9, 3};
  double sum = 0;  // Model::forward's loop, as it was
  int64_t n_valid = 0;
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] != -100) sum += static_cast<double>(lse[i]) - tl[i], ++n_valid;
  const float want = static_cast<float>(sum / static_cast<double>(n_valid));
  const Tensor t = view_of(targets, DType::i32, {N});
  EXPECT_TRUE(same_bits(cross_entropy_shard_loss(f32_view(lse, {N}), f32_view(tl, {N}), t), want));
  EXPECT_EQ(cross_entropy_count_valid(t), n_valid);
  std::vector<int32_t> none(N, -100);
  EXPECT_EQ(cross_entropy_shard_loss(f32_view(lse, {N}), f32_view(tl, {N}), view_of(none, DType::i32, {N})), 0.f);
  EXPECT_EQ(cross_entropy_count_valid(view_of(none, DType::i32, {N})), 0);
}

TEST(CrossEntropyShardCombine, MisuseThrowsNamingTheOpAndOperands) {
  Floats stats(12), lse(2), tl(3);
  std::vector<int32_t> targets(3);
  const char* op = "cross_entropy_shard_combine";
  expect_error([&] { cross_entropy_shard_combine(f32_view(lse, {2}), f32_view(tl, {2}), f32_view(stats, {3, 4})); },
               {op, "stats must be (P, 2, N)"});
  expect_error([&] { cross_entropy_shard_combine(f32_view(lse, {2}), f32_view(tl, {3}), f32_view(stats, {2, 2, 3})); },
               {op, "lse has 2 elements, expected N = 3"});
  expect_error([&] { cross_entropy_shard_loss(f32_view(lse, {2}), f32_view(tl, {3}), view_of(targets, DType::i32, {3})); },
               {"cross_entropy_shard_loss", "lse has 2 elements, expected N = 3"});
  expect_error([&] { cross_entropy_count_valid(f32_view(tl, {3})); },
               {"cross_entropy_count_valid", "targets has dtype f32, expected i32"});
}

// gather_columns: a context-parallel rank's tokens, columns r and
// 2cp - 1 - r of each sequence's 2cp chunks, taken from the whole batch.
TEST(GatherColumns, TakesTheSameColumnsOfEveryRowInTheirOrder) {
  std::vector<int32_t> src(2 * 8), dst(2 * 4, -1);
  for (int32_t i = 0; i < 16; ++i) src[static_cast<size_t>(i)] = 100 + i;
  std::vector<int32_t> columns = {2, 3, 4, 5};  // cp 2, rank 1: chunks 1 and 2 of 4
  gather_columns(Tensor(dst.data(), DType::i32, {2, 4}), Tensor(src.data(), DType::i32, {2, 8}),
                 Tensor(columns.data(), DType::i32, {4}));
  EXPECT_EQ(dst, (std::vector<int32_t>{102, 103, 104, 105, 110, 111, 112, 113}));
  columns = {7, 0, 0, 3};  // any order, repeats allowed
  gather_columns(Tensor(dst.data(), DType::i32, {2, 4}), Tensor(src.data(), DType::i32, {2, 8}),
                 Tensor(columns.data(), DType::i32, {4}));
  EXPECT_EQ(dst, (std::vector<int32_t>{107, 100, 100, 103, 115, 108, 108, 111}));
}

TEST(GatherColumns, AColumnOutsideTheRowIsAnErrorThatWritesNothing) {
  std::vector<float> src(8, 1.f), dst(4, 0.f);
  std::vector<int32_t> columns = {0, 4};
  expect_error([&] { gather_columns(Tensor(dst.data(), DType::f32, {2, 2}), Tensor(src.data(), DType::f32, {2, 4}),
                                    Tensor(columns.data(), DType::i32, {2})); },
               {"gather_columns", "columns[1] = 4", "outside the 4 columns"});
  EXPECT_EQ(dst, std::vector<float>(4, 0.f));
  expect_error([&] { gather_columns(Tensor(dst.data(), DType::f32, {2, 2}), Tensor(src.data(), DType::f32, {1, 8}),
                                    Tensor(columns.data(), DType::i32, {2})); },
               {"gather_columns", "dst has 2 rows, src has 1"});
}

// The router's top-k (moe_top_k): the largest scores first, ties to the
// lower expert id; the balancing bias moves the choice, never the weight;
// normalise divides the chosen scores by their sum.
TEST(MoeTopK, ChoosesTheLargestScoresTiesToTheLowerIdAndBiasOnlyMovesTheChoice) {
  std::vector<float> scores = {0.1f, 0.4f, 0.4f, 0.1f,    // a tie for first: experts 1, 2
                               0.25f, 0.25f, 0.25f, 0.25f,  // all tied: 0, 1
                               0.7f, 0.1f, 0.15f, 0.05f};
  std::vector<int32_t> sel(6);
  std::vector<float> weight(6);
  const Tensor s(scores.data(), DType::f32, {3, 4}), sl(sel.data(), DType::i32, {3, 2}),
      w(weight.data(), DType::f32, {3, 2});
  moe_top_k(sl, w, s, Tensor(), false);
  EXPECT_EQ(sel, (std::vector<int32_t>{1, 2, 0, 1, 0, 2}));
  EXPECT_EQ(weight, (std::vector<float>{0.4f, 0.4f, 0.25f, 0.25f, 0.7f, 0.15f}));
  moe_top_k(sl, w, s, Tensor(), true);
  EXPECT_FLOAT_EQ(weight[4], static_cast<float>(0.7 / (0.7 + 0.15)));
  EXPECT_FLOAT_EQ(weight[0], 0.5f);
  std::vector<float> bias = {0.f, 0.f, 0.f, 0.5f};  // expert 3 joins every token's choice, at its own score
  moe_top_k(sl, w, s, Tensor(bias.data(), DType::f32, {4}), false);
  EXPECT_EQ(sel, (std::vector<int32_t>{3, 1, 3, 0, 0, 3}));  // 0.7 still beats 0.05 + 0.5
  EXPECT_EQ(weight, (std::vector<float>{0.1f, 0.4f, 0.25f, 0.25f, 0.7f, 0.05f}));
}

TEST(MoeTopK, MisuseThrowsNamingTheOpAndOperands) {
  std::vector<float> scores(8), weight(6);
  std::vector<int32_t> sel(6);
  const Tensor s(scores.data(), DType::f32, {2, 4});
  expect_error([&] { moe_top_k(Tensor(sel.data(), DType::i32, {2, 3}), Tensor(weight.data(), DType::f32, {2, 3}),
                               Tensor(scores.data(), DType::f32, {2, 2}), Tensor(), true); },
               {"moe_top_k", "k = 3", "[1, 2]"});
  expect_error([&] { moe_top_k(Tensor(sel.data(), DType::i32, {3, 2}), Tensor(weight.data(), DType::f32, {3, 2}), s,
                               Tensor(), true); },
               {"moe_top_k", "sel has 3 tokens", "scores has 2"});
  expect_error([&] { moe_top_k(Tensor(sel.data(), DType::i32, {2, 2}), Tensor(weight.data(), DType::f32, {2, 2}), s,
                               Tensor(weight.data(), DType::f32, {3}), true); },
               {"moe_top_k", "bias"});
}

// Capacity, the dispatch plan and the balancing statistics of six tokens'
// two choices of three experts, in routing groups of three tokens: expert
// 0's choices in group 0 tie at 0.5 (tokens 0 and 1), expert 2's in group 1
// at 0.6 (tokens 3 and 5); a capacity of 2 keeps the higher scores and, of a
// tie, the earlier token (Megatron's drop policy).
TEST(MoeRouting, CapacityKeepsTheHighestScoresTiesToTheEarlierTokenAndRowsGoByExpertThenToken) {
  std::vector<int32_t> sel = {0, 1, 0, 2, 0, 1, 2, 1, 2, 0, 2, 1}, rows(12, -7);
  std::vector<float> scores = {0.5f, 0.3f, 0.2f, 0.5f, 0.1f, 0.4f, 0.6f, 0.3f, 0.1f,
                               0.1f, 0.3f, 0.6f, 0.2f, 0.1f, 0.7f, 0.1f, 0.3f, 0.6f};
  const Tensor sl(sel.data(), DType::i32, {6, 2}), sc(scores.data(), DType::f32, {6, 3});
  const Tensor r(rows.data(), DType::i32, {6, 2});
  moe_capacity(r, sl, sc, 3, 2);
  EXPECT_EQ(rows, (std::vector<int32_t>{1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1}));
  std::vector<int64_t> counts(3, -1);
  moe_assign_rows(r, Tensor(counts.data(), DType::i64, {3}), sl);
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 4, 3}));
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 3, -1, 7, 1, 4, 8, 5, 9, 2, -1, 6}));
  moe_capacity(r, sl, sc, 6, 1);  // one group: each expert's best choice
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0}));
  moe_capacity(r, sl, sc, 3, -1);
  EXPECT_EQ(rows, std::vector<int32_t>(12, 1));
  std::vector<float> count(6), sum(6);
  moe_group_stats(Tensor(count.data(), DType::f32, {2, 3}), Tensor(sum.data(), DType::f32, {2, 3}), sl, sc, 3, false);
  EXPECT_EQ(count, (std::vector<float>{3, 2, 1, 1, 2, 3}));
  // Each sum in double over the group's tokens, rounded once.
  auto sum3 = [](float a, float b, float c) { return static_cast<float>(double{a} + double{b} + double{c}); };
  EXPECT_EQ(sum, (std::vector<float>{sum3(0.5f, 0.5f, 0.6f), sum3(0.3f, 0.1f, 0.3f), sum3(0.2f, 0.4f, 0.1f),
                                     sum3(0.1f, 0.2f, 0.1f), sum3(0.3f, 0.1f, 0.3f), sum3(0.6f, 0.7f, 0.6f)}));
}

TEST(MoeRouting, ScoresAreTheSoftmaxOrSigmoidAndLseTheLogSumExp) {
  std::vector<float> logits = {1.f, -2.f, 0.5f, 3.f}, scores(4), lse(1);
  const Tensor l(logits.data(), DType::f32, {1, 4}), s(scores.data(), DType::f32, {1, 4});
  const Tensor z(lse.data(), DType::f32, {1});
  moe_router_scores(s, z, l, false);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v));
  EXPECT_FLOAT_EQ(lse[0], static_cast<float>(std::log(sum)));
  for (size_t e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(scores[e], static_cast<float>(std::exp(logits[e]) / sum));
  moe_router_scores(s, z, l, true);
  EXPECT_FLOAT_EQ(lse[0], static_cast<float>(std::log(sum)));
  for (size_t e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(scores[e], static_cast<float>(1 / (1 + std::exp(-logits[e]))));
}

TEST(MoeRouting, MisuseAndBadIdsThrowNamingTheOpAndTheEntry) {
  std::vector<int32_t> sel = {0, 1, 3, 0}, rows(4, 1);
  std::vector<float> scores(6);
  std::vector<int64_t> counts(3);
  const Tensor sl(sel.data(), DType::i32, {2, 2}), sc(scores.data(), DType::f32, {2, 3});
  const Tensor r(rows.data(), DType::i32, {2, 2}), c(counts.data(), DType::i64, {3});
  expect_error([&] { moe_capacity(r, sl, sc, 1, 1); }, {"moe_capacity", "sel[1, 0] = 3", "[0, 3)"});
  expect_error([&] { moe_assign_rows(r, c, sl); }, {"moe_assign_rows", "sel[1, 0] = 3"});
  sel[2] = 2, rows[3] = 5;
  expect_error([&] { moe_assign_rows(r, c, sl); }, {"moe_assign_rows", "rows[1, 1] = 5", "1 (kept) or 0"});
  expect_error([&] { moe_capacity(r, sl, sc, 3, 1); }, {"moe_capacity", "groups of 3 tokens", "divide"});
  std::vector<float> stats(6);
  const Tensor count(stats.data(), DType::f32, {1, 3}), sums(stats.data() + 3, DType::f32, {1, 3});
  expect_error([&] { moe_group_stats(count, sums, sl, sc, 1, false); },
               {"moe_group_stats", "count"});
}

}  // namespace
}  // namespace loom::kernels
