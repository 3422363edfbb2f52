// Tensor parallelism without communication (tensor_parallel.h, params.h):
// how each tp rank's parameter specs cut the global ones, the slice and
// assemble helpers built on them, sharding-invariant initialisation, the
// user errors for splits that cannot be made, the activation memory one
// layer takes against Korthikanti et al. 2022, and the order in which
// backward overlaps its tp sums with the weight gradients.
//
// Configs: GPT-2 (12 heads, d_ff 384) tied with V = 512 and untied with
// V = 50257 (padded at every tp), Llama GQA (24 heads, 12 KV heads,
// d_ff 240) untied with V = 512 and tied with V = 50257; tp = 2, 3 and 4
// divide every split size.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "model/model.h"
#include "model/params.h"

namespace loom::model {
namespace {

using loom::test::expect_error;
using loom::test::Floats;

ModelConfig gpt2_config(int64_t vocab, bool tied) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = 2, c.n_embd = 96, c.n_head = 12, c.n_kv_head = 12, c.d_ff = 384;
  c.vocab_size = vocab, c.max_seq_len = 32, c.tie_embeddings = tied;
  return c;
}

ModelConfig llama_config(int64_t vocab, bool tied) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = 2, c.n_embd = 96, c.n_head = 24, c.n_kv_head = 12, c.d_ff = 240;
  c.vocab_size = vocab, c.max_seq_len = 32, c.tie_embeddings = tied;
  return c;
}

struct NamedConfig {
  const char* name;
  ModelConfig cfg;
};

std::vector<NamedConfig> configs() {
  return {{"gpt2 tied V512", gpt2_config(512, true)},
          {"gpt2 untied V50257", gpt2_config(50257, false)},
          {"llama gqa untied V512", llama_config(512, false)},
          {"llama gqa tied V50257", llama_config(50257, true)}};
}

constexpr int kTpSizes[] = {2, 3, 4};

bool is_vocab(const std::string& name) {
  return name == "wte.weight" || name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

// The global flat index (within the parameter) of every local element, from
// the rank's shard runs; -1 for padding.
std::vector<int64_t> global_index_of(const ParamSpec& spec) {
  std::vector<int64_t> map(spec.numel(), std::numeric_limits<int64_t>::min());
  for (const ShardRun& r : shard_runs(spec))
    for (int64_t k = 0; k < r.count; ++k) map[r.local + k] = r.global < 0 ? -1 : r.global + k;
  return map;
}

// What the Megatron split means for one local element (row i, column j of
// the rank's 2-D shape; j = 0 for a 1-D spec): the global (row, column) it
// is, from the definitions alone — column-parallel: the rank's block of
// output rows (GPT-2's c_attn: its block of each of q, k and v); vocab: rows
// [r Vl, (r + 1) Vl); row-parallel: the rank's block of input columns.
std::pair<int64_t, int64_t> expected_global(const ParamSpec& s, int64_t i, int64_t j, const ModelConfig& cfg) {
  const int r = s.tp.rank;
  if (s.replicated()) return {i, j};
  if (s.split.dim == 1) return {i, r * s.shape[1] + j};
  if (is_vocab(s.name)) return {r * vocab_per_rank(cfg, s.tp.size) + i, j};
  const int64_t piece = s.shape[0] / s.split.blocks, block = i / piece;
  return {block * (s.global_shape[0] / s.split.blocks) + r * piece + i % piece, j};
}

TEST(TensorParallelSpecs, EveryRankHasTheGlobalNamesInOrderWithLocalShapesAndPackedOffsets) {
  for (const auto& [what, cfg] : configs())
    for (int tp : kTpSizes) {
      const std::vector<ParamSpec> whole = param_specs(cfg);
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(concat(what, " tp ", tp, " rank ", r));
        const std::vector<ParamSpec> mine = param_specs(cfg, {tp, r});
        ASSERT_EQ(mine.size(), whole.size());
        int64_t offset = 0;
        for (size_t k = 0; k < mine.size(); ++k) {
          const ParamSpec& s = mine[k];
          EXPECT_EQ(s.name, whole[k].name);
          EXPECT_EQ(s.global_shape, whole[k].shape) << s.name;
          EXPECT_EQ(s.tp.size, tp);
          EXPECT_EQ(s.tp.rank, r);
          EXPECT_EQ(s.offset, offset) << s.name;
          offset += s.numel();
          ASSERT_EQ(s.shape.ndim(), s.global_shape.ndim()) << s.name;
          for (int d = 0; d < s.shape.ndim(); ++d) {
            int64_t expected = s.global_shape[d];
            if (d == s.split.dim)
              expected = is_vocab(s.name) ? vocab_per_rank(cfg, tp) : s.global_shape[d] / tp;
            EXPECT_EQ(s.shape[d], expected) << s.name << " dim " << d;
          }
          // Every split's global extent is divisible (no padding) except the vocabulary's.
          if (!s.replicated() && !is_vocab(s.name)) {
            EXPECT_EQ(s.global_shape[s.split.dim] % tp, 0) << s.name;
          }
        }
        EXPECT_EQ(param_count(mine), offset);
      }
    }
}

TEST(TensorParallelSpecs, VocabPerRankIsTheVocabularyRoundedUpToTpDividedByTp) {
  EXPECT_EQ(vocab_per_rank(gpt2_config(50257, true), 1), 50257);
  EXPECT_EQ(vocab_per_rank(gpt2_config(50257, true), 2), 25129);  // 50258 / 2
  EXPECT_EQ(vocab_per_rank(gpt2_config(50257, true), 3), 16753);  // 50259 / 3
  EXPECT_EQ(vocab_per_rank(gpt2_config(50257, true), 4), 12565);  // 50260 / 4
  EXPECT_EQ(vocab_per_rank(gpt2_config(512, true), 4), 128);
  EXPECT_EQ(vocab_per_rank(gpt2_config(512, true), 3), 171);      // 513 / 3
}

TEST(TensorParallelSpecs, ShardRunsOfAllRanksCoverEveryGlobalElementExactlyOnce) {
  for (const auto& [what, cfg] : configs())
    for (int tp : kTpSizes) {
      SCOPED_TRACE(concat(what, " tp ", tp));
      const std::vector<ParamSpec> whole = param_specs(cfg);
      std::vector<std::vector<ParamSpec>> ranks;
      for (int r = 0; r < tp; ++r) ranks.push_back(param_specs(cfg, {tp, r}));
      for (size_t k = 0; k < whole.size(); ++k) {
        const std::string& name = whole[k].name;
        std::vector<int> hits(whole[k].numel(), 0);
        int64_t padding = 0;
        for (int r = 0; r < tp; ++r) {
          const ParamSpec& s = ranks[r][k];
          const std::vector<ShardRun> runs = shard_runs(s);
          if (s.replicated()) {
            ASSERT_EQ(runs.size(), 1u) << name;
            EXPECT_EQ(runs[0].local, 0);
            EXPECT_EQ(runs[0].global, 0);
            EXPECT_EQ(runs[0].count, s.numel());
          }
          int64_t next = 0;  // runs cover the local tensor in order, without gaps
          for (const ShardRun& run : runs) {
            EXPECT_EQ(run.local, next) << name << " rank " << r;
            EXPECT_GT(run.count, 0) << name;
            next = run.local + run.count;
            if (run.global >= 0) {
              ASSERT_LE(run.global + run.count, s.global_numel()) << name;
              for (int64_t g = run.global; g < run.global + run.count; ++g) ++hits[g];
              continue;
            }
            // Padding: whole rows of the vocabulary past its real extent.
            ASSERT_TRUE(is_vocab(name)) << name << " has padding";
            const int64_t C = s.shape[1];
            EXPECT_EQ(run.local % C, 0);
            EXPECT_EQ(run.count % C, 0);
            const int64_t first_row = r * vocab_per_rank(cfg, tp) + run.local / C;
            EXPECT_GE(first_row, cfg.vocab_size) << name << " rank " << r;
            padding += run.count;
          }
          EXPECT_EQ(next, s.numel()) << name << " rank " << r;
        }
        const int expected_hits = whole[k].split.dim < 0 ? tp : 1;
        int64_t wrong = 0;
        for (int h : hits) wrong += h != expected_hits;
        EXPECT_EQ(wrong, 0) << name << ": elements not covered " << expected_hits << " time(s)";
        const int64_t pad_rows = is_vocab(name) ? vocab_per_rank(cfg, tp) * tp - cfg.vocab_size : 0;
        EXPECT_EQ(padding, pad_rows * cfg.n_embd) << name;
      }
    }
}

TEST(TensorParallelSpecs, ShardRunsPlaceEveryLocalElementWhereTheMegatronSplitPutsIt) {
  for (const auto& [what, cfg] : configs())
    for (int tp : kTpSizes)
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(concat(what, " tp ", tp, " rank ", r));
        for (const ParamSpec& s : param_specs(cfg, {tp, r})) {
          const std::vector<int64_t> map = global_index_of(s);
          const int64_t cols = s.shape.ndim() == 2 ? s.shape[1] : 1;
          const int64_t gcols = s.global_shape.ndim() == 2 ? s.global_shape[1] : 1;
          int64_t wrong = 0;
          for (int64_t i = 0; i < s.shape[0]; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              const auto [gi, gj] = expected_global(s, i, j, cfg);
              const int64_t expected = gi >= s.global_shape[0] ? -1 : gi * gcols + gj;
              wrong += map[i * cols + j] != expected;
            }
          EXPECT_EQ(wrong, 0) << s.name;
        }
      }
}

// GPT-2's fused c_attn (3C, C) rows are q, k, v, each n_head blocks of
// head_size rows; rank r must hold heads [r NH/tp, (r + 1) NH/tp) of each,
// q then k then v, so its local rows split into its own q, k and v.
TEST(TensorParallelSpecs, Gpt2CAttnLocalRowsAreTheRanksQKVHeads) {
  const ModelConfig cfg = gpt2_config(512, true);
  const int64_t C = cfg.n_embd, HS = cfg.head_size();
  for (int tp : kTpSizes)
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(concat("tp ", tp, " rank ", r));
      const int64_t heads = cfg.n_head / tp, first = r * heads;
      for (const ParamSpec& s : param_specs(cfg, {tp, r})) {
        if (s.name != "h.0.attn.c_attn.weight" && s.name != "h.1.attn.c_attn.bias") continue;
        const int64_t cols = s.shape.ndim() == 2 ? s.shape[1] : 1;
        ASSERT_EQ(s.shape[0], 3 * heads * HS) << s.name;
        const std::vector<int64_t> map = global_index_of(s);
        for (int64_t i = 0; i < s.shape[0]; ++i) {
          const int64_t which = i / (heads * HS);  // 0 q, 1 k, 2 v
          const int64_t head = first + (i % (heads * HS)) / HS, within = i % HS;
          const int64_t global_row = which * C + head * HS + within;
          ASSERT_EQ(map[i * cols], global_row * cols) << s.name << " local row " << i;
          ASSERT_EQ(map[i * cols + cols - 1], global_row * cols + cols - 1) << s.name;
        }
      }
    }
  // One case spelled out: at tp = 3 rank 1 holds heads 4-7 (HS 8), that is
  // q rows 32-63, k rows 128-159, v rows 224-255.
  for (const ParamSpec& s : param_specs(cfg, {3, 1}))
    if (s.name == "h.0.attn.c_attn.weight") {
      const std::vector<ShardRun> runs = shard_runs(s);
      ASSERT_EQ(runs.size(), 3u);
      const int64_t rows[] = {32, 128, 224};
      for (int b = 0; b < 3; ++b) {
        EXPECT_EQ(runs[b].local, b * 32 * C);
        EXPECT_EQ(runs[b].global, rows[b] * C);
        EXPECT_EQ(runs[b].count, 32 * C);
      }
    }
}

// GQA: rank r's k_proj / v_proj rows are its KV heads [r NKV/tp, ...), and
// its q heads are the ones those KV heads serve (n_head / n_kv_head each).
TEST(TensorParallelSpecs, LlamaGqaRankHoldsItsKvHeadsAndTheQueryHeadsTheyServe) {
  const ModelConfig cfg = llama_config(512, false);
  const int64_t HS = cfg.head_size(), group = cfg.n_head / cfg.n_kv_head;
  for (int tp : kTpSizes)
    for (int r = 0; r < tp; ++r)
      for (const ParamSpec& s : param_specs(cfg, {tp, r})) {
        const bool kv = s.name == "model.layers.0.self_attn.k_proj.weight" ||
                        s.name == "model.layers.0.self_attn.v_proj.weight";
        const bool q = s.name == "model.layers.0.self_attn.q_proj.weight";
        if (!kv && !q) continue;
        const std::vector<int64_t> map = global_index_of(s);
        const int64_t first_kv = r * cfg.n_kv_head / tp, cols = s.shape[1];
        const int64_t first_head = kv ? first_kv : first_kv * group;
        for (int64_t i = 0; i < s.shape[0]; ++i)
          ASSERT_EQ(map[i * cols] / cols, first_head * HS + i) << s.name << " tp " << tp << " rank " << r;
      }
}

// ---- tp_slice / tp_assemble ------------------------------------------------

Tensor flat_view(Floats& v) { return Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}); }

TEST(TensorParallelSlice, SliceThenAssembleRoundTripsAGlobalBufferBitwise) {
  for (const auto& [what, cfg] : configs())
    for (int tp : kTpSizes) {
      SCOPED_TRACE(concat(what, " tp ", tp));
      const std::vector<ParamSpec> whole = param_specs(cfg);
      Floats global = loom::test::random_floats(param_count(whole), 7u + tp);
      std::vector<Floats> locals;
      std::vector<Tensor> views;
      for (int r = 0; r < tp; ++r) {
        const std::vector<ParamSpec> mine = param_specs(cfg, {tp, r});
        locals.emplace_back(param_count(mine), std::numeric_limits<float>::quiet_NaN());
        tp_slice(flat_view(locals.back()), cfg, {tp, r}, flat_view(global));
        // Every element is the global one its run names; padding is 0.
        int64_t wrong = 0;
        for (size_t k = 0; k < mine.size(); ++k)
          for (const ShardRun& run : shard_runs(mine[k]))
            for (int64_t e = 0; e < run.count; ++e) {
              const float got = locals.back()[mine[k].offset + run.local + e];
              const float want = run.global < 0 ? 0.f : global[whole[k].offset + run.global + e];
              wrong += std::memcmp(&got, &want, sizeof(float)) != 0;
            }
        EXPECT_EQ(wrong, 0) << "rank " << r;
      }
      for (Floats& l : locals) views.push_back(flat_view(l));
      Floats back(global.size(), std::numeric_limits<float>::quiet_NaN());
      tp_assemble(flat_view(back), cfg, tp, views);
      EXPECT_EQ(std::memcmp(back.data(), global.data(), global.size() * sizeof(float)), 0);
    }
}

TEST(TensorParallelSlice, SliceFillsVocabularyPaddingWithZero) {
  const ModelConfig cfg = gpt2_config(50257, false);
  const int tp = 4;  // 50260 rows: the last rank's last 3 rows are padding
  const std::vector<ParamSpec> whole = param_specs(cfg), last = param_specs(cfg, {tp, tp - 1});
  Floats global(param_count(whole), 1.5f);
  Floats local(param_count(last), std::numeric_limits<float>::quiet_NaN());
  tp_slice(flat_view(local), cfg, {tp, tp - 1}, flat_view(global));
  const int64_t Vl = vocab_per_rank(cfg, tp), C = cfg.n_embd;
  for (const ParamSpec& s : last) {
    if (!is_vocab(s.name)) continue;
    for (int64_t row = 0; row < Vl; ++row) {
      const bool pad = (tp - 1) * Vl + row >= cfg.vocab_size;
      for (int64_t j = 0; j < C; ++j)
        ASSERT_EQ(local[s.offset + row * C + j], pad ? 0.f : 1.5f) << s.name << " row " << row;
    }
  }
}

// ---- sharding-invariant initialisation -------------------------------------

TEST(TensorParallelInit, EachRanksInitEqualsTheSliceOfTheGlobalInitBitwise) {
  constexpr uint64_t kSeed = 1234;
  for (const auto& [what, cfg] : configs()) {
    const std::vector<ParamSpec> whole = param_specs(cfg);
    Floats global(param_count(whole));
    init_params(flat_view(global), whole, kSeed);
    double sq = 0;
    for (float x : global) sq += double(x) * x;
    ASSERT_GT(sq, 0.0) << what;  // the comparison below is not between zeros
    for (int tp : kTpSizes)
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(concat(what, " tp ", tp, " rank ", r));
        const std::vector<ParamSpec> mine = param_specs(cfg, {tp, r});
        Floats own(param_count(mine)), sliced(param_count(mine));
        init_params(flat_view(own), mine, kSeed);
        tp_slice(flat_view(sliced), cfg, {tp, r}, flat_view(global));
        for (const ParamSpec& s : mine)
          EXPECT_EQ(std::memcmp(own.data() + s.offset, sliced.data() + s.offset, s.numel() * sizeof(float)), 0)
              << s.name;
      }
  }
}

// init_param on rows [b, e) of a local spec gives those rows of the spec's
// whole local init (ZeRO initialises a rank's slice a bucket at a time).
TEST(TensorParallelInit, InitParamOnARowRangeEqualsThoseRowsOfTheWholeLocalInit) {
  constexpr uint64_t kSeed = 99;
  for (const auto& [what, cfg] : configs())
    for (int tp : kTpSizes)
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(concat(what, " tp ", tp, " rank ", r));
        const std::vector<ParamSpec> mine = param_specs(cfg, {tp, r});
        Floats all(param_count(mine));
        init_params(flat_view(all), mine, kSeed);
        for (const ParamSpec& s : mine) {
          const int64_t rows = s.shape[0], row_size = s.numel() / rows;
          const int64_t cuts[] = {0, rows / 3, rows / 3 + 1, rows - 1, rows};  // uneven, with a 1-row range
          for (int c = 0; c + 1 < 5; ++c) {
            const int64_t b = cuts[c], n = cuts[c + 1] - b;
            if (n <= 0) continue;
            Shape part = s.shape;
            part[0] = n;
            Floats got(n * row_size, std::numeric_limits<float>::quiet_NaN());
            init_param(Tensor(got.data(), DType::f32, part), s, kSeed, b);
            EXPECT_EQ(std::memcmp(got.data(), all.data() + s.offset + b * row_size, got.size() * sizeof(float)), 0)
                << s.name << " rows [" << b << ", " << b + n << ")";
          }
        }
      }
}

// ---- errors -----------------------------------------------------------------

TEST(TensorParallelErrors, TpNotDividingHeadsOrDffNamesParallelTpAndTheKey) {
  ModelConfig heads = gpt2_config(512, true);
  heads.n_head = 4, heads.n_kv_head = 4;  // d_ff 384 is divisible by 3
  expect_error([&] { param_specs(heads, {3, 0}); },
               {"parallel.tp = 3 does not divide model.n_head = 4", "attention heads"});
  ModelConfig kv = llama_config(512, false);
  kv.n_kv_head = 2;  // n_head 24 is divisible by 4
  expect_error([&] { param_specs(kv, {4, 1}); }, {"parallel.tp = 4 does not divide model.n_kv_head = 2"});
  ModelConfig ff = gpt2_config(512, true);
  ff.d_ff = 382;  // n_head 12 is divisible by 4
  expect_error([&] { param_specs(ff, {4, 0}); }, {"parallel.tp = 4 does not divide model.d_ff = 382"});
  // The Model and its memory estimate check the same splits.
  Pools pools;
  expect_error([&] { Model(heads, 1, 8, pools, {.tp = {{3, 0}, false, nullptr}}); },
               {"parallel.tp = 3 does not divide model.n_head = 4"});
  expect_error([&] { Model::activation_bytes(ff, 1, 8, {.compute = DType::bf16, .tp = {{4, 0}}}); },
               {"parallel.tp = 4 does not divide model.d_ff = 382"});
}

TEST(TensorParallelErrors, TpRankOutOfRangeIsAnError) {
  const ModelConfig cfg = gpt2_config(512, true);
  expect_error([&] { param_specs(cfg, {2, 2}); }, {"tensor-parallel rank 2 of 2 is invalid"});
  expect_error([&] { param_specs(cfg, {2, -1}); }, {"tensor-parallel rank -1 of 2 is invalid"});
  expect_error([&] { param_specs(cfg, {0, 0}); }, {"tensor-parallel rank 0 of 0 is invalid"});
}

TEST(TensorParallelErrors, SequenceParallelWithSeqLenNotDivisibleByTpIsAnError) {
  const ModelConfig cfg = gpt2_config(512, true);
  Pools pools;
  expect_error([&] { Model(cfg, 2, 30, pools, {.tp = {{4, 0}, true, nullptr}}); },
               {"sequence length 30 is not divisible by parallel.tp = 4", "sequence parallelism"});
  expect_error([&] { Model::activation_bytes(cfg, 2, 30, {.compute = DType::bf16, .tp = {{4, 0}, true}}); },
               {"sequence parallelism"});
  // Without SP the tokens are not split, so any T works.
  EXPECT_NO_THROW(Model(cfg, 2, 30, pools, {.tp = {{4, 0}, false, nullptr}}));
}

// ---- activation memory ------------------------------------------------------

size_t measured_activations(const ModelConfig& cfg, int64_t B, int64_t T, int tp, bool sp) {
  Pools pools;
  Model m(cfg, B, T, pools, {.compute = DType::bf16, .tp = {{tp, 0}, sp, nullptr}});
  return pools.report()[MemTag::activations].current;
}

ModelConfig memory_config(int64_t n_layer) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = n_layer, c.n_embd = 256, c.n_head = 8, c.n_kv_head = 8, c.d_ff = 4 * 256;
  c.vocab_size = 512, c.max_seq_len = 128;
  return c;
}

TEST(TensorParallelMemory, ActivationBytesEqualsTheActivationsPool) {
  const ModelConfig cfg = memory_config(2);
  for (int tp : {1, 2, 4})
    for (bool sp : {false, true}) {
      const int64_t counted = Model::activation_bytes(cfg, 2, 128, {.compute = DType::bf16, .tp = {{tp, 0}, sp}});
      EXPECT_EQ(static_cast<size_t>(counted), measured_activations(cfg, 2, 128, tp, sp)) << "tp " << tp << " sp " << sp;
    }
}

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models", §4) count one transformer layer's activations in bytes
// with 2-byte values as s b h (34 + 5 a s / h): 10 s b h outside the
// tensor-parallel regions (the two norms' inputs, the attention and MLP
// inputs, two dropout masks) and 24 s b h inside (q, k, v, the attention
// output, the MLP's 4h-wide input and output of the activation). TP divides
// the 24 by t; SP also divides the 10 by t. The 5 a s / h term is the
// s x s attention scores, softmax and its dropout mask: loom's flash
// attention keeps only a per-row log-sum-exp, so the term is dropped. (loom
// has no dropout either: its count sits a little below the formula, by
// 2 s b h of masks, offset in part by its f32 norm statistics and lse.)
// Measured: the activations pool of a 3-layer model minus that of a
// 2-layer one, so the embedding, head and backward scratch cancel.
TEST(TensorParallelMemory, PerLayerActivationsMatchKorthikantiWithin15Percent) {
  const int64_t B = 2, T = 128;
  const ModelConfig three = memory_config(3), two = memory_config(2);
  const double sbh = double(T) * B * three.n_embd;
  for (int tp : {1, 2, 4})
    for (bool sp : {false, true}) {
      if (tp == 1 && sp) continue;  // SP needs TP (Megatron ignores it at tp = 1)
      const double measured = double(measured_activations(three, B, T, tp, sp)) -
                              double(measured_activations(two, B, T, tp, sp));
      const double predicted = tp == 1 ? sbh * 34 : sp ? sbh * 34 / tp : sbh * (10 + 24.0 / tp);
      std::printf("[ per-layer activations ] tp %d sp %d: measured %.0f bytes (%.2f sbh), predicted %.0f bytes "
                  "(%.2f sbh), measured / predicted %.3f\n",
                  tp, int(sp), measured, measured / sbh, predicted, predicted / sbh, measured / predicted);
      EXPECT_NEAR(measured, predicted, 0.15 * predicted) << "tp " << tp << " sp " << sp;
    }
}

}  // namespace
}  // namespace loom::model

namespace loom::model {
namespace {

// Stands in for one rank of a tp = 2 group whose other rank contributes
// zeros (numbers do not matter here, only when things happen). It records,
// for every started reduce, the model's summed squared gradients and its
// input's when the reduce starts and when it is waited for (a real
// collective reads the input until then), and whether a started gather was
// waited for before it.
class RecordingTpOps final : public TensorParallelOps {
 public:
  struct Reduce {
    double grads_at_start = 0, grads_at_wait = -1;
    double input_at_start = 0, input_at_wait = -1;
    bool gather_waited_before = true;
  };
  const Model* model = nullptr;
  std::vector<Reduce> reduces;
  int gathers_started = 0, gathers_waited = 0;

  void reduce(Tensor out, Tensor partial) override { keep_rows(out, partial); }
  void gather(Tensor full, const Tensor& shard) override { spread(full, shard); }
  void all_reduce_sum(Tensor) override {}
  void combine_cross_entropy(Tensor, Tensor) override {}

  std::unique_ptr<TpPending> start_reduce(Tensor out, Tensor partial) override {
    reduces.push_back({grad_squares(), -1, squares(partial), -1, gathers_waited == gathers_started});
    return std::make_unique<Waiter>([this, out, partial, i = reduces.size() - 1] {
      reduces[i].grads_at_wait = grad_squares();
      reduces[i].input_at_wait = squares(partial);
      keep_rows(out, partial);  // the result lands at the wait, as a real one's may
    });
  }
  std::unique_ptr<TpPending> start_gather(Tensor full, const Tensor& shard) override {
    spread(full, shard);
    ++gathers_started;
    return std::make_unique<Waiter>([this] { ++gathers_waited; });
  }

 private:
  class Waiter final : public TpPending {
   public:
    explicit Waiter(std::function<void()> on_wait) : on_wait_(std::move(on_wait)) {}
    ~Waiter() override { wait(); }
    void wait() override {
      if (on_wait_) std::exchange(on_wait_, nullptr)();
    }

   private:
    std::function<void()> on_wait_;
  };

  static double squares(const Tensor& t) {
    const float* v = t.data_as<float>();
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(v[i]) * v[i];
    return s;
  }
  double grad_squares() const { return squares(model->grads()); }
  // SP: this rank's rows (the first half); without SP the sum is in place.
  static void keep_rows(Tensor out, const Tensor& partial) {
    if (out.data() != partial.data())
      std::memcpy(out.data(), partial.data(), static_cast<size_t>(out.numel()) * dtype_size(out.dtype()));
  }
  static void spread(Tensor full, const Tensor& shard) {
    const size_t bytes = static_cast<size_t>(shard.numel()) * dtype_size(shard.dtype());
    for (int64_t r = 0; r * shard.numel() < full.numel(); ++r)
      std::memcpy(static_cast<char*>(full.data()) + r * bytes, shard.data(), bytes);
  }
};

// Megatron's overlap in backward: each column-parallel input gradient (q/k/v,
// fc or gate/up, the vocab-parallel head) starts its sum over tp before the
// weight gradients of those linears are computed and is waited for after:
// the model's gradients grow between every start and its wait. Under SP the
// input rows' gather is started and waited for before that sum starts.
TEST(TensorParallelOverlap, InputGradientSumRunsWhileWeightGradientsAreComputed) {
  for (const NamedConfig& nc : {NamedConfig{"gpt2", gpt2_config(512, true)}, NamedConfig{"llama", llama_config(512, false)}}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(concat(nc.name, sp ? " SP" : ""));
      Pools pools;
      RecordingTpOps ops;
      Model m(nc.cfg, 2, 8, pools, {.tp = {{2, 0}, sp, &ops}});
      ops.model = &m;
      m.init_params(7);
      std::vector<int32_t> ids(16);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37) % 512);
      const Tensor tokens(ids.data(), DType::i32, {2, 8}), targets(ids.data(), DType::i32, {2, 8});
      m.zero_grads();
      (void)m.forward(tokens, targets);
      ASSERT_TRUE(ops.reduces.empty()) << "forward only uses blocking sums";
      m.backward(1.f);
      // Per layer: attention's q, k, v and the MLP's input; plus the head.
      ASSERT_EQ(ops.reduces.size(), static_cast<size_t>(2 * nc.cfg.n_layer + 1));
      for (const RecordingTpOps::Reduce& r : ops.reduces) {
        EXPECT_GE(r.grads_at_wait, 0) << "waited for";
        EXPECT_GT(r.grads_at_wait, r.grads_at_start) << "weight gradients computed while the sum was in flight";
        EXPECT_EQ(r.input_at_wait, r.input_at_start) << "the summed input gradient untouched while in flight";
        EXPECT_TRUE(r.gather_waited_before);
      }
      // SP: one started gather before each of those sums; none without SP.
      EXPECT_EQ(ops.gathers_started, sp ? static_cast<int>(ops.reduces.size()) : 0);
      EXPECT_EQ(ops.gathers_started, ops.gathers_waited);
    }
  }
}

}  // namespace
}  // namespace loom::model
