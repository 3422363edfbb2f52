#include "core/lru_cache.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace loom {
namespace {

TEST(LruCache, AHitReturnsTheStoredValueWithoutMakingIt) {
  LruCache<int, std::vector<int>> cache(4);
  int made = 0;
  auto make = [&] { return std::vector<int>{++made}; };
  EXPECT_EQ(cache.get_or_make(7, make), std::vector<int>{1});
  EXPECT_EQ(cache.get_or_make(7, make), std::vector<int>{1});
  EXPECT_EQ(made, 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(LruCache, BeyondCapacityTheLeastRecentlyUsedIsEvicted) {
  std::vector<int> evicted;
  LruCache<int, int> cache(3, [&](int& v) { evicted.push_back(v); });
  for (int k : {1, 2, 3}) cache.get_or_make(k, [k] { return 10 * k; });
  cache.get_or_make(1, [] { return -1; });  // 1 is now the most recent: 2 is the oldest
  cache.get_or_make(4, [] { return 40; });
  EXPECT_EQ(evicted, std::vector<int>{20});
  EXPECT_FALSE(cache.contains(2));
  EXPECT_TRUE(cache.contains(1) && cache.contains(3) && cache.contains(4));
  EXPECT_EQ(cache.size(), 3u);
  for (int k = 5; k < 105; ++k) cache.get_or_make(k, [k] { return 10 * k; });
  EXPECT_EQ(cache.size(), 3u);  // bounded however many keys pass through
  EXPECT_EQ(evicted.size(), 101u);
}

TEST(LruCache, AFailedMakeLeavesTheCacheAsItWas) {
  std::vector<int> evicted;
  LruCache<int, int> cache(1, [&](int& v) { evicted.push_back(v); });
  cache.get_or_make(1, [] { return 1; });
  EXPECT_THROW(cache.get_or_make(2, []() -> int { throw std::runtime_error("no plan"); }), std::runtime_error);
  EXPECT_TRUE(cache.contains(1));
  EXPECT_FALSE(cache.contains(2));
  EXPECT_TRUE(evicted.empty());
}

TEST(LruCache, ZeroCapacityIsRefused) {
  EXPECT_THROW((LruCache<int, int>(0)), InternalError);
}

}  // namespace
}  // namespace loom
