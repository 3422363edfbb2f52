// The paged runner on a GGUF file's quantized linears (model/quant_weights.h):
// every dense linear, every expert and the LM head multiplied in their blocks
// (kernels::linear_forward_quantized), the rest dequantized.
//
// - The blocks are what is read: the f32 places of the quantized linears are
//   filled with NaN and the logits stay finite, and they follow the runner
//   on the same file dequantized to f32 within the activations' rounding to
//   q8_0 / q8_K (ops.h bounds it per value): max |a - e| <= 6% of the largest
//   logit, about 3x the worst seen on these models (1.0-1.9% for every type;
//   a wrong row order or a wrong slice moves logits by their whole size).
// - Batch invariance: a sequence's logits are bitwise the same alone and in
//   ragged steps with other sequences (prefill chunks and decodes mixed).
// - GPT-2 (tied head: token_embd's blocks; q, k, v row blocks of c_attn),
//   Llama with GQA (untied; attn_q / attn_k rows put back from llama.cpp's
//   permutation) and Mixtral (each expert's rows of the stacked tensors),
//   in q8_0, q4_0, q6_K and q4_K_M; n_embd 256 so that the K
//   types' 256-value blocks divide every row.
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "io/gguf.h"
#include "kernels/cpu_isa.h"
#include "model/gguf_model.h"
#include "model/paged_runner.h"
#include "model/params.h"
#include "model/quant_weights.h"

namespace loom::model {
namespace {

using namespace loom::test;
namespace fs = std::filesystem;

ModelConfig config(Family family, int64_t n_expert = 0) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2, c.n_embd = 256, c.n_head = 4, c.n_kv_head = family == Family::llama ? 2 : 4, c.d_ff = 512;
  c.vocab_size = 96, c.max_seq_len = 48;
  if (family == Family::llama) c.rope_theta = 10000.f, c.norm_eps = 1e-5f, c.tie_embeddings = false;
  if (n_expert > 0) c.n_expert = n_expert, c.top_k = 2, c.capacity_factor = 0.f;  // Mixtral's routing
  c.validate();
  return c;
}

// The Llama above with 4 experts, top-2, in both layers.
ModelConfig mixtral() { return config(Family::llama, 4); }

// A file of its own per process: the test runs at every level at once (ctest -j).
std::string write_gguf(const ModelConfig& cfg, GgufWeights w) {
  std::vector<float> values(static_cast<size_t>(param_count(param_specs(cfg))));
  const Tensor flat(values.data(), DType::f32, {static_cast<int64_t>(values.size())});
  init_params(flat, param_specs(cfg), 7);
  const std::string path = (fs::temp_directory_path() /
                            concat("loom_test_quant_runner_", ::getpid(), "_", family_name(cfg.family),
                                   cfg.is_moe() ? "_moe_" : "_", gguf_weights_name(w), ".gguf")).string();
  io::GgufWriter writer;
  gguf_add_model(writer, cfg, flat, w, "test");
  writer.write(path);
  return path;
}

// Sequences, each in its own blocks (block_size 16, sequence i from block
// 1 + 4 i), stepped together: step() computes counts[i] more tokens of
// sequence i and returns each stepped sequence's last row of logits.
struct Steps {
  PagedRunner& runner;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> done;

  std::vector<std::vector<float>> step(const std::vector<int64_t>& counts) {
    std::vector<int32_t> toks, pos, qs{0}, lens, tables, rows;
    std::vector<int64_t> slots;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (counts[i] == 0) continue;
      for (int64_t p = done[i]; p < done[i] + counts[i]; ++p) {
        toks.push_back(tokens[i][static_cast<size_t>(p)]), pos.push_back(static_cast<int32_t>(p));
        slots.push_back((1 + 4 * static_cast<int64_t>(i)) * 16 + p);
      }
      done[i] += counts[i];
      qs.push_back(static_cast<int32_t>(toks.size()));
      lens.push_back(static_cast<int32_t>(done[i]));
      rows.push_back(static_cast<int32_t>(toks.size()) - 1);
      for (int32_t b = 0; b < 4; ++b) tables.push_back(static_cast<int32_t>(1 + 4 * i) + b);
    }
    const std::vector<float> all = to_floats(runner.step({toks, pos, slots, qs, lens, tables, 4, rows}));
    const int64_t V = runner.config().vocab_size;
    std::vector<std::vector<float>> out;
    for (size_t r = 0; r < rows.size(); ++r) out.emplace_back(all.begin() + r * V, all.begin() + (r + 1) * V);
    return out;
  }
};

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11 + salt * 101) % vocab));
  return t;
}

PagedRunnerSizes sizes() { return {.num_blocks = 13, .block_size = 16, .max_tokens = 64, .max_logit_rows = 8}; }

// The file's parameters as the engine loads them: the quantized linears'
// places NaN (load_params_from_gguf skips them), the rest dequantized.
OwnedTensor nan_filled_params(const ModelConfig& cfg, const QuantWeights& q, Pool& pool) {
  OwnedTensor flat = pool.empty(DType::f32, {param_count(param_specs(cfg))});
  std::fill_n(flat.data_as<float>(), flat.numel(), std::numeric_limits<float>::quiet_NaN());
  load_params_from_gguf(flat, cfg, q.file(), &q);
  return flat;
}

void expect_follows_dequantized(const ModelConfig& cfg, GgufWeights w, const std::string& want_summary) {
  const std::string path = write_gguf(cfg, w);
  Pools pools;
  const QuantWeights q(io::GgufFile::open(path), cfg, pools[MemTag::params]);
  EXPECT_EQ(q.summary(), want_summary) << path;
  EXPECT_TRUE(q.holds("lm_head.weight")) << path;
  const OwnedTensor params = nan_filled_params(cfg, q, pools[MemTag::params]);
  OwnedTensor dequantized = pools[MemTag::params].empty(DType::f32, {params.numel()});
  load_params_from_gguf(dequantized, cfg, q.file());
  PagedRunner quantized(cfg, params, pools, sizes(), &q), reference(cfg, dequantized, pools, sizes());
  const std::vector<std::vector<int32_t>> tokens = {some_tokens(30, cfg.vocab_size, 0),
                                                    some_tokens(12, cfg.vocab_size, 1)};
  Steps a{quantized, tokens, {0, 0}}, b{reference, tokens, {0, 0}};
  double worst = 0, scale = 0;
  for (const std::vector<int64_t>& counts : std::vector<std::vector<int64_t>>{{20, 12}, {10, 0}, {0, 0}}) {
    if (counts == std::vector<int64_t>{0, 0}) break;
    const auto got = a.step(counts), want = b.step(counts);
    for (size_t r = 0; r < got.size(); ++r)
      for (size_t v = 0; v < got[r].size(); ++v) {
        ASSERT_TRUE(std::isfinite(got[r][v])) << path << ": a NaN place of a quantized weight was read";
        worst = std::max(worst, std::abs(static_cast<double>(got[r][v]) - want[r][v]));
        scale = std::max(scale, std::abs(static_cast<double>(want[r][v])));
      }
  }
  EXPECT_GT(worst, 0) << path << ": the activations were not quantized (the blocks were not used)";
  EXPECT_LE(worst, 0.06 * scale) << path << ": logits up to " << scale;
  fs::remove(path);
}

TEST(QuantRunner, Gpt2LogitsFollowTheDequantizedFileInEveryType) {
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q8_0, "q8_0 9");
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q4_0, "q4_0 9");
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q6_K, "q6_K 9");
  // q4_K_M: the tied head (token_embd) and the last layer's attn_qkv and ffn_down in q6_K.
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q4_K_M, "q4_K 6, q6_K 3");
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q4_1, "q4_1 9");
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q5_K, "q5_K 9");
  expect_follows_dequantized(config(Family::gpt2), GgufWeights::q5_K_M, "q5_K 6, q6_K 3");
}

TEST(QuantRunner, LlamaGqaLogitsFollowTheDequantizedFileInEveryType) {
  expect_follows_dequantized(config(Family::llama), GgufWeights::q8_0, "q8_0 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q4_0, "q4_0 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q6_K, "q6_K 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q4_K_M, "q4_K 12, q6_K 3");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q5_0, "q5_0 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q5_1, "q5_1 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q2_K, "q2_K 15");
  expect_follows_dequantized(config(Family::llama), GgufWeights::q5_K_M, "q5_K 12, q6_K 3");
}

// A Mixtral layer's experts are held too, each its rows of the stacked
// tensor (a wrong slice would be another expert's weights): per layer q, k,
// v, o and 4 x 3 experts, plus the head; q4_K_M keeps the last layer's
// attn_v and ffn_down_exps (llama.cpp's use_more_bits) and the head in q6_K.
TEST(QuantRunner, MixtralExpertsAreServedInTheirBlocks) {
  expect_follows_dequantized(mixtral(), GgufWeights::q8_0, "q8_0 33");
  expect_follows_dequantized(mixtral(), GgufWeights::q4_0, "q4_0 33");
  expect_follows_dequantized(mixtral(), GgufWeights::q4_K_M, "q4_K 27, q6_K 6");
}

// Sequence 0 alone, then with two others in the same steps (its prefill in
// other chunks beside theirs): its logits at each of its steps are the same bits.
TEST(QuantRunner, ASequencesLogitsDoNotDependOnTheBatch) {
  for (const ModelConfig& cfg : {config(Family::gpt2), config(Family::llama), mixtral()}) {
    const std::string path = write_gguf(cfg, GgufWeights::q4_K_M);
    Pools pools;
    const QuantWeights q(io::GgufFile::open(path), cfg, pools[MemTag::params]);
    const OwnedTensor params = nan_filled_params(cfg, q, pools[MemTag::params]);
    PagedRunner alone_runner(cfg, params, pools, sizes(), &q), batched_runner(cfg, params, pools, sizes(), &q);
    const std::vector<int32_t> mine = some_tokens(24, cfg.vocab_size, 5);
    Steps alone{alone_runner, {mine}, {0}};
    Steps batched{batched_runner, {mine, some_tokens(33, cfg.vocab_size, 6), some_tokens(5, cfg.vocab_size, 7)},
                  {0, 0, 0}};
    for (const std::vector<int64_t>& counts :
         std::vector<std::vector<int64_t>>{{16, 30, 5}, {1, 3, 0}, {1, 0, 0}, {1, 0, 0}}) {
      const auto want = alone.step({counts[0]});
      const auto got = batched.step(counts);
      EXPECT_EQ(got[0], want[0]) << family_name(cfg.family) << (cfg.is_moe() ? " moe" : "") << " after "
                                 << alone.done[0] << " tokens";
    }
    fs::remove(path);
  }
}

// The op's bits are its scalar reference's at every level (ops.h): the same
// logits from every level this CPU runs, for dense layers and experts.
TEST(QuantRunner, EveryInstructionSetLevelGivesTheSameBits) {
  using kernels::CpuIsa;
  const CpuIsa before = kernels::cpu_isa();
  for (const ModelConfig& cfg : {config(Family::llama), mixtral()}) {
    const std::string path = write_gguf(cfg, GgufWeights::q4_K_M);
    Pools pools;
    const QuantWeights q(io::GgufFile::open(path), cfg, pools[MemTag::params]);
    const OwnedTensor params = nan_filled_params(cfg, q, pools[MemTag::params]);
    auto logits = [&] {
      PagedRunner runner(cfg, params, pools, sizes(), &q);
      Steps s{runner, {some_tokens(20, cfg.vocab_size, 8), some_tokens(7, cfg.vocab_size, 9)}, {0, 0}};
      std::vector<std::vector<float>> all = s.step({17, 7});
      for (const auto& row : s.step({1, 0})) all.push_back(row);
      return all;
    };
    const auto best = logits();
    for (const CpuIsa level : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16, CpuIsa::amx}) {
      if (static_cast<int>(level) > static_cast<int>(kernels::cpu_isa_supported())) continue;
      kernels::set_cpu_isa(level);
      EXPECT_EQ(logits(), best) << kernels::cpu_isa_name(level) << " vs " << kernels::cpu_isa_name(before)
                                << (cfg.is_moe() ? " (moe)" : "");
    }
    kernels::set_cpu_isa(before);
    fs::remove(path);
  }
}

TEST(QuantRunner, QuantizedWeightsWithBf16ComputeAreAClearError) {
  const ModelConfig cfg = config(Family::llama);
  const std::string path = write_gguf(cfg, GgufWeights::q8_0);
  Pools pools;
  const QuantWeights q(io::GgufFile::open(path), cfg, pools[MemTag::params]);
  const OwnedTensor bf16 = pools[MemTag::params].zeros(DType::bf16, {param_count(param_specs(cfg))});
  expect_error([&] { PagedRunner(cfg, bf16, pools, sizes(), &q); },
               {"quantized weights (q8_0 15)", "f32 activations", "not bf16"});
  fs::remove(path);
}

// f32 and f16 files hold nothing in blocks: the engine dequantizes them as before.
TEST(QuantRunner, SixteenAndThirtyTwoBitFilesHoldNoBlocks) {
  const ModelConfig cfg = config(Family::gpt2);
  for (GgufWeights w : {GgufWeights::f32, GgufWeights::f16}) {
    const std::string path = write_gguf(cfg, w);
    Pools pools;
    const QuantWeights q(io::GgufFile::open(path), cfg, pools[MemTag::params]);
    EXPECT_TRUE(q.empty()) << gguf_weights_name(w);
    EXPECT_EQ(q.bytes(), 0);
    fs::remove(path);
  }
}

}  // namespace
}  // namespace loom::model
