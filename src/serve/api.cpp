#include "serve/api.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

#include "core/error.h"
#include "serve/embeddings.h"
#include "serve/ollama/ollama_format.h"
#include "serve/openai/openai_format.h"
#include "serve/openai/openai_response.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

ApiError unavailable(const std::string& why) { return ApiError(503, "ServiceUnavailableError", "", why); }

bool ollama_path(const std::string& path) { return path.rfind("/api/", 0) == 0; }

// e in the envelope of path's API.
HttpResponse error_for(const std::string& path, const ApiError& e) {
  return ollama_path(path) ? ollama_error(e) : error_json(e);
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// "Bearer KEY" with the scheme in any case (RFC 9110 §11.1), compared in
// time independent of where the key differs.
bool bearer_matches(const std::string& header, const std::string& key) {
  static constexpr std::string_view kScheme = "bearer ";
  if (header.size() != kScheme.size() + key.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < kScheme.size(); ++i) diff |= static_cast<unsigned>(lower(header[i]) ^ kScheme[i]);
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned>(header[kScheme.size() + i] ^ key[i]);
  return diff == 0;
}

}  // namespace

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump(body);
  return r;
}

HttpResponse error_json(const ApiError& e) { return json_response(e.status(), e.envelope()); }

Api::Api(ApiOptions options) : options_(std::move(options)), rng_(std::random_device{}()) {}

void Api::ready(ModelManager& models, Catalog catalog, ExtraRoutes ollama) {
  catalog_ = std::move(catalog);
  ollama_ = std::move(ollama);
  models_.store(&models, std::memory_order_release);
}

void Api::draining() { draining_ = true; }

HttpResponse Api::error_response(int status, const std::string& message, const std::string& path) const {
  const char* type = status == 413   ? "RequestTooLarge"
                     : status == 503 ? "ServiceUnavailableError"
                     : status >= 500 ? "InternalServerError"
                                     : "BadRequestError";
  return error_for(path, ApiError(status, type, "", message));
}

HttpResponse Api::handle(const HttpRequest& req) {
  HttpResponse res;
  try {
    res = req.method == "OPTIONS" ? preflight(req) : route(req);
  } catch (const ApiError& e) {
    res = error_for(req.path, e);
  } catch (const loom::Error& e) {
    res = error_for(req.path, bad_request("", e.what()));
  }
  add_cors(req, res);
  // A client's request id: echoed, and in the access line.
  const std::string request_id = req.header("x-request-id").substr(0, 200);
  if (!request_id.empty()) res.headers.emplace_back("X-Request-Id", request_id);
  if (res.source) ++active_;
  // One access line per request when it is over: client, request, status,
  // what the route adds (a generation's id, tokens, time to first token),
  // total time.
  res.on_end = [this, counted = res.source != nullptr, method = req.method, path = req.path, peer = req.peer,
                start = req.received, inner = std::move(res.on_end), describe = std::move(res.describe),
                request_id](int status, bool complete) {
    if (counted) --active_;
    metrics_.response(status);
    if (inner) inner(status, complete);
    if (!options_.access_log) return;
    std::string more = describe ? describe() : std::string();
    if (!request_id.empty()) more += " request_id=" + dump(json(request_id));
    std::fprintf(stderr, "serve: %s \"%s %s\" %d%s%s total_ms=%.1f\n", peer.c_str(), method.c_str(), path.c_str(),
                 status, complete ? "" : " client_gone", more.c_str(), ms_between(start, Clock::now()));
  };
  return res;
}

HttpResponse Api::route(const HttpRequest& req) {
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (req.path == "/health" || req.path == "/metrics") {
    if (!get) throw ApiError(405, "MethodNotAllowed", "", req.path + " takes GET");
    return req.path == "/health" ? health() : metrics();
  }
  const bool v1 = req.path.rfind("/v1/", 0) == 0, ollama = req.path.rfind("/api/", 0) == 0;
  // ollama_ is set once, before models_ (acquire): read only after models() says the server is ready.
  const bool ready = models() != nullptr;
  if (!v1 && !(ollama && (!ready || ollama_)) && !(req.path == "/" && get))
    throw ApiError(404, "NotFoundError", "", "no route " + req.method + " " + req.path);
  if (req.path == "/") {  // what ollama's clients ask to see that a server is up
    HttpResponse r;
    r.content_type = "text/plain; charset=utf-8";
    r.body = "loom is running";
    return r;
  }
  if (!(req.path == "/api/version" && get)) authorize(req);  // the version is open, as "/" is
  if (models() == nullptr) throw unavailable("the server is still starting");
  if (ollama) return ollama_(req);
  if (req.path == "/v1/models" && get) return list_models();
  if (req.path.rfind("/v1/models/", 0) == 0 && get) return get_model(req.path.substr(11));
  const bool chat = req.path == "/v1/chat/completions";
  if ((chat || req.path == "/v1/completions") && req.method == "POST") return openai_generation(req, chat);
  if (req.path == "/v1/embeddings" && req.method == "POST") return openai_embeddings(req);
  if (chat || req.path == "/v1/models" || req.path == "/v1/completions" || req.path == "/v1/embeddings")
    throw ApiError(405, "MethodNotAllowed", "", req.path + " does not take " + req.method);
  throw ApiError(404, "NotFoundError", "", "no route " + req.method + " " + req.path);
}

void Api::authorize(const HttpRequest& req) const {
  if (options_.api_key.empty()) return;
  if (!bearer_matches(req.header("authorization"), options_.api_key))
    throw ApiError(401, "AuthenticationError", "",
                   "a valid API key is required: send the header 'Authorization: Bearer <key>'");
}

HttpResponse Api::health() const {
  const ModelManager* m = models();
  if (m == nullptr) throw unavailable("the server is still starting");
  if (draining_) throw unavailable("the server is shutting down");
  for (const auto& model : m->models()) {
    const LoopStats st = model->loop->stats();
    if (st.failed) throw unavailable("the engine of model " + model->name + " failed: " + st.failure);
    if (st.draining) throw unavailable("the server is shutting down");
  }
  HttpResponse r;
  r.body = "{}";
  return r;
}

HttpResponse Api::metrics() const {
  std::vector<std::pair<std::string, LoopStats>> loops;
  if (const ModelManager* m = models())
    for (const auto& model : m->models())
      if (model->parent.empty()) loops.emplace_back(model->name, model->loop->stats());  // adapters share their base's
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_.render(loops);
  return r;
}

namespace {

// OpenAI's model object, with vLLM's root and parent (an adapter's base).
json model_object(const CatalogEntry& c) {
  return {{"id", c.name},   {"object", "model"}, {"created", c.created}, {"owned_by", "loom"},
          {"root", c.name}, {"parent", c.parent.empty() ? json(nullptr) : json(c.parent)}};
}

}  // namespace

HttpResponse Api::list_models() const {
  json data = json::array();
  for (const CatalogEntry& c : catalog_())
    data.push_back(model_object(c));
  return json_response(200, {{"object", "list"}, {"data", data}});
}

// By the name the catalog lists or any the other routes take for it ("x"
// for "x:latest" in store mode).
HttpResponse Api::get_model(const std::string& id) const {
  std::string canonical = id;
  if (const ModelManager* m = models()) {
    try {
      canonical = m->canonical(id);
    } catch (const ApiError&) {  // not a valid name: not found below
    }
  }
  for (const CatalogEntry& c : catalog_())
    if (c.name == id || c.name == canonical)
      return json_response(200, model_object(c));
  throw ApiError(404, "NotFoundError", "model", "The model '" + id + "' does not exist");
}

void Api::add_cors(const HttpRequest& req, HttpResponse& res) const {
  const std::string origin = req.header("origin");
  if (origin.empty() || options_.allow_origins.empty()) return;
  const bool any = std::find(options_.allow_origins.begin(), options_.allow_origins.end(), "*") !=
                   options_.allow_origins.end();
  if (!any && std::find(options_.allow_origins.begin(), options_.allow_origins.end(), origin) ==
                  options_.allow_origins.end())
    return;
  res.headers.emplace_back("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.headers.emplace_back("Vary", "Origin");
}

HttpResponse Api::preflight(const HttpRequest& req) const {
  HttpResponse r;
  r.status = 204;
  r.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, HEAD, OPTIONS");
  const std::string asked = req.header("access-control-request-headers");
  r.headers.emplace_back("Access-Control-Allow-Headers",
                         asked.empty() ? "Authorization, Content-Type, X-Request-Id" : asked.substr(0, 1000));
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  return r;
}

HttpResponse Api::openai_generation(const HttpRequest& req, bool chat) {
  nlohmann::ordered_json body = parse_body(req.body);
  const auto model = body.find("model");
  if (model == body.end() || model->is_null()) throw bad_request("model", "model is required");
  if (!model->is_string()) throw bad_request("model", "model must be a string");
  const std::string name = *model;
  precheck(body, chat);
  const bool stream = body.value("stream", nlohmann::ordered_json(false)) == nlohmann::ordered_json(true);
  auto format = std::make_unique<OpenAiFormat>(std::move(body), chat, request_id(chat ? "chatcmpl-" : "cmpl-"));
  auto source = std::make_shared<GenerationSource>(*models(), name, std::move(format), draw_seed(), std::nullopt,
                                                   req.received);
  return generation(req, std::move(source), stream, "text/event-stream; charset=utf-8");
}

HttpResponse Api::openai_embeddings(const HttpRequest& req) {
  nlohmann::ordered_json body = parse_body(req.body);
  const auto model = body.find("model");
  if (model == body.end() || model->is_null()) throw bad_request("model", "model is required");
  if (!model->is_string()) throw bad_request("model", "model must be a string");
  const std::string name = *model;
  auto format = std::make_unique<EmbeddingFormat>(std::move(body), EmbedRoute::openai, request_id("embd-"));
  format->precheck();
  auto source = std::make_shared<GenerationSource>(*models(), name, std::move(format), draw_seed(), std::nullopt,
                                                   req.received);
  return generation(req, std::move(source), false, "");
}

HttpResponse Api::generation(const HttpRequest& req, std::shared_ptr<GenerationSource> source, bool stream,
                             const char* stream_type) {
  HttpResponse r;
  r.source = source;
  r.chunked = stream;
  if (stream) {
    r.content_type = stream_type;
    r.headers.emplace_back("Cache-Control", "no-cache");
  }
  (void)req;
  // Latencies into the metrics; the source outlives the exchange here (weak: no cycle through on_end).
  r.on_end = [this, weak = std::weak_ptr<GenerationSource>(source)](int status, bool) {
    const auto src = weak.lock();
    if (!src || status != 200) return;
    const GenerationTimes t = src->times();
    const Clock::time_point end = t.end == Clock::time_point{} ? Clock::now() : t.end;
    const double tokens = static_cast<double>(src->usage().value("completion_tokens", 0));
    if (tokens == 0) return;  // nothing generated (an embedding, a model load): no generation latencies
    const bool got_first = t.first_token != Clock::time_point{};
    metrics_.generation(got_first ? ms_between(t.received, t.first_token) / 1e3 : -1.0,
                        got_first && tokens >= 2 ? ms_between(t.first_token, end) / 1e3 / (tokens - 1) : -1.0,
                        ms_between(t.received, end) / 1e3);
  };
  r.describe = [weak = std::weak_ptr<GenerationSource>(source)] {
    const auto src = weak.lock();
    if (!src) return std::string();
    const json u = src->usage();
    const GenerationTimes t = src->times();
    char buf[200];
    std::snprintf(buf, sizeof buf, " model=%s prompt_tokens=%lld completion_tokens=%lld ttft_ms=%.1f",
                  src->model_name().c_str(), static_cast<long long>(u.value("prompt_tokens", 0)),
                  static_cast<long long>(u.value("completion_tokens", 0)),
                  t.first_token == Clock::time_point{} ? -1.0 : ms_between(t.received, t.first_token));
    const std::string id = src->id();
    return id.empty() ? std::string(buf) : " id=" + id + buf;
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
