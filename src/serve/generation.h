// One generation request of the HTTP API, from the model it names to the
// last byte of its response, never blocking an HTTP thread: the model is
// acquired from the ModelManager (loaded on its thread if need be), the
// request is then parsed against that model (the chat template rendered, the
// prompts tokenized: work that grows with the prompt) on a thread of the
// preparation pool, its prompts submitted to the model's EngineLoop, and the
// loop's deltas are turned into the response as they come. What the body looks like is the API's: a GenerationFormat
// (OpenAI's SSE or JSON; ollama's NDJSON or JSON).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/engine_loop.h"
#include "serve/http/http_server.h"
#include "serve/model_manager.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {

struct GenerationTimes {
  std::chrono::steady_clock::time_point received{}, model_ready{}, first_token{}, end{};
};

class GenerationFormat {
 public:
  virtual ~GenerationFormat() = default;
  // The request for this model; ApiError for what is wrong with it.
  virtual CompletionRequest parse(const LoadedModel& m, uint64_t seed) = 0;
  // False: the request only loads the model (ollama's empty prompt); once
  // it is loaded, loaded() writes the whole body.
  virtual bool generates() const { return true; }
  virtual void loaded(const LoadedModel& m, std::string& out) { (void)m, (void)out; }
  // The request runs (its prompts are queued); what the body starts with.
  virtual void begin(const CompletionRequest& r, const LoadedModel& m, std::string& out) = 0;
  // Deltas of prompt p's stream.
  virtual void add(int64_t p, const std::vector<Delta>& deltas, std::string& out) = 0;
  // Every sequence finished (t: when the request came, its model was
  // ready, its first token came, and now).
  virtual void end(const GenerationTimes& t, std::string& out) = 0;
  // An error: before begin() the whole body (status from the error);
  // after it, what a stream ends with.
  virtual std::string error_body(const ApiError& e, bool begun) const = 0;
  virtual nlohmann::json usage() const = 0;  // prompt_tokens, completion_tokens
  virtual std::string id() const { return {}; }  // the response's id, for the access line
  // Prompts of one request queued at once at most: the rest are queued as
  // those finish (an embedding request of thousands of inputs must not fill
  // the server's queue). Generations queue every prompt at once.
  virtual size_t max_in_flight() const { return SIZE_MAX; }
};

class GenerationSource : public BodySource, public std::enable_shared_from_this<GenerationSource> {
 public:
  GenerationSource(ModelManager& models, std::string model, std::unique_ptr<GenerationFormat> format, uint64_t seed,
                   std::optional<std::chrono::seconds> keep_alive, std::chrono::steady_clock::time_point received);
  ~GenerationSource() override;

  void start(std::function<void()> wake) override;
  bool pull(std::string& out) override;
  void cancel() override;
  int status() const override;

  nlohmann::json usage() const;
  GenerationTimes times() const;
  std::string model_name() const;
  std::string id() const;

 private:
  bool submit(std::string& out);
  void prepare(std::shared_ptr<LoadedModel> m);
  bool begin_prepared(std::string& out);
  void queue_more(bool first);
  bool fail(const ApiError& e, std::string& out);
  void arrived(std::shared_ptr<LoadedModel> m, std::optional<ApiError> error);

  ModelManager& models_;
  const std::string requested_;
  std::unique_ptr<GenerationFormat> format_;
  const uint64_t seed_;
  const std::optional<std::chrono::seconds> keep_alive_;

  mutable std::mutex mu_;  // what the manager's thread hands over
  std::function<void()> wake_;
  std::shared_ptr<LoadedModel> model_;
  std::optional<ApiError> load_error_;
  bool cancelled_ = false;
  // The parse on the preparation pool: format_ is its alone while preparing_
  // (usage() and id() wait on format_mu_); prepared_ says it ended.
  mutable std::mutex format_mu_;
  std::atomic<bool> prepared_{false};
  std::optional<ApiError> prepare_error_;

  // The connection's thread's own.
  CompletionRequest request_;                 // what parse() made of the body
  std::vector<std::shared_ptr<RequestStream>> streams_;  // one per prompt queued so far, in prompt order
  bool submitted_ = false, begun_ = false;
  bool preparing_ = false;  // on the preparation pool until prepared_
  int status_ = 200;
  GenerationTimes times_;
};

}  // namespace loom::serve
