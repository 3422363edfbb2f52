// Sampler: greedy, top-k, top-p, seeding and the sampled frequencies.
#include <cmath>
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

TEST(Sampler, TopKOneIsGreedy) {
  Sampler s({.temperature = 1.5f, .top_k = 1, .seed = 9});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(kLogits), 1);
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

TEST(Sampler, BadArgumentsAreErrors) {
  expect_error([] { Sampler({.temperature = -0.1f}); }, {"temperature", "-0.1", ">= 0"});
  expect_error([] { Sampler({.top_k = -1}); }, {"top-k = -1", ">= 0"});
  expect_error([] { Sampler({.top_p = 0.f}); }, {"top-p = 0", "(0, 1]"});
  expect_error([] { Sampler({.top_p = 1.5f}); }, {"top-p = 1.5", "(0, 1]"});
}

}  // namespace
}  // namespace loom::infer
