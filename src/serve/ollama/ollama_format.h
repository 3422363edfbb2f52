// ollama's side of a generation (generation.h): POST /api/generate and
// /api/chat bodies (options with ollama's names, keep_alive, raw, system)
// checked against the model that serves them, and the response as NDJSON
// (one object per piece of text, then a final object with done_reason,
// counts and durations in nanoseconds; /api/generate's with the context: the
// prompt's and the answer's token ids, which a next request's context
// continues) or as one object. options.num_ctx (or PARAMETER num_ctx) bounds
// the context. think (true / false: the template's enable_thinking; true
// only for a template that thinks) with true splits the think block into
// message.thinking (/api/generate: thinking), in pieces of their own when
// streaming. A chat's tools are
// offered as OpenAI's are (parse_chat); calls found in the output come as
// message.tool_calls [{"id", "function": {"index", "name", "arguments" as an
// object}}]: in a piece of their own when streaming, else in the message. An empty prompt (or
// no messages) only loads the model: {"done": true, "done_reason": "load"}.
// Errors are ollama's {"error": "..."}.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/generation.h"
#include "serve/store/model_store.h"
#include "serve/reasoning.h"

namespace loom::serve {

class OllamaFormat : public GenerationFormat {
 public:
  OllamaFormat(nlohmann::ordered_json body, bool chat);

  // What can be checked without the model (precheck in openai_request.h):
  // ApiError in ollama's field names before the request waits for a load.
  void precheck() const;
  CompletionRequest parse(const LoadedModel& m, uint64_t seed) override;
  bool generates() const override { return generates_; }
  void loaded(const LoadedModel& m, std::string& out) override;
  void begin(const CompletionRequest& r, const LoadedModel& m, std::string& out) override;
  void add(int64_t p, const std::vector<Delta>& deltas, std::string& out) override;
  void end(const GenerationTimes& t, std::string& out) override;
  std::string error_body(const ApiError& e, bool begun) const override;
  nlohmann::json usage() const override;

 private:
  nlohmann::json piece(const std::string& text, bool done, const std::string& thinking = {}) const;
  nlohmann::json tool_calls() const;
  CompletionRequest parse_chat_body(nlohmann::ordered_json& openai, const LoadedModel& m, const ServedModel& served,
                                    uint64_t seed);
  CompletionRequest parse_generate_body(nlohmann::ordered_json& openai, const LoadedModel& m,
                                        const ServedModel& served, uint64_t seed);

  nlohmann::ordered_json body_;
  const bool chat_;
  bool generates_ = true, stream_ = true;
  std::string model_, text_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  infer::FinishReason finish_ = infer::FinishReason::none;
  std::unique_ptr<OutputReader> reader_;  // the answer read for thinking or calls
  bool hide_thinking_ = false;            // think: false (a model that always thinks: harmony's)
  std::string thinking_;
  std::vector<ToolCall> calls_;
  std::vector<int32_t> context_;  // /api/generate: the prompt's ids and the answer's, returned as context
};

// keep_alive as ollama takes it: a number of seconds, or a duration string
// ("5m", "1h30m", "10s", "0", "-1"); negative: keep loaded. ApiError (400)
// for anything else.
std::optional<std::chrono::seconds> parse_keep_alive(const nlohmann::ordered_json& body);

// The model as a request may use it: its context bounded by options.num_ctx
// or the Modelfile's PARAMETER num_ctx (400 for a num_ctx that is not a
// positive integer).
ServedModel bounded(const nlohmann::ordered_json& body, const LoadedModel& m);

// {"error": message} with the status.
HttpResponse ollama_error(const ApiError& e);
// body[a] (or body[b] when a is absent: ollama's old field names), a string;
// 400 when neither is there or it is no string.
std::string required_string(const nlohmann::ordered_json& body, const char* a, const char* b = nullptr);
// body[key] as a boolean (stream, raw): `absent` when missing or null; 400
// for any other type, as ollama answers "stream": "no".
bool flag(const nlohmann::ordered_json& body, const char* key, bool absent);
bool flag(const nlohmann::json& body, const char* key, bool absent);
// 1.2K / 3.4M / 7.0B: ollama's parameter_size.
std::string human_count(int64_t n);
// A model name from a request; 400 when malformed.
ModelName model_name_of(const std::string& text);

// Nanoseconds from a to b (ollama's durations); 0 when either is unset or b is before a.
int64_t ns(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b);

// RFC 3339 time (what ollama's created_at, modified_at and expires_at hold).
std::string rfc3339(std::chrono::system_clock::time_point t);

}  // namespace loom::serve
