#include "serve/api.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>
#include <vector>

#include "core/error.h"
#include "serve/openai_response.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump(body);
  return r;
}

// POST /v1/completions: the deltas of one stream per prompt become the SSE
// events (stream) or the body at the end.
class CompletionSource : public BodySource {
 public:
  CompletionSource(std::unique_ptr<CompletionRequest> request, std::vector<std::shared_ptr<RequestStream>> streams,
                   std::string id, const text::Gpt2Tokenizer* tok)
      : request_(std::move(request)),
        streams_(std::move(streams)),
        response_(*request_, std::move(id), std::time(nullptr), tok) {}

  void start(std::function<void()> wake) override {
    for (auto& s : streams_) s->on_ready(wake);
  }

  bool pull(std::string& out) override {
    for (size_t p = 0; p < streams_.size(); ++p) {
      std::vector<Delta> deltas = streams_[p]->next(std::chrono::milliseconds(0));
      if (deltas.empty()) continue;
      if (first_token_ == Clock::time_point{}) first_token_ = Clock::now();
      for (const json& chunk : response_.add(static_cast<int64_t>(p), deltas))
        if (request_->stream) out += "data: " + dump(chunk) + "\n\n";
    }
    std::string failure;
    for (auto& s : streams_) {
      if (!s->done()) return false;
      if (failure.empty()) failure = s->error();
    }
    finish(failure, out);
    return true;
  }

  void cancel() override {
    for (auto& s : streams_) s->cancel();
  }

  int status() const override { return status_; }
  json usage() const { return response_.usage(); }
  Clock::time_point first_token() const { return first_token_; }

 private:
  void finish(const std::string& failure, std::string& out) {
    if (!failure.empty()) {
      // The engine failed: the server's fault, and the client is told so.
      const ApiError e(500, "InternalServerError", "", "the engine failed: " + failure);
      status_ = 500;
      if (request_->stream) out += "data: " + dump(e.envelope()) + "\n\ndata: [DONE]\n\n";
      else out = dump(e.envelope());
      return;
    }
    if (!request_->stream) {
      out = dump(response_.body());
      return;
    }
    if (request_->include_usage) out += "data: " + dump(response_.usage_chunk()) + "\n\n";
    out += "data: [DONE]\n\n";
  }

  std::unique_ptr<CompletionRequest> request_;  // response_ refers to it
  std::vector<std::shared_ptr<RequestStream>> streams_;
  CompletionResponse response_;
  Clock::time_point first_token_{};
  int status_ = 200;
};

}  // namespace

HttpResponse error_json(const ApiError& e) { return json_response(e.status(), e.envelope()); }

Api::Api(ApiOptions options, std::string model_name)
    : options_(std::move(options)), rng_(std::random_device{}()), model_name_(std::move(model_name)) {}

void Api::ready(EngineLoop& loop, ServedModel model) {
  served_ = std::make_unique<Served>(Served{&loop, std::move(model), static_cast<int64_t>(std::time(nullptr))});
  ready_.store(served_.get(), std::memory_order_release);
}

void Api::draining() { draining_ = true; }

HttpResponse Api::error_response(int status, const std::string& message) const {
  const char* type = status == 413 ? "RequestTooLarge" : status == 503 ? "ServiceUnavailableError" : "BadRequestError";
  return error_json(ApiError(status, type, "", message));
}

HttpResponse Api::handle(const HttpRequest& req) {
  HttpResponse res;
  Exchange ex;
  try {
    res = route(req, ex);
  } catch (const ApiError& e) {
    res = error_json(e);
  } catch (const loom::Error& e) {  // EngineLoop::submit's check of a request
    res = error_json(bad_request("", e.what()));
  }
  if (res.source) ++active_;
  // One access line per request when it is over: client, request, status,
  // the generation's id, tokens and time to first token, total time.
  res.on_end = [this, counted = res.source != nullptr, method = req.method, path = req.path, peer = req.peer,
                start = req.received, ex = std::move(ex)](int status, bool complete) {
    if (counted) --active_;
    metrics_.response(status);
    if (ex.observe) ex.observe();
    if (!options_.access_log) return;
    const std::string more = ex.detail ? ex.detail() : std::string();
    std::fprintf(stderr, "serve: %s \"%s %s\" %d%s%s total_ms=%.1f\n", peer.c_str(), method.c_str(), path.c_str(),
                 status, complete ? "" : " client_gone", more.c_str(), ms_between(start, Clock::now()));
  };
  return res;
}

HttpResponse Api::route(const HttpRequest& req, Exchange& ex) {
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (req.path == "/health" || req.path == "/metrics") {
    if (!get) throw ApiError(405, "MethodNotAllowed", "", req.path + " takes GET");
    if (req.path == "/health") return health();
    const Served* s = ready_.load(std::memory_order_acquire);
    const LoopStats stats = s != nullptr ? s->loop->stats() : LoopStats{};
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.render(s != nullptr ? &stats : nullptr, model_name_);
    return r;
  }
  if (req.path.rfind("/v1/", 0) != 0)
    throw ApiError(404, "NotFoundError", "", "no route " + req.method + " " + req.path);
  authorize(req);
  const Served* s = ready_.load(std::memory_order_acquire);
  if (req.path == "/v1/models" && get) {
    if (s == nullptr) throw ApiError(503, "ServiceUnavailableError", "", "the model is still loading");
    return models(*s);
  }
  if (req.path == "/v1/completions" && req.method == "POST") {
    if (s == nullptr) throw ApiError(503, "ServiceUnavailableError", "", "the model is still loading");
    return completions(req, *s, ex);
  }
  if (req.path == "/v1/models" || req.path == "/v1/completions")
    throw ApiError(405, "MethodNotAllowed", "", req.path + " does not take " + req.method);
  throw ApiError(404, "NotFoundError", "", "no route " + req.method + " " + req.path);
}

void Api::authorize(const HttpRequest& req) const {
  if (options_.api_key.empty()) return;
  if (req.header("authorization") != "Bearer " + options_.api_key)
    throw ApiError(401, "AuthenticationError", "",
                   "a valid API key is required: send the header 'Authorization: Bearer <key>'");
}

HttpResponse Api::health() const {
  const Served* s = ready_.load(std::memory_order_acquire);
  if (s == nullptr) throw ApiError(503, "ServiceUnavailableError", "", "the model is still loading");
  if (draining_) throw ApiError(503, "ServiceUnavailableError", "", "the server is shutting down");
  const LoopStats st = s->loop->stats();
  if (st.failed) throw ApiError(503, "ServiceUnavailableError", "", "the engine failed: " + st.failure);
  if (st.draining) throw ApiError(503, "ServiceUnavailableError", "", "the server is shutting down");
  HttpResponse r;
  r.body = "{}";
  return r;
}

HttpResponse Api::models(const Served& s) const {
  const json model = {{"id", s.model.name},     {"object", "model"},      {"created", s.created},
                      {"owned_by", "loom"},     {"root", s.model.name},   {"parent", nullptr},
                      {"max_model_len", s.model.max_model_len}};
  return json_response(200, {{"object", "list"}, {"data", json::array({model})}});
}

HttpResponse Api::completions(const HttpRequest& req, const Served& s, Exchange& ex) {
  auto request = std::make_unique<CompletionRequest>(parse_completion(parse_body(req.body), s.model, draw_seed()));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const std::vector<int32_t>& prompt : request->prompts) {
    Submitted sub = s.loop->submit({prompt, request->gen, request->stop});
    if (sub.admission != Admission::accepted) {
      for (auto& st : streams) st->cancel();  // the prompts already queued go too
      if (sub.admission == Admission::queue_full)
        throw ApiError(429, "TooManyRequests", "", "the server's queue is full; retry later");
      throw ApiError(503, "ServiceUnavailableError", "",
                     sub.admission == Admission::draining ? "the server is shutting down" : "the engine failed");
    }
    streams.push_back(std::move(sub.stream));
  }
  const bool stream = request->stream;
  const auto streams_count = static_cast<int64_t>(streams.size()), n = request->gen.n;
  const std::string id = request_id("cmpl-");
  auto source = std::make_shared<CompletionSource>(std::move(request), std::move(streams), id, s.model.tokenizer);
  HttpResponse r;
  r.source = source;
  r.chunked = stream;
  if (stream) {
    r.content_type = "text/event-stream; charset=utf-8";
    r.headers.emplace_back("Cache-Control", "no-cache");
  }
  // The access line's part; the source outlives the exchange in it (weak: no cycle through on_end).
  ex.observe = [this, weak = std::weak_ptr<CompletionSource>(source), start = req.received,
                sequences = static_cast<double>(streams_count * n)] {
    const auto src = weak.lock();
    if (!src) return;
    const Clock::time_point end = Clock::now(), first = src->first_token();
    const double tokens = static_cast<double>(src->usage().value("completion_tokens", 0)) / sequences;
    const bool got_first = first != Clock::time_point{};
    metrics_.generation(got_first ? ms_between(start, first) / 1e3 : -1.0,
                        got_first && tokens >= 2 ? ms_between(first, end) / 1e3 / (tokens - 1) : -1.0,
                        ms_between(start, end) / 1e3);
  };
  ex.detail = [weak = std::weak_ptr<CompletionSource>(source), id, start = req.received] {
    const auto src = weak.lock();
    if (!src) return " id=" + id;
    const json u = src->usage();
    const Clock::time_point first = src->first_token();
    char buf[160];
    std::snprintf(buf, sizeof buf, " prompt_tokens=%lld completion_tokens=%lld ttft_ms=%.1f",
                  static_cast<long long>(u.value("prompt_tokens", 0)),
                  static_cast<long long>(u.value("completion_tokens", 0)),
                  first == Clock::time_point{} ? -1.0 : ms_between(start, first));
    return " id=" + id + buf;
  };
  return r;
}

std::string Api::request_id(const char* prefix) {
  std::lock_guard lk(rng_mu_);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return prefix + std::string(hex);
}

uint64_t Api::draw_seed() {
  std::lock_guard lk(rng_mu_);
  return rng_();
}

}  // namespace loom::serve
