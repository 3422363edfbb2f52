#include "serve/openai_response.h"

#include <cstdio>
#include <utility>

#include "infer/text_stream.h"

namespace loom::serve {

using json = nlohmann::json;

std::string token_text(const text::Gpt2Tokenizer* tok, int32_t token) {
  if (tok == nullptr || token < 0 || token >= tok->vocab_size()) {
    std::string id = "<";  // appended, not operator+: GCC 12 warns falsely (-Wrestrict) on "<" + s + ">"
    id += std::to_string(token);
    id += '>';
    return id;
  }
  const std::string bytes = tok->decode(std::span<const int32_t>(&token, 1));
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
  return nullptr;
}

CompletionResponse::CompletionResponse(const CompletionRequest& request, std::string id, int64_t created,
                                       const text::Gpt2Tokenizer* tok)
    : request_(request), id_(std::move(id)), created_(created), tok_(tok) {
  choices_.resize(request.prompts.size() * static_cast<size_t>(request.gen.n));
  for (Choice& c : choices_)
    if (request.logprobs)
      c.logprobs = {{"tokens", json::array()},
                    {"token_logprobs", json::array()},
                    {"top_logprobs", json::array()},
                    {"text_offset", json::array()}};
  for (const std::vector<int32_t>& p : request.prompts) prompt_tokens_ += static_cast<int64_t>(p.size());
}

// The legacy logprobs of one token: its text, log-probability, the top
// alternatives (text -> logprob) and where its text starts in the choice.
json CompletionResponse::logprobs_of(const Delta& d, int64_t text_offset) const {
  json top = json::object();
  for (const infer::TokenLogprob& t : d.top) top[token_text(tok_, t.token)] = t.logprob;
  return {{"tokens", {token_text(tok_, d.token)}},
          {"token_logprobs", {d.logprob}},
          {"top_logprobs", {top}},
          {"text_offset", {text_offset}}};
}

void CompletionResponse::append_logprobs(json& into, const json& piece) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json& v : piece[key]) into[key].push_back(v);
}

json CompletionResponse::chunk(int64_t index, const std::string& text, const json& logprobs,
                               infer::FinishReason finish) const {
  const json choice = {
      {"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason_json(finish)}};
  return {{"id", id_},
          {"object", "text_completion"},
          {"created", created_},
          {"model", request_.model},
          {"choices", json::array({choice})}};
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
        lp = logprobs_of(d, static_cast<int64_t>(c.text.size()));
        append_logprobs(c.logprobs, lp);
      }
    }
    c.text += d.text;
    c.finish = d.finish;
    if (!d.text.empty() || !lp.is_null() || d.finish != infer::FinishReason::none)
      chunks.push_back(chunk(index, d.text, lp, d.finish));
  }
  return chunks;
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
    choices.push_back(
        {{"index", i}, {"text", c.text}, {"logprobs", c.logprobs}, {"finish_reason", finish_reason_json(c.finish)}});
  }
  return {{"id", id_},          {"object", "text_completion"}, {"created", created_},
          {"model", request_.model}, {"choices", choices},          {"usage", usage()}};
}

json CompletionResponse::usage_chunk() const {
  return {{"id", id_},
          {"object", "text_completion"},
          {"created", created_},
          {"model", request_.model},
          {"choices", json::array()},
          {"usage", usage()}};
}

}  // namespace loom::serve
