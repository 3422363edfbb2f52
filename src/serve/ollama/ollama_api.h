// ollama's HTTP API on `loom serve` (the routes under /api/), for ollama's
// own clients: POST /api/generate and /api/chat (NDJSON streams, durations
// in nanoseconds; an empty prompt loads a model, keep_alive 0 with it
// unloads), POST /api/embed and /api/embeddings (embeddings.h), GET /api/tags, POST /api/show, GET /api/ps, POST /api/create
// (a Modelfile, or ollama's newer fields: from, template, system,
// parameters, messages, license), DELETE /api/delete, POST /api/copy, GET
// /api/version. Errors are ollama's {"error": "..."} with a 4xx status for
// what the client sent.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "serve/api.h"
#include "serve/http/http_server.h"
#include "serve/model_manager.h"
#include "serve/store/model_store.h"

namespace loom::serve {

// ollama's ModelDetails, every field its clients read (ollama-js's .d.ts),
// of a model with this configuration. format: "gguf" or "safetensors";
// quantization_level: ollama's name of the weights' type ("Q8_0", "F32").
nlohmann::json ollama_details(const model::ModelConfig& c, const std::string& format,
                              const std::string& quantization_level, const std::string& parent_model);

class OllamaApi {
 public:
  // store: null when the server serves one directory (--model): the routes
  // that change the store then refuse. base_dir: where a relative FROM of
  // /api/create starts.
  OllamaApi(Api& api, ModelManager& models, ModelStore* store);
  ~OllamaApi();  // waits for the creates still running
  OllamaApi(const OllamaApi&) = delete;
  OllamaApi& operator=(const OllamaApi&) = delete;

  HttpResponse handle(const HttpRequest& req);
  // Waits up to timeout for the model creates still running on their
  // threads (call it while the server still runs); true when none is left.
  bool wait_for_tasks(std::chrono::milliseconds timeout);

 private:
  HttpResponse route(const HttpRequest& req);
  HttpResponse generate(const HttpRequest& req, bool chat);
  HttpResponse embed(const HttpRequest& req, bool batch);
  HttpResponse tags() const;
  HttpResponse show(const HttpRequest& req) const;
  HttpResponse ps() const;
  HttpResponse create(const HttpRequest& req);
  HttpResponse remove(const HttpRequest& req);
  HttpResponse copy(const HttpRequest& req);
  HttpResponse pull(const HttpRequest& req) const;
  ModelStore& store() const;
  // A loaded model's details and digest: a store model's from the store, a
  // --model directory's from what the server loaded (null when not loaded).
  nlohmann::json loaded_details(const std::string& name) const;
  std::string served_digest(const LoadedModel& m) const;

  Api& api_;
  ModelManager& models_;
  ModelStore* store_;
  std::atomic<int> tasks_{0};  // creates running on their threads
};

}  // namespace loom::serve
