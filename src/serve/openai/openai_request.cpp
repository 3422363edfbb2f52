#include "serve/openai/openai_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "infer/grammar.h"
#include "serve/openai/request_fields.h"
#include "serve/harmony.h"
#include "serve/structured_output.h"

namespace loom::serve {
namespace fields {

// The field, or null when it is absent or JSON null (the default applies).
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double fallback, double lo, double hi, const char* allowed) {
  const json* f = field(body, name);
  if (f == nullptr) return fallback;
  if (!f->is_number()) throw bad_request(name, cat(name, " must be a number, got ", f->type_name()));
  const double v = f->get<double>();
  if (!(v >= lo && v <= hi)) throw bad_request(name, cat(name, " = ", f->dump(), " is invalid: allowed ", allowed));
  return v;
}

// An integer; a float with an integral value is taken too (as pydantic, and
// so vLLM, does).
int64_t integer(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* f = field(body, name);
  if (f == nullptr) return fallback;
  int64_t v = 0;
  if (f->is_number_unsigned()) {
    v = f->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : f->get<int64_t>();
  } else if (f->is_number_integer()) {
    v = f->get<int64_t>();
  } else if (const double d = f->is_number_float() ? f->get<double>() : 0.5; std::trunc(d) == d && std::abs(d) < 9e18) {
    v = static_cast<int64_t>(d);
  } else {
    throw bad_request(name, cat(name, " must be an integer, got ", f->dump()));
  }
  if (v < lo || v > hi) throw bad_request(name, cat(name, " = ", f->dump(), " is invalid: allowed ", lo, " to ", hi));
  return v;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* f = field(body, name);
  if (f == nullptr) return fallback;
  if (!f->is_boolean()) throw bad_request(name, cat(name, " must be true or false, got ", f->dump()));
  return f->get<bool>();
}

std::string string(const json& body, const char* name) {
  const json* f = field(body, name);
  if (f == nullptr) return {};
  if (!f->is_string()) throw bad_request(name, cat(name, " must be a string, got ", f->type_name()));
  return f->get<std::string>();
}

std::vector<int32_t> token_ids(const json& ids, const char* param, const ServedModel& m) {
  std::vector<int32_t> out;
  for (const json& t : ids) {
    if (!t.is_number_integer())
      throw bad_request(param, cat(param, " holds ", t.dump(), ": token ids are integers"));
    const bool huge = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const int64_t id = huge ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= m.vocab_size)
      throw bad_request(param, cat(param, " holds token id ", id, ": allowed ids are 0 to ", m.vocab_size - 1));
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

std::vector<int32_t> tokenize(const std::string& text, const ServedModel& m) {
  if (m.tokenizer == nullptr)
    throw bad_request("prompt", cat("model ", m.name, " has no tokenizer: send the prompt as token ids"));
  return m.tokenizer->encode_prompt(text);
}

// prompt: a string, a list of strings, a list of token ids or a list of such lists.
std::vector<std::vector<int32_t>> prompts(const json& body, const ServedModel& m) {
  const json* p = field(body, "prompt");
  if (p == nullptr) throw bad_request("prompt", "prompt is required");
  std::vector<std::vector<int32_t>> out;
  const char* shape = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (p->is_string()) {
    out.push_back(tokenize(p->get<std::string>(), m));
  } else if (p->is_array() && !p->empty() && p->front().is_number()) {
    out.push_back(token_ids(*p, "prompt", m));
  } else if (p->is_array() && !p->empty()) {
    if (static_cast<int64_t>(p->size()) > m.max_prompts)
      throw bad_request("prompt", cat("prompt holds ", p->size(), " prompts: at most ", m.max_prompts, " are allowed"));
    for (const json& one : *p) {
      if (one.is_string()) out.push_back(tokenize(one.get<std::string>(), m));
      else if (one.is_array()) out.push_back(token_ids(one, "prompt", m));
      else throw bad_request("prompt", shape);
    }
  } else {
    throw bad_request("prompt", p->is_array() ? std::string("prompt is an empty list") : shape);
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].empty())
      throw bad_request("prompt", out.size() == 1 ? std::string("prompt is empty") : cat("prompt ", i, " is empty"));
  return out;
}

std::vector<std::string> stop_strings(const json& body) {
  const json* f = field(body, "stop");
  if (f == nullptr) return {};
  std::vector<std::string> out;
  if (f->is_string()) out.push_back(f->get<std::string>());
  else if (f->is_array())
    for (const json& s : *f) {
      if (!s.is_string()) throw bad_request("stop", "stop must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  else throw bad_request("stop", "stop must be a string or a list of strings");
  if (out.size() > 16) throw bad_request("stop", cat("stop holds ", out.size(), " strings: at most 16 are allowed"));
  for (const std::string& s : out)
    if (s.empty()) throw bad_request("stop", "stop strings must not be empty");
  return out;
}

// The sampler's fields (OpenAI's ranges; top_k, min_p and
// repetition_penalty are vLLM's extensions, repeat_last_n llama.cpp's).
infer::SamplerConfig sampler(const json& body, uint64_t seed) {
  infer::SamplerConfig s;
  s.temperature = static_cast<float>(number(body, "temperature", 1.0, 0.0, 2.0, "0 to 2"));
  s.top_p = static_cast<float>(number(body, "top_p", 1.0, 0.0, 1.0, "0 to 1"));
  if (s.top_p == 0.f) throw bad_request("top_p", "top_p = 0 is invalid: allowed (0, 1]");
  const int64_t top_k = integer(body, "top_k", 0, -1, INT32_MAX);
  s.top_k = top_k < 0 ? 0 : top_k;  // -1 and 0: every token
  s.min_p = static_cast<float>(number(body, "min_p", 0.0, 0.0, 1.0, "0 to 1"));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", 0.0, -2.0, 2.0, "-2 to 2"));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", 0.0, -2.0, 2.0, "-2 to 2"));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 1.0, 1e-6, 1e6, "> 0"));
  s.repetition_window = integer(body, "repeat_last_n", -1, -1, INT32_MAX);  // llama.cpp server's extension
  s.seed = static_cast<uint64_t>(integer(body, "seed", static_cast<int64_t>(seed >> 1), INT64_MIN, INT64_MAX));
  return s;
}

// logit_bias other than {}: an error rather than a silently different answer.
void refuse_logit_bias(const json& body) {
  if (const json* f = field(body, "logit_bias"); f != nullptr && !(f->is_object() && f->empty()))
    throw bad_request("logit_bias", "logit_bias is not supported");
}

// vLLM's extensions that loom does not implement and that would change the
// answer (guided_regex's output, a stop string kept, the last message
// continued): an error rather than a silently different answer. Those that
// change nothing here (guided_decoding_backend, skip_special_tokens) pass.
void refuse_unsupported_extensions(const json& body) {
  for (const char* name : {"guided_regex", "structured_outputs", "prompt_logprobs", "truncate_prompt_tokens",
                           "logits_processors", "allowed_token_ids", "bad_words"})
    if (const json* f = field(body, name); f != nullptr && !((f->is_array() || f->is_object()) && f->empty()))
      throw bad_request(name, cat(name, " is not supported"));
  for (const char* name : {"include_stop_str_in_output", "continue_final_message", "use_beam_search"})
    if (boolean(body, name, false)) throw bad_request(name, cat(name, " = true is not supported"));
}

// Fields of OpenAI's API that loom does not implement: an error rather than
// a silently different answer.
void refuse_unsupported(const json& body) {
  if (boolean(body, "echo", false)) throw bad_request("echo", "echo is not supported");
  if (integer(body, "best_of", 1, 1, 1 << 20) > 1) throw bad_request("best_of", "best_of > 1 is not supported");
  if (!string(body, "suffix").empty()) throw bad_request("suffix", "suffix is not supported");
  refuse_logit_bias(body);
  refuse_unsupported_extensions(body);
}

}  // namespace fields

using namespace fields;

ApiError::ApiError(int status, std::string type, std::string param, const std::string& message)
    : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}

nlohmann::json ApiError::envelope() const {
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_)},
            {"code", status_}}}};
}

ApiError bad_request(std::string param, const std::string& message) {
  return ApiError(400, "BadRequestError", std::move(param), message);
}

namespace {

// How deep arrays and objects nest in text that may be JSON (brackets inside
// strings skipped). Checked before parsing: nlohmann's parser and the
// destructor of what it builds recurse once per level, so a body of a
// million '[' would overflow the stack of the thread that parses it.
size_t nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

constexpr size_t kMaxJsonDepth = 64;

}  // namespace

json parse_body(std::string_view body) {
  if (nesting_depth(body) > kMaxJsonDepth)
    throw bad_request("", cat("the body nests arrays and objects more than ", kMaxJsonDepth, " levels deep"));
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past double's range
    throw bad_request("", cat("the body is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw bad_request("", cat("the body must be a JSON object, got ", j.type_name()));
  return j;
}

namespace fields {

// model, which must be m's: 404 for another.
std::string model_of(const json& body, const ServedModel& m) {
  const json* model = field(body, "model");
  if (model == nullptr) throw bad_request("model", "model is required");
  if (!model->is_string()) throw bad_request("model", cat("model must be a string, got ", model->type_name()));
  std::string name = model->get<std::string>();
  if (name != m.name) throw ApiError(404, "NotFoundError", "model", cat("The model `", name, "` does not exist."));
  return name;
}

// The fields completions and chat share: sampling, n, stops, streaming.
void generation_fields(const json& body, const ServedModel& m, uint64_t seed, CompletionRequest& r) {
  r.stop = stop_strings(body);
  r.gen.sampler = sampler(body, seed);
  r.gen.n = integer(body, "n", 1, 1, m.max_n);
  r.gen.stop.eos_token_ids = m.eos_token_ids;
  r.gen.stop.ignore_eos = boolean(body, "ignore_eos", false);
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) throw bad_request("stop_token_ids", "stop_token_ids must be a list of token ids");
    r.gen.stop.stop_token_ids = token_ids(*ids, "stop_token_ids", m);
  }
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!r.stream) throw bad_request("stream_options", "stream_options is only allowed with stream = true");
    if (!so->is_object()) throw bad_request("stream_options", "stream_options must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  r.user = string(body, "user");
}

// max_tokens (any positive count; one past the context is refused with both
// numbers, as vLLM words it) and min_tokens. Not given: the fallback, or
// the room the longest prompt leaves when that is less (a count the client
// never asked for is no reason to refuse); a prompt that leaves none is
// refused as too long.
void token_limits(const json& body, const ServedModel& m, const char* name, int64_t fallback, CompletionRequest& r) {
  if (field(body, name) == nullptr) {
    int64_t longest = 0;
    for (const std::vector<int32_t>& p : r.prompts) longest = std::max(longest, static_cast<int64_t>(p.size()));
    const char* what = r.chat ? "messages" : "prompt";
    if (longest >= m.max_model_len)
      throw bad_request(what, cat("This model's maximum context length is ", m.max_model_len, " tokens. However, the ",
                                  what, " take ", longest, " tokens, which leaves no room for the completion. ",
                                  "Please reduce the length of the ", what, "."));
    fallback = std::min(fallback, m.max_model_len - longest);
  }
  r.gen.stop.max_tokens = integer(body, name, fallback, 1, INT32_MAX);
  r.gen.stop.min_tokens = integer(body, "min_tokens", 0, 0, r.gen.stop.max_tokens);
  for (const std::vector<int32_t>& p : r.prompts) {
    const auto len = static_cast<int64_t>(p.size());
    if (len + r.gen.stop.max_tokens > m.max_model_len)
      throw bad_request(name, cat("This model's maximum context length is ", m.max_model_len,
                                  " tokens. However, you requested ", len + r.gen.stop.max_tokens, " tokens (", len,
                                  " in the ", r.chat ? "messages" : "prompt", ", ", r.gen.stop.max_tokens,
                                  " for the completion). Please reduce the length of the ",
                                  r.chat ? "messages" : "prompt", " or ", name, "."));
  }
}

// The grammar the output must follow (grammar: from tool_choice; else what
// response_format or guided_* ask for) into r.gen.grammar.
void structured_output(const json& body, const ServedModel& m, std::string grammar, CompletionRequest& r) {
  std::string param = "tool_choice";
  // A harmony answer is messages: what the schema describes is the final one's text.
  const bool harmony = r.reading.templated && r.reading.format == ToolFormat::harmony;
  if (std::string asked; !(asked = requested_grammar(body, param, harmony ? harmony_final_header() : "")).empty()) {
    if (!grammar.empty()) throw bad_request(param, cat(param, " cannot be used with tool_choice \"required\" or a "
                                                              "named function"));
    grammar = std::move(asked);
  }
  if (grammar.empty()) return;
  if (r.gen.stop.ignore_eos) throw bad_request("ignore_eos", cat("ignore_eos cannot be used with ", param));
  if (m.eos_token_ids.empty() && r.gen.stop.stop_token_ids.empty())
    throw bad_request(param, cat(param, " needs an end token: model ", m.name, " has no EOS; give stop_token_ids"));
  r.gen.grammar = compile_grammar(grammar, m.grammar_vocab, param);
}

}  // namespace fields

CompletionRequest parse_completion(const json& body, const ServedModel& m, uint64_t seed, OutputReading reading) {
  CompletionRequest r;
  r.reading = std::move(reading);
  r.model = model_of(body, m);
  refuse_unsupported(body);
  r.prompts = prompts(body, m);
  generation_fields(body, m, seed, r);
  r.logprobs = field(body, "logprobs") != nullptr;
  r.gen.top_logprobs = integer(body, "logprobs", 0, 0, 20);
  token_limits(body, m, "max_tokens", 16, r);
  structured_output(body, m, {}, r);
  return r;
}

}  // namespace loom::serve
