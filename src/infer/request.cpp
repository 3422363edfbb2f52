#include "infer/request.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
  }
  return "?";
}

void StopParams::validate() const {
  LOOM_REQUIRE(max_tokens >= 1, "max_tokens ", max_tokens, " is not allowed: it must be at least 1");
  LOOM_REQUIRE(min_tokens >= 0 && min_tokens <= max_tokens, "min_tokens ", min_tokens,
               " is not allowed: it must be between 0 and max_tokens (", max_tokens, ")");
  for (int32_t t : eos_token_ids) LOOM_REQUIRE(t >= 0, "eos token id ", t, " is not allowed: ids are >= 0");
  for (int32_t t : stop_token_ids) LOOM_REQUIRE(t >= 0, "stop token id ", t, " is not allowed: ids are >= 0");
}

FinishReason check_stop(const Request& r, int64_t max_model_len) {
  if (r.num_output_tokens() >= 1 && r.num_output_tokens() >= r.stop.min_tokens) {
    const int32_t last = r.tokens.back();
    const auto has = [last](const std::vector<int32_t>& ids) {
      return std::find(ids.begin(), ids.end(), last) != ids.end();
    };
    if ((!r.stop.ignore_eos && has(r.stop.eos_token_ids)) || has(r.stop.stop_token_ids)) return FinishReason::stop;
  }
  if (r.num_output_tokens() >= r.stop.max_tokens || r.num_tokens() >= max_model_len) return FinishReason::length;
  return FinishReason::none;
}

void check_prompt(std::span<const int32_t> prompt, int64_t vocab_size, int64_t max_model_len) {
  LOOM_REQUIRE(!prompt.empty(), "the prompt is empty: it needs at least one token");
  if (vocab_size > 0)
    for (size_t i = 0; i < prompt.size(); ++i)
      LOOM_REQUIRE(prompt[i] >= 0 && prompt[i] < vocab_size, "prompt token ", i, " is ", prompt[i],
                   ": allowed ids are 0 to ", vocab_size - 1);
  LOOM_REQUIRE(static_cast<int64_t>(prompt.size()) < max_model_len, "the prompt has ", prompt.size(),
               " tokens, which leaves no room for a new token: the context (max_model_len) is ", max_model_len,
               " tokens");
}

}  // namespace loom::infer
