#include "serve/ollama/ollama_format.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <utility>

#include "core/error.h"
#include "serve/openai/openai_format.h"
#include "serve/openai/openai_response.h"
#include "serve/reasoning.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// ollama's option names -> the OpenAI fields parse_completion / parse_chat read.
const std::pair<const char*, const char*> kOptions[] = {
    {"temperature", "temperature"}, {"top_k", "top_k"}, {"top_p", "top_p"}, {"min_p", "min_p"}, {"seed", "seed"},
    {"num_predict", "max_tokens"}, {"stop", "stop"}, {"repeat_penalty", "repetition_penalty"},
    {"repeat_last_n", "repeat_last_n"}, {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"}};


// A Go-style duration: "300ms", "10s", "5m", "1h30m", "-1m", or a bare number of seconds.
std::optional<double> duration_seconds(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  const bool negative = s[0] == '-';
  if (negative || s[0] == '+') ++i;
  double total = 0;
  bool any = false;
  while (i < s.size()) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s.substr(i), &used);
    } catch (...) {
      return std::nullopt;
    }
    i += used;
    size_t u = i;
    while (u < s.size() && std::isalpha(static_cast<unsigned char>(s[u]))) ++u;
    const std::string unit = s.substr(i, u - i);
    const double scale = unit == "ns" ? 1e-9 : unit == "us" || unit == "µs" ? 1e-6 : unit == "ms" ? 1e-3
                       : unit == "s" || (unit.empty() && u == s.size() && !any) ? 1.0 : unit == "m" ? 60.0
                       : unit == "h" ? 3600.0 : -1.0;
    if (scale < 0 || !std::isfinite(v) || v < 0) return std::nullopt;
    total += v * scale;
    any = true;
    i = u;
  }
  return negative ? -total : total;
}

}  // namespace

std::optional<std::chrono::seconds> parse_keep_alive(const ojson& body) {
  const auto it = body.find("keep_alive");
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::optional<double> seconds;
  if (it->is_number()) seconds = it->get<double>();
  else if (it->is_string()) seconds = duration_seconds(it->get<std::string>());
  if (!seconds || !std::isfinite(*seconds) || std::abs(*seconds) > 1e10)
    throw ApiError(400, "BadRequestError", "keep_alive",
                   "keep_alive must be a number of seconds or a duration such as \"5m\", \"1h\", \"0\", \"-1\"; got " +
                       it->dump());
  return std::chrono::seconds(*seconds < 0 ? -1 : static_cast<int64_t>(std::ceil(*seconds)));
}

HttpResponse ollama_error(const ApiError& e) {
  HttpResponse r;
  r.status = e.status();
  r.body = dump(json{{"error", e.what()}});
  return r;
}

std::string required_string(const ojson& body, const char* a, const char* b) {
  for (const char* k : {a, b}) {
    if (k == nullptr || !body.contains(k) || body[k].is_null()) continue;
    if (!body[k].is_string()) throw bad_request(k, std::string(k) + " must be a string");
    return body[k];
  }
  throw bad_request(a, std::string(a) + " is required");
}

namespace {
template <typename Json>
bool flag_of(const Json& body, const char* key, bool absent) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absent;
  if (!it->is_boolean()) throw bad_request(key, std::string(key) + " must be true or false");
  return it->template get<bool>();
}
}  // namespace

bool flag(const ojson& body, const char* key, bool absent) { return flag_of(body, key, absent); }
bool flag(const json& body, const char* key, bool absent) { return flag_of(body, key, absent); }

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) std::snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
  else if (n >= 1'000'000) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  return buf;
}

ModelName model_name_of(const std::string& text) {
  try {
    return ModelName::parse(text);
  } catch (const loom::Error& e) {
    throw bad_request("model", e.what());
  }
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count() % 1'000'000'000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(nanos));
  return buf;
}

OllamaFormat::OllamaFormat(ojson body, bool chat) : body_(std::move(body)), chat_(chat) {
  model_ = body_.value("model", ojson("")).is_string() ? body_.value("model", "") : "";
  stream_ = flag(body_, "stream", true);
  const ojson empty = chat_ ? body_.value("messages", ojson::array()) : body_.value("prompt", ojson(""));
  generates_ = !(empty.is_null() || (empty.is_string() && empty.get<std::string>().empty()) ||
                 (empty.is_array() && empty.empty()));
}

namespace {

// The OpenAI fields of an ollama body: options under their OpenAI names,
// format as response_format, tools (a chat's only).
ojson openai_fields(const ojson& body, const std::string& model, bool stream, bool chat) {
  ojson openai = {{"model", model}, {"stream", stream}};
  if (body.contains("options") && !body["options"].is_null()) {
    if (!body["options"].is_object()) throw bad_request("options", "options must be an object");
    for (const auto& [ollama, field] : kOptions)
      if (body["options"].contains(ollama) && !body["options"][ollama].is_null()) openai[field] = body["options"][ollama];
    // A Modelfile's rule for requests too: no mirostat sampling, refused rather than ignored.
    const ojson& mirostat = body["options"].value("mirostat", ojson());
    if (!mirostat.is_null() && mirostat != ojson(0))
      throw bad_request("options.mirostat", "options.mirostat = " + mirostat.dump() + " is not supported: loom has "
                        "no mirostat sampling (only 0, off); it samples with temperature, top_k, top_p and min_p");
  }
  for (const char* refused : {"images", "suffix"})
    if (body.contains(refused) && !body[refused].is_null() && body[refused] != ojson("") &&
        body[refused] != ojson::array())
      throw bad_request(refused, std::string(refused) + " is not supported");
  if (const auto f = body.find("format"); f != body.end() && !f->is_null() && *f != ojson("")) {
    if (*f == ojson("json")) openai["response_format"] = {{"type", "json_object"}};
    else if (f->is_object()) openai["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", *f}}}};
    else throw bad_request("format", "format must be \"json\" or a JSON schema, got " + f->dump());
  }
  if (body.contains("tools")) {
    if (!chat) throw bad_request("tools", "tools are offered in /api/chat, not /api/generate");
    openai["tools"] = body["tools"];
  }
  if (body.contains("tool_choice")) openai["tool_choice"] = body["tool_choice"];  // loom's extension: OpenAI's field
  if (openai.contains("max_tokens") && openai["max_tokens"].is_number() && openai["max_tokens"].get<double>() < 0)
    openai.erase("max_tokens");  // -1 (and -2): as many as the context holds
  return openai;
}

}  // namespace

namespace {

// options.num_ctx (or the Modelfile's PARAMETER num_ctx): the context a
// request may use, at most the model's.
// options.num_ctx, checked (a positive integer); null when not given.
ojson requested_num_ctx(const ojson& body) {
  if (!body.contains("options") || !body["options"].is_object() || !body["options"].contains("num_ctx")) return {};
  const ojson& n = body["options"]["num_ctx"];
  if (!n.is_null() && !(n.is_number_integer() && n.get<int64_t>() >= 1))
    throw bad_request("options.num_ctx", "options.num_ctx must be a positive integer, got " + n.dump());
  return n;
}

}  // namespace

ServedModel bounded(const ojson& body, const LoadedModel& m) {
  ServedModel served = m.served;
  ojson n = requested_num_ctx(body);
  if (n.is_null() && m.parameters.contains("num_ctx")) n = ojson(m.parameters["num_ctx"]);  // checked by the Modelfile
  if (!n.is_null()) served.max_model_len = std::min(served.max_model_len, n.get<int64_t>());
  return served;
}

namespace {

// think: true or false, or a level "low" / "medium" / "high" (gpt-oss's
// reasoning_effort, thinking on); null: absent. The template's
// enable_thinking, and when on the think block split from the answer
// (reasoning.h); on only for a template that thinks.
// m null: the check that needs no model.
ojson think_of(const ojson& body, const LoadedModel* m) {
  const auto t = body.find("think");
  if (t == body.end() || t->is_null()) return nullptr;
  const bool level = t->is_string() && (*t == "low" || *t == "medium" || *t == "high");
  if (!t->is_boolean() && !level)
    throw bad_request("think", "think must be true, false, or a level (\"low\", \"medium\", \"high\"), got " +
                                   t->dump());
  if (m != nullptr && *t != ojson(false) && !m->served.thinks)
    throw bad_request("think", "model \"" + m->name + "\" does not support thinking");
  return *t;
}

// /api/generate's context: the token ids a previous answer returned, put
// before this prompt's (encoded without BOS: it continues them).
std::vector<int32_t> context_ids(const ojson& body, const ServedModel& m) {
  const auto c = body.find("context");
  if (c == body.end() || c->is_null() || (c->is_array() && c->empty())) return {};
  if (!c->is_array()) throw bad_request("context", "context must be a list of token ids");
  std::vector<int32_t> ids;
  for (const ojson& t : *c) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.vocab_size)
      throw bad_request("context", "context holds " + t.dump() + ": token ids are 0 to " +
                                       std::to_string(m.vocab_size - 1));
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

// An error about an OpenAI field, in the name the ollama request used.
[[noreturn]] void rethrow_in_ollama_names(const ApiError& e) {
  for (const auto& [ollama, field] : kOptions)
    if (e.param() == field) throw ApiError(e.status(), e.type(), std::string("options.") + ollama,
                                           std::string("options.") + ollama + ": " + e.what());
  if (e.param().starts_with("response_format")) throw ApiError(e.status(), e.type(), "format", e.what());
  throw e;
}

}  // namespace

void OllamaFormat::precheck() const {
  try {
    ojson openai = openai_fields(body_, model_, stream_, chat_);
    if (chat_) openai["messages"] = body_.value("messages", ojson::array());
    serve::precheck(openai, chat_);
    (void)requested_num_ctx(body_);
    (void)think_of(body_, nullptr);
  } catch (const ApiError& e) {
    rethrow_in_ollama_names(e);
  }
}

CompletionRequest OllamaFormat::parse(const LoadedModel& m, uint64_t seed) {
  ojson openai = openai_fields(body_, m.served.name, stream_, chat_);
  try {
    const ojson think = think_of(body_, &m);
    if (!think.is_null()) openai["chat_template_kwargs"] = {{"enable_thinking", think != ojson(false)}};
    if (think.is_string()) openai["reasoning_effort"] = think;  // a level: gpt-oss's template reads it
    const ServedModel served = bounded(body_, m);
    CompletionRequest r = chat_ ? parse_chat_body(openai, m, served, seed) : parse_generate_body(openai, m, served, seed);
    r.reading.split_reasoning = !think.is_null() && think != ojson(false);  // ollama splits only when asked to
    r.reading.think_tags = m.served.think_tags;
    hide_thinking_ = think == ojson(false);
    prompt_tokens_ = static_cast<int64_t>(r.prompts[0].size());
    if (!chat_) context_ = r.prompts[0];
    return r;
  } catch (const ApiError& e) {
    rethrow_in_ollama_names(e);
  }
}

CompletionRequest OllamaFormat::parse_chat_body(ojson& openai, const LoadedModel& m, const ServedModel& served,
                                                uint64_t seed) {
  openai["messages"] = body_.value("messages", ojson::array());
  if (openai["messages"].is_array())
    for (const ojson& msg : openai["messages"])
      if (msg.is_object() && msg.contains("images") && !msg["images"].is_null() && !msg["images"].empty())
        throw bad_request("messages", "images are not supported: loom's models read text only");
  apply_model_defaults(openai, m, true);
  return parse_chat(openai, served, seed);
}

// The prompt through the model's template (unless raw) with the system
// prompt (the request's, else the Modelfile's; a model without a template
// of its own gets it as a first paragraph), after any context.
CompletionRequest OllamaFormat::parse_generate_body(ojson& openai, const LoadedModel& m, const ServedModel& served,
                                                    uint64_t seed) {
  const ojson& p = body_["prompt"];
  if (!p.is_string()) throw bad_request("prompt", "prompt must be a string");
  std::string text = p.get<std::string>();
  const bool raw = flag(body_, "raw", false);
  const std::string system = body_.value("system", ojson(m.system)).is_string() ? body_.value("system", m.system)
                                                                                : m.system;
  std::vector<std::string> template_stops;
  bool reasoning_inside = false;
  if (!raw && m.templated) {
    ojson messages = ojson::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    messages.push_back({{"role", "user"}, {"content", text}});
    ojson kwargs = openai.value("chat_template_kwargs", ojson());
    if (openai.contains("reasoning_effort")) kwargs["reasoning_effort"] = openai["reasoning_effort"];
    text = served.render_chat(messages, nullptr, true, kwargs);
    template_stops = served.chat_stop;
    reasoning_inside = prompt_opens_think(text, served.think_tags);
  } else if (!raw && !system.empty()) {
    text = system + "\n\n" + text;
  }
  const std::vector<int32_t> context = context_ids(body_, served);
  if (!context.empty() && served.tokenizer != nullptr) {
    std::vector<int32_t> ids = context;
    for (int32_t t : served.tokenizer->encode_special(text)) ids.push_back(t);
    openai["prompt"] = ids;
  } else {
    openai["prompt"] = text;
  }
  apply_model_defaults(openai, m, false);
  if (!openai.contains("max_tokens") && served.tokenizer != nullptr) {
    const auto len = static_cast<int64_t>(openai["prompt"].is_array() ? openai["prompt"].size()
                                                                       : served.tokenizer->encode_prompt(text).size());
    if (len >= served.max_model_len)
      throw bad_request("prompt", "the prompt takes " + std::to_string(len) + " tokens, which fills the model's " +
                                      "context of " + std::to_string(served.max_model_len) +
                                      " tokens (options.num_ctx): shorten the prompt or raise num_ctx");
    openai["max_tokens"] = served.max_model_len - len;
  }
  openai.erase("chat_template_kwargs");  // the template's, not /v1/completions'
  // The template's answer: a family that frames every answer is read (chat_output.h).
  OutputReading reading;
  if (!raw && m.templated) reading.format = served.tool_format, reading.templated = true;
  reading.reasoning_inside = reasoning_inside;
  CompletionRequest r = parse_completion(openai, served, seed, std::move(reading));
  for (const std::string& s : template_stops) r.stop.push_back(s);
  return r;
}

json OllamaFormat::piece(const std::string& text, bool done, const std::string& thinking) const {
  json j = {{"model", model_}, {"created_at", rfc3339(std::chrono::system_clock::now())}};
  if (chat_) j["message"] = {{"role", "assistant"}, {"content", text}};
  else j["response"] = text;
  if (!thinking.empty()) (chat_ ? j["message"]["thinking"] : j["thinking"]) = thinking;
  j["done"] = done;
  return j;
}

void OllamaFormat::loaded(const LoadedModel& m, std::string& out) {
  json j = piece("", true);
  j["model"] = m.name;
  j["done_reason"] = "load";
  out += dump(j) + "\n";
}

void OllamaFormat::begin(const CompletionRequest& r, const LoadedModel& m, std::string&) {
  if (model_.empty()) model_ = m.name;
  reader_ = output_reader(r.reading, r.seed);
}

json OllamaFormat::tool_calls() const {
  json out = json::array();
  for (size_t i = 0; i < calls_.size(); ++i)
    out.push_back({{"id", calls_[i].id},
                   {"function", {{"index", i}, {"name", calls_[i].name}, {"arguments", calls_[i].arguments}}}});
  return out;
}

void OllamaFormat::add(int64_t, const std::vector<Delta>& deltas, std::string& out) {
  for (const Delta& d : deltas) {
    if (d.token >= 0) ++completion_tokens_;
    if (d.token >= 0 && !chat_) context_.push_back(d.token);
    if (d.finish != infer::FinishReason::none) finish_ = d.finish;
    OutputPiece p = reader_ ? reader_->feed(d.text, d.finish != infer::FinishReason::none) : OutputPiece{{}, d.text, {}};
    if (!hide_thinking_) thinking_ += p.reasoning;
    if (stream_ && !hide_thinking_ && !p.reasoning.empty()) out += dump(piece("", false, p.reasoning)) + "\n";
    const std::string& text = p.content;
    if (!p.calls.empty()) calls_ = std::move(p.calls);
    text_ += text;
    if (stream_ && !text.empty()) out += dump(piece(text, false)) + "\n";
    if (stream_ && !calls_.empty() && d.finish != infer::FinishReason::none) {
      json j = piece("", false);
      j["message"]["tool_calls"] = tool_calls();
      out += dump(j) + "\n";
    }
  }
}

void OllamaFormat::end(const GenerationTimes& t, std::string& out) {
  json j = piece(stream_ ? std::string() : text_, true, stream_ ? std::string() : thinking_);
  if (!stream_ && !calls_.empty()) j["message"]["tool_calls"] = tool_calls();
  if (!chat_) j["context"] = context_;  // the conversation so far, for the next request's context
  j["done_reason"] = finish_ == infer::FinishReason::length  ? "length"
                    : finish_ == infer::FinishReason::abort ? "abort"  // cut by the server's drain deadline
                                                            : "stop";
  j["total_duration"] = ns(t.received, t.end);
  j["load_duration"] = ns(t.received, t.model_ready);
  j["prompt_eval_count"] = prompt_tokens_;
  j["prompt_eval_duration"] = ns(t.model_ready, t.first_token);
  j["eval_count"] = completion_tokens_;
  j["eval_duration"] = ns(t.first_token, t.end);
  out += dump(j) + "\n";
}

std::string OllamaFormat::error_body(const ApiError& e, bool begun) const {
  return dump(json{{"error", e.what()}}) + (begun ? "\n" : "");
}

json OllamaFormat::usage() const {
  return {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", completion_tokens_}};
}

int64_t ns(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  using Clock = std::chrono::steady_clock;
  return a == Clock::time_point{} || b == Clock::time_point{} || b < a
             ? 0
             : std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

}  // namespace loom::serve
