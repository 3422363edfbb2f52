// KvCacheManager: per-request block tables over a BlockPool, prefix caching
// and copy-on-write (DESIGN.md §8). Pure bookkeeping: the scheduler decides
// how many tokens each request computes in a step and asks for their slots
// here; the runner writes K/V where slot_mapping() says and reads them
// through block_table(). Learned from vLLM v1's KVCacheManager.
//
// A request's block table maps logical block i (token positions
// [i B, (i+1) B), B = block_size) to a physical block; it only grows, until
// free(). num_tokens(id) counts the tokens whose K/V are computed or
// scheduled: after allocate_slots(), the table holds ceil(num_tokens / B)
// blocks.
//
// Contract with the scheduler: a successful allocate_slots() commits the
// step. The full blocks it completes are cached at once (findable by other
// requests in the same step: the runner writes every K/V of a step before
// any attention reads them), so the step must run; free or preempt a
// request only between steps, or before its allocate_slots() in a step.
// A call that breaks its contract (an unknown request, counts out of range,
// a prefix evicted since its lookup) throws loom::Error saying which.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "infer/block_hash.h"
#include "infer/block_pool.h"

namespace loom::infer {

using RequestId = int64_t;

struct KvCacheConfig {
  int64_t num_blocks = 0;  // with the null block; >= 2
  int64_t block_size = 16;
  BlockHash seed{};  // fingerprint of the model's weights: the root of every hash chain
  bool enable_prefix_caching = true;
};

// The cached full blocks a request can start from, found by computed_prefix()
// and handed to its first allocate_slots() (before other allocations).
struct ComputedPrefix {
  std::vector<BlockId> blocks;    // logical order
  std::vector<BlockHash> hashes;  // their chain hashes
  int64_t num_tokens = 0;         // blocks.size() * block_size
  int64_t num_queried_tokens = 0;  // the request's length at the lookup; 0: no lookup (stats only)
};

// One request's share of a step.
struct SlotRequest {
  RequestId id = 0;
  // Every token the request knows: the prompt, then the sampled ones. Holds at
  // least num_tokens(id) + num_new_tokens; its first num_tokens(id) must be
  // those of earlier calls (a forked child's start with its parent's).
  std::span<const int32_t> tokens = {};
  int64_t num_new_tokens = 0;  // computed this step, after the computed ones; >= 1
  std::span<const uint64_t> extra_keys = {};  // part of every block hash; the same on every call
};

// The runner copies block src's K/V into block dst before the step's forward.
struct BlockCopy {
  BlockId src;
  BlockId dst;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

struct KvCacheStats {
  int64_t num_blocks = 0;  // allocatable: the pool less the null block
  int64_t block_size = 0;
  int64_t token_capacity = 0;  // num_blocks * block_size
  int64_t used_blocks = 0;
  int64_t free_blocks = 0;
  int64_t cached_blocks = 0;  // holding a hash, in use or free
  int64_t prefix_queried_tokens = 0;  // over admitted requests: their lengths at the lookup
  int64_t prefix_hit_tokens = 0;  // of those, the tokens found cached
  double prefix_hit_rate() const;  // hit / queried tokens; 0 before any query
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& cfg);  // loom::Error on a bad config

  // The longest run of cached full blocks that starts tokens, capped so the
  // last token is always computed (its logits are needed): at most
  // floor((tokens.size() - 1) / B) blocks. A prompt of exactly k full blocks,
  // all cached, reuses k - 1 of them (vLLM's rule: hits stay block-aligned).
  // extra_keys: the request's, as it will pass them to allocate_slots().
  // Empty when prefix caching is off. Changes nothing (statistics are
  // counted when the prefix is taken, so a request retried is counted once).
  ComputedPrefix computed_prefix(std::span<const int32_t> tokens, std::span<const uint64_t> extra_keys = {}) const;

  // Grows req.id's table to hold num_tokens(id) + num_new_tokens tokens. The
  // first call for a request takes its prefix (ref_cnt++ on its blocks, which
  // leave the free queue if they were there) and starts it at
  // prefix.num_tokens; later calls take an empty prefix. A write into a shared
  // partial block (after fork()) first moves the writer to a fresh copy,
  // queued for take_pending_copies(). Full blocks completed by this step are
  // hashed and cached. All or nothing: when the pool is short, returns false
  // and changes no reference count, table or cache entry.
  bool allocate_slots(const SlotRequest& req, const ComputedPrefix& prefix = {});

  // n > 1: child shares every block of parent (ref_cnt++) and its token
  // count. Full blocks stay shared for good; the first of the two to write
  // into a shared partial block copies it.
  void fork(RequestId parent, RequestId child);

  // Releases id's blocks, tail first, so its prefix stays cached longest. An
  // id without blocks (never allocated, or already freed) is a no-op.
  void free(RequestId id);

  // The copies allocate_slots() queued since the last call; the runner does
  // them before the step's forward.
  std::vector<BlockCopy> take_pending_copies();

  // Physical slot block_table[p / B] * B + p % B of each position p in
  // [first, first + count), which must lie in [0, num_tokens(id)).
  std::vector<int64_t> slot_mapping(RequestId id, int64_t first, int64_t count) const;
  // Valid until the next call that changes id's blocks.
  std::span<const BlockId> block_table(RequestId id) const;
  int64_t num_tokens(RequestId id) const;
  bool has_request(RequestId id) const { return requests_.contains(id); }

  // Forgets every cached hash; only when no block is in use (else false).
  bool reset_prefix_cache() { return pool_.reset_prefix_cache(); }
  KvCacheStats stats() const;
  int64_t block_size() const { return pool_.block_size(); }
  const BlockPool& pool() const { return pool_; }

 private:
  struct RequestBlocks {
    std::vector<BlockId> table;
    std::vector<BlockHash> hashes;  // chain hashes of the first hashes.size() full blocks
    std::vector<uint64_t> extra_keys;
    int64_t num_tokens = 0;
  };

  const RequestBlocks& find(RequestId id, const char* op) const;
  void check_prefix(const SlotRequest& req, const ComputedPrefix& prefix) const;
  RequestBlocks& start_request(const SlotRequest& req, const ComputedPrefix& prefix);
  void copy_on_write(RequestBlocks& r, size_t index);
  void cache_full_blocks(RequestBlocks& r, std::span<const int32_t> tokens);

  BlockPool pool_;
  BlockHash seed_;
  bool enable_prefix_caching_;
  std::unordered_map<RequestId, RequestBlocks> requests_;
  std::vector<BlockCopy> pending_copies_;
  int64_t prefix_queried_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace loom::infer
