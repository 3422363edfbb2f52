#include "serve/embeddings.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "serve/ollama/ollama_format.h"
#include "serve/openai/request_fields.h"
#include "serve/openai/openai_response.h"

namespace loom::serve {

namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;
using fields::field;

constexpr size_t kMaxInputs = 2048;  // OpenAI's limit on inputs per request

// The input field of a route: OpenAI's "input" (text or token ids), ollama's
// "input" (text) or the older route's "prompt" (one text).
const char* input_name(EmbedRoute route) { return route == EmbedRoute::ollama_embeddings ? "prompt" : "input"; }

// Every input as given: strings, or token-id lists (OpenAI only). Checks
// the shape, not the tokens.
void check_input_shape(const ojson* in, EmbedRoute route) {
  const char* name = input_name(route);
  const bool ids = route == EmbedRoute::openai;
  const std::string shape = route == EmbedRoute::openai
                                ? "input must be a string, a list of strings, a list of token ids or a list of lists "
                                  "of token ids"
                            : route == EmbedRoute::ollama_embed ? "input must be a string or a list of strings"
                                                                : "prompt must be a string";
  if (in == nullptr) {
    if (route == EmbedRoute::openai) throw bad_request(name, "input is required");
    return;  // ollama: only loads the model
  }
  if (in->is_string()) return;
  if (!in->is_array() || route == EmbedRoute::ollama_embeddings) throw bad_request(name, shape);
  if (in->empty() && route == EmbedRoute::openai) throw bad_request(name, "input is an empty list");
  if (in->size() > kMaxInputs)
    throw bad_request(name, "input holds " + std::to_string(in->size()) + " inputs: at most " +
                                std::to_string(kMaxInputs) + " are allowed");
  if (ids && !in->empty() && in->front().is_number()) return;  // one list of token ids, checked with the model
  for (const ojson& one : *in)
    if (!one.is_string() && !(ids && one.is_array())) throw bad_request(name, shape);
}

std::vector<int32_t> token_ids(const ojson& list, size_t i, int64_t vocab_size) {
  std::vector<int32_t> out;
  for (const ojson& t : list) {
    const bool fits = t.is_number_integer() && !(t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX);
    const int64_t id = fits ? t.get<int64_t>() : -1;
    if (!fits || id < 0 || id >= vocab_size)
      throw bad_request("input", "input " + std::to_string(i) + " holds " + t.dump() +
                                     ": token ids are integers from 0 to " + std::to_string(vocab_size - 1));
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

// The shortest decimal that reads back as the same f32 (JSON has no NaN).
void append_float(std::string& out, float v) {
  if (!std::isfinite(v))
    throw ApiError(500, "InternalServerError", "", "the model computed a non-finite embedding");
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

std::string floats_json(const std::vector<float>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ',';
    append_float(out, v[i]);
  }
  return out + "]";
}

}  // namespace

std::vector<float> unit_length(std::vector<float> v) {
  double sum = 0;
  for (float x : v) sum += double(x) * x;
  if (sum > 0) {
    const double scale = 1.0 / std::sqrt(sum);
    for (float& x : v) x = static_cast<float>(x * scale);
  }
  return v;
}

std::string base64_floats(const std::vector<float>& v) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  for (size_t i = 0; i < v.size(); ++i) {  // little-endian whatever the host
    uint32_t u;
    std::memcpy(&u, &v[i], sizeof u);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < 3; ++k) chunk = chunk << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(chunk >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

EmbeddingFormat::EmbeddingFormat(ojson body, EmbedRoute route, std::string id)
    : body_(std::move(body)), route_(route), id_(std::move(id)) {}

void EmbeddingFormat::precheck() const {
  check_input_shape(field(body_, input_name(route_)), route_);
  if (route_ == EmbedRoute::ollama_embeddings) return;
  if (const ojson* d = field(body_, "dimensions"); d != nullptr && !(d->is_number_integer() && d->get<int64_t>() >= 1))
    throw bad_request("dimensions", "dimensions must be a positive integer, got " + d->dump());
  if (route_ == EmbedRoute::openai) {
    const ojson* e = field(body_, "encoding_format");
    if (e != nullptr && *e != ojson("float") && *e != ojson("base64"))
      throw bad_request("encoding_format", "encoding_format must be \"float\" or \"base64\", got " + e->dump());
  } else if (const ojson* t = field(body_, "truncate"); t != nullptr && !t->is_boolean()) {
    throw bad_request("truncate", "truncate must be true or false, got " + t->dump());
  }
}

bool EmbeddingFormat::generates() const {
  const ojson* in = field(body_, input_name(route_));
  if (route_ == EmbedRoute::openai) return true;
  return in != nullptr && !(in->is_string() && in->get<std::string>().empty()) && !(in->is_array() && in->empty());
}

void EmbeddingFormat::loaded(const LoadedModel& m, std::string& out) {
  out += route_ == EmbedRoute::ollama_embeddings ? std::string("{\"embedding\":[]}")
                                                 : dump(json{{"model", body_["model"]}, {"embeddings", json::array()}});
}

// The inputs' token ids, checked against the model (and cut to its context
// where ollama's truncate allows).
std::vector<std::vector<int32_t>> EmbeddingFormat::inputs(const LoadedModel& m) const {
  const ojson& in = *field(body_, input_name(route_));
  const ServedModel served = route_ == EmbedRoute::openai ? m.served : bounded(body_, m);
  const auto text = [&](const ojson& s) {
    if (served.tokenizer == nullptr)
      throw bad_request("input", "model " + m.name + " has no tokenizer: send the input as token ids");
    return served.tokenizer->encode_prompt(s.get<std::string>());
  };
  std::vector<std::vector<int32_t>> out;
  if (in.is_string()) out.push_back(text(in));
  else if (!in.empty() && in.front().is_number()) out.push_back(token_ids(in, 0, served.vocab_size));
  else
    for (size_t i = 0; i < in.size(); ++i)
      out.push_back(in[i].is_string() ? text(in[i]) : token_ids(in[i], i, served.vocab_size));
  const int64_t room = served.max_model_len - 1;  // the engine keeps one position free in every sequence
  const bool truncate = route_ != EmbedRoute::openai && body_.value("truncate", ojson(true)) == ojson(true);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty())
      throw bad_request(input_name(route_), "input " + std::to_string(i) + " is empty: it needs at least one token");
    if (static_cast<int64_t>(out[i].size()) <= room) continue;
    if (truncate) out[i].resize(static_cast<size_t>(room));
    else
      throw bad_request(input_name(route_),
                        "input " + std::to_string(i) + " has " + std::to_string(out[i].size()) +
                            " tokens: this model embeds at most " + std::to_string(room) + " (its context " +
                            std::to_string(served.max_model_len) + " less one)" +
                            (route_ == EmbedRoute::openai ? "" : "; truncate: true cuts it to fit"));
  }
  return out;
}

CompletionRequest EmbeddingFormat::parse(const LoadedModel& m, uint64_t seed) {
  (void)seed;
  model_ = body_["model"].get<std::string>();  // as the client named it (the chat routes echo it so too)
  if (const ojson* d = field(body_, "dimensions"); d != nullptr && route_ != EmbedRoute::ollama_embeddings) {
    dimensions_ = d->get<int64_t>();
    if (dimensions_ > m.config.n_embd)
      throw bad_request("dimensions", "dimensions " + std::to_string(dimensions_) + " is more than model " + m.name +
                                          "'s embedding size " + std::to_string(m.config.n_embd));
  }
  base64_ = route_ == EmbedRoute::openai && body_.value("encoding_format", ojson("float")) == ojson("base64");
  CompletionRequest r;
  r.model = model_;
  r.prompts = inputs(m);
  r.gen.pooling = m.served.embedding_pooling;
  r.gen.stop.max_tokens = 1;
  for (const auto& p : r.prompts) prompt_tokens_ += static_cast<int64_t>(p.size());
  vectors_.assign(r.prompts.size(), {});
  return r;
}

void EmbeddingFormat::begin(const CompletionRequest& r, const LoadedModel& m, std::string& out) {
  (void)r, (void)m, (void)out;  // the body is written whole at the end
}

void EmbeddingFormat::add(int64_t p, const std::vector<Delta>& deltas, std::string& out) {
  (void)out;
  for (const Delta& d : deltas) {
    if (d.finish == infer::FinishReason::abort)
      throw ApiError(503, "ServiceUnavailableError", "", "the server stopped before the embedding was computed");
    if (!d.embedding.empty()) vectors_[static_cast<size_t>(p)] = d.embedding;
  }
}

void EmbeddingFormat::end(const GenerationTimes& t, std::string& out) {
  std::vector<std::string> vectors;
  for (std::vector<float> v : vectors_) {
    if (route_ != EmbedRoute::ollama_embeddings) {
      if (dimensions_ > 0) v.resize(static_cast<size_t>(dimensions_));
      v = unit_length(std::move(v));
    }
    vectors.push_back(base64_ ? dump(json(base64_floats(v))) : floats_json(v));
  }
  if (route_ == EmbedRoute::ollama_embeddings) {
    out += "{\"embedding\":" + vectors.at(0) + "}";
  } else if (route_ == EmbedRoute::ollama_embed) {
    out += "{\"model\":" + dump(json(model_)) + ",\"embeddings\":[";
    for (size_t i = 0; i < vectors.size(); ++i) out += (i > 0 ? "," : "") + vectors[i];
    out += "],\"total_duration\":" + std::to_string(ns(t.received, t.end)) +
           ",\"load_duration\":" + std::to_string(ns(t.received, t.model_ready)) +
           ",\"prompt_eval_count\":" + std::to_string(prompt_tokens_) + "}";
  } else {
    out += "{\"object\":\"list\",\"data\":[";
    for (size_t i = 0; i < vectors.size(); ++i)
      out += std::string(i > 0 ? "," : "") + "{\"object\":\"embedding\",\"index\":" + std::to_string(i) +
             ",\"embedding\":" + vectors[i] + "}";
    out += "],\"model\":" + dump(json(model_)) + ",\"usage\":" +
           dump(json{{"prompt_tokens", prompt_tokens_}, {"total_tokens", prompt_tokens_}}) + "}";
  }
}

std::string EmbeddingFormat::error_body(const ApiError& e, bool begun) const {
  (void)begun;
  return route_ == EmbedRoute::openai ? dump(e.envelope()) : dump(json{{"error", e.what()}});
}

json EmbeddingFormat::usage() const { return {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", 0}}; }

}  // namespace loom::serve
