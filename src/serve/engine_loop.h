// EngineLoop: the one thread that owns an infer::Engine (DESIGN.md §8). The
// server's HTTP threads never run the model: they submit requests into a
// bounded queue and read each request's output from its own RequestStream;
// the loop adds what was submitted, steps the engine, turns sampled tokens
// into text (TextStream: whole UTF-8 characters, stop strings held back and
// matched) and pushes them to the streams. A stream cancelled by its reader
// (the client went away) has its request aborted at the next step, which
// frees its KV blocks at once.
//
//   EngineLoop loop(engine, &tokenizer, {});
//   std::shared_ptr<RequestStream> s = loop.submit({prompt, gen, {"\n\n"}});
//   while (!s->done()) for (Delta& d : s->next(100ms)) send(d.text);
//
// Admission: submit() checks a request in the caller's thread and throws
// loom::Error for what the client got wrong (the server's 400), and returns
// a refusal for what is the server's state (queue full: 429; draining or
// the engine failed: 503), so the loop itself only ever sees valid requests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "infer/engine.h"
#include "infer/text_stream.h"
#include "text/tokenizer.h"

namespace loom::serve {

struct SubmitParams {
  std::vector<int32_t> prompt;
  infer::GenerationParams gen{};
  std::vector<std::string> stop_strings;  // matched on the text (needs a tokenizer)
};

// One piece of one sequence's output: a token with the text it made safe to
// emit (maybe empty: held back), or only text and a finish reason (the
// held-back tail at the end).
struct Delta {
  int64_t index = 0;   // which of the request's n sequences
  int32_t token = -1;  // -1: no new token (the end of a sequence ended by its reader or a stop string)
  float logprob = 0.f;
  std::vector<infer::TokenLogprob> top;
  std::string text;
  infer::FinishReason finish = infer::FinishReason::none;  // none: more to come for this sequence
  std::vector<float> embedding;  // an embedding request's (gen.pooling): its one delta, token -1
};

// One request's output, written by the loop and read by one reader thread.
class RequestStream {
 public:
  RequestStream(int64_t n, int64_t prompt_tokens) : n_(n), prompt_tokens_(prompt_tokens) {}

  // The deltas produced since the last call; waits up to timeout for one.
  // Empty on timeout, and once done().
  std::vector<Delta> next(std::chrono::milliseconds timeout);
  // Every sequence finished (or the request failed) and every delta taken.
  bool done() const;
  // The reader is gone: the loop aborts the request (finish reason abort).
  void cancel();
  // ready() is called (from the loop's thread, without the stream's lock)
  // after each push and fail, and once at once if something is already
  // waiting: how a reader that does not block in next() (the HTTP server's
  // event loop) learns that there is more to take.
  void on_ready(std::function<void()> ready);
  bool cancelled() const;
  // Non-empty when the request could not finish: the engine failed.
  std::string error() const;
  int64_t n() const { return n_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

  // The loop's side.
  void push(Delta d);
  void fail(std::string message);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Delta> pending_;
  std::function<void()> ready_;
  const int64_t n_, prompt_tokens_;
  int64_t finished_ = 0;
  bool cancelled_ = false;
  std::string error_;
};

struct LoopOptions {
  int64_t max_waiting = 256;  // requests submitted and not yet finished beyond those running: more is a refusal
  // Called on the loop's thread before each engine step with the number of
  // steps done; what it throws is handled as the engine failing (the seam
  // through which tests see how the server lives with a dead engine).
  std::function<void(int64_t steps)> before_step{};
  // Control tokens every output of the model shows as text (harmony's markers).
  text::ShownTokens shown_tokens{};
};

enum class Admission { accepted, queue_full, draining, failed };
const char* admission_name(Admission a);

struct Submitted {
  Admission admission = Admission::accepted;
  std::shared_ptr<RequestStream> stream;  // set when accepted
};

// What the server's /metrics and /health report; a snapshot taken by the
// loop after each step.
struct LoopStats {
  int64_t running = 0, waiting = 0, in_flight = 0;  // in_flight: accepted, not finished
  int64_t kv_used_blocks = 0, kv_blocks = 0;
  double prefix_hit_rate = 0;
  int64_t preemptions = 0, steps = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;  // since the start
  int64_t finished_stop = 0, finished_length = 0, finished_abort = 0;
  bool draining = false, failed = false;
  std::string failure;  // the engine's error, when failed
};

class EngineLoop {
 public:
  // engine (and tok, which may be null: no text, no stop strings) must
  // outlive the loop. Starts the loop thread.
  EngineLoop(infer::Engine& engine, const text::Tokenizer* tok, LoopOptions options);
  // Stops the thread; requests still running are aborted, their streams ended.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // loom::Error (nothing queued) for an invalid request; a refusal for a
  // full queue, a draining loop or a failed engine.
  Submitted submit(SubmitParams params);
  // Stops accepting (submit refuses: draining), waits up to grace for the
  // requests in flight to finish, aborts the rest; true if none was aborted.
  bool drain(std::chrono::milliseconds grace);
  LoopStats stats() const;

  int64_t max_model_len() const { return max_model_len_; }

 private:
  struct Entry {
    std::shared_ptr<RequestStream> stream;
    std::vector<std::unique_ptr<infer::TextStream>> text;  // per sequence (none without a tokenizer)
    std::vector<bool> ended;                               // per sequence
    int64_t open = 0;                                      // sequences not ended
  };
  struct Pending {
    SubmitParams params;
    std::shared_ptr<RequestStream> stream;
  };

  void check(const SubmitParams& p) const;
  void run();
  bool wait_for_work();
  void admit(std::vector<Pending>& pending, bool abort_all);
  void abort_cancelled(bool abort_all);
  void deliver(const infer::TokenEvent& e);
  void end_sequence(infer::RequestId id, Entry& entry, Delta d);
  void end_all(const std::string& message, bool failed);
  void publish();

  infer::Engine& engine_;
  const text::Tokenizer* tok_;
  const LoopOptions options_;
  const int64_t max_model_len_, vocab_size_;

  mutable std::mutex mu_;  // guards what submit(), drain() and stats() share with the loop
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  bool stop_ = false, draining_ = false, failed_ = false;
  bool abort_all_ = false;  // drain's grace ran out
  int64_t in_flight_ = 0;
  LoopStats stats_;

  // The loop thread's own.
  std::unordered_map<infer::RequestId, Entry> entries_;
  int64_t ended_ = 0;  // requests ended since the last publish()
  std::thread thread_;
};

}  // namespace loom::serve
