// Token + position embedding against PyTorch (tests/ref/ref_embedding.py),
// finite differences, the bf16 and f16 paths against the f32 path, determinism of the
// scatter-add, and misuse (tokens and positions out of range). The _at ops
// (positions per token) run the ref cases that have positions, and give their
// pos_offset siblings' bits on positions pos_offset + t.
//
// Tolerances (|a - e| <= atol + rtol |e|):
// - f32 vs torch (float64 from the same f32 inputs): y is one f32 add, so
//   rtol 1e-6 atol 0; dwte, dwpe are sums over repeated tokens / over B:
//   rtol 1e-5 atol 1e-6.
// - bf16 storage vs the f32 path on the same (rounded) inputs: one bf16
//   rounding of each stored value (2^-9 relative): rtol 1e-2 atol 1e-6 for y;
//   bf16 gradients rtol 1e-2 atol 1e-2 (prefill of order 1 rounded once);
//   f32 gradients from bf16 dy are the f32 path's: rtol 1e-6 atol 1e-6.
// - f16 likewise, with the rounding tolerances times 1/4 (f16 rounds to
//   2^-12 relative, 8x finer than bf16): y 2.5e-3, f16 gradients 2.5e-3.
// - finite differences: the embedding is linear, so central differences
//   (h = 1e-2) are exact up to f32 round-off ~1e-7 / h: rtol 1e-2 atol 1e-3.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "kernels/half_util.h"
#include "core/threads.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace loom::test;

// zigzag: a context-parallel rank's positions [4, 8) and [24, 28) for every
// sequence; scattered: positions repeated within and across sequences.
const char* const kCases[] = {"gpt2", "t1", "nopos", "zigzag", "scattered"};
const char* const kAtCases[] = {"zigzag", "scattered"};

// One case: wpe, dwpe0 empty when there are no learned positions; positions
// (B, T) empty for pos_offset + t.
struct EmbeddingInputs {
  int64_t B = 0, T = 0, C = 0, V = 0, max_t = 0, pos_offset = 0;
  std::vector<int32_t> tokens, positions;
  Floats wte, wpe, dy, dwte0, dwpe0;
};

EmbeddingInputs load_inputs(RefCase& rc) {
  EmbeddingInputs in;
  in.B = rc["tokens"].shape[0], in.T = rc["tokens"].shape[1];
  in.V = rc["wte"].shape[0], in.C = rc["wte"].shape[1];
  in.pos_offset = static_cast<int64_t>(rc["pos_offset"].scalar());
  const Tensor tokens = rc["tokens"].view();
  in.tokens.assign(tokens.data_as<int32_t>(), tokens.data_as<int32_t>() + tokens.numel());
  if (rc.has("positions")) {
    const Tensor pos = rc["positions"].view();
    in.positions.assign(pos.data_as<int32_t>(), pos.data_as<int32_t>() + pos.numel());
  }
  in.wte = rc["wte"].floats(), in.dy = rc["dy"].floats(), in.dwte0 = rc["dwte_prefill"].floats();
  if (rc.has("wpe")) {
    in.max_t = rc["wpe"].shape[0];
    in.wpe = rc["wpe"].floats(), in.dwpe0 = rc["dwpe_prefill"].floats();
  }
  return in;
}

struct EmbeddingOutputs {
  Floats y, dwte, dwpe;
};

// Forward, then backward into the pre-filled gradients (the _at ops when the
// case has positions). act: dtype of wte, wpe, y; grad: dtype of dy, dwte, dwpe.
EmbeddingOutputs run_embedding(EmbeddingInputs in, DType act, DType grad) {
  const Shape bt{in.B, in.T}, btc{in.B, in.T, in.C}, table{in.max_t, in.C};
  const Tensor tokens(in.tokens.data(), DType::i32, bt), positions(in.positions.data(), DType::i32, bt);
  Buffer wte(act, Shape{in.V, in.C}, in.wte), wpe(act, table, in.wpe), y(act, btc);
  Buffer dy(grad, btc, in.dy), dwte(grad, Shape{in.V, in.C}, in.dwte0), dwpe(grad, table, in.dwpe0);
  const bool learned = !in.wpe.empty();
  const Tensor wpe_t = learned ? wpe.view() : Tensor(), dwpe_t = learned ? dwpe.view() : Tensor();
  if (in.positions.empty()) {
    embedding_forward(y.view(), tokens, wte.view(), wpe_t, in.pos_offset);
    embedding_backward(dwte.view(), dwpe_t, dy.view(), tokens, in.pos_offset);
  } else {
    embedding_forward_at(y.view(), tokens, wte.view(), wpe_t, positions);
    embedding_backward_at(dwte.view(), dwpe_t, dy.view(), tokens, positions);
  }
  return {y.floats(), dwte.floats(), learned ? dwpe.floats() : Floats()};
}

TEST(Embedding, ForwardMatchesTorchF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("embedding_") + name + ".ref");
    EXPECT_TRUE(all_close(run_embedding(load_inputs(rc), DType::f32, DType::f32).y, rc["y"].floats(), 1e-6, 0));
  }
}

TEST(Embedding, BackwardScatterAddsTorchGradientsOntoPrefillF32) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("embedding_") + name + ".ref");
    const EmbeddingInputs in = load_inputs(rc);
    const EmbeddingOutputs out = run_embedding(in, DType::f32, DType::f32);
    EXPECT_TRUE(all_close(out.dwte, plus(in.dwte0, rc["dwte"].floats()), 1e-5, 1e-6));
    if (rc.has("dwpe")) {
      EXPECT_TRUE(all_close(out.dwpe, plus(in.dwpe0, rc["dwpe"].floats()), 1e-5, 1e-6));
    }
  }
}

// half (bf16 or f16) storage against the f32 path on the same rounded
// inputs; k scales the bf16 tolerances of the rounded values (kF16Tighter for f16).
void expect_half_matches_f32(DType half, double k) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("embedding_") + name + ".ref");
    EmbeddingInputs in = load_inputs(rc);
    for (Floats* v : {&in.wte, &in.wpe, &in.dy, &in.dwte0, &in.dwpe0}) *v = rounded_to(half, *v);
    const EmbeddingOutputs ref = run_embedding(in, DType::f32, DType::f32);
    const EmbeddingOutputs f32_grads = run_embedding(in, half, DType::f32);
    EXPECT_TRUE(all_close(f32_grads.y, ref.y, k * 1e-2, 1e-6)) << "y";
    EXPECT_TRUE(all_close(f32_grads.dwte, ref.dwte, 1e-6, 1e-6)) << "dwte, f32 gradients";
    EXPECT_TRUE(all_close(f32_grads.dwpe, ref.dwpe, 1e-6, 1e-6)) << "dwpe, f32 gradients";
    const EmbeddingOutputs half_grads = run_embedding(in, half, half);
    EXPECT_TRUE(all_close(half_grads.dwte, ref.dwte, k * 1e-2, k * 1e-2)) << "dwte, half gradients";
    EXPECT_TRUE(all_close(half_grads.dwpe, ref.dwpe, k * 1e-2, k * 1e-2)) << "dwpe, half gradients";
  }
}

TEST(Embedding, Bf16MatchesF32PathOnRoundedInputs) { expect_half_matches_f32(DType::bf16, 1.0); }
TEST(Embedding, F16MatchesF32PathOnRoundedInputs) { expect_half_matches_f32(DType::f16, kF16Tighter); }

// A tiny table with repeated tokens; loss = sum(y * r), analytic gradient = backward with dy = r.
TEST(Embedding, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  EmbeddingInputs in;
  in.B = 2, in.T = 3, in.C = 3, in.V = 7, in.max_t = 5, in.pos_offset = 1;
  in.tokens = {3, 0, 3, 6, 3, 0};
  for (Floats* v : {&in.wte, &in.wpe, &in.dy}) v->resize(v == &in.wte ? 21 : v == &in.wpe ? 15 : 18);
  for (Floats* v : {&in.wte, &in.wpe, &in.dy})
    for (float& f : *v) f = normal(rng);
  in.dwte0 = Floats(21), in.dwpe0 = Floats(15);
  const EmbeddingOutputs analytic = run_embedding(in, DType::f32, DType::f32);
  EmbeddingInputs probe = in;
  const auto loss = [&] { return test::weighted_sum(run_embedding(probe, DType::f32, DType::f32).y, in.dy); };
  const auto fd = [&](Floats& v) { return test::finite_difference(loss, v, 1e-2f); };
  EXPECT_TRUE(all_close(analytic.dwte, fd(probe.wte), 1e-2, 1e-3)) << "dwte";
  EXPECT_TRUE(all_close(analytic.dwpe, fd(probe.wpe), 1e-2, 1e-3)) << "dwpe";
}

// The scatter-add sums each token's (and, by positions, each position's)
// rows in (b, t) order on one thread.
TEST(Embedding, BackwardIsBitwiseIdenticalAcrossThreadCounts) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int32_t> pick(0, 49);
  EmbeddingInputs in;
  in.B = 8, in.T = 512, in.C = 64, in.V = 1000, in.max_t = 512;
  for (int64_t i = 0; i < in.B * in.T; ++i) in.tokens.push_back(pick(rng) * 20);  // 50 distinct, ~80 repeats each
  in.wte = Floats(in.V * in.C), in.wpe = Floats(in.max_t * in.C);
  in.dy = Floats(in.B * in.T * in.C);
  for (float& f : in.dy) f = normal(rng);
  in.dwte0 = Floats(in.V * in.C), in.dwpe0 = Floats(in.max_t * in.C);
  const int saved = num_threads();
  for (bool at : {false, true}) {
    SCOPED_TRACE(at ? "embedding_backward_at" : "embedding_backward");
    for (int64_t i = 0; at && i < in.B * in.T; ++i) in.positions.push_back(pick(rng) * 10 % in.max_t);
    std::vector<EmbeddingOutputs> runs;
    for (int threads : {1, 2, 3, 8}) {
      set_num_threads(threads);
      runs.push_back(run_embedding(in, DType::f32, DType::f32));
    }
    set_num_threads(saved);
    for (size_t i = 1; i < runs.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(runs[i].dwte.data(), runs[0].dwte.data(), runs[0].dwte.size() * 4)) << "run " << i;
      EXPECT_EQ(0, std::memcmp(runs[i].dwpe.data(), runs[0].dwpe.data(), runs[0].dwpe.size() * 4)) << "run " << i;
    }
  }
}

// ---- misuse ---------------------------------------------------------------------------------

// Small valid operands: tokens (2, 3), wte (10, 4), wpe (8, 4), y (2, 3, 4).
struct SmallOperands {
  std::vector<int32_t> toks{1, 2, 3, 4, 5, 6};
  Floats te = Floats(40), pe = Floats(32), ys = Floats(24);
  Tensor tokens{toks.data(), DType::i32, Shape{2, 3}};
  Tensor wte{te.data(), DType::f32, Shape{10, 4}}, wpe{pe.data(), DType::f32, Shape{8, 4}};
  Tensor y{ys.data(), DType::f32, Shape{2, 3, 4}};
};

TEST(Embedding, TokenOutsideVocabularyNamesValueIndexAndRange) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  toks[5] = 10;
  expect_error([&] { embedding_forward(y, tokens, wte, wpe, 0); },
               {"embedding_forward", "token 10", "(b, t) = (1, 2)", "[0, 10)"});
  expect_error([&] { embedding_backward(wte, wpe, y, tokens, 0); },
               {"embedding_backward", "token 10", "(b, t) = (1, 2)", "[0, 10)"});
  toks[5] = 6, toks[1] = -3;
  expect_error([&] { embedding_forward(y, tokens, wte, Tensor(), 0); },
               {"embedding_forward", "token -3", "(b, t) = (0, 1)", "[0, 10)"});
}

TEST(Embedding, PositionPastTableNamesValueIndexAndRange) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  // T = 3 from offset 6 reaches position 8, the first past an 8-row table.
  expect_error([&] { embedding_forward(y, tokens, wte, wpe, 6); },
               {"embedding_forward", "position 8", "t 2", "[0, 8)"});
  expect_error([&] { embedding_backward(wte, wpe, y, tokens, 6); },
               {"embedding_backward", "position 8", "t 2", "[0, 8)"});
  expect_error([&] { embedding_forward(y, tokens, wte, wpe, -1); }, {"embedding_forward", "pos_offset -1"});
  // pos_offset + T overflows int64: still past the table, not a wrapped-around small position.
  const int64_t huge = INT64_MAX - 1;
  expect_error([&] { embedding_forward(y, tokens, wte, wpe, huge); },
               {"embedding_forward", "position 9223372036854775806", "t 0", "[0, 8)"});
  expect_error([&] { embedding_backward(wte, wpe, y, tokens, huge); }, {"embedding_backward", "[0, 8)"});
  EXPECT_NO_THROW(embedding_forward(y, tokens, wte, wpe, 5));  // positions 5..7: the table's last rows
  EXPECT_NO_THROW(embedding_forward(y, tokens, wte, Tensor(), 100));  // no table, no limit
}

// Per-token positions: arange positions give embedding_forward's bits (every
// dtype), scattered ones each token's own row of wpe.
TEST(Embedding, ForwardAtPositionsGivesTheOffsetForwardsBitsAndEachTokensOwnRow) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t B = 2, T = 7, C = 24, V = 30, maxT = 40;
  std::vector<int32_t> toks(B * T), pos(B * T);
  for (int32_t& t : toks) t = static_cast<int32_t>(rng() % V);
  Floats te(V * C), pe(maxT * C);
  for (float& f : te) f = normal(rng);
  for (float& f : pe) f = normal(rng);
  const Tensor tokens{toks.data(), DType::i32, Shape{B, T}}, positions{pos.data(), DType::i32, Shape{B, T}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const size_t es = dtype_size(dt);
    std::vector<std::byte> wte_b(V * C * es), wpe_b(maxT * C * es), y1(B * T * C * es), y2(y1.size());
    const Tensor wte{wte_b.data(), dt, Shape{V, C}}, wpe{wpe_b.data(), dt, Shape{maxT, C}};
    cast(wte, Tensor(te.data(), DType::f32, Shape{V, C}));
    cast(wpe, Tensor(pe.data(), DType::f32, Shape{maxT, C}));
    const Tensor ya{y1.data(), dt, Shape{B, T, C}}, yb{y2.data(), dt, Shape{B, T, C}};
    for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>(11 + i % T);
    embedding_forward(ya, tokens, wte, wpe, 11);
    embedding_forward_at(yb, tokens, wte, wpe, positions);
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size()));
    // Scattered: row (b, t) equals the offset forward of that one token at its position.
    for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>((i * 17 + 3) % maxT);
    embedding_forward_at(yb, tokens, wte, wpe, positions);
    for (int64_t i = 0; i < B * T; ++i) {
      std::vector<std::byte> one(C * es);
      embedding_forward(Tensor(one.data(), dt, Shape{1, 1, C}), Tensor(&toks[i], DType::i32, Shape{1, 1}), wte, wpe,
                        pos[i]);
      EXPECT_EQ(0, std::memcmp(one.data(), y2.data() + i * C * es, one.size())) << "token " << i;
    }
  }
}

TEST(Embedding, ForwardAtPositionOutsideTheTableNamesValueIndexAndRange) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  std::vector<int32_t> pos{0, 1, 2, 3, 8, 5};
  const Tensor positions{pos.data(), DType::i32, Shape{2, 3}};
  expect_error([&] { embedding_forward_at(y, tokens, wte, wpe, positions); },
               {"embedding_forward_at", "position 8", "(b, t) = (1, 1)", "[0, 8)"});
  pos[4] = -1;
  expect_error([&] { embedding_forward_at(y, tokens, wte, wpe, positions); }, {"position -1", "[0, 8)"});
  EXPECT_NO_THROW(embedding_forward_at(y, tokens, wte, Tensor(), positions));  // no table, no limit
  const Tensor short_positions{pos.data(), DType::i32, Shape{2, 2}};
  expect_error([&] { embedding_forward_at(y, tokens, wte, wpe, short_positions); }, {"embedding_forward_at", "positions"});
}

// The other _at ops check their positions as embedding_forward_at does: each
// in [0, maxT) when wpe / dwpe is defined, and the tensor (B, T) i32.
TEST(Embedding, AtOpsNamePositionOutsideTheTableAndAWrongPositionsOperand) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  std::vector<int32_t> pos{0, 1, 2, 3, 8, 5};
  const Tensor positions{pos.data(), DType::i32, Shape{2, 3}};
  const char *bwd = "embedding_backward_at", *shard_fwd = "embedding_shard_forward_at",
             *shard_bwd = "embedding_shard_backward_at";
  expect_error([&] { embedding_backward_at(wte, wpe, y, tokens, positions); },
               {bwd, "position 8", "(b, t) = (1, 1)", "[0, 8)"});
  expect_error([&] { embedding_shard_forward_at(y, tokens, wte, 0, wpe, positions); },
               {shard_fwd, "position 8", "(b, t) = (1, 1)", "[0, 8)"});
  expect_error([&] { embedding_shard_backward_at(wte, wpe, y, tokens, 0, positions); },
               {shard_bwd, "position 8", "(b, t) = (1, 1)", "[0, 8)"});
  pos[4] = -1;
  expect_error([&] { embedding_backward_at(Tensor(), wpe, y, tokens, positions); }, {bwd, "position -1", "[0, 8)"});
  // No position table, no limit.
  EXPECT_NO_THROW(embedding_backward_at(wte, Tensor(), y, tokens, positions));
  EXPECT_NO_THROW(embedding_shard_forward_at(y, tokens, wte, 0, Tensor(), positions));
  EXPECT_NO_THROW(embedding_shard_backward_at(wte, Tensor(), y, tokens, 0, positions));
  pos[4] = 4;
  for (const Tensor& bad : {Tensor(pos.data(), DType::i32, Shape{2, 2}), Tensor(pos.data(), DType::f32, Shape{2, 3}),
                            Tensor(pos.data(), DType::i32, Shape{6})}) {
    SCOPED_TRACE(bad.shape().str());
    expect_error([&] { embedding_backward_at(wte, wpe, y, tokens, bad); }, {bwd, "positions"});
    expect_error([&] { embedding_shard_forward_at(y, tokens, wte, 0, wpe, bad); }, {shard_fwd, "positions"});
    expect_error([&] { embedding_shard_backward_at(wte, Tensor(), y, tokens, 0, bad); }, {shard_bwd, "positions"});
  }
  expect_error([&] { embedding_shard_forward_at(y, tokens, wte, -1, wpe, positions); }, {shard_fwd, "vocab_begin -1"});
}

TEST(Embedding, ShapeAndDtypeMismatchesNameTheOpAndShapes) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  Tensor y_bad(ys.data(), DType::f32, Shape{2, 4, 3}), wpe_bad(pe.data(), DType::f32, Shape{4, 8});
  Tensor tokens_f32(toks.data(), DType::f32, Shape{2, 3}), wte_bf16(te.data(), DType::bf16, Shape{10, 4});
  expect_error([&] { embedding_forward(y_bad, tokens, wte, wpe, 0); }, {"embedding_forward", "y", "(2, 3, 4)", "f32(2, 4, 3)"});
  expect_error([&] { embedding_forward(y, tokens, wte, wpe_bad, 0); }, {"embedding_forward", "wpe", "f32(4, 8)"});
  expect_error([&] { embedding_forward(y, tokens_f32, wte, wpe, 0); }, {"embedding_forward", "tokens", "f32(2, 3)"});
  expect_error([&] { embedding_forward(y, tokens, wte_bf16, wpe, 0); }, {"embedding_forward", "y", "wte", "bf16(10, 4)"});
  expect_error([&] { embedding_backward(wte, wpe, y_bad, tokens, 0); }, {"embedding_backward", "dy", "f32(2, 4, 3)"});
  expect_error([&] { embedding_backward(wpe_bad, Tensor(), y, tokens, 0); }, {"embedding_backward", "dwte", "f32(4, 8)"});
}

// ---- vocab-parallel shards ------------------------------------------------------------------
//
// A (V, C) table padded with zero rows to a multiple of tp and cut into tp
// row ranges, one per simulated rank; wpe / dwpe are given to rank 0 only.
// The sum over the ranks' outputs is what the tp all-reduce forms: exact for
// f32 (every row is a copy or the one add of the full kernel, plus zeros), and
// for bf16 / f16 once the f32 sum is rounded to the storage type, since the
// full kernel also adds in f32 and rounds once. The gradients are the full
// kernel's scatter-add restricted to a range: same sums in the same order.

// The tp row ranges of the V-row table padded to a multiple of tp.
struct VocabShards {
  int64_t V, tp, V_local;
  VocabShards(int64_t vocab, int64_t ranks) : V(vocab), tp(ranks), V_local((vocab + ranks - 1) / ranks) {}
  int64_t begin(int64_t r) const { return r * V_local; }
  // Rows [begin(r), begin(r) + V_local) of `table` (V, C), zero past row V.
  Floats slice(const Floats& table, int64_t C, int64_t r) const {
    Floats out(V_local * C, 0.f);
    const int64_t rows = std::clamp<int64_t>(V - begin(r), 0, V_local);
    std::copy_n(table.begin() + begin(r) * C, rows * C, out.begin());
    return out;
  }
};

// V = 50 (not a multiple of 3 or 4), tokens from the whole range with repeats
// and both ends; B * T * C reaches the kernels' parallel threshold.
EmbeddingInputs shard_inputs() {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> pick(0, 49);
  EmbeddingInputs in;
  in.B = 8, in.T = 64, in.C = 64, in.V = 50, in.max_t = 80, in.pos_offset = 3;
  for (int64_t i = 0; i < in.B * in.T; ++i) in.tokens.push_back(pick(rng));
  in.tokens[0] = 0, in.tokens[1] = 49;
  in.wte = random_floats(in.V * in.C, rng), in.wpe = random_floats(in.max_t * in.C, rng, 0.1f);
  in.dy = random_floats(in.B * in.T * in.C, rng);
  in.dwte0 = random_floats(in.V * in.C, rng), in.dwpe0 = random_floats(in.max_t * in.C, rng);
  return in;
}

TEST(EmbeddingShard, ShardOutputsSumToFullForwardBitwise) {
  const EmbeddingInputs in = shard_inputs();
  const Shape btc{in.B, in.T, in.C};
  std::vector<int32_t> toks = in.tokens;
  const Tensor tokens(toks.data(), DType::i32, Shape{in.B, in.T});
  for (DType act : {DType::f32, DType::bf16, DType::f16}) {
    for (bool learned : {true, false}) {
      Buffer wte(act, Shape{in.V, in.C}, in.wte), wpe(act, Shape{in.max_t, in.C}, in.wpe), y(act, btc);
      const Floats wte_stored = wte.floats();  // rounded to act, as the shards hold it
      embedding_forward(y.view(), tokens, wte.view(), learned ? wpe.view() : Tensor(), in.pos_offset);
      for (int64_t tp : {2, 3, 4}) {
        SCOPED_TRACE(std::string(dtype_name(act)) + (learned ? " wpe" : " no wpe") + " tp=" + std::to_string(tp));
        const VocabShards shards(in.V, tp);
        Floats sum(y.floats().size(), 0.f);
        for (int64_t r = 0; r < tp; ++r) {
          Buffer wte_r(act, Shape{shards.V_local, in.C}, shards.slice(wte_stored, in.C, r));
          Buffer y_r(act, btc, Floats(sum.size(), 5.f));  // written, not accumulated
          embedding_shard_forward(y_r.view(), tokens, wte_r.view(), shards.begin(r),
                                  learned && r == 0 ? wpe.view() : Tensor(), in.pos_offset);
          const Floats part = y_r.floats();
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
        }
        EXPECT_EQ(rounded_to(act, sum), y.floats());
      }
    }
  }
}

TEST(EmbeddingShard, ShardGradientsConcatenateToFullBackwardBitwise) {
  const EmbeddingInputs in = shard_inputs();
  const Shape btc{in.B, in.T, in.C}, table{in.max_t, in.C};
  std::vector<int32_t> toks = in.tokens;
  const Tensor tokens(toks.data(), DType::i32, Shape{in.B, in.T});
  for (DType grad : {DType::f32, DType::bf16}) {
    Buffer dy(grad, btc, in.dy), dwte(grad, Shape{in.V, in.C}, in.dwte0), dwpe(grad, table, in.dwpe0);
    const Floats dwte0 = dwte.floats();  // the prefill as stored
    embedding_backward(dwte.view(), dwpe.view(), dy.view(), tokens, in.pos_offset);
    const Floats full = dwte.floats();
    for (int64_t tp : {2, 3, 4}) {
      SCOPED_TRACE(std::string(dtype_name(grad)) + " tp=" + std::to_string(tp));
      const VocabShards shards(in.V, tp);
      Floats concat;
      for (int64_t r = 0; r < tp; ++r) {
        Floats prefill = shards.slice(dwte0, in.C, r);
        const int64_t rows = std::clamp<int64_t>(in.V - shards.begin(r), 0, shards.V_local);
        std::fill(prefill.begin() + rows * in.C, prefill.end(), 0.25f);  // padded rows: no token reaches them
        Buffer dwte_r(grad, Shape{shards.V_local, in.C}, prefill), dwpe_r(grad, table, in.dwpe0);
        embedding_shard_backward(dwte_r.view(), r == 0 ? dwpe_r.view() : Tensor(), dy.view(), tokens,
                                 shards.begin(r), in.pos_offset);
        const Floats got = dwte_r.floats();
        const auto pad = got.begin() + rows * in.C;
        concat.insert(concat.end(), got.begin(), pad);
        EXPECT_TRUE(std::all_of(pad, got.end(), [](float v) { return v == 0.25f; })) << "padded rows of rank " << r;
        if (r == 0) {
          EXPECT_EQ(dwpe_r.floats(), dwpe.floats()) << "dwpe";
        }
      }
      EXPECT_EQ(concat, full);
    }
  }
}

// The _at cases through two vocab shards, wpe / dwpe on rank 0: the summed
// outputs and the side-by-side gradients are PyTorch's (tolerances as the full ops').
TEST(EmbeddingShard, AtPositionsOverTwoShardsMatchTorchF32) {
  for (const char* name : kAtCases) {
    SCOPED_TRACE(name);
    RefCase rc(std::string("embedding_") + name + ".ref");
    EmbeddingInputs in = load_inputs(rc);
    const Shape bt{in.B, in.T}, btc{in.B, in.T, in.C}, table{in.max_t, in.C};
    const Tensor tokens = i32_view(in.tokens, bt), positions = i32_view(in.positions, bt), dy = f32_view(in.dy, btc);
    const VocabShards shards(in.V, 2);
    Floats y(in.B * in.T * in.C, 0.f), dwte, dwpe = in.dwpe0;
    for (int64_t r = 0; r < shards.tp; ++r) {
      Floats te = shards.slice(in.wte, in.C, r), dwte_r = shards.slice(in.dwte0, in.C, r), y_r(y.size());
      const Shape local{shards.V_local, in.C};
      embedding_shard_forward_at(f32_view(y_r, btc), tokens, f32_view(te, local), shards.begin(r),
                                 r == 0 ? f32_view(in.wpe, table) : Tensor(), positions);
      for (size_t i = 0; i < y.size(); ++i) y[i] += y_r[i];
      embedding_shard_backward_at(f32_view(dwte_r, local), r == 0 ? f32_view(dwpe, table) : Tensor(), dy, tokens,
                                  shards.begin(r), positions);
      dwte.insert(dwte.end(), dwte_r.begin(), dwte_r.begin() + std::min(shards.V_local, in.V - shards.begin(r)) * in.C);
    }
    EXPECT_TRUE(all_close(y, rc["y"].floats(), 1e-6, 0)) << "y";
    EXPECT_TRUE(all_close(dwte, plus(in.dwte0, rc["dwte"].floats()), 1e-5, 1e-6)) << "dwte";
    EXPECT_TRUE(all_close(dwpe, plus(in.dwpe0, rc["dwpe"].floats()), 1e-5, 1e-6)) << "dwpe";
  }
}

// On positions pos_offset + t each _at op is its pos_offset sibling, bit for
// bit, in every dtype: the same rows, sums in the same order, one rounding.
TEST(EmbeddingShard, AtOpsGiveTheirPosOffsetSiblingsBitsOnPositionsPosOffsetPlusT) {
  EmbeddingInputs in = shard_inputs();
  const Shape bt{in.B, in.T}, btc{in.B, in.T, in.C}, table{in.max_t, in.C}, vocab{in.V, in.C};
  for (int64_t i = 0; i < in.B * in.T; ++i) in.positions.push_back(static_cast<int32_t>(in.pos_offset + i % in.T));
  const Tensor tokens = i32_view(in.tokens, bt), positions = i32_view(in.positions, bt);
  const int64_t begin = 20, V_local = 30;  // the shard ops' table: rows [20, 50), wte's last 30
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Buffer wte(dt, vocab, in.wte), wpe(dt, table, in.wpe), dy(dt, btc, in.dy), y1(dt, btc), y2(dt, btc);
    const Tensor shard = wte.view().slice(0, begin, V_local);
    embedding_forward(y1.view(), tokens, wte.view(), wpe.view(), in.pos_offset);
    embedding_forward_at(y2.view(), tokens, wte.view(), wpe.view(), positions);
    EXPECT_EQ(y1.bytes, y2.bytes) << "embedding_forward_at";
    embedding_shard_forward(y1.view(), tokens, shard, begin, wpe.view(), in.pos_offset);
    embedding_shard_forward_at(y2.view(), tokens, shard, begin, wpe.view(), positions);
    EXPECT_EQ(y1.bytes, y2.bytes) << "embedding_shard_forward_at";
    Buffer dwte1(dt, vocab, in.dwte0), dwpe1(dt, table, in.dwpe0), dwte2 = dwte1, dwpe2 = dwpe1;
    embedding_backward(dwte1.view(), dwpe1.view(), dy.view(), tokens, in.pos_offset);
    embedding_backward_at(dwte2.view(), dwpe2.view(), dy.view(), tokens, positions);
    EXPECT_EQ(dwte1.bytes, dwte2.bytes) << "embedding_backward_at: dwte";
    EXPECT_EQ(dwpe1.bytes, dwpe2.bytes) << "embedding_backward_at: dwpe";
    embedding_shard_backward(dwte1.view().slice(0, begin, V_local), dwpe1.view(), dy.view(), tokens, begin,
                             in.pos_offset);
    embedding_shard_backward_at(dwte2.view().slice(0, begin, V_local), dwpe2.view(), dy.view(), tokens, begin,
                                positions);
    EXPECT_EQ(dwte1.bytes, dwte2.bytes) << "embedding_shard_backward_at: dwte";
    EXPECT_EQ(dwpe1.bytes, dwpe2.bytes) << "embedding_shard_backward_at: dwpe";
  }
}

// wte holds rows [10, 15) of the vocabulary; tokens on both sides of the range
// (and the largest i32) give zero rows (wpe rows with wpe) and no gradient.
TEST(EmbeddingShard, TokensOutsideTheShardContributeNothing) {
  const int64_t C = 3, begin = 10;
  std::vector<int32_t> toks = {9, 10, 14, 15, 0, INT32_MAX, 12, 10};
  const Tensor tokens(toks.data(), DType::i32, Shape{2, 4});
  Floats te = random_floats(5 * C, 3), pe = random_floats(4 * C, 4), dy = random_floats(8 * C, 5);
  const auto in_shard = [&](int64_t i) { return toks[i] >= begin && toks[i] < begin + 5; };
  for (bool learned : {false, true}) {
    SCOPED_TRACE(learned ? "wpe" : "no wpe");
    Floats ys(8 * C, 7.f);
    embedding_shard_forward(f32_view(ys, {2, 4, C}), tokens, f32_view(te, {5, C}), begin,
                            learned ? f32_view(pe, {4, C}) : Tensor(), 0);
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        const float e = in_shard(i) ? te[(toks[i] - begin) * C + c] : 0.f;
        const float p = learned ? pe[(i % 4) * C + c] : 0.f;
        EXPECT_EQ(ys[i * C + c], e + p) << "(bt, c) = " << i << ", " << c;
      }
    }
  }
  Floats dwte(5 * C, 1.f);
  embedding_shard_backward(f32_view(dwte, {5, C}), Tensor(), f32_view(dy, {2, 4, C}), tokens, begin, 0);
  Floats expected(5 * C, 1.f);
  for (int64_t i = 0; i < 8; ++i) {
    if (!in_shard(i)) continue;
    for (int64_t c = 0; c < C; ++c) expected[(toks[i] - begin) * C + c] += dy[i * C + c];
  }
  EXPECT_TRUE(all_close(dwte, expected, 1e-6, 0));
  EXPECT_EQ(Floats(dwte.begin() + 1 * C, dwte.begin() + 2 * C), Floats(C, 1.f)) << "row of token 11: none given";
}

TEST(EmbeddingShard, NegativeTokenOrVocabBeginNamesTheOp) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  toks[4] = 1000000;  // past this shard and any vocabulary: the caller's check, not the shard's
  EXPECT_NO_THROW(embedding_shard_forward(y, tokens, wte, 20, wpe, 0));
  EXPECT_NO_THROW(embedding_shard_backward(wte, wpe, y, tokens, 20, 0));
  toks[4] = -3;
  expect_error([&] { embedding_shard_forward(y, tokens, wte, 0, wpe, 0); },
               {"embedding_shard_forward", "token -3", "(b, t) = (1, 1)", "negative"});
  expect_error([&] { embedding_shard_backward(wte, wpe, y, tokens, 0, 0); },
               {"embedding_shard_backward", "token -3", "(b, t) = (1, 1)", "negative"});
  expect_error([&] { embedding_shard_backward(Tensor(), wpe, y, tokens, 0, 0); },
               {"embedding_shard_backward", "token -3"});
  toks[4] = 5;
  expect_error([&] { embedding_shard_forward(y, tokens, wte, -10, wpe, 0); },
               {"embedding_shard_forward", "vocab_begin -10"});
  expect_error([&] { embedding_shard_backward(wte, wpe, y, tokens, -10, 0); },
               {"embedding_shard_backward", "vocab_begin -10"});
}

TEST(EmbeddingShard, ShapeDtypeAndPositionMismatchesNameTheOpAndShapes) {
  SmallOperands o;
  auto& [toks, te, pe, ys, tokens, wte, wpe, y] = o;
  Tensor y_bad(ys.data(), DType::f32, Shape{2, 4, 3}), wpe_bad(pe.data(), DType::f32, Shape{4, 8});
  Tensor tokens_f32(toks.data(), DType::f32, Shape{2, 3}), wte_bf16(te.data(), DType::bf16, Shape{10, 4});
  const char* fwd = "embedding_shard_forward";
  const char* bwd = "embedding_shard_backward";
  expect_error([&] { embedding_shard_forward(y_bad, tokens, wte, 0, wpe, 0); }, {fwd, "y", "(2, 3, 4)", "f32(2, 4, 3)"});
  expect_error([&] { embedding_shard_forward(y, tokens, wte, 0, wpe_bad, 0); }, {fwd, "wpe", "f32(4, 8)"});
  expect_error([&] { embedding_shard_forward(y, tokens_f32, wte, 0, wpe, 0); }, {fwd, "tokens", "f32(2, 3)"});
  expect_error([&] { embedding_shard_forward(y, tokens, wte_bf16, 0, wpe, 0); }, {fwd, "y", "wte", "bf16(10, 4)"});
  expect_error([&] { embedding_shard_forward(y, tokens, wte, 0, wpe, 6); }, {fwd, "position 8", "[0, 8)"});
  expect_error([&] { embedding_shard_backward(wte, wpe, y_bad, tokens, 0, 0); }, {bwd, "dy", "f32(2, 4, 3)"});
  expect_error([&] { embedding_shard_backward(wpe_bad, Tensor(), y, tokens, 0, 0); }, {bwd, "dwte", "f32(4, 8)"});
  expect_error([&] { embedding_shard_backward(wte, wpe, y, tokens, 0, 6); }, {bwd, "position 8", "[0, 8)"});
  expect_error([&] { embedding_shard_backward(wte, wte, y, tokens, 0, 0); }, {bwd, "dwte must not overlap dwpe"});
}

}  // namespace
}  // namespace loom::kernels
