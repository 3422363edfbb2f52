#include "serve/openai/openai_format.h"

#include <ctime>
#include <utility>

namespace loom::serve {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

void apply_model_defaults(ojson& body, const LoadedModel& m, bool chat) {
  static const std::pair<const char*, const char*> names[] = {
      {"temperature", "temperature"}, {"top_p", "top_p"}, {"top_k", "top_k"}, {"min_p", "min_p"},
      {"seed", "seed"}, {"num_predict", "max_tokens"}, {"stop", "stop"}, {"repeat_penalty", "repetition_penalty"},
      {"repeat_last_n", "repeat_last_n"}, {"presence_penalty", "presence_penalty"},
      {"frequency_penalty", "frequency_penalty"}};
  for (const auto& [ollama, openai] : names) {
    const auto it = m.parameters.find(ollama);
    if (it == m.parameters.end() || (body.contains(openai) && !body[openai].is_null())) continue;
    if (std::string(ollama) == "num_predict" && (chat && body.contains("max_completion_tokens"))) continue;
    if (std::string(ollama) == "num_predict" && it->get<int64_t>() < 0) continue;  // -1: no limit
    body[openai] = *it;
  }
  if (!chat || !body.contains("messages") || !body["messages"].is_array()) return;
  ojson messages = ojson::array();
  bool has_system = false;
  for (const ojson& msg : body["messages"])
    if (msg.is_object() && msg.value("role", ojson()) == "system") has_system = true;
  if (!has_system && !m.system.empty()) messages.push_back({{"role", "system"}, {"content", m.system}});
  for (const json& msg : m.messages) messages.push_back(ojson(msg));
  for (ojson& msg : body["messages"]) messages.push_back(std::move(msg));
  body["messages"] = std::move(messages);
}

OpenAiFormat::OpenAiFormat(ojson body, bool chat, std::string id)
    : body_(std::move(body)), chat_(chat), id_(std::move(id)) {}

CompletionRequest OpenAiFormat::parse(const LoadedModel& m, uint64_t seed) {
  apply_model_defaults(body_, m, chat_);
  ServedModel served = m.served;
  served.name = body_["model"].get<std::string>();  // any name the manager resolved to this model
  request_ = std::make_unique<CompletionRequest>(chat_ ? parse_chat(body_, served, seed)
                                                       : parse_completion(body_, served, seed));
  response_ = std::make_unique<CompletionResponse>(*request_, id_, std::time(nullptr), served.tokenizer);
  return *request_;
}

void OpenAiFormat::begin(const CompletionRequest& r, const LoadedModel&, std::string& out) {
  if (r.chat && r.stream)
    for (const json& chunk : response_->role_chunks()) out += "data: " + dump(chunk) + "\n\n";
}

void OpenAiFormat::add(int64_t p, const std::vector<Delta>& deltas, std::string& out) {
  for (const json& chunk : response_->add(p, deltas))
    if (request_->stream) out += "data: " + dump(chunk) + "\n\n";
}

void OpenAiFormat::end(const GenerationTimes&, std::string& out) {
  if (!request_->stream) {
    out = dump(response_->body());
    return;
  }
  if (request_->include_usage) out += "data: " + dump(response_->usage_chunk()) + "\n\n";
  out += "data: [DONE]\n\n";
}

std::string OpenAiFormat::error_body(const ApiError& e, bool begun) const {
  if (begun && request_ && request_->stream) return "data: " + dump(e.envelope()) + "\n\ndata: [DONE]\n\n";
  return dump(e.envelope());
}

json OpenAiFormat::usage() const {
  return response_ ? response_->usage() : json{{"prompt_tokens", 0}, {"completion_tokens", 0}};
}

}  // namespace loom::serve
