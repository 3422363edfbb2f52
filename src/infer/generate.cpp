#include "infer/generate.h"

#include "core/error.h"

namespace loom::infer {

GenerateResult generate(model::Decoder& decoder, Sampler& sampler, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, const std::function<void(int32_t)>& on_token) {
  LOOM_REQUIRE(opts.max_tokens >= 0, "max tokens = ", opts.max_tokens, " is invalid: allowed values are >= 0");
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
