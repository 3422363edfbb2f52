#include "serve/generation.h"

#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "core/error.h"

namespace loom::serve {

using Clock = std::chrono::steady_clock;

GenerationSource::GenerationSource(ModelManager& models, std::string model, std::unique_ptr<GenerationFormat> format,
                                   uint64_t seed, std::optional<std::chrono::seconds> keep_alive,
                                   Clock::time_point received)
    : models_(models),
      requested_(std::move(model)),
      format_(std::move(format)),
      seed_(seed),
      keep_alive_(keep_alive) {
  times_.received = received;
}

GenerationSource::~GenerationSource() {
  std::lock_guard lk(mu_);
  if (model_) models_.release(*model_, keep_alive_, times_.received);
}

void GenerationSource::start(std::function<void()> wake) {
  {
    std::lock_guard lk(mu_);
    wake_ = wake;
  }
  std::weak_ptr<GenerationSource> weak = weak_from_this();
  try {
    models_.acquire(requested_, [weak](std::shared_ptr<LoadedModel> m, std::optional<ApiError> error) {
      if (auto self = weak.lock()) self->arrived(std::move(m), std::move(error));
    });
  } catch (const ApiError& e) {
    arrived(nullptr, e);
  }
}

void GenerationSource::arrived(std::shared_ptr<LoadedModel> m, std::optional<ApiError> error) {
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    model_ = std::move(m);
    load_error_ = std::move(error);
    if (!model_ && !load_error_) load_error_ = ApiError(500, "InternalServerError", "model", "the model did not load");
    wake = wake_;
  }
  if (wake) wake();
}

bool GenerationSource::fail(const ApiError& e, std::string& out) {
  status_ = e.status();  // a stream whose head went out keeps its 200 (the server asks only before the head)
  out += format_->error_body(e, begun_);
  times_.end = Clock::now();
  return true;
}

// The preparation pool: parsing a request against its model (rendering a
// chat template, tokenizing prompts) takes time that grows with the prompt,
// so it runs here and not on an HTTP thread, whose other streams it would
// hold up. Two threads: the engine loops need the cores.
boost::asio::thread_pool& preparation_pool() {
  static boost::asio::thread_pool pool(2);
  return pool;
}

// The model arrived: the request is parsed on the preparation pool (or, for
// one that only loads the model, answered at once).
bool GenerationSource::submit(std::string& out) {
  submitted_ = true;
  std::shared_ptr<LoadedModel> m;
  {
    std::lock_guard lk(mu_);
    if (load_error_) return fail(*load_error_, out);
    m = model_;
  }
  times_.model_ready = Clock::now();
  if (!format_->generates()) {
    format_->loaded(*m, out);
    times_.end = Clock::now();
    return true;
  }
  preparing_ = true;
  boost::asio::post(preparation_pool(), [self = shared_from_this(), m] { self->prepare(m); });
  return false;
}

void GenerationSource::prepare(std::shared_ptr<LoadedModel> m) {
  {
    std::lock_guard lk(format_mu_);
    try {
      request_ = format_->parse(*m, seed_);
    } catch (const ApiError& e) {
      prepare_error_ = e;
    } catch (const loom::Error& e) {  // what the model refuses (a template's raise_exception, ...)
      prepare_error_ = bad_request("", e.what());
    } catch (const std::exception& e) {
      prepare_error_ = ApiError(500, "InternalServerError", "", std::string("internal error: ") + e.what());
    }
  }
  prepared_ = true;
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    wake = wake_;
  }
  if (wake) wake();
}

// The parse ended: its error, or the prompts queued and the body begun.
bool GenerationSource::begin_prepared(std::string& out) {
  preparing_ = false;
  if (prepare_error_) return fail(*prepare_error_, out);
  std::shared_ptr<LoadedModel> m;
  {
    std::lock_guard lk(mu_);
    if (cancelled_) return true;  // the client left while its request was prepared: queue nothing
    m = model_;
  }
  try {
    queue_more(true);
    format_->begin(request_, *m, out);
    begun_ = true;
  } catch (const ApiError& e) {
    for (auto& s : streams_) s->cancel();
    return fail(e, out);
  } catch (const loom::Error& e) {  // EngineLoop::submit's check
    for (auto& s : streams_) s->cancel();
    return fail(bad_request("", e.what()), out);
  }
  return false;
}

// Queues prompts while fewer than the format's max_in_flight of this
// request's run. A full queue is an error for the first (429); later ones
// wait for a prompt of this request to finish (whose wake calls again).
void GenerationSource::queue_more(bool first) {
  std::shared_ptr<LoadedModel> m;
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    m = model_;
    wake = wake_;
  }
  size_t running = 0;
  for (const auto& s : streams_) running += s->done() ? 0 : 1;
  while (streams_.size() < request_.prompts.size() && running < format_->max_in_flight()) {
    const size_t p = streams_.size();
    infer::GenerationParams gen = request_.gen;
    gen.adapter = m->adapter;  // the model asked for: the base or one of its adapters
    Submitted sub = m->loop->submit({request_.prompts[p], std::move(gen), request_.stop});
    if (sub.admission == Admission::queue_full && !first && running > 0) return;
    if (sub.admission != Admission::accepted) {
      if (sub.admission == Admission::queue_full)
        throw ApiError(429, "TooManyRequests", "", "the server's queue is full; retry later");
      throw ApiError(503, "ServiceUnavailableError", "",
                     sub.admission == Admission::draining ? "the server is shutting down" : "the engine failed");
    }
    sub.stream->on_ready(wake);
    streams_.push_back(std::move(sub.stream));
    ++running;
  }
}

bool GenerationSource::pull(std::string& out) {
  if (!submitted_) {
    {
      std::lock_guard lk(mu_);
      if (!model_ && !load_error_) return false;  // still loading
      if (cancelled_) return true;
    }
    if (submit(out)) return true;
  }
  if (preparing_) {
    if (!prepared_) return false;  // still on the preparation pool; its end wakes us
    if (begin_prepared(out)) return true;
  }
  try {  // a format may refuse what came (an embedding cut by the drain)
    for (size_t p = 0; p < streams_.size(); ++p) {
      std::vector<Delta> deltas = streams_[p]->next(std::chrono::milliseconds(0));
      if (deltas.empty()) continue;
      if (times_.first_token == Clock::time_point{}) times_.first_token = Clock::now();
      format_->add(static_cast<int64_t>(p), deltas, out);
    }
  } catch (const ApiError& e) {
    for (auto& s : streams_) s->cancel();
    return fail(e, out);
  }
  std::string failure;
  for (auto& s : streams_)
    if (failure.empty() && s->done()) failure = s->error();
  if (failure.empty() && streams_.size() < request_.prompts.size()) {
    try {
      queue_more(false);
    } catch (const ApiError& e) {
      for (auto& s : streams_) s->cancel();
      return fail(e, out);
    }
  }
  for (auto& s : streams_)
    if (!s->done()) return false;
  if (failure.empty() && streams_.size() < request_.prompts.size()) return false;  // more to queue when one ends
  if (!failure.empty()) return fail(ApiError(500, "InternalServerError", "", "the engine failed: " + failure), out);
  times_.end = Clock::now();
  try {
    format_->end(times_, out);
  } catch (const ApiError& e) {
    return fail(e, out);
  }
  return true;
}

void GenerationSource::cancel() {
  {
    std::lock_guard lk(mu_);
    cancelled_ = true;
  }
  for (auto& s : streams_) s->cancel();
}

int GenerationSource::status() const { return status_; }

nlohmann::json GenerationSource::usage() const {
  std::lock_guard lk(format_mu_);
  return format_->usage();
}

std::string GenerationSource::id() const {
  std::lock_guard lk(format_mu_);
  return format_->id();
}

GenerationTimes GenerationSource::times() const { return times_; }

std::string GenerationSource::model_name() const {
  std::lock_guard lk(mu_);
  return model_ ? model_->name : requested_;
}

}  // namespace loom::serve
