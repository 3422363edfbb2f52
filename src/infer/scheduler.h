// Scheduler: continuous batching as pure bookkeeping (DESIGN.md §8; learned
// from vLLM v1's scheduler). There is no prefill phase: each step gives every
// scheduled request a number of tokens to compute, under a token budget
// (max_num_batched_tokens) and a limit on running requests (max_num_seqs).
//
// One step, schedule():
//  1. Running requests, oldest first: a decode is one token, a prompt still
//     being prefilled gets the rest of it (or what the budget leaves: chunked
//     prefill). When the KV cache has no blocks for one, the newest running
//     request is preempted by recompute (its blocks freed, its computed
//     count reset, put at the front of the waiting queue), until it fits or it
//     was itself the newest.
//  2. Only in a step that preempted nothing: waiting requests, first come
//     first served, each starting from its cached prefix; the last one
//     admitted may get a chunk of its prompt. Without chunked prefill a
//     prompt that does not fit the budget whole waits (strict FCFS: nothing
//     behind it is admitted either).
// The runner computes the scheduled tokens; every request whose tokens are
// then all computed has logits for its last token; the engine samples and
// passes the tokens to update(), which appends them and applies the stop
// rules (request.h). Stop strings are matched by the engine on text, which
// then calls finish().
//
// A request can always run alone: the constructor requires the KV cache to
// hold max_model_len tokens, and add_request() a prompt shorter than
// max_model_len; so preemption never livelocks.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "infer/kv_cache_manager.h"
#include "infer/request.h"

namespace loom::infer {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // tokens computed per step, all requests together
  int64_t max_num_seqs = 256;             // running requests at most
  int64_t max_model_len = 0;              // tokens per sequence (prompt + output) at most; required
  bool chunked_prefill = true;
  int64_t long_prefill_token_threshold = 0;  // > 0: at most this many prompt tokens per request per step
  void validate() const;                     // loom::Error naming the field
};

// A request's share of a step: positions [first_position, first_position +
// num_tokens) of its tokens. samples: after this step all its known tokens
// are computed, so the runner returns logits for the last one.
struct ScheduledRequest {
  RequestId id = 0;
  int64_t first_position = 0;
  int64_t num_tokens = 0;
  bool samples = false;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;  // the running requests first, then those admitted
  std::vector<RequestId> preempted;         // this step, newest first
  std::vector<BlockCopy> copies;            // copy-on-write: to do before the step's forward
  int64_t num_tokens = 0;                   // sum of scheduled num_tokens
};

struct SampledToken {
  RequestId id = 0;
  int32_t token = 0;
};

// What update() did to a request.
struct TokenUpdate {
  RequestId id = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::none;
};

struct SchedulerStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t num_preemptions = 0;  // since the start
};

class Scheduler {
 public:
  // loom::Error when the config is invalid or the KV cache cannot hold one
  // sequence of max_model_len tokens.
  Scheduler(const SchedulerConfig& cfg, KvCacheManager& kv);

  // A new request at the back of the waiting queue. loom::Error (nothing
  // added) for an id in use, an empty prompt, a prompt of max_model_len
  // tokens or more, or invalid stop params.
  // reuse_prefix false: the request computes every token, cached or not
  // (an embedding that averages every token's hidden state).
  void add_request(RequestId id, std::vector<int32_t> prompt, const StopParams& stop,
                   std::vector<uint64_t> extra_keys = {}, bool reuse_prefix = true);

  SchedulerOutput schedule();

  // The sampled tokens of requests that await one (awaits_token()): each is
  // appended and the stop rules applied; a finished request's blocks are
  // freed and it is forgotten. Tokens for requests no longer here (aborted
  // since the step was scheduled) are ignored; a token for a request that
  // awaits none is an InternalError.
  std::vector<TokenUpdate> update(std::span<const SampledToken> sampled);

  // n > 1: after parent's prompt is computed and before its first token is
  // passed to update(), each child becomes a request with the same tokens,
  // to be sampled on its own. In order, while max_num_seqs allows, a child
  // runs at once sharing every KV block (copy-on-write); the rest wait at the
  // front of the queue, in order, as if preempted at once (no blocks: when
  // admitted they take the prompt's cached blocks and compute the rest, at
  // least its last token). Returns how many run (the first ones).
  int64_t fork(RequestId parent, const std::vector<RequestId>& children);

  // Ends a request now (abort: the client left; stop: the engine matched a
  // stop string) and frees its blocks. Between steps only. False when id is
  // not here (finished or never added).
  bool finish(RequestId id, FinishReason reason);

  bool has_request(RequestId id) const { return requests_.contains(id); }
  const Request& request(RequestId id) const;
  bool has_unfinished() const { return !requests_.empty(); }
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return cfg_; }
  const KvCacheManager& kv() const { return kv_; }

 private:
  Request& get(RequestId id);
  bool schedule_running(SchedulerOutput& out, int64_t& budget);
  void schedule_waiting(SchedulerOutput& out, int64_t& budget);
  int64_t cap_prefill(int64_t num_new, int64_t budget) const;
  void preempt(RequestId id);
  void remove(RequestId id);

  SchedulerConfig cfg_;
  KvCacheManager& kv_;
  std::unordered_map<RequestId, Request> requests_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  // oldest admitted first
  int64_t num_preemptions_ = 0;
};

}  // namespace loom::infer
