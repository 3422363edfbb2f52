// The OpenAI-compatible request side of `loom serve`, independent of HTTP:
// a JSON body becomes a CompletionRequest the engine loop can run, or an
// ApiError with the status and vLLM's error envelope
// {"error": {"message", "type", "param", "code"}}. Every field is checked
// for its type and range and named when wrong; fields loom does not know are
// ignored, as vLLM does.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/engine.h"
#include "serve/chat_output.h"
#include "serve/reasoning.h"
#include "serve/tool_calls.h"
#include "text/tokenizer.h"

namespace loom::serve {

// What a client gets back for a request it got wrong (4xx), or for the
// server's state (429, 503).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string param, const std::string& message);
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }  // empty: none
  // {"error": {"message", "type", "param" (null when empty), "code" (the status)}}
  nlohmann::json envelope() const;

 private:
  int status_;
  std::string type_, param_;
};

// 400 invalid_request_error naming param.
ApiError bad_request(std::string param, const std::string& message);

// The body as JSON, its objects' keys in the order the client wrote them
// (what a chat template prints tools and arguments in): 400 for broken JSON
// or invalid UTF-8, and for a body that is not an object.
nlohmann::ordered_json parse_body(std::string_view body);

// The model a request may name, and the limits it is checked against.
struct ServedModel {
  std::string name;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;
  const text::Tokenizer* tokenizer = nullptr;  // null: prompts must be token ids
  int64_t max_n = 16;                              // sequences per prompt
  int64_t max_prompts = 64;                        // prompts per request
  // The chat template: messages (each with role and content strings, and
  // tool_calls / tool_call_id where given), the tools offered (null: none)
  // and more template variables (null or an object) to the prompt's text;
  // loom::Error for messages it refuses (a 400). Unset: the model takes no
  // chat requests.
  std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                            bool add_generation_prompt, const nlohmann::ordered_json& kwargs)>
      render_chat{};
  std::vector<std::string> chat_stop{};  // stop strings every chat request gets (where the template's turn ends)
  bool renders_tools = false;              // the template reads `tools`: chat requests may offer tools
  ToolFormat tool_format = ToolFormat::hermes;  // how the template teaches the model to write calls
  bool thinks = false;  // the template has a thinking mode (reasoning.h's template_thinks)
  ThinkTags think_tags{};  // the tags its think block stands between
  infer::Pooling embedding_pooling = infer::Pooling::mean;  // what an embedding request gets (embeddings.h)
  // The vocabulary grammars are compiled for (structured_output.h); null:
  // requests for structured output are refused.
  std::shared_ptr<const infer::GrammarVocab> grammar_vocab{};
};

// POST /v1/completions, and POST /v1/chat/completions (chat: one prompt, the
// rendered messages).
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // one or more; each runs with gen
  infer::GenerationParams gen{};              // n, sampling, stops, top_logprobs
  std::vector<std::string> stop;              // stop strings
  bool logprobs = false;  // completions: "logprobs" given; chat: logprobs = true (top_logprobs in gen.top_logprobs)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  uint64_t seed = 0;  // the request's, for call ids
  // How the answer is read for reasoning and calls (chat_output.h): the
  // template's family, the functions tools offer, the think block.
  OutputReading reading{};
};

// Throws ApiError: 400 for a missing or invalid field (named in param), 404
// for a model other than m's, 400 when a prompt and max_tokens do not fit in
// the context (both numbers in the message). seed: used when the request
// names none (the server draws it per request). Structured output
// (response_format, guided_*: structured_output.h) becomes gen.grammar.
// reading: how the answer will be read (ollama's templated /api/generate:
// the template's family), known before structured output is made for it.
CompletionRequest parse_completion(const nlohmann::ordered_json& body, const ServedModel& m, uint64_t seed,
                                   OutputReading reading = {});

// The same for a chat: messages (roles system, developer, user, assistant,
// tool; content a string or a list of text parts) rendered by the model's
// template, max_completion_tokens or max_tokens (default: the rest of the
// context), logprobs as a bool with top_logprobs; tools with tool_choice
// ("auto", "none", "required" or a named function: the last two constrain
// the output to calls) and parallel_tool_calls (assistant messages may hold
// tool_calls, their arguments a JSON string as OpenAI sends them or an
// object as ollama does: the template gets objects); chat_template_kwargs
// (vLLM's: more variables for the template, such as enable_thinking); 400
// for a model without a chat template, or tools for a template that does not
// read them. A model whose template thinks gets split_reasoning.
CompletionRequest parse_chat(const nlohmann::ordered_json& body, const ServedModel& m, uint64_t seed);

// The checks that need no model (field types and ranges, messages' shape,
// tools, structured output's schema or grammar), run before the request
// waits for its model to load: a malformed request is answered at once and
// loads nothing. What needs the model (the prompt's tokens, the context,
// the template) is checked by parse_completion / parse_chat.
void precheck(const nlohmann::ordered_json& body, bool chat);

}  // namespace loom::serve
