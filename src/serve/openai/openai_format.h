// The OpenAI API's side of a generation (generation.h): the request parsed
// against the model that serves it, with the model's Modelfile defaults
// (parameters, system prompt, messages) where the request gives none, and
// the response as server-sent events (data: {chunk}, a role chunk first for
// chat, the usage chunk with stream_options.include_usage, data: [DONE]) or
// one JSON body.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/generation.h"
#include "serve/openai/openai_response.h"

namespace loom::serve {

class OpenAiFormat : public GenerationFormat {
 public:
  OpenAiFormat(nlohmann::ordered_json body, bool chat, std::string id);

  CompletionRequest parse(const LoadedModel& m, uint64_t seed) override;
  void begin(const CompletionRequest& r, const LoadedModel& m, std::string& out) override;
  void add(int64_t p, const std::vector<Delta>& deltas, std::string& out) override;
  void end(const GenerationTimes& t, std::string& out) override;
  std::string error_body(const ApiError& e, bool begun) const override;
  nlohmann::json usage() const override;
  std::string id() const override { return id_; }

 private:
  nlohmann::ordered_json body_;
  const bool chat_;
  const std::string id_;
  std::unique_ptr<CompletionRequest> request_;  // response_ refers to it
  std::unique_ptr<CompletionResponse> response_;
};

// The Modelfile's PARAMETERs (ollama's names) as OpenAI fields where body
// has none; for a chat, its SYSTEM and MESSAGEs before the request's
// messages (SYSTEM only when the request has no system message).
void apply_model_defaults(nlohmann::ordered_json& body, const LoadedModel& m, bool chat);

}  // namespace loom::serve
