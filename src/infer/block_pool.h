// BlockPool: the bookkeeping of a paged KV cache (DESIGN.md §8), no tensors.
// num_blocks blocks of block_size tokens, laid out once; a block is an id, a
// reference count and, when its K/V are those of a full block of a known
// token chain, a hash (block_hash.h) under which the prefix cache finds it.
//
// Block 0 is the null block: never handed out, never freed, never cached, not
// counted by num_free() or num_used(); a table can point at it for a slot that
// holds nothing.
//
// The free queue holds exactly the blocks with ref_cnt 0, as a doubly-linked
// list over block ids (O(1) push, pop and removal from the middle). Its front
// is the eviction end: allocate() pops there, release() appends at the tail,
// so the least recently released block is reused first (LRU). A free block
// keeps its hash until it is popped (lazy eviction): until then a prefix hit
// can take it back out of the queue with touch().
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "infer/block_hash.h"

namespace loom::infer {

using BlockId = int32_t;
inline constexpr BlockId kNullBlock = 0;

class BlockPool {
 public:
  // num_blocks counts the null block: num_blocks - 1 can be handed out.
  // loom::Error unless num_blocks >= 2 and block_size >= 1.
  BlockPool(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }  // with the null block
  int64_t block_size() const { return block_size_; }
  int64_t num_free() const { return num_free_; }  // allocatable now, cached or not
  int64_t num_used() const { return num_blocks() - 1 - num_free_; }  // ref_cnt > 0
  int64_t num_cached() const { return static_cast<int64_t>(cached_.size()); }  // hashed, used or free

  int32_t ref_cnt(BlockId id) const;
  std::optional<BlockHash> hash(BlockId id) const;

  // Pops n blocks from the front of the free queue with ref_cnt 1, evicting
  // the hash of any that still holds one. All or nothing: with fewer than n
  // free, returns nullopt and changes nothing (num_free() is the check
  // that allocates nothing).
  std::optional<std::vector<BlockId>> allocate(int64_t n);
  // A prefix hit: ref_cnt++ for each id, taking a free one out of the queue.
  void touch(std::span<const BlockId> ids);
  // ref_cnt-- for each id; one that reaches 0 is appended to the tail, in the
  // order given (so a finished request passes its blocks tail first: its
  // prefix is evicted last). The blocks keep their hashes.
  void release(std::span<const BlockId> ids);

  // Makes id (in use, full, its K/V those of the chain named hash) findable
  // under hash. When another block already holds hash, that one stays cached
  // and id stays unhashed: returns false. Returns true when id holds hash.
  bool cache(BlockId id, const BlockHash& hash);
  std::optional<BlockId> lookup(const BlockHash& hash) const;
  // Forgets every hash (e.g. after new weights are loaded). Only when no
  // block is in use: otherwise returns false and changes nothing.
  bool reset_prefix_cache();

  // The free queue, front (evicted first) to tail.
  std::vector<BlockId> free_queue() const;
  // Throws InternalError when the queue is not exactly the blocks with
  // ref_cnt 0 (no duplicates, links consistent, the null block outside), or
  // the hash map and the blocks' hashes disagree. O(num_blocks), for tests.
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_cnt = 0;
    std::optional<BlockHash> hash;
  };

  void check_id(BlockId id, const char* op) const;
  BlockId sentinel() const { return static_cast<BlockId>(blocks_.size()); }
  void queue_push_back(BlockId id);
  void queue_remove(BlockId id);
  void evict(BlockId id);  // drops id's hash from it and from the map

  int64_t block_size_;
  std::vector<Block> blocks_;
  // Free-queue links, indexed by block id; index sentinel() is the list's
  // head/tail node, so the queue is never empty of links.
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  int64_t num_free_ = 0;
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> cached_;
};

}  // namespace loom::infer
