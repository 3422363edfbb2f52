// The routes of `loom serve` over an EngineLoop: the OpenAI-compatible API
// (POST /v1/completions, GET /v1/models), GET /health, GET /metrics
// (Prometheus), with vLLM's error
// envelope for every refusal and an access line per request on stderr. The
// HTTP server (http_server.h) calls handle() on its threads; nothing here
// runs the model or blocks on it: a generation's body is a BodySource fed by
// the loop's RequestStreams.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve/openai_request.h"

namespace loom::serve {

struct ApiOptions {
  std::string api_key;      // non-empty: /v1/ routes need "Authorization: Bearer <key>"
  bool access_log = true;   // one line per request on stderr
};

class Api {
 public:
  // model_name: the name it will serve (for /metrics while it loads).
  Api(ApiOptions options, std::string model_name);

  // The model is loaded: serve it through loop (both must outlive the
  // server). Until then /health and the API answer 503.
  void ready(EngineLoop& loop, ServedModel model);
  // SIGTERM: /health answers 503 from now on (the loop refuses new work).
  void draining();

  HttpResponse handle(const HttpRequest& req);
  // Generations whose response is not over yet (a drain waits for them).
  int64_t active() const { return active_.load(); }
  // The server's own refusals (malformed HTTP, 413, 431, too many
  // connections) in the same envelope.
  HttpResponse error_response(int status, const std::string& message) const;

 private:
  struct Served {
    EngineLoop* loop = nullptr;
    ServedModel model;
    int64_t created = 0;
  };

  // What a route adds when its exchange ends: to the access line, and to
  // the metrics (a generation's latencies).
  struct Exchange {
    std::function<std::string()> detail;
    std::function<void()> observe;
  };
  HttpResponse route(const HttpRequest& req, Exchange& ex);
  HttpResponse completions(const HttpRequest& req, const Served& s, Exchange& ex);
  HttpResponse models(const Served& s) const;
  HttpResponse health() const;
  void authorize(const HttpRequest& req) const;
  std::string request_id(const char* prefix);
  uint64_t draw_seed();

  const ApiOptions options_;
  std::unique_ptr<Served> served_;
  std::atomic<const Served*> ready_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  Metrics metrics_;
  std::string model_name_;  // for /metrics before the model is ready
};

// A response with vLLM's error envelope.
HttpResponse error_json(const ApiError& e);

}  // namespace loom::serve
