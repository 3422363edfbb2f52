// Sampler: next token from logits by temperature, top-k, min-p and top-p
// (nucleus) sampling, in that order (Hugging Face's generate applies
// temperature, then top-k, then top-p; min-p is relative to the most likely
// token, which top-k keeps, so it may come before or after top-k), after the
// repetition, presence and frequency penalties. Draw i of a sampler uses Philox (core/rng.h) at
// (seed, "sampler", i), so the same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace loom::infer {

struct SamplerConfig {
  float temperature = 1.f;  // 0: greedy (argmax); > 0 divides the logits
  int64_t top_k = 0;        // keep the k most likely tokens, and every token tied with the k-th; 0: all
  float top_p = 1.f;        // keep the smallest most-likely set with mass >= top_p; in (0, 1]
  uint64_t seed = 0;
  float min_p = 0.f;  // keep tokens with probability >= min_p * the most likely one's; in [0, 1]
  // OpenAI's: logit -= presence * (token is in the output) + frequency * (its count there); in [-2, 2].
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  // Hugging Face's (CTRL): a token of the prompt or output has its logit
  // divided by it when positive, multiplied when negative; > 0, 1 is none.
  float repetition_penalty = 1.f;
  // The tokens repetition_penalty looks at: the last N of the prompt and the
  // output together (llama.cpp's and ollama's repeat_last_n); -1: all of
  // them; 0: none.
  int64_t repetition_window = -1;
  // Throws loom::Error naming the option and what is allowed.
  void validate() const;
};

// The penalties of cfg applied to logits (V) in place: repetition over the
// prompt's and the output's tokens (the last repetition_window of them),
// presence and frequency over the output's.
void apply_penalties(const SamplerConfig& cfg, std::span<float> logits, std::span<const int32_t> prompt,
                     std::span<const int32_t> output);

struct TokenLogprob {
  int32_t token;
  float logprob;
};

// One draw of a request: its token, the token's log-probability under the
// model's own distribution (log_softmax of the raw logits, before penalties
// and temperature, as OpenAI and vLLM report it) and the top_logprobs most
// likely tokens with theirs (most likely first, ties: lower id).
struct SampleResult {
  int32_t token = 0;
  float logprob = 0.f;
  std::vector<TokenLogprob> top;
};

// Draw number `draw` of a request with cfg (temperature, top-k, min-p,
// top-p, after the penalties): uniform number `draw` of the Philox stream
// (cfg.seed, "sampler"). Keyed by the draw's index, not by how many draws
// came before in this process, so a request recomputed after a preemption,
// or run in another batch, draws the same token. logits (V) f32, unchanged.
// allowed (V, or empty: every token): a token with allowed[t] == 0 is never
// drawn (constrained decoding: its logit is -inf before the penalties);
// logprobs stay those of the model's own distribution.
SampleResult sample_at(const SamplerConfig& cfg, std::span<const float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, uint64_t draw, int64_t top_logprobs = 0,
                       std::span<const uint8_t> allowed = {});

// One row of a step's sampling: sample_at's arguments.
struct SampleRow {
  SamplerConfig cfg{};
  std::span<const float> logits;  // (V)
  std::span<const int32_t> prompt, output;
  uint64_t draw = 0;
  int64_t top_logprobs = 0;
  std::span<const uint8_t> allowed{};  // empty: every token
  // Or, when set, what fills the mask (a grammar's walk over the vocabulary),
  // called in the row's own parallel iteration.
  std::function<void(std::vector<uint8_t>&)> allowed_of{};
  // Tokens never drawn on top of the mask (min_tokens: the stop tokens, as
  // vLLM's MinTokensLogitsProcessor sets them to -inf, greedy too), unless
  // they are all the mask leaves (a complete grammar allows only its end
  // tokens: one is drawn, and before min_tokens the next step draws again).
  // Logprobs stay the model's own.
  std::vector<int32_t> banned{};
};

// sample_at over many rows at once (the engine's step); rows run in
// parallel, each exactly as sample_at alone (a row's result never depends on
// the others). A row that throws fails the call with a loom::Error naming
// the row (after every row ran: an exception never leaves the parallel
// region).
std::vector<SampleResult> sample_rows(std::span<const SampleRow> rows);

// The same with row r of logits (R, V) and cfgs[r], prompts[r], outputs[r],
// draws[r], top_logprobs[r].
std::vector<SampleResult> sample_rows(std::span<const float> logits, int64_t V, std::span<const SamplerConfig> cfgs,
                                      std::span<const std::span<const int32_t>> prompts,
                                      std::span<const std::span<const int32_t>> outputs,
                                      std::span<const uint64_t> draws, std::span<const int64_t> top_logprobs);

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
