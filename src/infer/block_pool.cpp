#include "infer/block_pool.h"

#include <limits>

#include "core/error.h"

namespace loom::infer {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size) : block_size_(block_size) {
  LOOM_REQUIRE(num_blocks >= 2 && num_blocks <= std::numeric_limits<BlockId>::max() - 1,
               "kv cache: num_blocks ", num_blocks, " must be in [2, ", std::numeric_limits<BlockId>::max() - 1,
               "] (block 0 is the reserved null block)");
  LOOM_REQUIRE(block_size >= 1, "kv cache: block_size ", block_size, " must be >= 1");
  blocks_.resize(num_blocks);
  prev_.resize(num_blocks + 1);
  next_.resize(num_blocks + 1);
  prev_[sentinel()] = next_[sentinel()] = sentinel();
  for (BlockId id = 1; id < sentinel(); ++id) queue_push_back(id);
}

void BlockPool::check_id(BlockId id, const char* op) const {
  LOOM_CHECK(id > kNullBlock && id < sentinel(), op, ": block id ", id, " not in [1, ", sentinel(), ")");
}

int32_t BlockPool::ref_cnt(BlockId id) const {
  LOOM_CHECK(id >= 0 && id < sentinel(), "ref_cnt: block id ", id, " not in [0, ", sentinel(), ")");
  return blocks_[id].ref_cnt;
}

std::optional<BlockHash> BlockPool::hash(BlockId id) const {
  LOOM_CHECK(id >= 0 && id < sentinel(), "hash: block id ", id, " not in [0, ", sentinel(), ")");
  return blocks_[id].hash;
}

void BlockPool::queue_push_back(BlockId id) {
  const BlockId last = prev_[sentinel()];
  prev_[id] = last;
  next_[id] = sentinel();
  next_[last] = id;
  prev_[sentinel()] = id;
  ++num_free_;
}

void BlockPool::queue_remove(BlockId id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  prev_[id] = next_[id] = kNullBlock;
  --num_free_;
}

void BlockPool::evict(BlockId id) {
  const auto it = cached_.find(*blocks_[id].hash);
  LOOM_CHECK(it != cached_.end() && it->second == id, "evict: block ", id, " holds a hash the map does not give it");
  cached_.erase(it);
  blocks_[id].hash.reset();
}

std::optional<std::vector<BlockId>> BlockPool::allocate(int64_t n) {
  LOOM_CHECK(n >= 0, "allocate: n=", n);
  if (n > num_free_) return std::nullopt;
  std::vector<BlockId> ids;
  ids.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const BlockId id = next_[sentinel()];
    queue_remove(id);
    if (blocks_[id].hash) evict(id);
    blocks_[id].ref_cnt = 1;
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::touch(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    check_id(id, "touch");
    if (blocks_[id].ref_cnt == 0) queue_remove(id);
    ++blocks_[id].ref_cnt;
  }
}

void BlockPool::release(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    check_id(id, "release");
    LOOM_CHECK(blocks_[id].ref_cnt > 0, "release: block ", id, " is already free");
    if (--blocks_[id].ref_cnt == 0) queue_push_back(id);
  }
}

bool BlockPool::cache(BlockId id, const BlockHash& hash) {
  check_id(id, "cache");
  Block& block = blocks_[id];
  LOOM_CHECK(block.ref_cnt > 0, "cache: block ", id, " is free; only a block being written is cached");
  if (block.hash) {
    LOOM_CHECK(*block.hash == hash, "cache: block ", id, " already holds another hash");
    return true;
  }
  if (!cached_.emplace(hash, id).second) return false;
  block.hash = hash;
  return true;
}

std::optional<BlockId> BlockPool::lookup(const BlockHash& hash) const {
  const auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::reset_prefix_cache() {
  if (num_used() != 0) return false;
  for (Block& block : blocks_) block.hash.reset();
  cached_.clear();
  return true;
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> ids;
  ids.reserve(num_free_);
  for (BlockId id = next_[sentinel()]; id != sentinel(); id = next_[id]) ids.push_back(id);
  return ids;
}

void BlockPool::check_invariants() const {
  std::vector<bool> queued(blocks_.size(), false);
  int64_t walked = 0;
  for (BlockId id = next_[sentinel()]; id != sentinel(); id = next_[id]) {
    LOOM_CHECK(id > kNullBlock && id < sentinel(), "free queue holds block id ", id);
    LOOM_CHECK(!queued[id], "free queue holds block ", id, " twice");
    LOOM_CHECK(next_[prev_[id]] == id && prev_[next_[id]] == id, "free queue links broken at block ", id);
    LOOM_CHECK(walked < num_free(), "free queue longer than num_free=", num_free());
    queued[id] = true;
    ++walked;
  }
  LOOM_CHECK(walked == num_free_, "free queue has ", walked, " blocks, num_free=", num_free_);
  const Block& null = blocks_[kNullBlock];
  LOOM_CHECK(null.ref_cnt == 0 && !null.hash, "the null block was used or cached");
  int64_t hashed = 0;
  for (BlockId id = 1; id < sentinel(); ++id) {
    const Block& block = blocks_[id];
    LOOM_CHECK(block.ref_cnt >= 0, "block ", id, " ref_cnt ", block.ref_cnt);
    LOOM_CHECK(queued[id] == (block.ref_cnt == 0), "block ", id, " ref_cnt ", block.ref_cnt,
               queued[id] ? " is in" : " is not in", " the free queue");
    if (!block.hash) continue;
    ++hashed;
    const auto it = cached_.find(*block.hash);
    LOOM_CHECK(it != cached_.end() && it->second == id, "block ", id, " holds a hash the map does not give it");
  }
  LOOM_CHECK(hashed == num_cached(), "map has ", num_cached(), " hashes, blocks hold ", hashed);
}

}  // namespace loom::infer
