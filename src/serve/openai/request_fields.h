// The request fields /v1/completions and /v1/chat/completions share, and
// the readers every field goes through (openai_request.cpp,
// openai_chat_request.cpp; embeddings.cpp reads with field()): each checks a
// field's type and range and throws ApiError (400) naming it, as vLLM does.
// Private to src/serve.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/sampler.h"
#include "serve/openai/openai_request.h"

namespace loom::serve::fields {

using json = nlohmann::ordered_json;

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// The field, or null when it is absent or JSON null (the default applies).
const json* field(const json& body, const char* name);
// A number in [lo, hi] (allowed: how the range reads in the error).
double number(const json& body, const char* name, double fallback, double lo, double hi, const char* allowed);
// An integer in [lo, hi]; a float with an integral value is taken too (as pydantic, and so vLLM, does).
int64_t integer(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi);
bool boolean(const json& body, const char* name, bool fallback);
std::string string(const json& body, const char* name);  // "" when absent
// A list of token ids of m's vocabulary (param names the field in errors).
std::vector<int32_t> token_ids(const json& ids, const char* param, const ServedModel& m);
// prompt: a string, a list of strings, a list of token ids or a list of such lists.
std::vector<std::vector<int32_t>> prompts(const json& body, const ServedModel& m);
std::vector<std::string> stop_strings(const json& body);
// The sampler's fields (OpenAI's ranges; top_k, min_p and repetition_penalty are vLLM's).
infer::SamplerConfig sampler(const json& body, uint64_t seed);
// logit_bias other than {}: an error rather than a silently different answer.
void refuse_logit_bias(const json& body);
// vLLM's extensions loom does not implement that would change the answer
// (guided_regex, include_stop_str_in_output, continue_final_message, ...).
void refuse_unsupported_extensions(const json& body);
// Fields of OpenAI's API loom does not implement (echo, best_of > 1, suffix,
// logit_bias), and the extensions above.
void refuse_unsupported(const json& body);
// model, which must be m's: 404 for another.
std::string model_of(const json& body, const ServedModel& m);
// The fields completions and chat share: sampling, n, stops, streaming.
void generation_fields(const json& body, const ServedModel& m, uint64_t seed, CompletionRequest& r);
// max_tokens (name: or max_completion_tokens) and min_tokens against the context.
void token_limits(const json& body, const ServedModel& m, const char* name, int64_t fallback, CompletionRequest& r);
// The grammar the output must follow (grammar: from tool_choice; else what
// response_format or guided_* ask for) into r.gen.grammar.
void structured_output(const json& body, const ServedModel& m, std::string grammar, CompletionRequest& r);

}  // namespace loom::serve::fields
