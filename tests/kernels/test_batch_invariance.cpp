// Batch invariance of the serving path's row-wise kernels: a row's output is
// bitwise the same whatever the number of rows M of the call and whatever rows
// surround it. The engine's determinism rests on it (a request's tokens must
// not depend on what else runs in its step, on chunked prefill or on
// preemption): the paged runner feeds every GEMM, norm and activation the
// flat list of a step's rows, whose count and neighbours change from step to
// step. (The paged attention kernel states its own invariance in ops.h and
// tests/kernels/test_paged_attention.cpp; the sampler's sample_rows vs
// sample_at is in tests/infer/test_engine_determinism.cpp, since the sampler
// lives in infer/.)
//
// Method: a pool of 512 random input rows and the op's output over all of
// them (the reference); then for each M in {1, 2, 3, 7, 17, 64, 100, 255,
// 512} the op over M rows drawn from the pool in a random order (so each row
// gets other neighbours and another index in the call), every output row
// compared byte for byte with the reference's. Shapes: the quickstart model
// (C 128, F 512, V 50257) and gpt2-124m (C 768, F 3072; the fused QKV 2304)
// and their LM heads, two odd ones, f32, bf16 and f16 (16-bit outputs for the
// layers' GEMMs, f32 logits for the LM head, as the paged runner computes).
// The linears are linear_forward_invariant, as the paged runner runs them
// (oneDNN's linear_forward of training makes no such promise).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/dtype.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using loom::test::Buffer;

const std::vector<int64_t> kRowCounts = {1, 2, 3, 7, 17, 64, 100, 255, 512};
constexpr int64_t kPoolRows = 512;

std::string dt(DType t) { return std::string(dtype_name(t)); }

// Cheap deterministic values in [-scale, scale): large weights (the LM head's
// 38.6M) are filled in well under a second.
void fill_hashed(Buffer& b, uint64_t seed, float scale) {
  const int64_t n = b.shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
    z ^= z >> 29;
    b.set(i, scale * (static_cast<float>(z >> 40) * 0x1p-23f - 1.f));
  }
}

// The rows idx of a (rows, cols) buffer, gathered in that order.
Buffer gather_rows(const Buffer& src, const std::vector<int64_t>& idx) {
  const int64_t cols = src.shape[src.shape.ndim() - 1];
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(src.dtype);
  Buffer out(src.dtype, {static_cast<int64_t>(idx.size()), cols});
  for (size_t i = 0; i < idx.size(); ++i)
    std::memcpy(out.bytes.data() + i * row_bytes, src.bytes.data() + static_cast<size_t>(idx[i]) * row_bytes,
                row_bytes);
  return out;
}

// M distinct pool rows in a random order (all of them, shuffled, for M = pool).
std::vector<int64_t> draw_rows(int64_t M, uint32_t seed) {
  std::vector<int64_t> idx(static_cast<size_t>(kPoolRows));
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), std::mt19937(seed));
  idx.resize(static_cast<size_t>(M));
  return idx;
}

// How the rows of one call compare with the reference's.
struct RowDiff {
  int64_t rows = 0, differing = 0;
  double max_abs = 0, max_rel = 0;
  std::string first;  // the first differing row, for the message
};

void compare_rows(RowDiff& d, const Buffer& got, const Buffer& ref, const std::vector<int64_t>& idx, int64_t M) {
  const int64_t cols = got.shape[got.shape.ndim() - 1];
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(got.dtype);
  auto row = [&](const Buffer& b, size_t r) {
    return loom::test::to_floats(Tensor(const_cast<unsigned char*>(b.bytes.data()) + r * row_bytes, b.dtype, {cols}));
  };
  for (size_t i = 0; i < idx.size(); ++i) {
    ++d.rows;
    const auto j = static_cast<size_t>(idx[i]);
    if (std::memcmp(got.bytes.data() + i * row_bytes, ref.bytes.data() + j * row_bytes, row_bytes) == 0) continue;
    if (d.differing++ == 0) d.first = "M " + std::to_string(M) + ", pool row " + std::to_string(j);
    const loom::test::Floats g = row(got, i), r = row(ref, j);
    for (size_t c = 0; c < g.size(); ++c) {
      const double a = g[c], e = r[c], diff = std::fabs(a - e);
      d.max_abs = std::max(d.max_abs, diff);
      if (diff > 0) d.max_rel = std::max(d.max_rel, diff / std::max(std::fabs(e), 1e-30));
    }
  }
}

// op(y, x): a row-wise op, y (M, out_cols) from x (M, in_cols). Also takes
// the rows' pool indices, for inputs other than x that follow the rows
// (positions).
using RowOp = std::function<void(Buffer& y, Buffer& x, const std::vector<int64_t>& rows)>;

struct RowCase {
  std::string name;
  DType in, out;
  int64_t in_cols, out_cols;
  RowOp op;
  float x_scale = 1.f;
};

::testing::AssertionResult rows_are_batch_invariant(const RowCase& c) {
  Buffer pool(c.in, {kPoolRows, c.in_cols});
  fill_hashed(pool, 7, c.x_scale);
  std::vector<int64_t> all(static_cast<size_t>(kPoolRows));
  std::iota(all.begin(), all.end(), 0);
  Buffer ref(c.out, {kPoolRows, c.out_cols});
  c.op(ref, pool, all);
  RowDiff d;
  for (int64_t M : kRowCounts) {
    const std::vector<int64_t> idx = draw_rows(M, static_cast<uint32_t>(1000 + M));
    Buffer x = gather_rows(pool, idx), y(c.out, {M, c.out_cols});
    c.op(y, x, idx);
    compare_rows(d, y, ref, idx, M);
  }
  if (d.differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.name << ": " << d.differing << " of " << d.rows
                                       << " rows differ from the same row in a call of 512 (first: " << d.first
                                       << "); max abs diff " << d.max_abs << ", max rel diff " << d.max_rel;
}

// ---- linear ---------------------------------------------------------------------

struct LinearShape {
  const char* name;
  int64_t in, out;
  bool bias;
};

// The quickstart model's (configs/quickstart.toml: C 128, F 512) and
// gpt2-124m's (C 768, F 3072) GEMMs: q/k/v/out projection, fused QKV, MLP up
// and down.
const LinearShape kLayerShapes[] = {
    {"quickstart qkv 128x128", 128, 128, true},   {"quickstart fused qkv 128x384", 128, 384, true},
    {"quickstart fc 128x512", 128, 512, true},    {"quickstart proj 512x128", 512, 128, true},
    {"gpt2-124m attn 768x768", 768, 768, true},   {"gpt2-124m fused qkv 768x2304", 768, 2304, true},
    {"gpt2-124m fc 768x3072", 768, 3072, true},   {"gpt2-124m proj 3072x768", 3072, 768, true},
    {"llama-tiny-like kv 100x37", 100, 37, false}, {"odd 33x130", 33, 130, true},
};

RowCase linear_case(const LinearShape& s, DType in, DType out) {
  auto w = std::make_shared<Buffer>(in, Shape{s.out, s.in});
  fill_hashed(*w, 11, 1.f / std::sqrt(static_cast<float>(s.in)));
  std::shared_ptr<Buffer> b;
  if (s.bias) {
    b = std::make_shared<Buffer>(in, Shape{s.out});
    fill_hashed(*b, 13, 0.1f);
  }
  RowOp op = [w, b](Buffer& y, Buffer& x, const std::vector<int64_t>&) {
    linear_forward_invariant(y.view(), x.view(), w->view(), b ? b->view() : Tensor());  // the paged runner's
  };
  return {std::string(s.name) + " " + dt(in) + " -> " + dt(out), in, out, s.in, s.out, op};
}

TEST(BatchInvariance, LinearF32RowsDoNotDependOnTheBatch) {
  for (const LinearShape& s : kLayerShapes) EXPECT_TRUE(rows_are_batch_invariant(linear_case(s, DType::f32, DType::f32)));
}

TEST(BatchInvariance, LinearBf16AndF16RowsDoNotDependOnTheBatch) {
  for (const LinearShape& s : kLayerShapes) {
    EXPECT_TRUE(rows_are_batch_invariant(linear_case(s, DType::bf16, DType::bf16)));
    EXPECT_TRUE(rows_are_batch_invariant(linear_case(s, DType::f16, DType::f16)));
  }
}

// The LM heads (V 50257): f32 logits, from f32 or bf16 operands.
TEST(BatchInvariance, LmHeadLogitRowsDoNotDependOnTheBatch) {
  const LinearShape heads[] = {{"quickstart lm head 128x50257", 128, 50257, false},
                               {"gpt2-124m lm head 768x50257", 768, 50257, false}};
  for (const LinearShape& s : heads) {
    EXPECT_TRUE(rows_are_batch_invariant(linear_case(s, DType::f32, DType::f32)));
    EXPECT_TRUE(rows_are_batch_invariant(linear_case(s, DType::bf16, DType::f32)));
  }
}

// ---- norms, activations, rope, residual add ------------------------------------

const DType kDtypes[] = {DType::f32, DType::bf16};

TEST(BatchInvariance, LayerNormAndRmsNormRowsDoNotDependOnTheBatch) {
  for (DType t : kDtypes) {
    for (int64_t C : {128, 768}) {
      auto w = std::make_shared<Buffer>(t, Shape{C}), b = std::make_shared<Buffer>(t, Shape{C});
      fill_hashed(*w, 3, 1.f), fill_hashed(*b, 4, 0.5f);
      const std::string dims = " C " + std::to_string(C) + " " + dt(t);
      // Inference: no saved statistics (the runner passes none), and with them.
      EXPECT_TRUE(rows_are_batch_invariant({"layernorm" + dims, t, t, C, C, [=](Buffer& y, Buffer& x, auto&) {
                                              layernorm_forward(y.view(), Tensor(), Tensor(), x.view(), w->view(),
                                                                b->view(), 1e-5f);
                                            }, 3.f}));
      EXPECT_TRUE(rows_are_batch_invariant({"layernorm with statistics" + dims, t, t, C, C,
                                            [=](Buffer& y, Buffer& x, auto&) {
                                              const int64_t M = x.shape[0];
                                              Buffer mean(DType::f32, {M}), rstd(DType::f32, {M});
                                              layernorm_forward(y.view(), mean.view(), rstd.view(), x.view(),
                                                                w->view(), b->view(), 1e-5f);
                                            }, 3.f}));
      EXPECT_TRUE(rows_are_batch_invariant({"rmsnorm" + dims, t, t, C, C, [=](Buffer& y, Buffer& x, auto&) {
                                              rmsnorm_forward(y.view(), Tensor(), x.view(), w->view(), 1e-5f);
                                            }, 3.f}));
    }
  }
}

// Elementwise ops over (M, F): GELU (GPT-2's MLP), SwiGLU (Llama's: gate and
// up side by side in one input row of 2F), SiLU; F 512 and 3072 as in the
// models, and Llama-shaped odd widths (llama-tiny's F 172, and 100), whose
// rows do not start on a vector boundary.
TEST(BatchInvariance, ActivationRowsDoNotDependOnTheBatch) {
  for (DType t : kDtypes) {
    for (int64_t F : {512, 3072, 172, 100}) {
      const std::string dims = " F " + std::to_string(F) + " " + dt(t);
      EXPECT_TRUE(rows_are_batch_invariant({"gelu" + dims, t, t, F, F, [](Buffer& y, Buffer& x, auto&) {
                                              gelu_forward(y.view(), x.view());
                                            }, 4.f}));
      EXPECT_TRUE(rows_are_batch_invariant({"silu" + dims, t, t, F, F, [](Buffer& y, Buffer& x, auto&) {
                                              silu_forward(y.view(), x.view());
                                            }, 4.f}));
      EXPECT_TRUE(rows_are_batch_invariant({"swiglu" + dims, t, t, 2 * F, F, [F](Buffer& y, Buffer& x, auto&) {
                                              // x's row = [gate | up]: split into two (M, F) operands.
                                              const int64_t M = x.shape[0];
                                              Buffer gate(x.dtype, {M, F}), up(x.dtype, {M, F});
                                              const size_t es = dtype_size(x.dtype), row = F * es;
                                              for (int64_t r = 0; r < M; ++r) {
                                                std::memcpy(gate.bytes.data() + r * row, x.bytes.data() + 2 * r * row, row);
                                                std::memcpy(up.bytes.data() + r * row, x.bytes.data() + (2 * r + 1) * row, row);
                                              }
                                              swiglu_forward(y.view(), gate.view(), up.view());
                                            }, 4.f}));
    }
  }
}

// RoPE over a ragged step's rows, each at its own position (the pool row's
// index times 3, up to 1533), q of llama-tiny (NH 4, HS 16) and llama-110m
// (NH 12, HS 64) shapes; and the residual add.
TEST(BatchInvariance, RopeAndResidualAddRowsDoNotDependOnTheBatch) {
  for (DType t : kDtypes) {
    for (auto [NH, HS] : {std::pair<int64_t, int64_t>{4, 16}, {12, 64}}) {
      const int64_t D = NH * HS;
      const std::string dims = " NH " + std::to_string(NH) + " HS " + std::to_string(HS) + " " + dt(t);
      EXPECT_TRUE(rows_are_batch_invariant({"rope" + dims, t, t, D, D,
                                            [NH, HS](Buffer& y, Buffer& x, const std::vector<int64_t>& rows) {
                                              const int64_t M = x.shape[0];
                                              std::vector<int32_t> pos;
                                              for (int64_t r : rows) pos.push_back(static_cast<int32_t>(3 * r));
                                              rope_forward(y.view().reshape({1, M, NH, HS}),
                                                           x.view().reshape({1, M, NH, HS}),
                                                           Tensor(pos.data(), DType::i32, {M}), 10000.f);
                                            }}));
    }
    for (int64_t C : {128, 768}) {
      EXPECT_TRUE(rows_are_batch_invariant({"add C " + std::to_string(C) + " " + dt(t), t, t, 2 * C, C,
                                            [C](Buffer& y, Buffer& x, auto&) {
                                              // x's row = [a | b]; y = a + b.
                                              const int64_t M = x.shape[0];
                                              const Tensor v = x.view().reshape({M, 2, C});
                                              Buffer a(x.dtype, {M, C}), b(x.dtype, {M, C});
                                              copy(a.view().reshape({M, 1, C}), v.slice(1, 0, 1));
                                              copy(b.view().reshape({M, 1, C}), v.slice(1, 1, 1));
                                              add(y.view(), a.view(), b.view());
                                            }}));
    }
  }
}

// ---- embedding ---------------------------------------------------------------------

// embedding_forward_at over a ragged step's rows (token, position): row r's
// output is the same whatever rows are looked up beside it. Quickstart (GPT-2
// vocabulary, C 128, 128 positions) and gpt2-124m (C 768, 1024 positions).
TEST(BatchInvariance, EmbeddingRowsDoNotDependOnTheBatch) {
  for (DType t : kDtypes) {
    for (auto [C, maxT] : {std::pair<int64_t, int64_t>{128, 128}, {768, 1024}}) {
      constexpr int64_t V = 50257;
      Buffer wte(t, {V, C}), wpe(t, {maxT, C});
      fill_hashed(wte, 21, 0.1f), fill_hashed(wpe, 22, 0.02f);
      std::vector<int32_t> tok_pool, pos_pool;
      for (int64_t i = 0; i < kPoolRows; ++i) {
        tok_pool.push_back(static_cast<int32_t>((i * 7919 + 13) % V));
        pos_pool.push_back(static_cast<int32_t>((i * 37 + 5) % maxT));
      }
      auto run = [&](const std::vector<int64_t>& rows) {
        const auto M = static_cast<int64_t>(rows.size());
        std::vector<int32_t> tok, pos;
        for (int64_t r : rows) tok.push_back(tok_pool[r]), pos.push_back(pos_pool[r]);
        Buffer y(t, {M, C});
        embedding_forward_at(y.view().reshape({1, M, C}), Tensor(tok.data(), DType::i32, {1, M}), wte.view(),
                             wpe.view(), Tensor(pos.data(), DType::i32, {1, M}));
        return y;
      };
      std::vector<int64_t> all(static_cast<size_t>(kPoolRows));
      std::iota(all.begin(), all.end(), 0);
      const Buffer ref = run(all);
      RowDiff d;
      for (int64_t M : kRowCounts) {
        const std::vector<int64_t> idx = draw_rows(M, static_cast<uint32_t>(2000 + M));
        compare_rows(d, run(idx), ref, idx, M);
      }
      EXPECT_EQ(d.differing, 0) << "embedding C " << C << " " << dtype_name(t) << ": " << d.differing << " of "
                                << d.rows << " rows differ (first: " << d.first << "), max abs " << d.max_abs;
    }
  }
}

}  // namespace
}  // namespace loom::kernels
