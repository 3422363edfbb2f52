// Scheduler: what each step computes (decode first, chunked prefill, strict
// FCFS without it), preemption by recompute, stops, aborts and forks, by
// exact ids and counts; then thousands of seeded random steps against the
// invariants. After every scenario the KV cache must be empty again.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "infer/scheduler.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;
using Tokens = std::vector<int32_t>;

Tokens count_up(int64_t n, int32_t from) {
  Tokens v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + static_cast<int32_t>(i);
  return v;
}

struct Engine {
  KvCacheManager kv;
  Scheduler s;
  Engine(int64_t num_blocks, int64_t block_size, SchedulerConfig cfg, bool prefix_caching = true)
      : kv(KvCacheConfig{.num_blocks = num_blocks, .block_size = block_size, .enable_prefix_caching = prefix_caching}),
        s(cfg, kv) {}
  // One step; every request that samples gets token next_token.
  SchedulerOutput step(int32_t next_token = 1) {
    SchedulerOutput out = s.schedule();
    std::vector<SampledToken> sampled;
    for (const ScheduledRequest& r : out.scheduled)
      if (r.samples) sampled.push_back({r.id, next_token});
    s.update(sampled);
    return out;
  }
};

SchedulerConfig config(int64_t budget, int64_t max_model_len, bool chunked = true) {
  return {.max_num_batched_tokens = budget, .max_model_len = max_model_len, .chunked_prefill = chunked};
}

StopParams max_new(int64_t n) { return {.max_tokens = n}; }

// Nothing left: no request, every block free with no reference.
void expect_empty(const Engine& e) {
  EXPECT_FALSE(e.s.has_unfinished());
  e.kv.pool().check_invariants();
  EXPECT_EQ(e.kv.pool().num_used(), 0);
  EXPECT_EQ(e.kv.pool().num_free(), e.kv.pool().num_blocks() - 1);
  for (BlockId b = 1; b < e.kv.pool().num_blocks(); ++b) EXPECT_EQ(e.kv.pool().ref_cnt(b), 0);
}

void drain(Engine& e) {
  for (int i = 0; i < 10000 && e.s.has_unfinished(); ++i) e.step();
  expect_empty(e);
}

ScheduledRequest at(const SchedulerOutput& out, size_t i) {
  EXPECT_LT(i, out.scheduled.size());
  return i < out.scheduled.size() ? out.scheduled[i] : ScheduledRequest{};
}

void expect_scheduled(const ScheduledRequest& r, RequestId id, int64_t first, int64_t n, bool samples) {
  EXPECT_EQ(r.id, id);
  EXPECT_EQ(r.first_position, first) << "request " << id;
  EXPECT_EQ(r.num_tokens, n) << "request " << id;
  EXPECT_EQ(r.samples, samples) << "request " << id;
}

TEST(Scheduler, RunningDecodesComeBeforeWaitingPrompts) {
  Engine e(64, 16, config(100, 256));
  e.s.add_request(1, count_up(10, 0), max_new(5));
  expect_scheduled(at(e.step(), 0), 1, 0, 10, true);
  e.s.add_request(2, count_up(20, 100), max_new(5));
  const SchedulerOutput out = e.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 1, 10, 1, true);
  expect_scheduled(out.scheduled[1], 2, 0, 20, true);
  EXPECT_EQ(out.num_tokens, 21);
  drain(e);
}

TEST(Scheduler, ChunkedPrefillAdmitsTwoLongPromptsInOneStep) {
  Engine e(64, 16, config(64, 256));
  e.s.add_request(1, count_up(40, 0), max_new(3));
  e.s.add_request(2, count_up(40, 1000), max_new(3));
  SchedulerOutput out = e.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 1, 0, 40, true);
  expect_scheduled(out.scheduled[1], 2, 0, 24, false);
  out = e.step();  // the decode first, then the rest of the second prompt
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 1, 40, 1, true);
  expect_scheduled(out.scheduled[1], 2, 24, 16, true);
  drain(e);
}

TEST(Scheduler, WithoutChunkedPrefillAPromptOverTheBudgetWaitsAndSoDoesEveryoneBehindIt) {
  Engine e(64, 16, config(64, 64, false));
  e.s.add_request(1, count_up(40, 0), max_new(2));
  e.s.add_request(2, count_up(40, 1000), max_new(2));
  e.s.add_request(3, count_up(5, 2000), max_new(2));  // would fit, but is behind 2
  SchedulerOutput out = e.step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  expect_scheduled(out.scheduled[0], 1, 0, 40, true);
  out = e.step();
  ASSERT_EQ(out.scheduled.size(), 3u);
  expect_scheduled(out.scheduled[0], 1, 40, 1, true);
  expect_scheduled(out.scheduled[1], 2, 0, 40, true);
  expect_scheduled(out.scheduled[2], 3, 0, 5, true);
  drain(e);
}

TEST(Scheduler, LongPrefillThresholdCapsEachPromptsTokensPerStep) {
  SchedulerConfig cfg = config(100, 256);
  cfg.long_prefill_token_threshold = 16;
  Engine e(64, 16, cfg);
  e.s.add_request(1, count_up(40, 0), max_new(1));
  e.s.add_request(2, count_up(40, 1000), max_new(1));
  const SchedulerOutput out = e.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 1, 0, 16, false);
  expect_scheduled(out.scheduled[1], 2, 0, 16, false);
  drain(e);
}

TEST(Scheduler, MaxNumSeqsLimitsTheRunningRequests) {
  SchedulerConfig cfg = config(100, 256);
  cfg.max_num_seqs = 2;
  Engine e(64, 16, cfg);
  for (RequestId id = 1; id <= 3; ++id) e.s.add_request(id, count_up(4, 100 * id), max_new(3));
  EXPECT_EQ(e.step().scheduled.size(), 2u);
  EXPECT_EQ(e.s.stats().num_waiting, 1);
  drain(e);
}

// Block size 4, 7 usable blocks: 1 and 2 hold 2 blocks each, 3 holds 3.
// Their first tokens push 1 and 2 into a third block each: 1 preempts 3 (the
// newest), which frees 3 blocks; 1 and 2 take one each; 4 could use the
// last, but a step that preempted admits nobody; 3 resumes first, from
// position 0.
TEST(Scheduler, WhenBlocksRunOutTheNewestRunningRequestIsPreemptedAndResumesFirst) {
  Engine e(8, 4, config(100, 28), /*prefix_caching=*/false);
  e.s.add_request(1, count_up(8, 0), max_new(4));
  e.s.add_request(2, count_up(8, 100), max_new(4));
  e.s.add_request(3, count_up(9, 200), max_new(4));
  EXPECT_EQ(e.step().scheduled.size(), 3u);
  EXPECT_EQ(e.kv.pool().num_free(), 0);
  e.s.add_request(4, count_up(2, 300), max_new(4));
  SchedulerOutput out = e.step();
  EXPECT_EQ(out.preempted, std::vector<RequestId>{3});
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 1, 8, 1, true);
  expect_scheduled(out.scheduled[1], 2, 8, 1, true);
  EXPECT_EQ(e.kv.pool().num_free(), 1);
  EXPECT_EQ(e.s.request(3).num_computed_tokens, 0);
  EXPECT_EQ(e.s.request(3).num_preemptions, 1);
  EXPECT_EQ(e.s.request(3).num_output_tokens(), 1);  // kept: recomputed, not resampled
  EXPECT_TRUE(e.s.finish(1, FinishReason::abort));
  out = e.step();
  ASSERT_GE(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 2, 9, 1, true);
  expect_scheduled(out.scheduled[1], 3, 0, 10, true);  // prompt and its one token, recomputed
  drain(e);
}

TEST(Scheduler, ARequestThatCanNeverFitIsAClearErrorNotALivelock) {
  KvCacheManager kv(KvCacheConfig{.num_blocks = 5, .block_size = 4});  // 16 tokens
  expect_error([&] { Scheduler(config(64, 32), kv); },
               {"holds 16 tokens", "4 blocks of 4", "max_model_len 32"});
  Scheduler s(config(64, 16), kv);
  expect_error([&] { s.add_request(1, count_up(16, 0), max_new(1)); },
               {"request 1", "16 tokens", "(max_model_len) is 16 tokens"});
  expect_error([&] { s.add_request(1, {}, max_new(1)); }, {"request 1", "prompt is empty"});
  s.add_request(1, count_up(3, 0), max_new(1));
  expect_error([&] { s.add_request(1, count_up(3, 0), max_new(1)); }, {"request id 1 is already in use"});
  expect_error([&] { s.add_request(2, count_up(3, 0), max_new(0)); }, {"max_tokens 0"});
  EXPECT_FALSE(s.has_request(2));
}

TEST(Scheduler, BadConfigsAreClearErrors) {
  KvCacheManager kv(KvCacheConfig{.num_blocks = 64, .block_size = 16});
  expect_error([&] { Scheduler(config(0, 32), kv); }, {"max_num_batched_tokens 0"});
  expect_error([&] { Scheduler(config(16, 32, false), kv); },
               {"without chunked prefill", "max_num_batched_tokens (16)", "max_model_len (32)"});
  SchedulerConfig cfg = config(64, 32);
  cfg.max_num_seqs = 0;
  expect_error([&] { Scheduler(cfg, kv); }, {"max_num_seqs 0"});
}

TEST(Scheduler, EachStopRuleEndsItsRequestAndFreesItsBlocks) {
  Engine e(64, 4, config(100, 12));
  e.s.add_request(1, count_up(5, 0), {.max_tokens = 10, .eos_token_ids = {7}});
  e.s.add_request(2, count_up(5, 100), {.max_tokens = 10, .stop_token_ids = {7}});
  e.s.add_request(3, count_up(5, 200), {.max_tokens = 10, .min_tokens = 2, .eos_token_ids = {7}});
  e.s.add_request(4, count_up(5, 300), max_new(1));
  e.s.add_request(5, count_up(10, 400), max_new(10));  // 12 = max_model_len after 2 new tokens
  e.s.schedule();
  std::vector<TokenUpdate> u = e.s.update(std::vector<SampledToken>{{1, 7}, {2, 7}, {3, 7}, {4, 7}, {5, 8}});
  ASSERT_EQ(u.size(), 5u);
  EXPECT_EQ(u[0].finish, FinishReason::stop);
  EXPECT_EQ(u[1].finish, FinishReason::stop);
  EXPECT_EQ(u[2].finish, FinishReason::none);  // min_tokens 2
  EXPECT_EQ(u[3].finish, FinishReason::length);
  EXPECT_EQ(u[4].finish, FinishReason::none);
  EXPECT_FALSE(e.s.has_request(1));
  e.s.schedule();
  u = e.s.update(std::vector<SampledToken>{{3, 7}, {5, 8}});
  EXPECT_EQ(u[0].finish, FinishReason::stop);
  EXPECT_EQ(u[1].finish, FinishReason::length);
  expect_empty(e);
}

TEST(Scheduler, AbortMidPrefillAndMidDecodeFreesEverythingAtOnce) {
  Engine e(64, 4, config(8, 64));
  e.s.add_request(1, count_up(20, 0), max_new(5));
  e.step();  // 8 of 20 prompt tokens
  EXPECT_TRUE(e.s.finish(1, FinishReason::abort));
  expect_empty(e);
  e.s.add_request(2, count_up(6, 100), max_new(5));
  e.step();
  e.step();  // decoding
  const SchedulerOutput out = e.s.schedule();
  EXPECT_TRUE(e.s.finish(2, FinishReason::abort));  // a client gone while the step ran
  EXPECT_TRUE(e.s.update(std::vector<SampledToken>{{2, 1}}).empty());
  EXPECT_FALSE(e.s.finish(2, FinishReason::abort));
  EXPECT_EQ(out.scheduled.size(), 1u);
  expect_empty(e);
  e.s.add_request(3, count_up(6, 200), max_new(5));
  EXPECT_TRUE(e.s.finish(3, FinishReason::abort));  // still waiting
  expect_empty(e);
}

TEST(Scheduler, ForkedChildrenShareThePromptAndCopyOnlyThePartialBlock) {
  Engine e(64, 4, config(100, 64));
  e.s.add_request(1, count_up(10, 0), max_new(3));  // blocks: 4 + 4 + 2
  SchedulerOutput out = e.s.schedule();
  ASSERT_TRUE(out.scheduled[0].samples);
  EXPECT_EQ(e.s.fork(1, {2, 3}), 2);
  EXPECT_EQ(e.kv.pool().num_used(), 3);
  e.s.update(std::vector<SampledToken>{{1, 11}, {2, 12}, {3, 13}});
  out = e.s.schedule();
  ASSERT_EQ(out.scheduled.size(), 3u);
  for (size_t i = 0; i < 3; ++i) expect_scheduled(out.scheduled[i], static_cast<RequestId>(i + 1), 10, 1, true);
  EXPECT_EQ(out.copies.size(), 2u);  // the last writer keeps the original
  EXPECT_EQ(e.kv.pool().num_used(), 5);
  EXPECT_EQ(e.s.request(2).tokens.back(), 12);
  e.s.update(std::vector<SampledToken>{{1, 1}, {2, 1}, {3, 1}});
  drain(e);
}

TEST(Scheduler, ForkNeedsARunningParentWithItsTokensComputed) {
  Engine e(64, 4, config(4, 64));
  e.s.add_request(1, count_up(10, 0), max_new(3));
  expect_error([&] { e.s.fork(1, {2}); }, {"fork: request 1 is not running"});
  e.s.schedule();  // 4 of 10
  expect_error([&] { e.s.fork(1, {2}); }, {"fork: request 1 is not running"});
  drain(e);
}

// n > 1 under max_num_seqs: the children that do not fit wait at the front
// of the queue in order, with no blocks, and when admitted compute only what
// the prefix cache lacks (the prompt's last token at least).
TEST(Scheduler, ForkedChildrenBeyondMaxNumSeqsWaitAtTheFrontInOrder) {
  SchedulerConfig cfg = config(100, 64);
  cfg.max_num_seqs = 2;
  Engine e(64, 4, cfg);
  e.s.add_request(1, count_up(8, 0), max_new(2));  // two full blocks
  e.s.add_request(9, count_up(5, 100), max_new(2));
  e.s.schedule();  // 1 and 9 run
  e.s.update(std::vector<SampledToken>{{9, 1}});
  EXPECT_EQ(e.s.fork(1, {2, 3, 4}), 0);  // 1 and 9 run: every child waits
  EXPECT_EQ(e.kv.pool().num_used(), 2 + 2);
  EXPECT_EQ(e.s.stats().num_waiting, 3);
  EXPECT_EQ(e.s.request(3).status, RequestStatus::waiting);
  EXPECT_EQ(e.s.request(3).num_computed_tokens, 0);
  EXPECT_EQ(e.s.request(3).tokens, count_up(8, 0));
  e.s.add_request(5, count_up(3, 200), max_new(1));  // arrives later: served after the children
  e.s.update(std::vector<SampledToken>{{1, 1}});
  SchedulerOutput out = e.s.schedule();  // 1 and 9 decode; no room
  EXPECT_EQ(out.scheduled.size(), 2u);
  e.s.update(std::vector<SampledToken>{{1, 1}, {9, 1}});  // both end (max_tokens 2)
  out = e.s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  expect_scheduled(out.scheduled[0], 2, 4, 4, true);  // its first block from the cache, the rest computed
  expect_scheduled(out.scheduled[1], 3, 4, 4, true);
  e.s.update(std::vector<SampledToken>{{2, 1}, {3, 1}});
  drain(e);
}

// Seeded random arrivals (with shared prefixes), lengths, aborts, EOS and
// budgets over small pools, so that preemption happens; every step is
// checked against the rules, and at the end the cache is empty.
// Adds its preemptions to preemptions.
void random_run(uint64_t seed, int64_t& preemptions) {
  std::mt19937_64 rng(seed);
  const int64_t block_size = std::array<int64_t, 3>{1, 4, 16}[seed % 3];
  const int64_t max_model_len = 64;
  SchedulerConfig cfg = config(8 + static_cast<int64_t>(rng() % 120), max_model_len, seed % 2 == 0);
  cfg.max_num_batched_tokens = std::max(cfg.max_num_batched_tokens, cfg.chunked_prefill ? 1 : max_model_len);
  cfg.max_num_seqs = 1 + static_cast<int64_t>(rng() % 12);
  const int64_t num_blocks = 1 + (max_model_len + block_size - 1) / block_size + static_cast<int64_t>(rng() % 40);
  Engine e(num_blocks, block_size, cfg);
  const Tokens shared = count_up(40, 5);
  RequestId next_id = 1;
  std::map<RequestId, int64_t> max_tokens, prompt_len, produced;
  int64_t finished = 0;
  for (int step = 0; step < 2500; ++step) {
    if (step < 2000 && rng() % 3 == 0) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % (max_model_len - 1));
      Tokens prompt = rng() % 2 ? Tokens(shared.begin(), shared.begin() + std::min<int64_t>(n, 40)) : Tokens{};
      while (static_cast<int64_t>(prompt.size()) < n) prompt.push_back(100 + static_cast<int32_t>(rng() % 900));
      const StopParams stop{.max_tokens = 1 + static_cast<int64_t>(rng() % 30), .eos_token_ids = {0}};
      e.s.add_request(next_id, prompt, stop);
      prompt_len[next_id] = n;
      max_tokens[next_id++] = stop.max_tokens;
    }
    if (rng() % 10 == 0 && next_id > 1) e.s.finish(1 + static_cast<RequestId>(rng() % (next_id - 1)), FinishReason::abort);
    const SchedulerOutput out = e.s.schedule();
    ASSERT_LE(out.num_tokens, cfg.max_num_batched_tokens);
    ASSERT_LE(e.s.stats().num_running, cfg.max_num_seqs);
    std::set<RequestId> ids;
    std::vector<SampledToken> sampled;
    for (const ScheduledRequest& r : out.scheduled) {
      ASSERT_TRUE(ids.insert(r.id).second) << "request " << r.id << " scheduled twice";
      ASSERT_GE(r.num_tokens, 1);
      ASSERT_EQ(e.kv.num_tokens(r.id), r.first_position + r.num_tokens);
      ASSERT_EQ(r.samples, r.first_position + r.num_tokens == e.s.request(r.id).num_tokens());
      if (r.samples) sampled.push_back({r.id, static_cast<int32_t>(rng() % 40)});  // EOS (0) now and then
    }
    if (!out.preempted.empty()) preemptions += static_cast<int64_t>(out.preempted.size());
    for (const TokenUpdate& u : e.s.update(sampled)) {
      const int64_t out_tokens = ++produced[u.id];
      if (u.finish == FinishReason::length) {
        EXPECT_TRUE(out_tokens == max_tokens.at(u.id) || prompt_len.at(u.id) + out_tokens == max_model_len);
      } else if (u.finish == FinishReason::stop) {
        EXPECT_EQ(u.token, 0);
      } else {
        EXPECT_LT(out_tokens, max_tokens.at(u.id));
      }
      if (u.finish != FinishReason::none) ++finished;
    }
    e.kv.pool().check_invariants();
    if (step >= 2000 && !e.s.has_unfinished()) break;
  }
  drain(e);
  EXPECT_GT(finished, 100) << "seed " << seed;
}

TEST(Scheduler, RandomArrivalsAbortsAndBudgetsKeepEveryRuleAndLeakNothing) {
  int64_t preemptions = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SCOPED_TRACE(seed);
    random_run(seed, preemptions);
  }
  EXPECT_GT(preemptions, 0) << "the pools were meant to be small enough to preempt";
}

}  // namespace
}  // namespace loom::infer
