#include "infer/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace loom::infer {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

double KvCacheStats::prefix_hit_rate() const {
  return prefix_queried_tokens == 0 ? 0.0 : static_cast<double>(prefix_hit_tokens) / prefix_queried_tokens;
}

KvCacheManager::KvCacheManager(const KvCacheConfig& cfg)
    : pool_(cfg.num_blocks, cfg.block_size), seed_(cfg.seed), enable_prefix_caching_(cfg.enable_prefix_caching) {}

const KvCacheManager::RequestBlocks& KvCacheManager::find(RequestId id, const char* op) const {
  const auto it = requests_.find(id);
  LOOM_REQUIRE(it != requests_.end(), op, ": request ", id, " has no KV blocks (never allocated, or freed)");
  return it->second;
}

ComputedPrefix KvCacheManager::computed_prefix(std::span<const int32_t> tokens,
                                               std::span<const uint64_t> extra_keys) const {
  ComputedPrefix prefix;
  if (!enable_prefix_caching_ || tokens.empty()) return prefix;
  prefix.num_queried_tokens = static_cast<int64_t>(tokens.size());
  const int64_t B = block_size();
  // The last token is never a hit: its logits are needed.
  const int64_t max_blocks = (prefix.num_queried_tokens - 1) / B;
  BlockHash parent = seed_;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = block_hash(parent, tokens.subspan(i * B, B), extra_keys);
    const std::optional<BlockId> id = pool_.lookup(h);
    if (!id) break;
    prefix.blocks.push_back(*id);
    prefix.hashes.push_back(h);
    parent = h;
  }
  prefix.num_tokens = static_cast<int64_t>(prefix.blocks.size()) * B;
  return prefix;
}

void KvCacheManager::check_prefix(const SlotRequest& req, const ComputedPrefix& prefix) const {
  LOOM_REQUIRE(prefix.blocks.size() == prefix.hashes.size() &&
                   prefix.num_tokens == static_cast<int64_t>(prefix.blocks.size()) * block_size(),
               "allocate_slots: request ", req.id, ": the prefix's ", prefix.blocks.size(), " blocks, ",
               prefix.hashes.size(), " hashes and ", prefix.num_tokens,
               " tokens disagree; pass computed_prefix()'s result unchanged");
  for (size_t i = 0; i < prefix.blocks.size(); ++i)
    LOOM_REQUIRE(pool_.hash(prefix.blocks[i]) == prefix.hashes[i], "allocate_slots: request ", req.id,
                 ": prefix block ", prefix.blocks[i], " was evicted since computed_prefix(); look it up again");
}

KvCacheManager::RequestBlocks& KvCacheManager::start_request(const SlotRequest& req, const ComputedPrefix& prefix) {
  pool_.touch(prefix.blocks);
  prefix_queried_tokens_ += prefix.num_queried_tokens;
  prefix_hit_tokens_ += prefix.num_tokens;
  RequestBlocks r{.table = prefix.blocks,
                  .hashes = prefix.hashes,
                  .extra_keys = {req.extra_keys.begin(), req.extra_keys.end()},
                  .num_tokens = prefix.num_tokens};
  return requests_.emplace(req.id, std::move(r)).first->second;
}

// The writer leaves the shared block to the others and continues in a copy.
void KvCacheManager::copy_on_write(RequestBlocks& r, size_t index) {
  const BlockId shared = r.table[index];
  const std::optional<std::vector<BlockId>> fresh = pool_.allocate(1);
  LOOM_CHECK(fresh, "copy_on_write: no free block after the check said there was");
  pending_copies_.push_back({.src = shared, .dst = fresh->front()});
  const BlockId released[] = {shared};
  pool_.release(released);  // ref_cnt was > 1: stays in use by the others
  r.table[index] = fresh->front();
}

// Hashes the request's full blocks not hashed yet: those this step completes.
void KvCacheManager::cache_full_blocks(RequestBlocks& r, std::span<const int32_t> tokens) {
  if (!enable_prefix_caching_) return;
  const int64_t B = block_size();
  const size_t full = static_cast<size_t>(r.num_tokens / B);
  for (size_t i = r.hashes.size(); i < full; ++i) {
    const BlockHash& parent = i == 0 ? seed_ : r.hashes[i - 1];
    r.hashes.push_back(block_hash(parent, tokens.subspan(i * B, B), r.extra_keys));
    pool_.cache(r.table[i], r.hashes.back());  // false: an equal block is cached already, keep that one
  }
}

bool KvCacheManager::allocate_slots(const SlotRequest& req, const ComputedPrefix& prefix) {
  const auto it = requests_.find(req.id);
  const bool first = it == requests_.end();
  if (first) {
    check_prefix(req, prefix);
  } else {
    LOOM_REQUIRE(prefix.blocks.empty(), "allocate_slots: request ", req.id,
                 " already has blocks; a computed prefix is taken on its first call only");
    LOOM_REQUIRE(std::ranges::equal(req.extra_keys, it->second.extra_keys), "allocate_slots: request ", req.id,
                 ": extra_keys differ from its first call's");
  }
  LOOM_REQUIRE(req.num_new_tokens >= 1, "allocate_slots: request ", req.id, ": num_new_tokens ",
               req.num_new_tokens, " must be >= 1");
  const int64_t computed = first ? prefix.num_tokens : it->second.num_tokens;
  const int64_t total = computed + req.num_new_tokens;
  LOOM_REQUIRE(total <= static_cast<int64_t>(req.tokens.size()), "allocate_slots: request ", req.id, " passes ",
               req.tokens.size(), " tokens, fewer than its ", computed, " computed plus ", req.num_new_tokens, " new");

  const int64_t B = block_size();
  const std::vector<BlockId>& table = first ? prefix.blocks : it->second.table;
  const int64_t new_blocks = ceil_div(total, B) - static_cast<int64_t>(table.size());
  LOOM_CHECK(new_blocks >= 0, "request ", req.id, " has ", table.size(), " blocks for ", total, " tokens");
  const bool cow = computed % B != 0 && pool_.ref_cnt(table[computed / B]) > 1;
  // Prefix blocks with ref_cnt 0 sit in the free queue: touching takes them out.
  auto is_free = [&](BlockId id) { return pool_.ref_cnt(id) == 0; };
  const int64_t revived = first ? std::ranges::count_if(prefix.blocks, is_free) : 0;
  if (new_blocks + (cow ? 1 : 0) + revived > pool_.num_free()) return false;

  // Committed from here on: touch before allocate, so the prefix is never
  // evicted by its own request.
  RequestBlocks& r = first ? start_request(req, prefix) : it->second;
  if (cow) copy_on_write(r, static_cast<size_t>(computed / B));
  const std::optional<std::vector<BlockId>> fresh = pool_.allocate(new_blocks);
  LOOM_CHECK(fresh, "allocate_slots: ", new_blocks, " blocks not free after the check said they were");
  r.table.insert(r.table.end(), fresh->begin(), fresh->end());
  r.num_tokens = total;
  cache_full_blocks(r, req.tokens);
  return true;
}

void KvCacheManager::fork(RequestId parent, RequestId child) {
  LOOM_REQUIRE(!requests_.contains(child), "fork: child request ", child, " already has KV blocks");
  RequestBlocks copy = find(parent, "fork");
  pool_.touch(copy.table);
  requests_.emplace(child, std::move(copy));
}

void KvCacheManager::free(RequestId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::vector<BlockId> tail_first(it->second.table.rbegin(), it->second.table.rend());
  pool_.release(tail_first);
  requests_.erase(it);
}

std::vector<BlockCopy> KvCacheManager::take_pending_copies() { return std::exchange(pending_copies_, {}); }

std::vector<int64_t> KvCacheManager::slot_mapping(RequestId id, int64_t first, int64_t count) const {
  const RequestBlocks& r = find(id, "slot_mapping");
  LOOM_REQUIRE(first >= 0 && count >= 0 && first + count <= r.num_tokens, "slot_mapping: request ", id,
               ": positions [", first, ", ", first + count, ") not within its ", r.num_tokens, " tokens");
  const int64_t B = block_size();
  std::vector<int64_t> slots(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = first + i;
    slots[i] = static_cast<int64_t>(r.table[p / B]) * B + p % B;
  }
  return slots;
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const { return find(id, "block_table").table; }

int64_t KvCacheManager::num_tokens(RequestId id) const { return find(id, "num_tokens").num_tokens; }

KvCacheStats KvCacheManager::stats() const {
  const int64_t usable = pool_.num_blocks() - 1;
  return {.num_blocks = usable,
          .block_size = pool_.block_size(),
          .token_capacity = usable * pool_.block_size(),
          .used_blocks = pool_.num_used(),
          .free_blocks = pool_.num_free(),
          .cached_blocks = pool_.num_cached(),
          .prefix_queried_tokens = prefix_queried_tokens_,
          .prefix_hit_tokens = prefix_hit_tokens_};
}

}  // namespace loom::infer
