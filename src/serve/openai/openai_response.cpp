#include "serve/openai/openai_response.h"

#include <cstdio>
#include <utility>

#include "infer/text_stream.h"

namespace loom::serve {

using json = nlohmann::json;

std::string token_text(const text::Tokenizer* tok, int32_t token) {
  if (tok == nullptr || token < 0 || token >= tok->vocab_size()) {
    std::string id = "<";  // appended, not operator+: GCC 12 warns falsely (-Wrestrict) on "<" + s + ">"
    id += std::to_string(token);
    id += '>';
    return id;
  }
  const std::string bytes = tok->token_bytes(token);
  // Valid UTF-8: nothing held back at the end and nothing invalid before it.
  bool valid = infer::incomplete_utf8_tail(bytes) == 0;
  for (size_t i = 0; valid && i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    valid = n != 0 && i + n <= bytes.size();
    for (size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    i += n == 0 ? 1 : n;
  }
  if (valid) return bytes;
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json finish_reason_json(infer::FinishReason f) {
  if (f == infer::FinishReason::stop) return "stop";
  if (f == infer::FinishReason::length) return "length";
  if (f == infer::FinishReason::abort) return "abort";  // vLLM's word: cut by the server (its drain deadline)
  return nullptr;
}

json openai_tool_call(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", nlohmann::ordered_json(call.arguments).dump()}}}};
}

CompletionResponse::CompletionResponse(const CompletionRequest& request, std::string id, int64_t created,
                                       const text::Tokenizer* tok)
    : request_(request), id_(std::move(id)), created_(created), tok_(tok) {
  choices_.resize(request.prompts.size() * static_cast<size_t>(request.gen.n));
  for (size_t i = 0; i < choices_.size(); ++i) choices_[i].reader = output_reader(request.reading, request.seed + 7919 * i);
  for (Choice& c : choices_)
    if (request.logprobs && request.chat)
      c.logprobs = {{"content", json::array()}};
    else if (request.logprobs)
      c.logprobs = {{"tokens", json::array()},
                    {"token_logprobs", json::array()},
                    {"top_logprobs", json::array()},
                    {"text_offset", json::array()}};
  for (const std::vector<int32_t>& p : request.prompts) prompt_tokens_ += static_cast<int64_t>(p.size());
}

// The legacy logprobs of one token: its text, log-probability, the top
// alternatives (text -> logprob) and where its text starts in the choice.
// The sampled token is one of the alternatives even when it is not among the
// top N (OpenAI: "up to logprobs+1 elements"; vLLM merges it in).
json CompletionResponse::logprobs_of(const Delta& d, int64_t text_offset) const {
  json top = json::object();
  for (const infer::TokenLogprob& t : d.top) top[token_text(tok_, t.token)] = t.logprob;
  if (const std::string sampled = token_text(tok_, d.token); !top.contains(sampled)) top[sampled] = d.logprob;
  return {{"tokens", {token_text(tok_, d.token)}},
          {"token_logprobs", {d.logprob}},
          {"top_logprobs", {top}},
          {"text_offset", {text_offset}}};
}

// Chat's form: the token's text, its UTF-8 bytes, its log-probability and
// the top alternatives in the same form.
json CompletionResponse::chat_logprobs_of(const Delta& d) const {
  const auto one = [&](int32_t token, float logprob) {
    const std::string bytes = tok_ != nullptr && token >= 0 && token < tok_->vocab_size()
                                  ? tok_->token_bytes(token)
                                  : std::string();
    json b = json::array();
    for (unsigned char c : bytes) b.push_back(c);
    return json{{"token", token_text(tok_, token)}, {"logprob", logprob}, {"bytes", b}};
  };
  json entry = one(d.token, d.logprob), top = json::array();
  for (const infer::TokenLogprob& t : d.top) top.push_back(one(t.token, t.logprob));
  entry["top_logprobs"] = std::move(top);
  return {{"content", json::array({entry})}};
}

void CompletionResponse::append_logprobs(json& into, const json& piece) const {
  if (request_.chat) {
    for (const json& v : piece["content"]) into["content"].push_back(v);
    return;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json& v : piece[key]) into[key].push_back(v);
}

json CompletionResponse::envelope(const char* object, json choices) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", request_.model}, {"choices", choices}};
}

json CompletionResponse::chunk(int64_t index, const std::string& text, const json& logprobs,
                               infer::FinishReason finish) const {
  if (!request_.chat)
    return envelope("text_completion", json::array({{{"index", index},
                                                     {"text", text},
                                                     {"logprobs", logprobs},
                                                     {"finish_reason", finish_reason_json(finish)}}}));
  json delta = json::object();
  if (!text.empty() || finish == infer::FinishReason::none) delta["content"] = text;
  return envelope("chat.completion.chunk", json::array({{{"index", index},
                                                         {"delta", delta},
                                                         {"logprobs", logprobs},
                                                         {"finish_reason", finish_reason_json(finish)}}}));
}

std::vector<json> CompletionResponse::role_chunks() const {
  std::vector<json> out;
  for (size_t i = 0; i < choices_.size(); ++i)
    out.push_back(envelope("chat.completion.chunk",
                           json::array({{{"index", i},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}})));
  return out;
}

std::vector<json> CompletionResponse::add(int64_t prompt, const std::vector<Delta>& deltas) {
  std::vector<json> chunks;
  for (const Delta& d : deltas) {
    const int64_t index = prompt * request_.gen.n + d.index;
    Choice& c = choices_.at(static_cast<size_t>(index));
    json lp = nullptr;
    if (d.token >= 0) {
      c.tokens.push_back(d.token);
      if (request_.logprobs) {
        lp = request_.chat ? chat_logprobs_of(d) : logprobs_of(d, static_cast<int64_t>(c.text.size()));
        append_logprobs(c.logprobs, lp);
      }
    }
    c.finish = d.finish;
    if (c.reader) {
      read_delta(index, c, d, lp, chunks);
      continue;
    }
    c.text += d.text;
    if (!d.text.empty() || !lp.is_null() || d.finish != infer::FinishReason::none)
      chunks.push_back(chunk(index, d.text, lp, d.finish));
  }
  return chunks;
}

// The reasoning in a delta of its own, then the content that is certain
// now; at the choice's end what was held back, as calls or as content.
void CompletionResponse::read_delta(int64_t index, Choice& c, const Delta& d, const json& lp,
                                    std::vector<json>& chunks) const {
  OutputPiece p = c.reader->feed(d.text, d.finish != infer::FinishReason::none);
  if (!p.reasoning.empty()) {
    c.reasoning += p.reasoning;
    chunks.push_back(envelope("chat.completion.chunk", json::array({{{"index", index},
                                                                    {"delta", {{"reasoning_content", p.reasoning}}},
                                                                    {"logprobs", nullptr},
                                                                    {"finish_reason", nullptr}}})));
  }
  const std::string& text = p.content;
  c.text += text;
  if (d.finish == infer::FinishReason::none) {
    if (!text.empty() || !lp.is_null()) chunks.push_back(chunk(index, text, lp, d.finish));
    return;
  }
  c.calls = std::move(p.calls);
  if (c.calls.empty()) {
    chunks.push_back(chunk(index, text, lp, d.finish));
    return;
  }
  if (!text.empty() || !lp.is_null()) chunks.push_back(chunk(index, text, lp, infer::FinishReason::none));
  for (size_t k = 0; k < c.calls.size(); ++k) {
    json call = openai_tool_call(c.calls[k]);
    call["index"] = k;
    chunks.push_back(envelope("chat.completion.chunk",
                              json::array({{{"index", index},
                                            {"delta", {{"tool_calls", json::array({call})}}},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}})));
  }
  chunks.push_back(envelope("chat.completion.chunk", json::array({{{"index", index},
                                                                  {"delta", json::object()},
                                                                  {"logprobs", nullptr},
                                                                  {"finish_reason", finish_of(c)}}})));
}

json CompletionResponse::finish_of(const Choice& c) const {
  return c.calls.empty() ? finish_reason_json(c.finish) : json("tool_calls");
}

json CompletionResponse::usage() const {
  int64_t completion = 0;
  for (const Choice& c : choices_) completion += static_cast<int64_t>(c.tokens.size());
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion}};
}

json CompletionResponse::body() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", finish_of(c)}};
    if (request_.chat) {
      const bool blank = c.text.find_first_not_of(" \t\r\n") == std::string::npos;
      choice["message"] = {{"role", "assistant"}, {"content", !c.calls.empty() && blank ? json(nullptr) : json(c.text)}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      for (const ToolCall& call : c.calls) choice["message"]["tool_calls"].push_back(openai_tool_call(call));
    } else {
      choice["text"] = c.text;
    }
    choices.push_back(std::move(choice));
  }
  json out = envelope(request_.chat ? "chat.completion" : "text_completion", std::move(choices));
  out["usage"] = usage();
  return out;
}

json CompletionResponse::usage_chunk() const {
  json out = envelope(request_.chat ? "chat.completion.chunk" : "text_completion", json::array());
  out["usage"] = usage();
  return out;
}

}  // namespace loom::serve
