// Engine: the scheduler, KV cache, paged runner and sampler together on a
// tiny random model. Greedy output equals the argmax of a full no-cache
// Model::forward, token after token; a
// request's tokens and log-probabilities are bitwise the same alone, in a
// batch, in chunks and after preemption; n > 1 shares the prompt's blocks;
// aborts and bad requests leave nothing behind.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/paged_runner.h"
#include "model/params.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;
using Tokens = std::vector<int32_t>;

struct Fixture {
  model::ModelConfig cfg = model::model_preset("llama-tiny");
  Pools pools;
  OwnedTensor params;
  explicit Fixture(const char* preset = "llama-tiny") : cfg(model::model_preset(preset)) {
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
    params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(params, specs, 9);
  }
};

Tokens prompt(int64_t n, int64_t salt, int64_t vocab) {
  Tokens t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 31 + salt * 97 + 5) % vocab));
  return t;
}

void expect_empty(const Engine& e) {
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.kv().pool().num_used(), 0);
  e.kv().pool().check_invariants();
}

// Greedy decoding the slow way: the whole sequence through Model::forward
// for every new token, the argmax of its last row (ties: the lower id).
Tokens greedy_by_full_forward(const Fixture& f, const Tokens& prompt, int64_t new_tokens) {
  Tokens seq = prompt;
  const int64_t V = f.cfg.vocab_size;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const auto T = static_cast<int64_t>(seq.size());
    Pools pools;
    model::Model m(f.cfg, 1, T, pools);
    kernels::copy(m.params(), f.params);
    m.forward(Tensor(seq.data(), DType::i32, {1, T}));
    const float* last = m.logits().data_as<float>() + (T - 1) * V;
    seq.push_back(static_cast<int32_t>(std::max_element(last, last + V) - last));
  }
  return Tokens(seq.begin() + static_cast<int64_t>(prompt.size()), seq.end());
}

TEST(Engine, GreedyTokensEqualTheArgmaxOfAFullForwardEachStep) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Fixture f(preset);
    Engine engine(f.cfg, f.params, f.pools, {.block_size = 4, .max_num_batched_tokens = 16});
    GenerationParams p{.sampler = {.temperature = 0.f}, .stop = {.max_tokens = 12}};
    const std::vector<Tokens> prompts = {prompt(9, 1, f.cfg.vocab_size), prompt(3, 2, f.cfg.vocab_size),
                                         prompt(21, 3, f.cfg.vocab_size)};
    const auto outputs = engine.generate(prompts, p);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(outputs[i][0].tokens, greedy_by_full_forward(f, prompts[i], 12)) << preset << " prompt " << i;
      EXPECT_EQ(outputs[i][0].finish, FinishReason::length);
    }
    expect_empty(engine);
  }
}

// The one request, run five ways at one block size (the attention's reduction
// order follows the block size, so that stays fixed); everything it returns
// must be bitwise equal.
TEST(Engine, ARequestGivesTheSameTokensAloneInABatchChunkedAndPreempted) {
  Fixture f;
  const int64_t V = f.cfg.vocab_size;
  const GenerationParams p{.sampler = {.temperature = 0.9f, .top_p = 0.95f, .seed = 1234}, .stop = {.max_tokens = 20},
                           .top_logprobs = 3};
  const Tokens target = prompt(27, 7, V);
  int64_t preemptions = 0;
  auto run = [&](EngineConfig c, int others) {
    Engine engine(f.cfg, f.params, f.pools, c);
    std::vector<Tokens> prompts;
    for (int i = 0; i < others / 2; ++i) prompts.push_back(prompt(5 + 3 * i, 20 + i, V));
    prompts.push_back(target);
    for (int i = others / 2; i < others; ++i) prompts.push_back(prompt(8 + 5 * i, 40 + i, V));
    const auto out = engine.generate(prompts, p);
    expect_empty(engine);
    preemptions = engine.scheduler().stats().num_preemptions;
    return out[static_cast<size_t>(others / 2)][0];
  };
  const GenerationOutput alone = run({.block_size = 16, .max_num_batched_tokens = 256}, 0);
  ASSERT_EQ(alone.tokens.size(), 20u);
  struct Case {
    const char* name;
    EngineConfig c;
    int others;
  };
  const Case cases[] = {
      {"in a batch of 8", {.block_size = 16, .max_num_batched_tokens = 256}, 7},
      {"in chunks of 7", {.block_size = 16, .max_num_batched_tokens = 7}, 3},
      {"in chunks of 1", {.block_size = 16, .max_num_batched_tokens = 1}, 1},
      {"preempted", {.num_blocks = 1 + 5, .block_size = 16, .max_num_batched_tokens = 64}, 7},
  };
  for (const Case& c : cases) {
    const GenerationOutput got = run(c.c, c.others);
    EXPECT_EQ(got.tokens, alone.tokens) << c.name;
    EXPECT_EQ(got.logprobs, alone.logprobs) << c.name;
  }
  EXPECT_GT(preemptions, 0) << "the last case was meant to preempt";
}

TEST(Engine, NSequencesShareThePromptAndDrawTheirOwnTokens) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 4});
  const GenerationParams p{.sampler = {.temperature = 1.f, .seed = 5}, .stop = {.max_tokens = 6}, .n = 3};
  const Tokens pr = prompt(16, 3, f.cfg.vocab_size);  // 4 full blocks
  const RequestId id = engine.add_request(pr, p);
  std::vector<Tokens> seqs(3);
  for (const TokenEvent& e : engine.step()) seqs[static_cast<size_t>(e.index)].push_back(e.token);  // prompt, fork
  EXPECT_EQ(engine.scheduler().stats().num_running, 3);
  EXPECT_EQ(engine.kv().pool().num_used(), 4);  // the prompt's blocks, shared
  for (const TokenEvent& e : engine.step()) seqs[static_cast<size_t>(e.index)].push_back(e.token);
  EXPECT_EQ(engine.kv().pool().num_used(), 4 + 3);  // and each sequence's own next block
  while (engine.has_unfinished())
    for (const TokenEvent& e : engine.step()) {
      EXPECT_EQ(e.request, id);
      seqs[static_cast<size_t>(e.index)].push_back(e.token);
    }
  EXPECT_NE(seqs[0], seqs[1]);
  EXPECT_NE(seqs[1], seqs[2]);
  expect_empty(engine);
}

// vLLM splits n into requests that each count against max_num_seqs; here
// the children that do not fit wait, and must sample exactly what they
// would have sampled forked at once.
TEST(Engine, NSequencesNeverRunMoreThanMaxNumSeqsAndDrawTheSameTokens) {
  Fixture f;
  const GenerationParams p{.sampler = {.temperature = 1.f, .seed = 7}, .stop = {.max_tokens = 9}, .n = 6,
                           .top_logprobs = 2};
  const std::vector<Tokens> prompts = {prompt(18, 3, f.cfg.vocab_size), prompt(7, 4, f.cfg.vocab_size)};
  Engine wide(f.cfg, f.params, f.pools, {.block_size = 4, .max_num_seqs = 16});
  const auto want = wide.generate(prompts, p);
  for (const bool prefix_caching : {true, false}) {
    Engine narrow(f.cfg, f.params, f.pools, {.block_size = 4, .max_num_seqs = 2, .prefix_caching = prefix_caching});
    std::map<RequestId, size_t> which;
    for (size_t i = 0; i < prompts.size(); ++i) which[narrow.add_request(prompts[i], p)] = i;
    std::vector<std::vector<Tokens>> got(prompts.size(), std::vector<Tokens>(6));
    std::vector<std::vector<std::vector<float>>> logprobs(prompts.size(), std::vector<std::vector<float>>(6));
    while (narrow.has_unfinished()) {
      const std::vector<TokenEvent> events = narrow.step();
      EXPECT_LE(events.size(), 2u);
      for (const TokenEvent& e : events) {
        got[which.at(e.request)][static_cast<size_t>(e.index)].push_back(e.token);
        logprobs[which.at(e.request)][static_cast<size_t>(e.index)].push_back(e.logprob);
      }
      EXPECT_LE(narrow.scheduler().stats().num_running, 2);
    }
    for (size_t i = 0; i < prompts.size(); ++i)
      for (size_t k = 0; k < 6; ++k) {
        EXPECT_EQ(got[i][k], want[i][k].tokens) << "prompt " << i << " sequence " << k;
        EXPECT_EQ(logprobs[i][k], want[i][k].logprobs) << "prompt " << i << " sequence " << k;
      }
    expect_empty(narrow);
  }
  EXPECT_NE(want[0][0].tokens, want[0][5].tokens);
}

// vLLM's MinTokensLogitsProcessor: EOS and stop tokens get -inf until
// min_tokens are out, greedy too; the logprobs stay the model's own.
TEST(Engine, MinTokensNeverSamplesEosOrAStopTokenBeforeThenEvenGreedy) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 4, .max_num_batched_tokens = 64});
  const Tokens pr = prompt(9, 1, f.cfg.vocab_size);
  GenerationParams p{.sampler = {.temperature = 0.f}, .stop = {.max_tokens = 6}, .top_logprobs = 1};
  const GenerationOutput free = engine.generate({pr}, p)[0][0];
  const int32_t first = free.tokens[0];
  p.stop.min_tokens = 4;
  for (int stop_token = 0; stop_token < 2; ++stop_token) {
    p.stop.eos_token_ids = stop_token ? Tokens{} : Tokens{first};
    p.stop.stop_token_ids = stop_token ? Tokens{first} : Tokens{};
    engine.add_request(pr, p);
    std::vector<TokenEvent> events;
    while (engine.has_unfinished())
      for (TokenEvent& e : engine.step()) events.push_back(std::move(e));
    ASSERT_GE(events.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NE(events[i].token, first) << "output token " << i;
    EXPECT_EQ(events[0].top[0].token, first) << "the logprobs are the model's, before the mask";
    EXPECT_EQ(events[0].top[0].logprob, free.logprobs[0]);
  }
  expect_empty(engine);
}

TEST(Engine, AbortFreesEveryBlockAtOnce) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 4, .max_num_batched_tokens = 8});
  const RequestId a = engine.add_request(prompt(30, 1, f.cfg.vocab_size), {.stop = {.max_tokens = 5}});
  const RequestId b = engine.add_request(prompt(5, 2, f.cfg.vocab_size), {.stop = {.max_tokens = 50}, .n = 2});
  for (int i = 0; i < 6; ++i) engine.step();
  EXPECT_TRUE(engine.abort(a));
  EXPECT_TRUE(engine.finish(b, FinishReason::abort));
  EXPECT_FALSE(engine.abort(b));
  expect_empty(engine);
}

TEST(Engine, FinishSequenceEndsOneSampleAndItsSiblingsGoOn) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 4});
  const RequestId id = engine.add_request(prompt(6, 4, f.cfg.vocab_size),
                                          {.sampler = {.seed = 3}, .stop = {.max_tokens = 8}, .n = 3});
  std::vector<int64_t> counts(3, 0);
  std::vector<FinishReason> finish(3, FinishReason::none);
  for (const TokenEvent& e : engine.step()) ++counts[static_cast<size_t>(e.index)];
  EXPECT_TRUE(engine.finish_sequence(id, 1, FinishReason::stop));  // as a stop string would
  EXPECT_FALSE(engine.finish_sequence(id, 1, FinishReason::stop));
  EXPECT_FALSE(engine.finish_sequence(id + 100, 0, FinishReason::stop));
  while (engine.has_unfinished())
    for (const TokenEvent& e : engine.step()) {
      ++counts[static_cast<size_t>(e.index)];
      finish[static_cast<size_t>(e.index)] = e.finish;
    }
  EXPECT_EQ(counts, (std::vector<int64_t>{8, 1, 8}));
  EXPECT_EQ(finish[0], FinishReason::length);
  EXPECT_EQ(finish[2], FinishReason::length);
  expect_empty(engine);
}

TEST(Engine, AKvCacheBudgetInBytesGivesItsBlocksOrAClearError) {
  Fixture f;
  const int64_t block = model::kv_block_bytes(f.cfg, 4, DType::bf16);
  EXPECT_EQ(block, 2 * f.cfg.n_layer * 4 * f.cfg.n_kv_head * f.cfg.head_size() * 2);
  const int64_t per_seq = (f.cfg.max_seq_len + 3) / 4;
  Engine engine(f.cfg, f.params, f.pools,
                {.kv_cache_bytes = (per_seq + 3) * block + block / 2, .block_size = 4, .kv_dtype = DType::bf16});
  EXPECT_EQ(engine.config().num_blocks, per_seq + 3);
  EXPECT_EQ(engine.runner().kv_cache_bytes(), (per_seq + 3) * block);
  const std::string needs = "needs " + std::to_string(per_seq + 1);
  expect_error([&] { Engine(f.cfg, f.params, f.pools, {.kv_cache_bytes = per_seq * block, .block_size = 4}); },
               {"one sequence of max_model_len = " + std::to_string(f.cfg.max_seq_len), needs});
}

TEST(Engine, BadRequestsAreClearErrorsAndQueueNothing) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 4});
  expect_error([&] { engine.add_request({1, static_cast<int32_t>(f.cfg.vocab_size)}, {}); },
               {"prompt token 1", "0 to " + std::to_string(f.cfg.vocab_size - 1)});
  expect_error([&] { engine.add_request({1}, {.n = 0}); }, {"n = 0"});
  expect_error([&] { engine.add_request({}, {}); }, {"prompt is empty"});
  expect_error([&] { engine.add_request(prompt(f.cfg.max_seq_len, 1, f.cfg.vocab_size), {}); },
               {"leaves no room", "max_model_len"});
  expect_error([&] { Engine(f.cfg, f.params, f.pools, {.max_model_len = f.cfg.max_seq_len + 1}); },
               {"max_model_len", "model.max_seq_len"});
  expect_empty(engine);
}

}  // namespace
}  // namespace loom::infer
