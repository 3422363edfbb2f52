#include "infer/generate.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

void GenerateOptions::validate() const {
  LOOM_REQUIRE(max_tokens >= 0, "max-tokens = ", max_tokens, " is invalid: allowed values are >= 0");
}

int64_t generate_capacity(int64_t prompt_tokens, const GenerateOptions& opts, int64_t max_seq_len) {
  LOOM_CHECK(prompt_tokens >= 1 && opts.max_tokens >= 0 && max_seq_len >= 1, "prompt ", prompt_tokens,
             ", max tokens ", opts.max_tokens, ", max_seq_len ", max_seq_len);
  // Capped one term at a time: max_tokens may be near INT64_MAX.
  return std::min(max_seq_len, prompt_tokens + std::min(opts.max_tokens, max_seq_len));
}

GenerateResult generate(model::Decoder& decoder, Sampler& sampler, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, const std::function<void(int32_t)>& on_token) {
  opts.validate();
  LOOM_REQUIRE(!prompt.empty(), "the prompt has no tokens: give at least one");
  GenerateResult r;
  Tensor logits = decoder.prefill(prompt);  // (V)
  const size_t V = static_cast<size_t>(logits.numel());
  while (static_cast<int64_t>(r.tokens.size()) < opts.max_tokens) {
    const int32_t token = sampler.sample(std::span<const float>(logits.data_as<float>(), V));
    if (token == opts.stop_token) {
      r.reason = StopReason::stop_token;
      return r;
    }
    r.tokens.push_back(token);
    if (on_token) on_token(token);
    if (static_cast<int64_t>(r.tokens.size()) == opts.max_tokens) break;
    if (decoder.position() == decoder.capacity()) {
      r.reason = StopReason::cache_full;
      return r;
    }
    logits = decoder.decode_step(token);
  }
  r.reason = StopReason::max_tokens;
  return r;
}

}  // namespace loom::infer
