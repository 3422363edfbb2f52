// The routes of `loom serve`: the OpenAI-compatible API (POST
// /v1/completions and /v1/chat/completions, GET /v1/models), GET /health,
// GET /metrics (Prometheus), with vLLM's error envelope for every refusal and
// an access line per request on stderr. The HTTP server (http_server.h)
// calls handle() on its threads; nothing here runs the model or waits for
// it: a generation's body is a GenerationSource (generation.h) that gets its
// model from the ModelManager and its tokens from the model's engine loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/generation.h"
#include "serve/http/http_server.h"
#include "serve/metrics.h"
#include "serve/model_manager.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {

struct ApiOptions {
  std::string api_key;     // non-empty: /v1/ and /api/ routes need "Authorization: Bearer <key>"
  bool access_log = true;  // one line per request on stderr
  // Origins browsers may call from (CORS): "*" for any; none: no CORS headers.
  std::vector<std::string> allow_origins = {};
};

// A model the server can serve (loaded or not), for /v1/models and /api/tags.
struct CatalogEntry {
  std::string name;
  int64_t created = 0;  // unix seconds
  int64_t size = 0;     // bytes of its blobs (0: unknown)
  std::string digest;   // "sha256:..." of its manifest ("" for a directory)
  nlohmann::json details = nlohmann::json::object();
  std::string parent;   // a LoRA adapter's base model ("" for a model)
};
using Catalog = std::function<std::vector<CatalogEntry>()>;

// The ollama routes (/api/...), when the server has them: handle() hands
// them any path under /api/.
using ExtraRoutes = std::function<HttpResponse(const HttpRequest& req)>;

class Api {
 public:
  explicit Api(ApiOptions options);

  // Serving starts: models come from the manager, the list of those that
  // can be served from the catalog (both must outlive the server). Until
  // then /health and the API answer 503.
  void ready(ModelManager& models, Catalog catalog, ExtraRoutes ollama = nullptr);
  // SIGTERM: /health answers 503 from now on (the loops refuse new work).
  void draining();

  HttpResponse handle(const HttpRequest& req);
  // Generations whose response is not over yet (a drain waits for them).
  int64_t active() const { return active_.load(); }
  // The server's own refusals (malformed HTTP, 413, 431, too many
  // connections) in the envelope of the API path is under (ollama's under
  // /api/, OpenAI's elsewhere and where the path is not known).
  HttpResponse error_response(int status, const std::string& message, const std::string& path = "") const;

  // For the ollama routes: a generation's response with its access line and
  // metrics, and the seeds and ids the OpenAI routes use.
  HttpResponse generation(const HttpRequest& req, std::shared_ptr<GenerationSource> source, bool stream,
                          const char* stream_type);
  uint64_t draw_seed();
  std::string request_id(const char* prefix);
  ModelManager* models() const { return models_.load(std::memory_order_acquire); }

 private:
  HttpResponse route(const HttpRequest& req);
  HttpResponse openai_generation(const HttpRequest& req, bool chat);
  HttpResponse openai_embeddings(const HttpRequest& req);
  HttpResponse list_models() const;
  HttpResponse get_model(const std::string& id) const;
  // CORS: the headers for req's Origin where allowed (none otherwise), and
  // the answer to a preflight (OPTIONS).
  void add_cors(const HttpRequest& req, HttpResponse& res) const;
  HttpResponse preflight(const HttpRequest& req) const;
  HttpResponse health() const;
  HttpResponse metrics() const;
  void authorize(const HttpRequest& req) const;

  const ApiOptions options_;
  std::atomic<ModelManager*> models_{nullptr};
  Catalog catalog_;
  ExtraRoutes ollama_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  Metrics metrics_;
};

// A response with vLLM's error envelope.
HttpResponse error_json(const ApiError& e);
HttpResponse json_response(int status, const nlohmann::json& body);

}  // namespace loom::serve
