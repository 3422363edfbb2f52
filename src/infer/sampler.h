// Sampler: next token from logits by temperature, top-k and top-p (nucleus)
// sampling, as Hugging Face's generate applies them (temperature, then
// top-k, then top-p). Draw i of a sampler uses Philox (core/rng.h) at
// (seed, "sampler", i), so the same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace loom::infer {

struct SamplerConfig {
  float temperature = 1.f;  // 0: greedy (argmax); > 0 divides the logits
  int64_t top_k = 0;        // keep the k most likely tokens; 0: all
  float top_p = 1.f;        // keep the smallest most-likely set with mass >= top_p; in (0, 1]
  uint64_t seed = 0;
  // Throws loom::Error naming the option and what is allowed.
  void validate() const;
};

struct TokenProb {
  int32_t token;
  float prob;
};

// The distribution the sampler draws from: the kept tokens, most likely first
// (ties: lower id first), with probabilities renormalised to sum to 1. With
// temperature 0, the argmax alone.
std::vector<TokenProb> sampling_distribution(const SamplerConfig& cfg, std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);  // validates cfg
  const SamplerConfig& config() const { return cfg_; }
  // logits: (V) f32.
  int32_t sample(std::span<const float> logits);

 private:
  SamplerConfig cfg_;
  uint64_t draws_ = 0;
};

}  // namespace loom::infer
