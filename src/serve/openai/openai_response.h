// The OpenAI-compatible response side of POST /v1/completions and
// /v1/chat/completions, independent of HTTP: the deltas of a request's
// streams (EngineLoop) become the final JSON body or the chunks of a
// server-sent-event stream, with OpenAI's shapes: choices indexed
// prompt * n + sequence, finish_reason "stop" / "length" / "abort" (cut by
// the server, as vLLM reports it), the legacy completions logprobs object or
// chat's {"content": [...]}, and usage counts. A chat stream starts with a
// chunk per choice that only names the role. A chat's answer is read
// (CompletionRequest::reading, chat_output.h) for its reasoning, given as
// reasoning_content (vLLM's field: in the message, and in deltas of their
// own while streaming), and for calls: text that may start a call is held
// back, and a call found ends the choice with a delta per call
// ({"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"
// as a JSON string}}]}) and finish_reason "tool_calls".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/engine_loop.h"
#include "serve/openai/openai_request.h"
#include "serve/chat_output.h"
#include "text/tokenizer.h"

namespace loom::serve {

// A token's text for logprobs: the tokenizer's bytes when they are valid
// UTF-8, else "bytes:" and the bytes as \xNN escapes (vLLM's form for a token
// that is part of a character); "<id>" without a tokenizer.
std::string token_text(const text::Tokenizer* tok, int32_t token);

// JSON text that is valid UTF-8 whatever the strings hold (invalid bytes
// become U+FFFD): what the server writes.
std::string dump(const nlohmann::json& j);

class CompletionResponse {
 public:
  // id: "cmpl-..." chosen by the server; created: unix seconds.
  CompletionResponse(const CompletionRequest& request, std::string id, int64_t created,
                     const text::Tokenizer* tok);

  // The deltas of prompt p's stream, in order. Returns the stream chunks
  // they make: one per delta that carries text, a token with logprobs or a
  // finish reason.
  std::vector<nlohmann::json> add(int64_t prompt, const std::vector<Delta>& deltas);
  // Chat: the first chunks of a stream, {"role": "assistant"} per choice.
  std::vector<nlohmann::json> role_chunks() const;
  // The non-streaming body: every choice whole, and usage.
  nlohmann::json body() const;
  // The last chunk when stream_options.include_usage: no choices, usage.
  nlohmann::json usage_chunk() const;
  nlohmann::json usage() const;

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> tokens;
    nlohmann::json logprobs;  // the legacy object, or null
    infer::FinishReason finish = infer::FinishReason::none;
    std::unique_ptr<OutputReader> reader;  // set when the answer is read for reasoning or calls
    std::vector<ToolCall> calls;
    std::string reasoning;
  };
  nlohmann::json finish_of(const Choice& c) const;
  // A delta of a choice with a reader: its reasoning, content and calls.
  void read_delta(int64_t index, Choice& c, const Delta& d, const nlohmann::json& lp,
                  std::vector<nlohmann::json>& chunks) const;
  nlohmann::json logprobs_of(const Delta& d, int64_t text_offset) const;
  nlohmann::json chat_logprobs_of(const Delta& d) const;
  void append_logprobs(nlohmann::json& into, const nlohmann::json& piece) const;
  nlohmann::json chunk(int64_t index, const std::string& text, const nlohmann::json& logprobs,
                       infer::FinishReason finish) const;
  nlohmann::json envelope(const char* object, nlohmann::json choices) const;

  const CompletionRequest& request_;
  std::string id_;
  int64_t created_;
  const text::Tokenizer* tok_;
  std::vector<Choice> choices_;  // prompt * n + sequence
  int64_t prompt_tokens_ = 0;
};

// "stop", "length", "abort" or null (none: not finished).
nlohmann::json finish_reason_json(infer::FinishReason f);

// OpenAI's form of a call: {"id", "type": "function", "function": {"name",
// "arguments": the arguments as a JSON string}}.
nlohmann::json openai_tool_call(const ToolCall& call);

}  // namespace loom::serve
