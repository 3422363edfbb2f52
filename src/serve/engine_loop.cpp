#include "serve/engine_loop.h"

#include <exception>
#include <utility>

#include "core/error.h"
#include "infer/stop_strings.h"

namespace loom::serve {

// ---- RequestStream ----------------------------------------------------------

std::vector<Delta> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || finished_ == n_ || !error_.empty(); });
  std::vector<Delta> out(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_.clear();
  return out;
}

bool RequestStream::done() const {
  std::lock_guard lk(mu_);
  return pending_.empty() && (finished_ == n_ || !error_.empty());
}

void RequestStream::cancel() {
  std::lock_guard lk(mu_);
  cancelled_ = true;
}

bool RequestStream::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

std::string RequestStream::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

void RequestStream::on_ready(std::function<void()> ready) {
  bool waiting = false;
  {
    std::lock_guard lk(mu_);
    ready_ = ready;
    waiting = !pending_.empty() || finished_ == n_ || !error_.empty();
  }
  if (waiting && ready) ready();
}

void RequestStream::push(Delta d) {
  std::function<void()> ready;
  {
    std::lock_guard lk(mu_);
    if (d.finish != infer::FinishReason::none) ++finished_;
    pending_.push_back(std::move(d));
    ready = ready_;
  }
  cv_.notify_all();
  if (ready) ready();
}

void RequestStream::fail(std::string message) {
  std::function<void()> ready;
  {
    std::lock_guard lk(mu_);
    error_ = std::move(message);
    ready = ready_;
  }
  cv_.notify_all();
  if (ready) ready();
}

// ---- EngineLoop -------------------------------------------------------------

namespace {

// The last delta of sequence `index` of an aborted request: no token.
Delta aborted(int64_t index) {
  Delta d;
  d.index = index;
  d.finish = infer::FinishReason::abort;
  return d;
}

}  // namespace

const char* admission_name(Admission a) {
  switch (a) {
    case Admission::accepted: return "accepted";
    case Admission::queue_full: return "queue_full";
    case Admission::draining: return "draining";
    case Admission::failed: return "failed";
  }
  return "?";
}

EngineLoop::EngineLoop(infer::Engine& engine, const text::Tokenizer* tok, LoopOptions options)
    : engine_(engine),
      tok_(tok),
      options_(options),
      max_model_len_(engine.config().max_model_len),
      vocab_size_(engine.runner().config().vocab_size) {
  LOOM_REQUIRE(options_.max_waiting >= 0, "max_waiting = ", options_.max_waiting,
               " is invalid: allowed values are >= 0");
  publish();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EngineLoop::check(const SubmitParams& p) const {
  p.gen.validate();
  infer::check_prompt(p.prompt, vocab_size_, max_model_len_);
  LOOM_REQUIRE(p.stop_strings.empty() || tok_ != nullptr, "stop strings need a tokenizer, and this model has none");
  (void)infer::StopStrings(p.stop_strings);  // an empty stop string is an error
}

Submitted EngineLoop::submit(SubmitParams params) {
  check(params);
  auto stream = std::make_shared<RequestStream>(params.gen.n, static_cast<int64_t>(params.prompt.size()));
  {
    std::lock_guard lk(mu_);
    if (failed_ || stop_) return {Admission::failed, nullptr};
    if (draining_) return {Admission::draining, nullptr};
    if (in_flight_ >= engine_.config().max_num_seqs + options_.max_waiting) return {Admission::queue_full, nullptr};
    ++in_flight_;
    inbox_.push_back({std::move(params), stream});
  }
  cv_.notify_all();
  return {Admission::accepted, stream};
}

bool EngineLoop::drain(std::chrono::milliseconds grace) {
  std::unique_lock lk(mu_);
  draining_ = true;
  stats_.draining = true;
  const bool finished = cv_.wait_for(lk, grace, [&] { return in_flight_ == 0; });
  if (finished) return true;
  abort_all_ = true;
  lk.unlock();
  cv_.notify_all();
  lk.lock();
  cv_.wait(lk, [&] { return in_flight_ == 0 || failed_; });
  return false;
}

LoopStats EngineLoop::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void EngineLoop::run() {
  while (wait_for_work()) {
    std::vector<Pending> pending;
    bool abort_all = false;  // drain's grace ran out: everything goes
    {
      std::lock_guard lk(mu_);
      pending.swap(inbox_);
      abort_all = abort_all_;
    }
    // Anything thrown here is the engine's (or loom's) fault, not a
    // client's: every stream gets the error and the loop refuses from now on.
    try {
      admit(pending, abort_all);
      abort_cancelled(abort_all);
      if (engine_.has_unfinished()) {
        if (options_.before_step) options_.before_step(stats().steps);
        for (const infer::TokenEvent& e : engine_.step()) deliver(e);
        std::lock_guard lk(mu_);
        ++stats_.steps;
      }
    } catch (const std::exception& e) {
      const std::string message = std::string("the engine failed: ") + e.what();
      for (Pending& p : pending) p.stream->fail(message);  // those admit() had not reached
      end_all(message, /*failed=*/true);
      return;
    }
    publish();
  }
  end_all("the server is stopping", /*failed=*/false);
}

bool EngineLoop::wait_for_work() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop_ || !inbox_.empty() || !entries_.empty(); });
  return !stop_;
}

void EngineLoop::admit(std::vector<Pending>& pending, bool abort_all) {
  for (Pending& p : pending) {
    const int64_t n = p.params.gen.n;
    Entry entry{p.stream, {}, std::vector<bool>(static_cast<size_t>(n), false), n};
    if (abort_all || p.stream->cancelled()) {  // gone before it started
      for (int64_t i = 0; i < n; ++i) end_sequence(0, entry, aborted(i));
      continue;
    }
    infer::RequestId id = 0;
    try {
      id = engine_.add_request(p.params.prompt, p.params.gen);
    } catch (const std::exception& e) {  // check() should have caught it: say so, lose nothing else
      p.stream->fail(e.what());
      ++ended_;
      continue;
    }
    if (tok_ != nullptr)
      for (int64_t i = 0; i < n; ++i)
        entry.text.push_back(std::make_unique<infer::TextStream>(*tok_, p.params.stop_strings,
                                                                 p.params.gen.stop.eos_token_ids,
                                                                 options_.shown_tokens, p.params.gen.stop.min_tokens));
    std::lock_guard lk(mu_);
    stats_.prompt_tokens += static_cast<int64_t>(p.params.prompt.size());
    entries_.emplace(id, std::move(entry));
  }
}

void EngineLoop::abort_cancelled(bool abort_all) {
  std::vector<infer::RequestId> gone;
  for (auto& [id, entry] : entries_)
    if (abort_all || entry.stream->cancelled()) gone.push_back(id);
  for (infer::RequestId id : gone) {
    engine_.abort(id);
    Entry& entry = entries_.at(id);
    std::vector<int64_t> open;  // the last end_sequence() erases the entry: list them first
    for (size_t i = 0; i < entry.ended.size(); ++i)
      if (!entry.ended[i]) open.push_back(static_cast<int64_t>(i));
    for (int64_t i : open) end_sequence(id, entry, aborted(i));
  }
}

void EngineLoop::deliver(const infer::TokenEvent& e) {
  const auto it = entries_.find(e.request);
  if (it == entries_.end()) return;  // aborted this step
  Entry& entry = it->second;
  Delta d{.index = e.index, .token = e.token, .logprob = e.logprob, .top = e.top, .text = {}, .finish = e.finish, .embedding = {}};
  if (e.token < 0) {  // an embedding: no token, no text
    d.embedding = e.embedding;
    end_sequence(e.request, entry, std::move(d));
    return;
  }
  {
    std::lock_guard lk(mu_);
    ++stats_.generation_tokens;
  }
  if (!entry.text.empty()) {
    infer::TextStream& ts = *entry.text[static_cast<size_t>(e.index)];
    // The engine's stop is an EOS or stop token: its text is left out (vLLM's detokenizer skips it).
    infer::TextStream::Piece piece = ts.feed(e.token, e.finish == infer::FinishReason::stop);
    d.text = std::move(piece.text);
    if (piece.stopped) {  // a stop string: reason stop, even on the last allowed token (vLLM's overrides length)
      if (d.finish == infer::FinishReason::none) engine_.finish_sequence(e.request, e.index, infer::FinishReason::stop);
      d.finish = infer::FinishReason::stop;
    }
    if (d.finish != infer::FinishReason::none) d.text += ts.flush();
  }
  if (d.finish == infer::FinishReason::none) {
    entry.stream->push(std::move(d));
    return;
  }
  end_sequence(e.request, entry, std::move(d));
}

// Pushes a sequence's last delta; the request's last one removes its entry
// (id 0: an entry that never reached the engine).
void EngineLoop::end_sequence(infer::RequestId id, Entry& entry, Delta d) {
  const infer::FinishReason finish = d.finish;
  {  // counted before the client can see the end, so a /metrics read after it agrees
    std::lock_guard lk(mu_);
    if (finish == infer::FinishReason::stop) ++stats_.finished_stop;
    if (finish == infer::FinishReason::length) ++stats_.finished_length;
    if (finish == infer::FinishReason::abort) ++stats_.finished_abort;
  }
  entry.ended[static_cast<size_t>(d.index)] = true;
  entry.stream->push(std::move(d));
  const bool last = --entry.open == 0;
  if (last) {
    ++ended_;
    if (id != 0) entries_.erase(id);
  }
}

// Ends every request, queued or running, with message: when the loop stops
// (their blocks freed in the engine) or when the engine failed (its state is
// not to be trusted: nothing more is asked of it, and submit() refuses).
void EngineLoop::end_all(const std::string& message, bool failed) {
  std::vector<Pending> pending;
  {
    std::lock_guard lk(mu_);
    if (failed) {
      failed_ = stats_.failed = true;
      stats_.failure = message;
    }
    pending.swap(inbox_);
  }
  for (Pending& p : pending) p.stream->fail(message);
  for (auto& [id, entry] : entries_) {
    if (!failed) engine_.abort(id);
    entry.stream->fail(message);
  }
  entries_.clear();
  std::lock_guard lk(mu_);
  in_flight_ = ended_ = 0;
  stats_.in_flight = 0;
  cv_.notify_all();
}

// The snapshot stats() returns, and the end of the requests that ended since
// the last one: a request leaves in_flight together with the KV cache
// figures that show its blocks freed, and drain() wakes on that.
void EngineLoop::publish() {
  const infer::SchedulerStats s = engine_.scheduler().stats();
  const infer::KvCacheStats kv = engine_.kv().stats();
  std::lock_guard lk(mu_);
  in_flight_ -= std::exchange(ended_, 0);
  cv_.notify_all();
  stats_.running = s.num_running;
  stats_.waiting = s.num_waiting + static_cast<int64_t>(inbox_.size());
  stats_.preemptions = s.num_preemptions;
  stats_.in_flight = in_flight_;
  stats_.kv_used_blocks = kv.used_blocks;
  stats_.kv_blocks = kv.num_blocks;
  stats_.prefix_hit_rate = kv.prefix_hit_rate();
}

}  // namespace loom::serve
