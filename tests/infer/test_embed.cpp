// The engine's embeddings (GenerationParams::pooling) against a float64
// PyTorch GPT-2 and Llama written independently (tests/ref/ref_embed.py):
// the final hidden states after the last norm, averaged over every prompt
// token (mean) or the last token's (last), for prompts of 1 to 63 tokens
// (the longest the 64-token context takes), computed in chunks of 8 tokens
// over KV blocks of 4. Then the serving properties: an embedding does not
// depend on what else runs in its steps, on the prefix cache (a prompt whose
// blocks are cached by a generation before it still averages every token),
// nor on preemption (recomputed from its start).
//
// Tolerance: f32 vs float64, rtol 1e-4 and atol 1e-5 (DESIGN.md §6, model
// fp32 vs PyTorch, as test_model's logits); observed worst |a - e| (printed):
// 3.6e-7 (GPT-2) and 6.0e-7 (Llama) on values of order 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/ref_model_config.h"
#include "core/error.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace loom::infer {
namespace {

using namespace loom::test;
using Tokens = std::vector<int32_t>;

constexpr int kPrompts = 4;

struct Case {
  explicit Case(const std::string& family)
      : rc("embed_" + family + ".ref"), cfg(model_config_of(rc)), model(cfg, 1, cfg.max_seq_len, pools) {
    model.load_params(io::SafetensorsFile::open(std::string(LOOM_REF_DIR) + "/embed_" + family + ".safetensors"));
    for (int i = 0; i < kPrompts; ++i) {
      Tokens t;
      for (float v : rc["tokens." + std::to_string(i)].floats()) t.push_back(static_cast<int32_t>(v));
      prompts.push_back(std::move(t));
    }
  }
  // Chunks of 8 tokens over blocks of 4: a 63-token prompt takes 8 steps.
  EngineConfig config(int64_t num_blocks = 0) const {
    EngineConfig e;
    e.block_size = 4, e.max_num_batched_tokens = 8, e.max_num_seqs = 4, e.num_blocks = num_blocks;
    return e;
  }
  RefCase rc;
  model::ModelConfig cfg;
  Pools pools;
  model::Model model;
  std::vector<Tokens> prompts;
};

double worst_error(const std::vector<float>& a, const std::vector<float>& e) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) worst = std::max(worst, std::fabs(double(a[i]) - e[i]));
  return worst;
}

void expect_matches_torch(const std::string& family) {
  Case c(family);
  Pools pools;
  Engine engine(c.cfg, c.model.params(), pools, c.config());
  for (const Pooling pooling : {Pooling::mean, Pooling::last}) {
    const std::vector<std::vector<float>> got = engine.embed(c.prompts, pooling);
    ASSERT_EQ(got.size(), c.prompts.size());
    double worst = 0;
    for (int i = 0; i < kPrompts; ++i) {
      const std::vector<float> want = c.rc[pooling_name(pooling) + std::string(".") + std::to_string(i)].floats();
      ASSERT_EQ(got[i].size(), static_cast<size_t>(c.cfg.n_embd));
      EXPECT_ALL_CLOSE(got[i], want, 1e-4, 1e-5);
      worst = std::max(worst, worst_error(got[i], want));
    }
    std::printf("%s %s pooling: worst |engine - torch| %.3g\n", family.c_str(), pooling_name(pooling), worst);
  }
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.kv().stats().used_blocks, 0) << "an embedding's blocks are freed when it ends";
}

TEST(Embed, Gpt2MatchesTorch) { expect_matches_torch("gpt2"); }
TEST(Embed, LlamaMatchesTorch) { expect_matches_torch("llama"); }

// Embeddings computed beside generations (their prefill chunks and decodes
// sharing steps), after a generation cached the same prompt's blocks, and
// under preemption are bit for bit those computed alone.
TEST(Embed, DoesNotDependOnTheBatchThePrefixCacheOrPreemption) {
  Case c("llama");
  std::vector<std::vector<float>> alone;
  {
    Pools pools;
    Engine engine(c.cfg, c.model.params(), pools, c.config());
    alone = engine.embed(c.prompts, Pooling::mean);
  }
  GenerationParams gen;
  gen.stop.max_tokens = 20, gen.stop.ignore_eos = true;
  gen.sampler.temperature = 0.f;
  // A cache of 20 blocks (80 tokens) for a 63-token embedding and 3 more requests: preemption.
  for (const int64_t num_blocks : {int64_t{0}, int64_t{21}}) {
    Pools pools;
    Engine engine(c.cfg, c.model.params(), pools, c.config(num_blocks));
    engine.generate({c.prompts[3]}, gen);  // caches the 63-token prompt's blocks
    std::vector<RequestId> ids;
    GenerationParams mean;
    mean.pooling = Pooling::mean;
    for (int i = 0; i < kPrompts; ++i) {
      engine.add_request(c.prompts[static_cast<size_t>((i + 1) % kPrompts)], gen);  // a generation between each
      ids.push_back(engine.add_request(c.prompts[static_cast<size_t>(i)], mean));
    }
    std::vector<std::vector<float>> got(kPrompts);
    while (engine.has_unfinished())
      for (TokenEvent& e : engine.step())
        for (int i = 0; i < kPrompts; ++i)
          if (e.request == ids[static_cast<size_t>(i)]) {
            EXPECT_EQ(e.token, -1);
            EXPECT_EQ(e.finish, FinishReason::stop);
            got[static_cast<size_t>(i)] = std::move(e.embedding);
          }
    for (int i = 0; i < kPrompts; ++i) {
      EXPECT_EQ(got[i], alone[i]) << "prompt " << i << ", num_blocks " << num_blocks;
    }
    if (num_blocks > 0) {
      EXPECT_GT(engine.scheduler().stats().num_preemptions, 0) << "the small cache preempts";
    }
    EXPECT_GT(engine.kv().stats().cached_blocks, 0);
  }
}

TEST(Embed, RefusesSamplingParameters) {
  GenerationParams p;
  p.pooling = Pooling::mean;
  p.n = 2;
  EXPECT_THROW(p.validate(), loom::Error);
  p.n = 1, p.top_logprobs = 3;
  EXPECT_THROW(p.validate(), loom::Error);
  p.top_logprobs = 0;
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace loom::infer
