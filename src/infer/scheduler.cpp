#include "infer/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

void SchedulerConfig::validate() const {
  LOOM_REQUIRE(max_num_batched_tokens >= 1, "max_num_batched_tokens ", max_num_batched_tokens,
               " is not allowed: it must be at least 1");
  LOOM_REQUIRE(max_num_seqs >= 1, "max_num_seqs ", max_num_seqs, " is not allowed: it must be at least 1");
  LOOM_REQUIRE(max_model_len >= 2, "max_model_len ", max_model_len,
               " is not allowed: it must be at least 2 (a prompt token and a new one)");
  LOOM_REQUIRE(long_prefill_token_threshold >= 0, "long_prefill_token_threshold ", long_prefill_token_threshold,
               " is not allowed: it must be 0 (no cap) or more");
  LOOM_REQUIRE(chunked_prefill || max_num_batched_tokens >= max_model_len, "without chunked prefill, ",
               "max_num_batched_tokens (", max_num_batched_tokens, ") must be at least max_model_len (",
               max_model_len, "): a longer prompt could never be scheduled");
}

Scheduler::Scheduler(const SchedulerConfig& cfg, KvCacheManager& kv) : cfg_(cfg), kv_(kv) {
  cfg_.validate();
  const int64_t capacity = kv.stats().token_capacity;
  LOOM_REQUIRE(capacity >= cfg_.max_model_len, "the KV cache holds ", capacity, " tokens (",
               kv.stats().num_blocks, " blocks of ", kv.block_size(), "), fewer than one sequence of max_model_len ",
               cfg_.max_model_len, ": give it more memory or lower max_model_len");
}

void Scheduler::add_request(RequestId id, std::vector<int32_t> prompt, const StopParams& stop,
                            std::vector<uint64_t> extra_keys, bool reuse_prefix) {
  LOOM_REQUIRE(!requests_.contains(id) && !kv_.has_request(id), "request id ", id, " is already in use");
  try {
    check_prompt(prompt, 0, cfg_.max_model_len);
  } catch (const Error& e) {
    fail("request ", id, ": ", e.what());
  }
  const auto n = static_cast<int64_t>(prompt.size());
  stop.validate();
  Request r;
  r.id = id;
  r.tokens = std::move(prompt);
  r.num_prompt_tokens = n;
  r.stop = stop;
  r.extra_keys = std::move(extra_keys);
  r.reuse_prefix = reuse_prefix;
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = cfg_.max_num_batched_tokens;
  const bool preempted = schedule_running(out, budget);
  if (!preempted) schedule_waiting(out, budget);
  out.copies = kv_.take_pending_copies();
  for (const ScheduledRequest& s : out.scheduled) out.num_tokens += s.num_tokens;
  return out;
}

int64_t Scheduler::cap_prefill(int64_t num_new, int64_t budget) const {
  if (cfg_.long_prefill_token_threshold > 0) num_new = std::min(num_new, cfg_.long_prefill_token_threshold);
  return std::min(num_new, budget);
}

// Returns whether a request was preempted.
bool Scheduler::schedule_running(SchedulerOutput& out, int64_t& budget) {
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = get(running_[i]);
    const int64_t num_new = cap_prefill(r.num_tokens() - r.num_computed_tokens, budget);
    if (num_new <= 0) continue;  // awaits a token the engine has not passed yet (a fork's parent)
    bool fits = kv_.allocate_slots({r.id, r.tokens, num_new, r.extra_keys});
    while (!fits) {
      const RequestId victim = running_.back();  // the newest; not yet scheduled in this step
      preempt(victim);
      out.preempted.push_back(victim);
      preempted = true;
      if (victim == r.id) break;
      fits = kv_.allocate_slots({r.id, r.tokens, num_new, r.extra_keys});
    }
    if (!fits) break;
    out.scheduled.push_back({r.id, r.num_computed_tokens, num_new, r.num_computed_tokens + num_new == r.num_tokens()});
    r.num_computed_tokens += num_new;
    budget -= num_new;
  }
  return preempted;
}

void Scheduler::schedule_waiting(SchedulerOutput& out, int64_t& budget) {
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
    Request& r = get(waiting_.front());
    const ComputedPrefix prefix = r.reuse_prefix ? kv_.computed_prefix(r.tokens, r.extra_keys) : ComputedPrefix{};
    const int64_t remaining = r.num_tokens() - prefix.num_tokens;
    if (!cfg_.chunked_prefill && remaining > budget) break;  // strict first come, first served
    const int64_t num_new = cap_prefill(remaining, budget);
    if (!kv_.allocate_slots({r.id, r.tokens, num_new, r.extra_keys}, prefix)) break;
    waiting_.pop_front();
    running_.push_back(r.id);
    r.status = RequestStatus::running;
    r.num_computed_tokens = prefix.num_tokens + num_new;
    out.scheduled.push_back({r.id, prefix.num_tokens, num_new, r.num_computed_tokens == r.num_tokens()});
    budget -= num_new;
  }
}

void Scheduler::preempt(RequestId id) {
  Request& r = get(id);
  kv_.free(id);
  running_.erase(std::find(running_.begin(), running_.end(), id));
  r.status = RequestStatus::waiting;
  r.num_computed_tokens = 0;
  ++r.num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(id);
}

std::vector<TokenUpdate> Scheduler::update(std::span<const SampledToken> sampled) {
  std::vector<TokenUpdate> updates;
  for (const SampledToken& s : sampled) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;  // aborted since the step was scheduled
    Request& r = it->second;
    LOOM_CHECK(r.status == RequestStatus::running && r.awaits_token(), "Scheduler::update: request ", s.id,
               " awaits no token (", r.num_computed_tokens, " of ", r.num_tokens(), " computed)");
    r.tokens.push_back(s.token);
    const FinishReason reason = check_stop(r, cfg_.max_model_len);
    updates.push_back({s.id, s.token, reason});
    if (reason != FinishReason::none) remove(s.id);
  }
  return updates;
}

int64_t Scheduler::fork(RequestId parent, const std::vector<RequestId>& children) {
  const Request& p = request(parent);
  LOOM_REQUIRE(p.status == RequestStatus::running && p.awaits_token(), "fork: request ", parent,
               " is not running with its tokens computed");
  Request c = p;  // p may move: requests_ grows below
  c.num_preemptions = 0;
  int64_t num_running = 0;
  std::vector<RequestId> queued;
  for (RequestId child : children) {
    LOOM_REQUIRE(!requests_.contains(child) && !kv_.has_request(child), "fork: request id ", child,
                 " is already in use");
    c.id = child;
    if (queued.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
      kv_.fork(parent, child);
      running_.push_back(child);
      ++num_running;
      requests_.emplace(child, c);
      continue;
    }
    queued.push_back(child);
    Request& w = requests_.emplace(child, c).first->second;
    w.status = RequestStatus::waiting;
    w.num_computed_tokens = 0;
  }
  waiting_.insert(waiting_.begin(), queued.begin(), queued.end());  // they came with their parent: first served
  return num_running;
}

bool Scheduler::finish(RequestId id, FinishReason reason) {
  LOOM_CHECK(reason != FinishReason::none, "Scheduler::finish without a reason");
  if (!requests_.contains(id)) return false;
  remove(id);
  return true;
}

void Scheduler::remove(RequestId id) {
  kv_.free(id);
  if (auto it = std::find(running_.begin(), running_.end(), id); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), id); it != waiting_.end()) waiting_.erase(it);
  requests_.erase(id);
}

const Request& Scheduler::request(RequestId id) const {
  auto it = requests_.find(id);
  LOOM_REQUIRE(it != requests_.end(), "request ", id, " is not in the scheduler");
  return it->second;
}

Request& Scheduler::get(RequestId id) {
  auto it = requests_.find(id);
  LOOM_CHECK(it != requests_.end(), "scheduler: request ", id, " missing");
  return it->second;
}

SchedulerStats Scheduler::stats() const {
  return {static_cast<int64_t>(waiting_.size()), static_cast<int64_t>(running_.size()), num_preemptions_};
}

}  // namespace loom::infer
