// Sampler: greedy, top-k, top-p, seeding and the sampled frequencies.
#include <cmath>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "infer/sampler.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, 0.0f};  // argmax 1 (ties: lower id)

TEST(Sampler, TemperatureZeroIsArgmax) {
  Sampler s({.temperature = 0.f, .seed = 3});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, TopKOneIsGreedyWhenTheMostLikelyIsUnique) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 1.9f, 0.0f};
  Sampler s({.temperature = 1.5f, .top_k = 1, .seed = 9});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 1);
}

// vLLM's apply_top_k_top_p masks only logits below the k-th value.
TEST(Sampler, TopKKeepsEveryTokenTiedWithTheKth) {
  const std::vector<float> logits = {3.f, 2.f, 1.f, 2.f, 0.f, 2.f};
  const std::vector<TokenProb> d = sampling_distribution({.top_k = 2}, logits);
  ASSERT_EQ(d.size(), 4u);
  const int32_t order[] = {0, 1, 3, 5};  // ties: lower id first
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i].token, order[i]);
  EXPECT_EQ(d[1].prob, d[3].prob);
  EXPECT_EQ(sampling_distribution({.top_k = 1}, kLogits).size(), 2u);  // 1 and 4 tie for the most likely
  EXPECT_EQ(sampling_distribution({.temperature = 0.f, .top_k = 1}, kLogits)[0].token, 1);  // greedy: lower id
  for (uint64_t draw = 0; draw < 10; ++draw)  // a draw is still a function of (seed, index)
    EXPECT_EQ(sample_at({.top_k = 2, .seed = 4}, logits, {}, {}, draw).token,
              sample_at({.top_k = 2, .seed = 4}, logits, {}, {}, draw).token);
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<TokenProb> d = sampling_distribution({.top_k = 3}, kLogits);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 4);
  EXPECT_EQ(d[2].token, 3);
  EXPECT_NEAR(d[0].prob + d[1].prob + d[2].prob, 1.0, 1e-6);
}

TEST(Sampler, TopPKeepsTheSmallestSetWithMassAtLeastP) {
  // probabilities 0.5, 0.25, 0.125, 0.125
  const std::vector<float> logits = {std::log(0.125f), std::log(0.5f), std::log(0.125f), std::log(0.25f)};
  auto kept = [&](float p) { return sampling_distribution({.top_p = p}, logits).size(); };
  EXPECT_EQ(kept(0.5f), 1u);
  EXPECT_EQ(kept(0.51f), 2u);
  EXPECT_EQ(kept(0.75f), 2u);
  EXPECT_EQ(kept(0.8f), 3u);
  EXPECT_EQ(kept(1.0f), 4u);
  const std::vector<TokenProb> d = sampling_distribution({.top_p = 0.8f}, logits);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 3);
  EXPECT_EQ(d[2].token, 0);
  EXPECT_NEAR(d[0].prob, 0.5 / 0.875, 1e-6);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  auto draw = [](uint64_t seed) {
    Sampler s({.temperature = 1.f, .seed = seed});
    std::vector<int32_t> t;
    for (int i = 0; i < 50; ++i) t.push_back(s.sample(kLogits));
    return t;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, FrequenciesFollowTheSoftmaxWithTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -0.5f};
  const float temperature = 0.8f;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature);
  Sampler s({.temperature = temperature, .seed = 5});
  const int n = 40000;
  std::vector<int> count(logits.size());
  for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] / sum, sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(double(count[i]) / n, expected, 5 * sd) << "token " << i;  // 5 sigma
  }
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMostLikely) {
  // probabilities 0.5, 0.25, 0.125, 0.125: min_p 0.3 keeps those >= 0.15
  const std::vector<float> logits = {std::log(0.125f), std::log(0.5f), std::log(0.125f), std::log(0.25f)};
  const std::vector<TokenProb> d = sampling_distribution({.min_p = 0.3f}, logits);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 3);
  EXPECT_NEAR(d[0].prob, 2.0 / 3.0, 1e-6);
  EXPECT_EQ(sampling_distribution({.min_p = 0.2f}, logits).size(), 4u);  // 0.125 >= 0.2 * 0.5
  EXPECT_EQ(sampling_distribution({.min_p = 1.f}, logits).size(), 1u);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  std::vector<float> logits = {2.f, -2.f, 2.f, -2.f, 1.f};
  const std::vector<int32_t> prompt = {0, 1}, output = {1, 4};
  apply_penalties({.repetition_penalty = 2.f}, logits, prompt, output);
  EXPECT_EQ(logits, (std::vector<float>{1.f, -4.f, 2.f, -2.f, 0.5f}));
}

// repeat_last_n: only the last N tokens of the prompt and output together.
TEST(Sampler, RepetitionWindowSeesOnlyTheLastTokensOfPromptAndOutput) {
  const std::vector<int32_t> prompt = {0, 1, 2}, output = {3, 4};
  const auto penalised = [&](int64_t window) {
    std::vector<float> logits(5, 2.f);
    apply_penalties({.repetition_penalty = 2.f, .repetition_window = window}, logits, prompt, output);
    std::vector<int32_t> seen;
    for (int32_t t = 0; t < 5; ++t)
      if (logits[static_cast<size_t>(t)] == 1.f) seen.push_back(t);
    return seen;
  };
  EXPECT_EQ(penalised(-1), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(penalised(0), std::vector<int32_t>{});
  EXPECT_EQ(penalised(1), std::vector<int32_t>{4});
  EXPECT_EQ(penalised(3), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(penalised(99), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  expect_error([] { SamplerConfig{.repetition_window = -2}.validate(); }, {"repeat_last_n = -2 is invalid"});
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOnlyTheOutput) {
  std::vector<float> logits = {1.f, 1.f, 1.f, 1.f};
  const std::vector<int32_t> prompt = {0, 0, 0}, output = {1, 2, 2};
  apply_penalties({.presence_penalty = 0.5f, .frequency_penalty = 0.25f}, logits, prompt, output);
  EXPECT_EQ(logits, (std::vector<float>{1.f, 1.f - 0.5f - 0.25f, 1.f - 0.5f - 0.5f, 1.f}));
  expect_error([&] { apply_penalties({.presence_penalty = 1.f}, logits, prompt, std::vector<int32_t>{7}); },
               {"token 7", "0 to 3"});
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxWithTheTopNMostLikelyFirst) {
  const std::vector<int32_t> none;
  const SampleResult r = sample_at({.temperature = 0.5f, .repetition_penalty = 3.f}, kLogits, none, none, 0, 3);
  double z = 0;
  for (float x : kLogits) z += std::exp(double(x));
  EXPECT_NEAR(r.logprob, kLogits[r.token] - std::log(z), 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 1);  // ties: lower id first
  EXPECT_EQ(r.top[1].token, 4);
  EXPECT_EQ(r.top[2].token, 3);
  EXPECT_NEAR(r.top[2].logprob, 1.0 - std::log(z), 1e-6);
}

TEST(Sampler, ADrawDependsOnlyOnTheSeedAndItsIndex) {
  const std::vector<int32_t> none;
  Sampler s({.temperature = 1.f, .seed = 11});
  std::vector<int32_t> in_order;
  for (int i = 0; i < 30; ++i) in_order.push_back(s.sample(kLogits));
  for (int i = 29; i >= 0; --i)
    EXPECT_EQ(sample_at({.temperature = 1.f, .seed = 11}, kLogits, none, none, i).token, in_order[i]) << "draw " << i;
}

TEST(Sampler, RowsSampledTogetherEqualEachRowAlone) {
  const int64_t R = 33, V = 50;
  std::vector<float> logits(R * V);
  for (int64_t i = 0; i < R * V; ++i) logits[i] = std::sin(0.37f * static_cast<float>(i)) * 4.f;
  std::vector<SamplerConfig> cfgs;
  std::vector<std::vector<int32_t>> prompt_store, output_store;
  std::vector<std::span<const int32_t>> prompts, outputs;
  std::vector<uint64_t> draws;
  std::vector<int64_t> tops;
  for (int64_t r = 0; r < R; ++r) {
    cfgs.push_back({.temperature = r % 3 == 0 ? 0.f : 0.7f, .top_k = r % 5, .top_p = r % 2 ? 0.9f : 1.f,
                    .seed = static_cast<uint64_t>(r), .min_p = r % 4 == 1 ? 0.05f : 0.f,
                    .presence_penalty = r % 6 == 2 ? 0.5f : 0.f, .repetition_penalty = r % 7 == 3 ? 1.3f : 1.f});
    prompt_store.push_back({static_cast<int32_t>(r % V), 3, 4});
    output_store.push_back({5, static_cast<int32_t>((r * 7) % V)});
    draws.push_back(static_cast<uint64_t>(r * 13 % 17));
    tops.push_back(r % 4);
  }
  for (int64_t r = 0; r < R; ++r) prompts.push_back(prompt_store[r]), outputs.push_back(output_store[r]);
  const std::vector<SampleResult> all = sample_rows(logits, V, cfgs, prompts, outputs, draws, tops);
  for (int64_t r = 0; r < R; ++r) {
    const SampleResult one =
        sample_at(cfgs[r], std::span<const float>(logits).subspan(r * V, V), prompts[r], outputs[r], draws[r], tops[r]);
    EXPECT_EQ(all[r].token, one.token) << "row " << r;
    EXPECT_EQ(all[r].logprob, one.logprob) << "row " << r;
    ASSERT_EQ(all[r].top.size(), one.top.size());
    for (size_t i = 0; i < one.top.size(); ++i) EXPECT_EQ(all[r].top[i].logprob, one.top[i].logprob);
  }
  cfgs[5].top_p = 2.f;
  expect_error([&] { sample_rows(logits, V, cfgs, prompts, outputs, draws, tops); }, {"row 5", "top-p = 2"});
}

// min_tokens' stop tokens: never drawn, greedy or not, and the logprobs are
// still the model's own; a mask that leaves only banned tokens keeps them.
TEST(Sampler, BannedTokensAreNeverDrawnUnlessTheyAreAllTheMaskLeaves) {
  std::vector<SampleRow> rows;
  for (float t : {0.f, 1.f})
    for (uint64_t draw = 0; draw < 20; ++draw)
      rows.push_back({.cfg = {.temperature = t, .seed = 3}, .logits = kLogits, .prompt = {}, .output = {}, .draw = draw,
                      .top_logprobs = 1, .banned = {1, 4}});
  double z = 0;
  for (float x : kLogits) z += std::exp(double(x));
  for (const SampleResult& r : sample_rows(rows)) {
    EXPECT_NE(r.token, 1);
    EXPECT_NE(r.token, 4);
    EXPECT_NEAR(r.logprob, kLogits[r.token] - std::log(z), 1e-6);
    ASSERT_EQ(r.top.size(), 1u);
    EXPECT_EQ(r.top[0].token, 1);  // the raw top, banned or not
  }
  EXPECT_EQ(sample_rows(rows)[0].token, 3);  // greedy: the most likely left
  const std::vector<uint8_t> only_ends = {0, 1, 0, 0, 1, 0};
  const SampleRow end_row{
      .cfg = {.temperature = 0.f}, .logits = kLogits, .prompt = {}, .output = {}, .allowed = only_ends};
  rows = {end_row, end_row};
  rows[0].banned = {1, 4};
  rows[1].banned = {1};
  const std::vector<SampleResult> ends = sample_rows(rows);
  EXPECT_EQ(ends[0].token, 1);
  EXPECT_EQ(ends[1].token, 4);
}

TEST(Sampler, BadArgumentsAreErrors) {
  expect_error([] { Sampler({.temperature = -0.1f}); }, {"temperature", "-0.1", ">= 0"});
  expect_error([] { Sampler({.top_k = -1}); }, {"top-k = -1", ">= 0"});
  expect_error([] { Sampler({.top_p = 0.f}); }, {"top-p = 0", "(0, 1]"});
  expect_error([] { Sampler({.top_p = 1.5f}); }, {"top-p = 1.5", "(0, 1]"});
  expect_error([] { Sampler({.min_p = -0.5f}); }, {"min-p = -0.5", "[0, 1]"});
  expect_error([] { Sampler({.presence_penalty = 3.f}); }, {"presence_penalty = 3", "[-2, 2]"});
  expect_error([] { Sampler({.frequency_penalty = -2.5f}); }, {"frequency_penalty = -2.5", "[-2, 2]"});
  expect_error([] { Sampler({.repetition_penalty = 0.f}); }, {"repetition_penalty = 0", "> 0"});
}

}  // namespace
}  // namespace loom::infer
