#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

using namespace loom;

// Known-answer vectors from Random123's tests/kat_vectors (philox4x32 10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, GeneratingWholeEqualsGeneratingInArbitrarySlices) {
  const int64_t n = 10007;
  const uint64_t seed = 1234, key = rng_key("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> whole_u(n), whole_n(n), sliced_u(n), sliced_n(n);
  rng_fill_uniform(whole_u.data(), n, seed, key, 0, -0.5f, 0.5f);
  rng_fill_normal(whole_n.data(), n, seed, key, 0, 0.f, 0.02f);
  // Uneven slices, generated out of order, as shards of different ranks would.
  const int64_t cuts[] = {0, 1, 17, 4096, 4097, 9000, n};
  for (int i = 5; i >= 0; --i) {
    const int64_t lo = cuts[i], len = cuts[i + 1] - lo;
    rng_fill_uniform(sliced_u.data() + lo, len, seed, key, lo, -0.5f, 0.5f);
    rng_fill_normal(sliced_n.data() + lo, len, seed, key, lo, 0.f, 0.02f);
  }
  EXPECT_EQ(whole_u, sliced_u);
  EXPECT_EQ(whole_n, sliced_n);
  // A 2-D shard (rows 3..5 of a (7, 1429) tensor) is a contiguous index range.
  std::vector<float> rows(3 * 1429);
  rng_fill_normal(rows.data(), 3 * 1429, seed, key, 3 * 1429, 0.f, 0.02f);
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), whole_n.begin() + 3 * 1429));
}

TEST(Philox, KeysAndSeedsGiveIndependentStreams) {
  EXPECT_NE(rng_key("a.weight"), rng_key("b.weight"));
  EXPECT_NE(rng_uniform(1, rng_key("w"), 0), rng_uniform(2, rng_key("w"), 0));
  EXPECT_NE(rng_uniform(1, rng_key("w"), 0), rng_uniform(1, rng_key("v"), 0));
  EXPECT_EQ(rng_normal(7, 9, 123456789012ull), rng_normal(7, 9, 123456789012ull));
}

TEST(Philox, UniformAndNormalHaveTheRightMoments) {
  const int64_t n = 200000;
  std::vector<float> u(n), z(n);
  rng_fill_uniform(u.data(), n, 42, rng_key("u"), 0);
  rng_fill_normal(z.data(), n, 42, rng_key("z"), 0);
  double su = 0, sz = 0, szz = 0;
  float umin = 1, umax = 0;
  for (int64_t i = 0; i < n; ++i) {
    su += u[i];
    sz += z[i];
    szz += double(z[i]) * z[i];
    umin = std::min(umin, u[i]);
    umax = std::max(umax, u[i]);
    ASSERT_TRUE(std::isfinite(z[i]));
  }
  EXPECT_GE(umin, 0.f);
  EXPECT_LT(umax, 1.f);
  // Standard errors: uniform mean 1/sqrt(12 n) ~ 6.5e-4, normal mean 1/sqrt(n) ~ 2.2e-3.
  EXPECT_NEAR(su / n, 0.5, 4e-3);
  EXPECT_NEAR(sz / n, 0.0, 1e-2);
  EXPECT_NEAR(szz / n, 1.0, 1.5e-2);
}
