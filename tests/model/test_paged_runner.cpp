// PagedRunner against model::Model's full forward without a cache (the
// training path: flash attention over the whole sequence): sequences of
// different lengths prefilled whole or in chunks, decoded together in one
// ragged step, their K/V in shuffled physical blocks of size 1, 16 or 32
// (sequences of 9, 23 and 40 tokens cross block boundaries); every returned
// logit row equals the Model's at that position. GPT-2, Llama with GQA and
// Llama with experts (routed per token, never dropped); also copy-on-write
// of a block and clear operand errors.
//
// Tolerances (|a - e| <= atol + rtol |e|), worst cases observed on the
// 2-layer tiny presets in brackets:
// - f32: rtol 1e-5 (DESIGN.md §6, kernels vs PyTorch), atol 1e-6 for logits
//   near zero. The same kernels on the same rows (the GEMMs, norms and
//   activations are batch invariant: tests/kernels/test_batch_invariance.cpp);
//   only the attention's summation order differs, flash tiles vs cache
//   blocks [max |a - e| 1.9e-7, logits up to 0.6].
// - bf16 weights vs the Model built with compute bf16, and a bf16 cache under
//   f32 weights vs the f32 Model: rtol 1e-2, atol 1e-2, docs/numerics.md's
//   bf16 attention tolerance (the one op whose summation order differs; its
//   bf16 output may round the other way, 2^-8 relative, and the difference
//   propagates), and the Model's logits are bf16 (one more rounding) where
//   the runner's are f32 [bf16 weights: max |a - e| 1.8e-3; bf16 cache:
//   7.8e-4; logits up to 0.6; the same for every block size and for a bf16
//   or f32 cache].
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/paged_runner.h"
#include "model/params.h"

namespace loom::model {
namespace {

using namespace loom::test;

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11 + salt * 101) % vocab));
  return t;
}

// The test's own block bookkeeping: blocks handed out from a shuffled list.
struct Pages {
  int64_t block_size;
  std::vector<int32_t> free_ids;
  std::map<int, std::vector<int32_t>> tables;
  Pages(int64_t num_blocks, int64_t bs, uint32_t seed) : block_size(bs) {
    for (int32_t b = 1; b < num_blocks; ++b) free_ids.push_back(b);
    std::shuffle(free_ids.begin(), free_ids.end(), std::mt19937(seed));
  }
  int64_t slot(int seq, int64_t pos) {
    std::vector<int32_t>& t = tables[seq];
    while (static_cast<int64_t>(t.size()) * block_size <= pos) t.push_back(free_ids.back()), free_ids.pop_back();
    return t[static_cast<size_t>(pos / block_size)] * block_size + pos % block_size;
  }
};

struct Seq {
  int id;
  std::vector<int32_t> tokens;
  int64_t done = 0;  // tokens computed
};

// One step: sequence i computes counts[i] more tokens; returns the logits of
// each sequence's last row.
std::vector<std::vector<float>> run_step(PagedRunner& runner, Pages& pages, std::vector<Seq>& seqs,
                                         const std::vector<int64_t>& counts) {
  PagedBatch b;
  std::vector<int32_t> tokens, positions, query_start{0}, seq_lens, tables, logit_rows;
  std::vector<int64_t> slots;
  int64_t max_blocks = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs[i];
    for (int64_t p = s.done; p < s.done + counts[i]; ++p) {
      tokens.push_back(s.tokens[static_cast<size_t>(p)]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(pages.slot(s.id, p));
    }
    s.done += counts[i];
    query_start.push_back(static_cast<int32_t>(tokens.size()));
    seq_lens.push_back(static_cast<int32_t>(s.done));
    logit_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(pages.tables[s.id].size()));
  }
  for (const Seq& s : seqs) {
    std::vector<int32_t> t = pages.tables[s.id];
    t.resize(static_cast<size_t>(max_blocks), -1);
    tables.insert(tables.end(), t.begin(), t.end());
  }
  b.tokens = tokens, b.positions = positions, b.slots = slots, b.query_start = query_start;
  b.seq_lens = seq_lens, b.block_tables = tables, b.max_blocks = max_blocks, b.logit_rows = logit_rows;
  const std::vector<float> all = to_floats(runner.step(b));
  const int64_t V = runner.config().vocab_size;
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < seqs.size(); ++i) rows.emplace_back(all.begin() + i * V, all.begin() + (i + 1) * V);
  return rows;
}

// The reference: model::Model's full forward, no cache, over the whole
// sequence (B = 1, T = its length), in the compute dtype `compute` with the
// f32 weights params (rounded once to it, as the runner's are); row t of the
// logits (1, T, V) is the next-token distribution after t + 1 tokens (causal:
// it reads only tokens 0 ..= t).
std::vector<std::vector<float>> model_logits(const ModelConfig& cfg, const Tensor& params, DType compute,
                                             std::vector<int32_t> tokens) {
  Pools pools;
  const auto T = static_cast<int64_t>(tokens.size());
  Model m(cfg, 1, T, pools, {.compute = compute});
  kernels::copy(m.master_params(), params);
  m.sync_params();
  m.forward(i32_view(tokens, {1, T}));
  const std::vector<float> all = to_floats(m.logits());
  const int64_t V = cfg.vocab_size;
  std::vector<std::vector<float>> rows;
  for (int64_t t = 0; t < T; ++t) rows.emplace_back(all.begin() + t * V, all.begin() + (t + 1) * V);
  return rows;
}

struct Tolerance {
  double rtol, atol;
};
// See the top of the file.
constexpr Tolerance kF32{1e-5, 1e-6}, kBf16{1e-2, 1e-2};

// init_params, then a loss-free balancing bias (zeros at init) set to
// +-0.2 steps so that it changes which experts are chosen.
void init_test_params(const Tensor& master, const std::vector<ParamSpec>& specs) {
  init_params(master, specs, 3);
  for (const ParamSpec& s : specs) {
    if (!s.name.ends_with("e_score_correction_bias")) continue;
    float* bias = master.data_as<float>() + s.offset;
    for (int64_t e = 0; e < s.numel(); ++e) bias[e] = 0.2f * static_cast<float>((e * 3) % 5 - 2);
  }
}

// cfg: the runner's model; reference (default cfg): the Model's, with the
// same parameters. compute: the dtype of the params the runner gets (and
// the Model computes in).
void expect_runner_matches_model(const ModelConfig& cfg, const char* preset, int64_t block_size, DType compute,
                                  DType kv_dtype, Tolerance tol, const ModelConfig* reference = nullptr) {
  Pools pools;
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const OwnedTensor master = pools[MemTag::params].empty(DType::f32, {param_count(specs)});
  init_test_params(master, specs);
  OwnedTensor low;
  if (compute != DType::f32) {
    low = pools[MemTag::params].empty(compute, {master.numel()});
    kernels::cast(low, master);
  }
  const Tensor params = compute == DType::f32 ? Tensor(master) : Tensor(low);
  const int64_t num_blocks = 1 + 3 * ((40 + block_size - 1) / block_size) + 2;
  PagedRunner runner(cfg, params, pools, {.num_blocks = num_blocks, .block_size = block_size, .max_tokens = 64,
                                          .max_logit_rows = 8, .kv_dtype = kv_dtype});
  Pages pages(num_blocks, block_size, 17);
  std::vector<Seq> seqs{{0, some_tokens(23, cfg.vocab_size, 0)}, {1, some_tokens(40, cfg.vocab_size, 1)},
                        {2, some_tokens(9, cfg.vocab_size, 2)}};
  std::vector<std::vector<std::vector<float>>> want;
  for (const Seq& s : seqs) want.push_back(model_logits(reference ? *reference : cfg, master, compute, s.tokens));
  // Whole prefill, a chunk of a long prompt, a one-token prompt start; then
  // mixed chunks and decodes until every sequence is done.
  const std::vector<std::vector<int64_t>> plan = {{20, 7, 1}, {1, 13, 3}, {1, 1, 5}, {1, 19, 0}, {0, 0, 0}};
  for (const std::vector<int64_t>& counts : plan) {
    std::vector<Seq> active;
    std::vector<int64_t> active_counts;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (counts[i] > 0) active.push_back(seqs[i]), active_counts.push_back(counts[i]);
    if (active.empty()) break;
    const std::vector<std::vector<float>> got = run_step(runner, pages, active, active_counts);
    for (size_t j = 0; j < active.size(); ++j) {
      Seq& s = seqs[static_cast<size_t>(active[j].id)];
      s.done = active[j].done;
      const std::vector<float>& e = want[static_cast<size_t>(s.id)][static_cast<size_t>(s.done - 1)];
      EXPECT_ALL_CLOSE(got[j], e, tol.rtol, tol.atol)
          << preset << " block size " << block_size << " sequence " << s.id << " after " << s.done << " tokens";
    }
  }
}

void expect_runner_matches_model(const char* preset, int64_t block_size, DType compute, DType kv_dtype,
                                  Tolerance tol) {
  expect_runner_matches_model(model_preset(preset), preset, block_size, compute, kv_dtype, tol);
}

TEST(PagedRunner, Gpt2LogitsEqualTheModelsForEveryBlockSize) {
  for (int64_t bs : {1, 16, 32}) expect_runner_matches_model("gpt2-tiny", bs, DType::f32, DType::f32, kF32);
}

TEST(PagedRunner, LlamaGqaLogitsEqualTheModelsForEveryBlockSize) {
  for (int64_t bs : {1, 16, 32}) expect_runner_matches_model("llama-tiny", bs, DType::f32, DType::f32, kF32);
}

TEST(PagedRunner, Bf16CacheStaysWithinBf16Tolerance) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"})
    expect_runner_matches_model(preset, 16, DType::f32, DType::bf16, kBf16);
}

// bf16 weights: the runner computes in bf16 (as the Model built with compute
// bf16 does), with a bf16 cache and with an f32 one (which holds the same
// bf16-rounded k and v exactly).
// Without a bf16 GEMM (AVX2) the model's matmuls widen bf16 to f32 and the
// runner converts in registers: bf16 serves on every CPU.
TEST(PagedRunner, Bf16WeightsMatchTheBf16ModelForEveryBlockSize) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (int64_t bs : {1, 16, 32}) expect_runner_matches_model(preset, bs, DType::bf16, DType::bf16, kBf16);
    expect_runner_matches_model(preset, 16, DType::bf16, DType::f32, kBf16);
  }
}

// llama-tiny with experts: 4 of them, top-2 (softmax, renormalised) in both
// layers with a shared expert; top-1 sigmoid scores with the loss-free bias
// in the second layer only (moe_every 2, the first layer dense).
std::vector<ModelConfig> moe_configs() {
  ModelConfig a = model_preset("llama-tiny");
  a.n_expert = 4, a.top_k = 2, a.capacity_factor = 0.f, a.n_shared_expert = 1;
  ModelConfig b = model_preset("llama-tiny");
  b.n_expert = 4, b.top_k = 1, b.capacity_factor = 0.f, b.moe_every = 2;
  b.router_score = RouterScore::sigmoid, b.aux_free_rate = 1e-3f;
  return {a, b};
}

// Serving routes every token on its own, whatever the batch: a MoE model's
// logits in ragged steps (prefill chunks, decodes, several sequences) equal
// the Model's over each whole sequence, dropless.
TEST(PagedRunner, MoeLogitsEqualTheModelsForEveryBlockSize) {
  for (const ModelConfig& cfg : moe_configs()) {
    cfg.validate();
    for (int64_t bs : {1, 16}) expect_runner_matches_model(cfg, "llama-tiny moe", bs, DType::f32, DType::f32, kF32);
  }
}

// No capacity at inference: with capacity_factor 0.5 the Model (training)
// drops tokens (checked: its logits differ from the dropless Model's), and
// the runner given that config still computes every token's experts, the
// dropless Model's logits.
TEST(PagedRunner, MoeNeverDropsTokensWhateverTheCapacityFactor) {
  for (const ModelConfig& dropless : moe_configs()) {
    ModelConfig capped = dropless;
    capped.capacity_factor = 0.5f;
    Pools pools;
    const std::vector<ParamSpec> specs = param_specs(capped);
    const OwnedTensor master = pools[MemTag::params].empty(DType::f32, {param_count(specs)});
    init_test_params(master, specs);
    const std::vector<int32_t> tokens = some_tokens(40, capped.vocab_size, 1);
    EXPECT_NE(model_logits(capped, master, DType::f32, tokens), model_logits(dropless, master, DType::f32, tokens))
        << "capacity 0.5 drops no token: the test would not tell dropping from not";
    expect_runner_matches_model(capped, "llama-tiny moe, capacity 0.5", 16, DType::f32, DType::f32, kF32, &dropless);
  }
}

TEST(PagedRunner, CacheIsCountedUnderKvCache) {
  const ModelConfig cfg = model_preset("llama-tiny");
  Pools pools;
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {param_count(specs)});
  PagedRunner runner(cfg, params, pools, {.num_blocks = 10, .block_size = 16, .kv_dtype = DType::bf16});
  const int64_t bytes = 2 * cfg.n_layer * 10 * 16 * cfg.kv_dim() * 2;
  EXPECT_EQ(runner.kv_cache_bytes(), bytes);
  EXPECT_EQ(pools.report()[MemTag::kv_cache].current, bytes);
}

TEST(PagedRunner, BadBatchesAndSizesAreClearErrors) {
  const ModelConfig cfg = model_preset("gpt2-tiny");
  Pools pools;
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].zeros(DType::f32, {param_count(specs)});
  expect_error([&] { PagedRunner(cfg, params, pools, {.num_blocks = 1}); }, {"KV cache blocks 1", "at least 2"});
  PagedRunner runner(cfg, params, pools, {.num_blocks = 8, .block_size = 4, .max_tokens = 8, .max_logit_rows = 2});
  std::vector<int32_t> tokens{1, 2, 3}, positions{0, 1, 2}, qs{0, 3}, lens{3}, tables{1, -1}, rows{2};
  std::vector<int64_t> slots{4, 5, 6};
  PagedBatch b{tokens, positions, slots, qs, lens, tables, 2, rows};
  EXPECT_NO_THROW(runner.step(b));
  positions[1] = 5;
  expect_error([&] { runner.step(b); }, {"row 1 of sequence 0", "position 5", "puts it at 1"});
  positions[1] = 1, rows[0] = 3;
  expect_error([&] { runner.step(b); }, {"logit row 3", "of 3"});
  rows[0] = 2, qs[1] = 2;
  expect_error([&] { runner.step(b); }, {"query_start", "from 0 to 3"});
  qs[1] = 3, slots[2] = 99;
  expect_error([&] { runner.step(b); }, {"slots[2] = 99"});
  slots[2] = 6;
  const std::pair<int32_t, int32_t> bad[] = {{1, 8}};
  expect_error([&] { runner.copy_blocks(bad); }, {"copy_blocks", "block 1 to 8"});
}

// Copy-on-write: a block copied, then a second sequence continuing from it
// sees the first's keys: its logits equal the first's continuation.
TEST(PagedRunner, CopiedBlockServesAForkedSequence) {
  const ModelConfig cfg = model_preset("llama-tiny");
  Pools pools;
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {param_count(specs)});
  init_params(params, specs, 5);
  PagedRunner runner(cfg, params, pools, {.num_blocks = 8, .block_size = 4, .max_tokens = 8, .max_logit_rows = 2});
  const std::vector<int32_t> prompt = some_tokens(6, cfg.vocab_size, 4);  // blocks 1 (full), 2 (2 of 4)
  auto step = [&](std::vector<int32_t> toks, std::vector<int32_t> pos, std::vector<int64_t> slots,
                  std::vector<int32_t> table) {
    std::vector<int32_t> qs{0, static_cast<int32_t>(toks.size())}, lens{pos.back() + 1};
    std::vector<int32_t> rows{static_cast<int32_t>(toks.size()) - 1};
    return to_floats(runner.step({toks, pos, slots, qs, lens, table, 2, rows}));
  };
  step(prompt, {0, 1, 2, 3, 4, 5}, {4, 5, 6, 7, 8, 9}, {1, 2});
  const std::pair<int32_t, int32_t> cow[] = {{2, 3}};
  runner.copy_blocks(cow);
  const std::vector<float> parent = step({7}, {6}, {10}, {1, 2});
  const std::vector<float> child = step({7}, {6}, {14}, {1, 3});
  EXPECT_EQ(parent, child);
}

}  // namespace
}  // namespace loom::model
