// The generation loop: how much KV cache a request needs, option checks, and
// stopping when the sequence reaches the model's max_seq_len.
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/memory.h"
#include "infer/generate.h"
#include "model/params.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;

TEST(GenerateCapacity, IsPromptPlusMaxTokensCappedAtMaxSeqLen) {
  EXPECT_EQ(generate_capacity(5, {.max_tokens = 16}, 1 << 20), 5 + 16);
  EXPECT_EQ(generate_capacity(5, {.max_tokens = 0}, 64), 5);
  EXPECT_EQ(generate_capacity(5, {.max_tokens = 100}, 64), 64);
  EXPECT_EQ(generate_capacity(5, {.max_tokens = std::numeric_limits<int64_t>::max()}, 64), 64);
}

TEST(GenerateOptions, NegativeMaxTokensIsAnError) {
  expect_error([] { GenerateOptions{.max_tokens = -1}.validate(); }, {"max-tokens = -1", "allowed values are >= 0"});
}

TEST(Generate, StopsWithCacheFullWhenTheSequenceReachesMaxSeqLen) {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  cfg.max_seq_len = 6;
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::init_params(params, specs, 3);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const GenerateOptions opts{.max_tokens = 100};
  model::Decoder dec(cfg, params, pools, {.capacity = generate_capacity(3, opts, cfg.max_seq_len)});
  Sampler greedy({.temperature = 0.f});
  const GenerateResult r = generate(dec, greedy, prompt, opts);
  EXPECT_EQ(r.reason, StopReason::cache_full);
  EXPECT_EQ(dec.position(), cfg.max_seq_len);
  // Each new token but the last was fed back; the last came from the full cache.
  EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), cfg.max_seq_len - 3 + 1);
}

TEST(Generate, ACacheOfPromptPlusMaxTokensNeverFillsUp) {
  const model::ModelConfig cfg = model::model_preset("llama-tiny");
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::init_params(params, specs, 3);
  const std::vector<int32_t> prompt = {4, 5};
  const GenerateOptions opts{.max_tokens = 7};
  model::Decoder dec(cfg, params, pools, {.capacity = generate_capacity(2, opts, cfg.max_seq_len)});
  Sampler greedy({.temperature = 0.f});
  const GenerateResult r = generate(dec, greedy, prompt, opts);
  EXPECT_EQ(r.reason, StopReason::max_tokens);
  EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), opts.max_tokens);
}

}  // namespace
}  // namespace loom::infer
