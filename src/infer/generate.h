// The generation loop: prefill the prompt, then sample and decode one token
// at a time until a stop condition, handing each new token to a callback
// (`loom generate` streams its text).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "infer/sampler.h"
#include "model/decoder.h"

namespace loom::infer {

struct GenerateOptions {
  int64_t max_tokens = 64;  // new tokens at most; >= 0
  int32_t stop_token = -1;  // e.g. GPT-2's <|endoftext|>; not emitted; -1: none
  // loom::Error naming the option and what is allowed. generate() checks it
  // too; a caller that prints before generating checks it first.
  void validate() const;
};

// KV-cache positions a generation can use: the prompt plus max_tokens new
// tokens, at most max_seq_len (where generate stops with cache_full).
int64_t generate_capacity(int64_t prompt_tokens, const GenerateOptions& opts, int64_t max_seq_len);

enum class StopReason { max_tokens, stop_token, cache_full };

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens, prompt excluded
  StopReason reason = StopReason::max_tokens;
};

// Continues the decoder's sequence (normally empty: call reset() first) with
// prompt (at least one token) and up to max_tokens sampled tokens. Stops
// early at the stop token or when the KV cache is full.
GenerateResult generate(model::Decoder& decoder, Sampler& sampler, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, const std::function<void(int32_t)>& on_token = {});

}  // namespace loom::infer
