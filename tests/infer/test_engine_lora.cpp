// LoRA adapters served unmerged (Engine::add_adapter, PagedRunner's runs of
// rows per adapter): three adapters of other ranks, scales and targets beside
// the base, in one engine.
// - Each adapter's logits in the paged runner equal those of its merged
//   model (lora_merge: W + scale B A) in a runner of its own, f32 rtol 1e-5
//   atol 1e-5 as test_lora.cpp's merged-vs-unmerged (the merge rounds W
//   once more) [observed below 2e-6].
// - 32 requests mixed over the base and the adapters, greedy and sampled,
//   all at once: every request's tokens and log-probabilities are bitwise
//   those of the same request run alone (its rows' bits depend on its
//   adapter only: the batch-invariant GEMMs, one run of rows at a time), in
//   f32 and in bf16.
// - The prefix cache is keyed by adapter: a prompt cached for one adapter is
//   never reused by the base or another adapter, and is by the same adapter
//   (and by the same weights added under a second id).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/paged_runner.h"
#include "model/params.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;
using Tokens = std::vector<int32_t>;

struct Adapter {
  model::LoraConfig lora;
  std::vector<float> weights;  // f32, lora_param_specs order
};

// Adapters whose update matters: A ~ U(-1/sqrt(in), 1/sqrt(in)) as LoRA's
// init, B ~ U(-0.5, 0.5) (a trained B, not the zero it starts from).
Adapter make_adapter(const model::ModelConfig& cfg, int64_t rank, double alpha, std::vector<std::string> targets,
                     uint32_t seed) {
  Adapter a;
  a.lora.rank = rank, a.lora.alpha = alpha, a.lora.targets = std::move(targets);
  std::mt19937 rng(seed);
  for (const model::ParamSpec& s : model::lora_param_specs(cfg, a.lora)) {
    const bool is_a = s.name.ends_with("lora_A.weight");
    const double bound = is_a ? 1.0 / std::sqrt(static_cast<double>(s.shape[1])) : 0.5;
    std::uniform_real_distribution<float> u(static_cast<float>(-bound), static_cast<float>(bound));
    for (int64_t i = 0; i < s.numel(); ++i) a.weights.push_back(u(rng));
  }
  return a;
}

Tensor view(Adapter& a) { return Tensor(a.weights.data(), DType::f32, {static_cast<int64_t>(a.weights.size())}); }

struct Fixture {
  model::ModelConfig cfg;
  Pools pools;
  OwnedTensor master, params;  // f32; params in the serving dtype
  std::vector<Adapter> adapters;
  Fixture(const char* preset, DType dtype) : cfg(model::model_preset(preset)) {
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
    master = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(master, specs, 9);
    params = pools[MemTag::params].empty(dtype, {master.numel()});
    kernels::cast(params, master);
    const bool gpt2 = cfg.family == model::Family::gpt2;
    adapters.push_back(make_adapter(cfg, 8, 16, {"all-linear"}, 1));
    adapters.push_back(make_adapter(cfg, 2, 8, {gpt2 ? "c_attn" : "q_proj", gpt2 ? "c_proj" : "v_proj"}, 2));
    adapters.push_back(make_adapter(cfg, 4, 4, {gpt2 ? "c_fc" : "down_proj"}, 3));
  }
  EngineConfig config() const { return {.num_blocks = 96, .block_size = 16, .max_num_batched_tokens = 64}; }
  std::unique_ptr<Engine> engine() {
    auto e = std::make_unique<Engine>(cfg, params, pools, config());
    for (Adapter& a : adapters) e->add_adapter(a.lora, view(a));
    return e;
  }
};

Tokens prompt(int64_t n, int64_t salt, int64_t vocab) {
  Tokens t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 31 + salt * 97 + 5) % vocab));
  return t;
}

// The last-row logits of `tokens` prefilled alone with `adapter` (0: none).
std::vector<float> last_logits(model::PagedRunner& runner, const Tokens& tokens, int32_t adapter) {
  const auto n = static_cast<int32_t>(tokens.size());
  std::vector<int32_t> positions(tokens.size()), query_start{0, n}, seq_lens{n}, logit_rows{n - 1}, ids{adapter};
  std::vector<int64_t> slots(tokens.size());
  const int64_t bs = runner.sizes().block_size, blocks = (n + bs - 1) / bs;
  std::vector<int32_t> table;
  for (int32_t b = 0; b < blocks; ++b) table.push_back(b + 1);
  for (int32_t i = 0; i < n; ++i) positions[i] = i, slots[i] = (i / bs + 1) * bs + i % bs;
  return loom::test::to_floats(runner.step({tokens, positions, slots, query_start, seq_lens, table, blocks,
                                            logit_rows, {}, ids}));
}

TEST(EngineLora, AdaptedLogitsEqualTheMergedModels) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Fixture f(preset, DType::f32);
    const model::PagedRunnerSizes sizes{.num_blocks = 8, .block_size = 16, .max_tokens = 64, .max_logit_rows = 4};
    model::PagedRunner runner(f.cfg, f.params, f.pools, sizes);
    for (Adapter& a : f.adapters) runner.add_adapter(a.lora, view(a));
    const Tokens tokens = prompt(40, 1, f.cfg.vocab_size);
    const std::vector<float> base = last_logits(runner, tokens, 0);
    for (size_t k = 0; k < f.adapters.size(); ++k) {
      OwnedTensor merged = f.pools[MemTag::params].empty(DType::f32, {f.master.numel()});
      kernels::copy(merged, f.master);
      model::lora_merge(merged, f.cfg, f.adapters[k].lora, view(f.adapters[k]));
      model::PagedRunner plain(f.cfg, merged, f.pools, sizes);
      const std::vector<float> want = last_logits(plain, tokens, 0);
      const std::vector<float> got = last_logits(runner, tokens, static_cast<int32_t>(k + 1));
      EXPECT_ALL_CLOSE(got, want, 1e-5, 1e-5) << preset << " adapter " << k + 1;
      double moved = 0;  // the adapter does change the logits
      for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, double(std::fabs(got[i] - base[i])));
      EXPECT_GT(moved, 1e-2) << preset << " adapter " << k + 1;
    }
  }
}

struct Output {
  Tokens tokens;
  std::vector<float> logprobs;
  bool operator==(const Output&) const = default;
};

// 32 requests: request i runs with adapter i % 4 (0: the base), prompts of
// 3 to 45 tokens, half greedy and half sampled with a seed of their own.
std::vector<std::pair<Tokens, GenerationParams>> mixed_requests(int64_t vocab) {
  std::vector<std::pair<Tokens, GenerationParams>> out;
  for (int64_t i = 0; i < 32; ++i) {
    GenerationParams p{.sampler = {.temperature = i % 2 == 0 ? 0.f : 0.9f, .seed = static_cast<uint64_t>(100 + i)},
                       .stop = {.max_tokens = 6 + i % 5, .ignore_eos = true}};
    p.adapter = static_cast<int32_t>(i % 4);
    out.emplace_back(prompt(3 + (i * 7) % 43, i / 4, vocab), p);  // the same prompt for the 4 of a group
  }
  return out;
}

std::vector<Output> run(Engine& e, const std::vector<std::pair<Tokens, GenerationParams>>& requests, bool together) {
  std::vector<Output> out(requests.size());
  std::vector<RequestId> ids;
  auto drain = [&] {
    while (e.has_unfinished())
      for (const TokenEvent& ev : e.step()) {
        const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), ev.request) - ids.begin());
        out[i].tokens.push_back(ev.token), out[i].logprobs.push_back(ev.logprob);
      }
  };
  for (const auto& [tokens, params] : requests) {
    ids.push_back(e.add_request(tokens, params));
    if (!together) drain();
  }
  drain();
  return out;
}

void expect_mixed_batch_equals_alone(const char* preset, DType dtype) {
  Fixture f(preset, dtype);
  const auto requests = mixed_requests(f.cfg.vocab_size);
  const std::unique_ptr<Engine> together = f.engine(), alone = f.engine();
  const std::vector<Output> got = run(*together, requests, true), want = run(*alone, requests, false);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << preset << " " << dtype_name(dtype) << " request " << i << " adapter "
                               << requests[i].second.adapter;
    EXPECT_EQ(static_cast<int64_t>(got[i].tokens.size()), requests[i].second.stop.max_tokens);
  }
  // The same prompt under the four gives four answers (the adapters act).
  for (size_t g = 0; g + 3 < requests.size(); g += 4) {
    int64_t distinct_logprob_paths = 0;
    for (size_t k = 1; k < 4; ++k) distinct_logprob_paths += got[g + k].logprobs != got[g].logprobs ? 1 : 0;
    EXPECT_EQ(distinct_logprob_paths, 3) << preset << " group " << g / 4;
  }
}

TEST(EngineLora, MixedAdapterBatchGivesEachRequestItsTokensAlone) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) expect_mixed_batch_equals_alone(preset, DType::f32);
}

TEST(EngineLora, MixedAdapterBatchGivesEachRequestItsTokensAloneInBf16) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) expect_mixed_batch_equals_alone(preset, DType::bf16);
}

TEST(EngineLora, PrefixCacheNeverCrossesAdapters) {
  Fixture f("llama-tiny", DType::f32);
  const std::unique_ptr<Engine> e = f.engine();
  const int32_t same_as_first = e->add_adapter(f.adapters[0].lora, view(f.adapters[0]));  // id 4: adapter 1's weights
  EXPECT_EQ(same_as_first, 4);
  const Tokens p = prompt(48, 5, f.cfg.vocab_size);  // 3 blocks: a repeat reuses 2 (32 tokens)
  auto hits_after = [&](int32_t adapter) {
    GenerationParams g{.sampler = {.temperature = 0.f}, .stop = {.max_tokens = 2, .ignore_eos = true}};
    g.adapter = adapter;
    const int64_t before = e->kv().stats().prefix_hit_tokens;
    const auto out = run(*e, {{p, g}}, true);
    return std::make_pair(e->kv().stats().prefix_hit_tokens - before, out[0]);
  };
  const auto [first_hits, first] = hits_after(1);
  EXPECT_EQ(first_hits, 0);
  EXPECT_EQ(hits_after(0).first, 0) << "the base reused adapter 1's blocks";
  EXPECT_EQ(hits_after(2).first, 0) << "adapter 2 reused another's blocks";
  EXPECT_EQ(hits_after(3).first, 0) << "adapter 3 reused another's blocks";
  const auto [again_hits, again] = hits_after(1);
  EXPECT_EQ(again_hits, 32);
  EXPECT_EQ(again, first);
  EXPECT_EQ(hits_after(same_as_first).first, 32);  // the same weights: the same blocks
  EXPECT_EQ(hits_after(0).first, 32);              // the base's own, cached above
}

TEST(EngineLora, BadAdaptersAndIdsAreClearErrors) {
  Fixture f("gpt2-tiny", DType::f32);
  const std::unique_ptr<Engine> e = f.engine();
  GenerationParams g{.stop = {.max_tokens = 2}};
  g.adapter = 4;
  expect_error([&] { e->add_request(prompt(5, 1, f.cfg.vocab_size), g); }, {"adapter 4 is invalid"});
  g.adapter = -1;
  expect_error([&] { e->add_request(prompt(5, 1, f.cfg.vocab_size), g); }, {"adapter -1 is invalid"});
  Adapter& a = f.adapters[0];
  expect_error([&] { e->add_adapter(a.lora, view(a).slice(0, 0, 10)); }, {"f32 adapter parameters"});
  model::LoraConfig unknown = a.lora;
  unknown.targets = {"q_proj"};  // a Llama name on GPT-2
  expect_error([&] { e->add_adapter(unknown, view(a)); }, {"q_proj"});
  EXPECT_EQ(e->num_adapters(), 3);  // nothing added by the failures
}

}  // namespace
}  // namespace loom::infer
