// KvCacheManager: block tables, prefix caching, copy-on-write and slot
// mapping, by exact block ids; then thousands of seeded random operations
// against the invariants and a simulated K/V store.
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/error.h"
#include "infer/kv_cache_manager.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;
using Ids = std::vector<BlockId>;
using Tokens = std::vector<int32_t>;

Tokens count_up(int64_t n, int32_t from = 0) {
  Tokens v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + static_cast<int32_t>(i);
  return v;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KvCacheConfig config(int64_t num_blocks, int64_t block_size, uint8_t seed_byte = 0) {
  const uint8_t fingerprint[] = {seed_byte};
  return {.num_blocks = num_blocks, .block_size = block_size, .seed = sha256_128(fingerprint)};
}

// A new request: its cached prefix, then the rest of tokens in one step.
bool admit(KvCacheManager& m, RequestId id, const Tokens& tokens) {
  const ComputedPrefix prefix = m.computed_prefix(tokens);
  const int64_t rest = static_cast<int64_t>(tokens.size()) - prefix.num_tokens;
  return m.allocate_slots({.id = id, .tokens = tokens, .num_new_tokens = rest}, prefix);
}

// A running request computes its tokens past num_tokens(id).
bool advance(KvCacheManager& m, RequestId id, const Tokens& tokens) {
  const int64_t rest = static_cast<int64_t>(tokens.size()) - m.num_tokens(id);
  return m.allocate_slots({.id = id, .tokens = tokens, .num_new_tokens = rest});
}

Ids table(const KvCacheManager& m, RequestId id) { return {m.block_table(id).begin(), m.block_table(id).end()}; }

std::vector<int32_t> ref_cnts(const KvCacheManager& m) {
  std::vector<int32_t> counts;
  for (BlockId id = 0; id < m.pool().num_blocks(); ++id) counts.push_back(m.pool().ref_cnt(id));
  return counts;
}

TEST(KvCache, TablesGrowInFreeQueueOrder) {
  KvCacheManager m(config(9, 4));
  const Tokens a = count_up(10), b = count_up(5, 100);
  ASSERT_TRUE(admit(m, 1, a));
  ASSERT_TRUE(admit(m, 2, b));
  EXPECT_EQ(table(m, 1), (Ids{1, 2, 3}));
  EXPECT_EQ(table(m, 2), (Ids{4, 5}));
  ASSERT_TRUE(advance(m, 1, concat(a, {7, 8})));  // 12 tokens: still 3 blocks
  EXPECT_EQ(table(m, 1), (Ids{1, 2, 3}));
  ASSERT_TRUE(advance(m, 1, concat(a, {7, 8, 9})));  // 13
  EXPECT_EQ(table(m, 1), (Ids{1, 2, 3, 6}));
  EXPECT_EQ(m.num_tokens(1), 13);
  EXPECT_EQ(m.pool().free_queue(), (Ids{7, 8}));
  m.pool().check_invariants();
}

TEST(KvCache, FinishedRequestIsFreedTailFirst) {
  KvCacheManager m(config(9, 4));
  ASSERT_TRUE(admit(m, 1, count_up(13)));  // 1 2 3 4
  ASSERT_TRUE(admit(m, 2, count_up(5, 100)));  // 5 6
  m.free(1);
  EXPECT_EQ(m.pool().free_queue(), (Ids{7, 8, 4, 3, 2, 1}));
  m.free(2);
  EXPECT_EQ(m.pool().free_queue(), (Ids{7, 8, 4, 3, 2, 1, 6, 5}));
  EXPECT_FALSE(m.has_request(1));
  m.pool().check_invariants();
}

TEST(KvCache, SharedPrefixBlocksHaveRefCountTwo) {
  KvCacheManager m(config(9, 4));
  const Tokens shared = count_up(8);
  ASSERT_TRUE(admit(m, 1, concat(shared, {50, 51})));  // 1 2 | 3
  const ComputedPrefix prefix = m.computed_prefix(concat(shared, {60, 61, 62}));
  EXPECT_EQ(prefix.blocks, (Ids{1, 2}));
  EXPECT_EQ(prefix.num_tokens, 8);
  ASSERT_TRUE(admit(m, 2, concat(shared, {60, 61, 62})));
  EXPECT_EQ(table(m, 2), (Ids{1, 2, 4}));
  EXPECT_EQ(m.pool().ref_cnt(1), 2);
  EXPECT_EQ(m.pool().ref_cnt(2), 2);
  EXPECT_EQ(m.pool().ref_cnt(3), 1);
  EXPECT_EQ(m.pool().ref_cnt(4), 1);
  EXPECT_EQ(m.stats().prefix_hit_tokens, 8);
  EXPECT_EQ(m.stats().prefix_queried_tokens, 10 + 11);
  m.pool().check_invariants();
}

TEST(KvCache, OnlyFullBlocksAreHashedAndThePartialOneIsNot) {
  const KvCacheConfig cfg = config(9, 4);
  KvCacheManager m(cfg);
  const Tokens tokens = count_up(12);
  const std::vector<BlockHash> expected = block_hashes(cfg.seed, tokens, 4, {});
  const Tokens prompt(tokens.begin(), tokens.begin() + 10);
  ASSERT_TRUE(admit(m, 1, prompt));  // 1 2 full, 3 holds 2 of 4
  EXPECT_EQ(m.pool().hash(1), expected[0]);
  EXPECT_EQ(m.pool().hash(2), expected[1]);
  EXPECT_EQ(m.pool().hash(3), std::nullopt);
  ASSERT_TRUE(advance(m, 1, Tokens(tokens.begin(), tokens.begin() + 11)));
  EXPECT_EQ(m.pool().hash(3), std::nullopt);
  ASSERT_TRUE(advance(m, 1, tokens));  // block 3 is full now
  EXPECT_EQ(m.pool().hash(3), expected[2]);
  EXPECT_EQ(m.pool().lookup(expected[2]), 3);
  m.pool().check_invariants();
}

TEST(KvCache, HashIsClearedWhenAFreedCachedBlockIsReused) {
  KvCacheManager m(config(4, 4));  // 3 blocks
  const Tokens a = count_up(9);
  ASSERT_TRUE(admit(m, 1, a));  // 1 2 cached, 3 partial
  const std::optional<BlockHash> h1 = m.pool().hash(1);
  ASSERT_TRUE(h1);
  m.free(1);  // queue: 3 2 1
  EXPECT_EQ(m.pool().lookup(*h1), 1);
  ASSERT_TRUE(admit(m, 2, count_up(12, 500)));  // takes 3 2 1
  EXPECT_EQ(table(m, 2), (Ids{3, 2, 1}));
  EXPECT_EQ(m.pool().lookup(*h1), std::nullopt);
  EXPECT_NE(m.pool().hash(1), h1);  // block 1 now holds request 2's third block
  EXPECT_EQ(m.computed_prefix(a).blocks, Ids{});
  m.pool().check_invariants();
}

// The prefix blocks sit at the front of the free queue, exactly where new
// blocks are popped: they are touched first, so they are not evicted.
TEST(KvCache, ComputedPrefixBlocksAreNeverEvictedByTheirOwnRequest) {
  KvCacheManager m(config(5, 4));  // 4 blocks
  const Tokens shared = count_up(8);
  ASSERT_TRUE(admit(m, 1, shared));  // 1 2
  ASSERT_TRUE(admit(m, 2, count_up(8, 100)));  // 3 4
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.pool().free_queue(), (Ids{2, 1, 4, 3}));
  const Tokens b = concat(shared, count_up(7, 200));  // 15 tokens: 4 blocks, 2 cached
  const ComputedPrefix prefix = m.computed_prefix(b);
  ASSERT_EQ(prefix.blocks, (Ids{1, 2}));
  ASSERT_TRUE(m.allocate_slots({.id = 3, .tokens = b, .num_new_tokens = 7}, prefix));
  EXPECT_EQ(table(m, 3), (Ids{1, 2, 4, 3}));
  EXPECT_EQ(m.pool().num_free(), 0);
  m.pool().check_invariants();
}

TEST(KvCache, FailedAllocationChangesNoRefCountTableOrQueue) {
  KvCacheManager m(config(6, 4));  // 5 blocks
  const Tokens shared = count_up(8);
  ASSERT_TRUE(admit(m, 1, shared));  // 1 2
  m.free(1);  // 1 2 stay cached in the queue: 3 4 5 2 1
  ASSERT_TRUE(admit(m, 2, count_up(6, 100)));  // 3 4
  const std::vector<int32_t> counts = ref_cnts(m);
  const Ids queue = m.pool().free_queue();

  // A prefix hit on 2 free blocks plus 3 new ones: 5 needed, 3 free.
  const Tokens long_prompt = concat(shared, count_up(10, 300));
  const ComputedPrefix prefix = m.computed_prefix(long_prompt);
  ASSERT_EQ(prefix.blocks, (Ids{1, 2}));
  EXPECT_FALSE(m.allocate_slots({.id = 3, .tokens = long_prompt, .num_new_tokens = 10}, prefix));
  EXPECT_FALSE(m.has_request(3));
  // Growing request 2 from 2 blocks to 6 (4 needed, 3 free).
  EXPECT_FALSE(advance(m, 2, count_up(24, 100)));

  EXPECT_EQ(ref_cnts(m), counts);
  EXPECT_EQ(m.pool().free_queue(), queue);
  EXPECT_EQ(table(m, 2), (Ids{3, 4}));
  EXPECT_EQ(m.num_tokens(2), 6);
  EXPECT_EQ(m.stats().prefix_queried_tokens, 8 + 6);
  m.pool().check_invariants();
}

TEST(KvCache, PromptOfExactlyKCachedBlocksReusesKMinusOne) {
  KvCacheManager m(config(9, 4));
  const Tokens tokens = count_up(13);
  ASSERT_TRUE(admit(m, 1, tokens));  // 3 full blocks cached
  auto prefix_of = [&](int64_t n) { return m.computed_prefix(Tokens(tokens.begin(), tokens.begin() + n)); };
  EXPECT_EQ(prefix_of(12).blocks, (Ids{1, 2}));  // 12 = 3 blocks: the last is recomputed
  EXPECT_EQ(prefix_of(12).num_tokens, 8);
  EXPECT_EQ(prefix_of(13).blocks, (Ids{1, 2, 3}));
  EXPECT_EQ(prefix_of(13).num_tokens, 12);
  EXPECT_EQ(prefix_of(4).blocks, Ids{});
  EXPECT_EQ(prefix_of(5).blocks, (Ids{1}));
  EXPECT_EQ(prefix_of(1).num_tokens, 0);
}

TEST(KvCache, DifferentSeedsNeverShareBlocks) {
  const KvCacheConfig cfg_a = config(9, 4, 1), cfg_b = config(9, 4, 2);
  KvCacheManager m(cfg_a);
  const Tokens tokens = count_up(17);
  ASSERT_TRUE(admit(m, 1, tokens));
  ASSERT_EQ(m.pool().num_cached(), 4);
  for (const BlockHash& h : block_hashes(cfg_b.seed, tokens, 4, {})) EXPECT_EQ(m.pool().lookup(h), std::nullopt);
  for (const BlockHash& h : block_hashes(cfg_a.seed, tokens, 4, {})) EXPECT_NE(m.pool().lookup(h), std::nullopt);
}

TEST(KvCache, ForkThenWriteIntoTheSharedPartialBlockCopiesIt) {
  KvCacheManager m(config(9, 4));
  const Tokens prompt = count_up(10);
  ASSERT_TRUE(admit(m, 1, prompt));  // 1 2 | 3 (2 of 4)
  m.fork(1, 2);
  EXPECT_EQ(table(m, 2), (Ids{1, 2, 3}));
  EXPECT_EQ(m.num_tokens(2), 10);
  for (BlockId id : {1, 2, 3}) EXPECT_EQ(m.pool().ref_cnt(id), 2);

  ASSERT_TRUE(advance(m, 2, concat(prompt, {77})));
  EXPECT_EQ(m.take_pending_copies(), (std::vector<BlockCopy>{{.src = 3, .dst = 4}}));
  EXPECT_EQ(m.take_pending_copies(), std::vector<BlockCopy>{});
  EXPECT_EQ(table(m, 2), (Ids{1, 2, 4}));
  EXPECT_EQ(m.pool().ref_cnt(3), 1);
  EXPECT_EQ(m.pool().ref_cnt(4), 1);
  EXPECT_EQ(m.pool().ref_cnt(1), 2);
  EXPECT_EQ(m.pool().ref_cnt(2), 2);

  ASSERT_TRUE(advance(m, 1, concat(prompt, {88})));  // block 3 is the parent's alone now
  EXPECT_EQ(m.take_pending_copies(), std::vector<BlockCopy>{});
  EXPECT_EQ(table(m, 1), (Ids{1, 2, 3}));
  m.pool().check_invariants();
}

TEST(KvCache, ForkAtABlockBoundaryNeedsNoCopy) {
  KvCacheManager m(config(9, 4));
  const Tokens prompt = count_up(8);
  ASSERT_TRUE(admit(m, 1, prompt));
  m.fork(1, 2);
  ASSERT_TRUE(advance(m, 2, concat(prompt, {5})));
  ASSERT_TRUE(advance(m, 1, concat(prompt, {6})));
  EXPECT_EQ(m.take_pending_copies(), std::vector<BlockCopy>{});
  EXPECT_EQ(table(m, 2), (Ids{1, 2, 3}));
  EXPECT_EQ(table(m, 1), (Ids{1, 2, 4}));
  EXPECT_EQ(m.pool().ref_cnt(1), 2);
  EXPECT_EQ(m.pool().ref_cnt(2), 2);
}

TEST(KvCache, FailedCopyOnWriteChangesNothing) {
  KvCacheManager m(config(4, 4));  // 3 blocks
  const Tokens prompt = count_up(6);
  ASSERT_TRUE(admit(m, 1, prompt));  // 1 | 2
  ASSERT_TRUE(admit(m, 3, count_up(1, 500)));  // 3: the pool is full
  m.fork(1, 2);
  const std::vector<int32_t> counts = ref_cnts(m);
  EXPECT_FALSE(advance(m, 2, concat(prompt, {9})));
  EXPECT_EQ(ref_cnts(m), counts);
  EXPECT_EQ(table(m, 2), (Ids{1, 2}));
  EXPECT_EQ(m.take_pending_copies(), std::vector<BlockCopy>{});
}

// Request 2's blocks are 3 4 5 2, not contiguous: slots jump at each boundary.
TEST(KvCache, SlotMappingCrossesBlockBoundaries) {
  for (int64_t B : {1, 16, 32}) {
    KvCacheManager m(config(6, B));  // 5 blocks
    ASSERT_TRUE(admit(m, 1, count_up(B + 1)));  // 1 2
    const Tokens tokens = count_up(3 * B + 1, 1000);
    ASSERT_TRUE(m.allocate_slots({.id = 2, .tokens = tokens, .num_new_tokens = 2 * B}));  // 3 4
    m.free(1);  // queue: 5 2 1
    ASSERT_TRUE(advance(m, 2, tokens));
    ASSERT_EQ(table(m, 2), (Ids{3, 4, 5, 2}));
    const Ids physical = {3, 4, 5, 2};
    const int64_t first = B - 1, count = 2 * B + 2;  // positions B-1 .. 3B
    std::vector<int64_t> expected;
    for (int64_t p = first; p < first + count; ++p) expected.push_back(physical[p / B] * B + p % B);
    EXPECT_EQ(m.slot_mapping(2, first, count), expected) << "block_size " << B;
    EXPECT_EQ(m.slot_mapping(2, 0, 1), std::vector<int64_t>{3 * B});
    EXPECT_EQ(m.slot_mapping(2, 3 * B, 1), std::vector<int64_t>{2 * B});
  }
}

TEST(KvCache, DisabledPrefixCachingNeverHashesOrHits) {
  KvCacheConfig cfg = config(9, 4);
  cfg.enable_prefix_caching = false;
  KvCacheManager m(cfg);
  const Tokens tokens = count_up(13);
  ASSERT_TRUE(admit(m, 1, tokens));
  EXPECT_EQ(m.pool().num_cached(), 0);
  EXPECT_EQ(m.computed_prefix(tokens).blocks, Ids{});
  ASSERT_TRUE(admit(m, 2, tokens));
  EXPECT_EQ(table(m, 2), (Ids{5, 6, 7, 8}));
}

TEST(KvCache, StatsCountBlocksTokensAndHits) {
  KvCacheManager m(config(9, 4));
  const Tokens tokens = count_up(13);
  ASSERT_TRUE(admit(m, 1, tokens));
  ASSERT_TRUE(admit(m, 2, tokens));
  const KvCacheStats s = m.stats();
  EXPECT_EQ(s.num_blocks, 8);
  EXPECT_EQ(s.token_capacity, 32);
  EXPECT_EQ(s.used_blocks, 5);  // 1 2 3 shared, 4 and 5 each's last
  EXPECT_EQ(s.free_blocks, 3);
  EXPECT_EQ(s.cached_blocks, 3);
  EXPECT_EQ(s.prefix_queried_tokens, 26);
  EXPECT_EQ(s.prefix_hit_tokens, 12);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate(), 12.0 / 26.0);
}

TEST(KvCache, MisuseIsAClearError) {
  KvCacheManager m(config(9, 4));
  const Tokens tokens = count_up(6);
  ASSERT_TRUE(admit(m, 1, tokens));
  expect_error([&] { (void)m.slot_mapping(1, 4, 3); }, {"slot_mapping", "request 1", "[4, 7)", "6 tokens"});
  expect_error([&] { (void)m.block_table(9); }, {"block_table", "request 9", "no KV blocks"});
  expect_error([&] { m.allocate_slots({.id = 1, .tokens = tokens, .num_new_tokens = 1}); },
               {"request 1", "6 tokens", "6 computed plus 1 new"});
  expect_error([&] { m.allocate_slots({.id = 1, .tokens = tokens, .num_new_tokens = 0}); },
               {"num_new_tokens 0", ">= 1"});
  expect_error([&] { m.fork(1, 1); }, {"fork", "child request 1", "already"});
  const Tokens more = count_up(9);
  ASSERT_TRUE(advance(m, 1, more));
  const ComputedPrefix prefix = m.computed_prefix(more);
  expect_error([&] { m.allocate_slots({.id = 1, .tokens = more, .num_new_tokens = 1}, prefix); },
               {"request 1", "first call only"});
  m.free(1);
  m.free(1);  // freeing a request without blocks is a no-op
  EXPECT_EQ(m.pool().num_free(), 8);
}

TEST(KvCache, StalePrefixIsAClearError) {
  KvCacheManager m(config(3, 4));  // 2 blocks
  const Tokens tokens = count_up(5);
  ASSERT_TRUE(admit(m, 1, tokens));
  m.free(1);
  const ComputedPrefix prefix = m.computed_prefix(tokens);
  ASSERT_EQ(prefix.blocks, (Ids{1}));
  ASSERT_TRUE(admit(m, 2, count_up(8, 100)));  // evicts block 1
  m.free(2);
  expect_error([&] { m.allocate_slots({.id = 3, .tokens = tokens, .num_new_tokens = 1}, prefix); },
               {"request 3", "prefix block 1", "evicted"});
}

// ---- randomized: the manager against a simulated runner ----

// Everything an allocation may change, to compare around a failed one.
struct Snapshot {
  std::vector<int32_t> ref_cnts = {};
  Ids free_queue = {};
  std::vector<std::optional<BlockHash>> hashes = {};
  std::map<RequestId, Ids> tables = {};
  std::map<RequestId, int64_t> num_tokens = {};
  bool operator==(const Snapshot&) const = default;
};

// Requests arrive (with shared prefixes, or back from preemption), compute in
// random chunks, decode, fork, finish or abort. The runner is simulated by a
// store of one token id per slot: a step does the pending copies, then writes
// its tokens where slot_mapping() says. After each operation every live request
// reads back exactly its tokens, the pool's invariants hold and each block's
// ref_cnt is the number of tables holding it.
class RandomScenario {
 public:
  RandomScenario(int64_t block_size, uint32_t seed)
      : m_(config(160 / block_size + 1, block_size)), kv_(m_.pool().num_blocks() * block_size, -1), rng_(seed) {
    for (Tokens& base : bases_) base = random_tokens(48, 1000);
  }

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      const int dice = pick(0, 99);
      if (live_.empty() || (dice < 25 && live_.size() < 12)) {
        add();
      } else {
        auto it = live_.begin();
        std::advance(it, pick(0, static_cast<int>(live_.size()) - 1));
        if (dice < 70) step(it->first);
        else if (dice < 80) fork(it->first);
        else finish(it->first);
      }
      check();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  void finish_all() {
    while (!live_.empty()) finish(live_.begin()->first);
  }
  const KvCacheManager& manager() const { return m_; }
  int64_t failures = 0, copies = 0;

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Tokens random_tokens(int n, int vocab) {
    Tokens t(n);
    for (int32_t& x : t) x = pick(0, vocab - 1);
    return t;
  }

  // A new prompt (a cut of a shared base plus a suffix from 4 token ids, so
  // equal blocks also arise by chance), or a preempted request's tokens.
  void add() {
    Tokens tokens;
    if (!waiting_.empty() && pick(0, 1) == 0) {
      tokens = std::move(waiting_.back());
      waiting_.pop_back();
    } else {
      const Tokens& base = bases_[pick(0, 2)];
      tokens.assign(base.begin(), base.begin() + pick(0, 40));
      tokens = concat(tokens, random_tokens(pick(tokens.empty() ? 1 : 0, 20), 4));
    }
    const RequestId id = next_id_++;
    const ComputedPrefix prefix = m_.computed_prefix(tokens);
    const int64_t chunk = pick(1, static_cast<int>(tokens.size() - prefix.num_tokens));
    live_[id] = tokens;
    if (!allocate(id, chunk, prefix)) live_.erase(id);
  }

  // A prefill chunk, or one decoded token; out of blocks: preempted.
  void step(RequestId id) {
    Tokens& tokens = live_[id];
    const int64_t computed = m_.num_tokens(id);
    int64_t n = 1;
    if (computed < static_cast<int64_t>(tokens.size())) n = pick(1, static_cast<int>(tokens.size() - computed));
    else tokens.push_back(pick(0, 3));
    if (allocate(id, n, {})) return;
    waiting_.push_back(tokens);
    finish(id);
  }

  void fork(RequestId parent) {
    const RequestId child = next_id_++;
    m_.fork(parent, child);
    live_[child] = live_[parent];
  }

  void finish(RequestId id) { m_.free(id), live_.erase(id); }

  Snapshot snapshot() const {
    Snapshot s{.ref_cnts = ref_cnts(m_), .free_queue = m_.pool().free_queue()};
    for (BlockId b = 0; b < m_.pool().num_blocks(); ++b) s.hashes.push_back(m_.pool().hash(b));
    for (const auto& [id, tokens] : live_) {
      if (!m_.has_request(id)) continue;
      s.tables[id] = table(m_, id);
      s.num_tokens[id] = m_.num_tokens(id);
    }
    return s;
  }

  bool allocate(RequestId id, int64_t n, const ComputedPrefix& prefix) {
    const Snapshot before = snapshot();
    const Tokens& tokens = live_[id];
    if (!m_.allocate_slots({.id = id, .tokens = tokens, .num_new_tokens = n}, prefix)) {
      ++failures;
      EXPECT_TRUE(snapshot() == before) << "a failed allocation changed the pool or a table";
      return false;
    }
    const int64_t B = m_.block_size();
    for (const BlockCopy& c : m_.take_pending_copies()) {
      std::copy_n(kv_.begin() + c.src * B, B, kv_.begin() + c.dst * B);
      ++copies;
    }
    const int64_t first = m_.num_tokens(id) - n;
    const std::vector<int64_t> slots = m_.slot_mapping(id, first, n);
    for (int64_t i = 0; i < n; ++i) kv_[slots[i]] = tokens[first + i];
    return true;
  }

  void check() {
    ASSERT_NO_THROW(m_.pool().check_invariants());
    std::vector<int32_t> holders(m_.pool().num_blocks(), 0);
    for (const auto& [id, tokens] : live_) {
      const Ids t = table(m_, id);
      for (BlockId b : t) ++holders[b];
      const int64_t n = m_.num_tokens(id);
      ASSERT_EQ(static_cast<int64_t>(t.size()), (n + m_.block_size() - 1) / m_.block_size());
      const std::vector<int64_t> slots = m_.slot_mapping(id, 0, n);
      for (int64_t p = 0; p < n; ++p)
        ASSERT_EQ(kv_[slots[p]], tokens[p]) << "request " << id << " position " << p;
    }
    ASSERT_EQ(holders, ref_cnts(m_));
  }

  KvCacheManager m_;
  std::vector<int32_t> kv_;  // the token whose K/V each slot holds; -1: never written
  std::mt19937 rng_;
  Tokens bases_[3];
  std::map<RequestId, Tokens> live_;
  std::vector<Tokens> waiting_;  // preempted: recomputed when re-admitted
  RequestId next_id_ = 1;
};

TEST(KvCache, RandomOperationsKeepEveryInvariantAndLeakNothing) {
  for (int64_t block_size : {1, 4, 16}) {
    SCOPED_TRACE(::testing::Message() << "block_size " << block_size);
    RandomScenario scenario(block_size, 17 + static_cast<uint32_t>(block_size));
    scenario.run(5000);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    scenario.finish_all();
    const KvCacheManager& m = scenario.manager();
    EXPECT_NO_THROW(m.pool().check_invariants());
    for (BlockId b = 0; b < m.pool().num_blocks(); ++b) EXPECT_EQ(m.pool().ref_cnt(b), 0);
    EXPECT_EQ(m.pool().num_free(), m.pool().num_blocks() - 1);
    // The scenario reached the paths it is for.
    EXPECT_GT(m.stats().prefix_hit_tokens, 0);
    EXPECT_TRUE(block_size == 1 || scenario.copies > 0);  // with 1 token a block, none is partial
    EXPECT_GT(scenario.failures, 0);
  }
}

}  // namespace
}  // namespace loom::infer
