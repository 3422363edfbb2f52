// BlockPool (free-queue order, reference counts, lazy eviction, the hash map)
// and the block hashes under it (the chain, seeds, extra keys).
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/error.h"
#include "infer/block_hash.h"
#include "infer/block_pool.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;
using Ids = std::vector<BlockId>;

std::vector<int32_t> count_up(int64_t n, int32_t from = 0) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + static_cast<int32_t>(i);
  return v;
}

// ---- block hashes ----

TEST(BlockHash, OnlyFullBlocksAreHashed) {
  const BlockHash seed = sha256_128({});
  EXPECT_EQ(block_hashes(seed, count_up(31), 16, {}).size(), 1u);
  EXPECT_EQ(block_hashes(seed, count_up(32), 16, {}).size(), 2u);
  EXPECT_EQ(block_hashes(seed, count_up(33), 16, {}).size(), 2u);
  EXPECT_EQ(block_hashes(seed, count_up(15), 16, {}).size(), 0u);
}

TEST(BlockHash, EachHashChainsItsParentAndItsBlock) {
  const BlockHash seed = sha256_128({});
  const std::vector<int32_t> tokens = count_up(12);
  const std::span<const int32_t> all(tokens);
  const std::vector<BlockHash> h = block_hashes(seed, tokens, 4, {});
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], block_hash(seed, all.subspan(0, 4), {}));
  EXPECT_EQ(h[1], block_hash(h[0], all.subspan(4, 4), {}));
  EXPECT_EQ(h[2], block_hash(h[1], all.subspan(8, 4), {}));
}

TEST(BlockHash, ChangingATokenChangesItsBlockAndEveryLaterOneOnly) {
  const BlockHash seed = sha256_128({});
  std::vector<int32_t> tokens = count_up(12);
  const std::vector<BlockHash> before = block_hashes(seed, tokens, 4, {});
  tokens[5] = 1000;
  const std::vector<BlockHash> after = block_hashes(seed, tokens, 4, {});
  EXPECT_EQ(before[0], after[0]);
  EXPECT_NE(before[1], after[1]);
  EXPECT_NE(before[2], after[2]);
}

TEST(BlockHash, DifferentSeedsNeverMatch) {
  const uint8_t weights_a[] = {1, 2, 3};
  const uint8_t weights_b[] = {1, 2, 4};
  const std::vector<int32_t> tokens = count_up(64);
  const std::vector<BlockHash> a = block_hashes(sha256_128(weights_a), tokens, 4, {});
  const std::vector<BlockHash> b = block_hashes(sha256_128(weights_b), tokens, 4, {});
  for (const BlockHash& x : a)
    for (const BlockHash& y : b) EXPECT_NE(x, y);
}

TEST(BlockHash, ExtraKeysChangeEveryHash) {
  const BlockHash seed = sha256_128({});
  const std::vector<int32_t> tokens = count_up(8);
  const std::vector<uint64_t> lora_1 = {1}, lora_2 = {2};
  const std::vector<BlockHash> none = block_hashes(seed, tokens, 4, {});
  const std::vector<BlockHash> one = block_hashes(seed, tokens, 4, lora_1);
  const std::vector<BlockHash> two = block_hashes(seed, tokens, 4, lora_2);
  for (size_t i = 0; i < none.size(); ++i) {
    EXPECT_NE(none[i], one[i]);
    EXPECT_NE(one[i], two[i]);
  }
}

// ---- BlockPool ----

TEST(BlockPool, FreshPoolHandsOutBlocksInIdOrderButNeverTheNullBlock) {
  BlockPool pool(5, 16);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(pool.allocate(3), (Ids{1, 2, 3}));
  EXPECT_EQ(pool.allocate(1), (Ids{4}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_used(), 4);
  EXPECT_EQ(pool.ref_cnt(kNullBlock), 0);
  pool.check_invariants();
}

TEST(BlockPool, AllocatingMoreThanIsFreeFailsAndChangesNothing) {
  BlockPool pool(6, 4);
  ASSERT_TRUE(pool.allocate(3));
  EXPECT_EQ(pool.allocate(3), std::nullopt);
  EXPECT_EQ(pool.free_queue(), (Ids{4, 5}));
  for (BlockId id = 1; id <= 3; ++id) EXPECT_EQ(pool.ref_cnt(id), 1);
  EXPECT_EQ(pool.ref_cnt(4), 0);
  EXPECT_EQ(pool.allocate(2), (Ids{4, 5}));
  pool.check_invariants();
}

TEST(BlockPool, ReleasedBlocksJoinTheTailInTheOrderGiven) {
  BlockPool pool(7, 4);
  ASSERT_TRUE(pool.allocate(4));  // 1 2 3 4; queue: 5 6
  pool.release(Ids{3, 1});
  EXPECT_EQ(pool.free_queue(), (Ids{5, 6, 3, 1}));
  pool.release(Ids{4, 2});
  EXPECT_EQ(pool.free_queue(), (Ids{5, 6, 3, 1, 4, 2}));
  EXPECT_EQ(pool.allocate(3), (Ids{5, 6, 3}));
  pool.check_invariants();
}

TEST(BlockPool, TouchTakesAFreeBlockOutOfTheMiddleOfTheQueue) {
  BlockPool pool(7, 4);
  const Ids touched = {3};
  pool.touch(touched);
  EXPECT_EQ(pool.ref_cnt(3), 1);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 2, 4, 5, 6}));
  pool.touch(touched);
  EXPECT_EQ(pool.ref_cnt(3), 2);
  EXPECT_EQ(pool.num_free(), 5);
  pool.check_invariants();
}

TEST(BlockPool, SharedBlockReturnsToTheQueueWhenItsLastHolderReleasesIt) {
  BlockPool pool(4, 4);
  const Ids one = *pool.allocate(1);
  pool.touch(one);
  pool.release(one);
  EXPECT_EQ(pool.ref_cnt(one[0]), 1);
  EXPECT_EQ(pool.free_queue(), (Ids{2, 3}));
  pool.release(one);
  EXPECT_EQ(pool.free_queue(), (Ids{2, 3, 1}));
  pool.check_invariants();
}

TEST(BlockPool, FreedCachedBlockIsFoundUntilItIsReallocated) {
  BlockPool pool(4, 4);
  const BlockHash h = sha256_128({});
  const Ids one = *pool.allocate(1);  // block 1; queue: 2 3
  ASSERT_TRUE(pool.cache(one[0], h));
  pool.release(one);  // queue: 2 3 1
  EXPECT_EQ(pool.lookup(h), one[0]);
  EXPECT_EQ(pool.hash(one[0]), h);
  EXPECT_EQ(pool.num_cached(), 1);
  pool.check_invariants();
  EXPECT_EQ(pool.allocate(3), (Ids{2, 3, 1}));
  EXPECT_EQ(pool.lookup(h), std::nullopt);
  EXPECT_EQ(pool.hash(one[0]), std::nullopt);
  EXPECT_EQ(pool.num_cached(), 0);
  pool.check_invariants();
}

TEST(BlockPool, SecondBlockWithTheSameHashStaysUnhashed) {
  BlockPool pool(4, 4);
  const BlockHash h = sha256_128({});
  const Ids two = *pool.allocate(2);
  EXPECT_TRUE(pool.cache(two[0], h));
  EXPECT_FALSE(pool.cache(two[1], h));
  EXPECT_EQ(pool.lookup(h), two[0]);
  EXPECT_EQ(pool.hash(two[1]), std::nullopt);
  EXPECT_TRUE(pool.cache(two[0], h));  // caching a block again under its own hash is a no-op
  pool.check_invariants();
}

TEST(BlockPool, ResetPrefixCacheOnlyWhenNothingIsInUse) {
  BlockPool pool(4, 4);
  const BlockHash h = sha256_128({});
  const Ids one = *pool.allocate(1);
  ASSERT_TRUE(pool.cache(one[0], h));
  EXPECT_FALSE(pool.reset_prefix_cache());
  EXPECT_EQ(pool.lookup(h), one[0]);
  pool.release(one);
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_EQ(pool.lookup(h), std::nullopt);
  EXPECT_EQ(pool.hash(one[0]), std::nullopt);
  pool.check_invariants();
}

TEST(BlockPool, ReleasingAFreeBlockIsAnInternalError) {
  BlockPool pool(4, 4);
  EXPECT_THROW(pool.release(Ids{2}), InternalError);
  EXPECT_THROW(pool.touch(Ids{kNullBlock}), InternalError);
}

TEST(BlockPool, BadSizesAreClearErrors) {
  expect_error([] { BlockPool(1, 16); }, {"num_blocks 1", "null block"});
  expect_error([] { BlockPool(8, 0); }, {"block_size 0", ">= 1"});
}

}  // namespace
}  // namespace loom::infer
