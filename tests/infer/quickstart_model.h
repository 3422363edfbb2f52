// Shared by the engine tests: the quickstart-shaped GPT-2 (configs/
// quickstart.toml's [model]: the gpt2-124m preset with n_layer 4, n_embd 128,
// n_head 4, d_ff 512, max_seq_len 128, GPT-2's vocabulary of 50257) trained
// for a few dozen AdamW steps on a deterministic repetitive token stream, so
// that its next-token distributions are peaked like a trained model's (a
// random model's are nearly flat over 50257 tokens: every top-20 is a near
// tie); and model::Model's full forward over a sequence, the reference the
// engine's log-probabilities are held to.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"

namespace loom::infer::quickstart {

inline model::ModelConfig config() {
  model::ModelConfig cfg = model::model_preset("gpt2-124m");
  cfg.n_layer = 4, cfg.n_embd = 128, cfg.n_head = 4, cfg.n_kv_head = 4, cfg.d_ff = 512, cfg.max_seq_len = 128;
  return cfg;
}

// The training stream: the 8 letters (token ids spread over the vocabulary)
// in a cycle, letter((phase + k) mod 8) at position k.
constexpr int64_t kAlphabet = 8;
inline int32_t letter(int64_t i) { return static_cast<int32_t>((i * 2099 + 198) % 50257); }

inline std::vector<int32_t> cycle(int64_t n, int64_t phase) {
  std::vector<int32_t> t;
  for (int64_t k = 0; k < n; ++k) t.push_back(letter((phase + k) % kAlphabet));
  return t;
}

struct Trained {
  model::ModelConfig cfg = config();
  Pools pools;
  OwnedTensor params;  // (P) f32
  float first_loss = 0, last_loss = 0;
};

// Trained once per test process (function-local static, never freed): from
// init seed 1337, 40 AdamW steps (lr 5e-2 after a 5-step warmup, no decay)
// on the cycle from phase 0 over the whole context (B 1, T 128). The loss
// goes from ln 50257 = 10.8 to ~1 (ln 8 = 2.1 would be knowing only the
// alphabet): the most likely token has typically 50-98% of the mass, the 8
// letters nearly all of it (log-probabilities of the rest ~ -80). It learns
// the cycle by position more than by content, which is all these tests need:
// peaked, reproducible distributions. ~3 s on 2 cores (the 50257-way head
// dominates); streams of 24 letters tried first stayed near their alphabet's
// entropy (ln 24 = 3.2) for 100+ steps.
inline const Trained& trained() {
  static const Trained* t = [] {
    auto* r = new Trained;
    constexpr int64_t T = 128, kSteps = 40, kWarmup = 5;
    Pools pools;
    model::Model m(r->cfg, 1, T, pools);
    m.init_params(1337);
    const int64_t P = m.num_params();
    OwnedTensor mom = pools[MemTag::optimizer].zeros(DType::f32, {P});
    OwnedTensor var = pools[MemTag::optimizer].zeros(DType::f32, {P});
    std::vector<int32_t> stream = cycle(T + 1, 0);
    std::vector<int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
    for (int64_t step = 1; step <= kSteps; ++step) {
      m.zero_grads();
      const float loss = m.forward(loom::test::i32_view(tokens, {1, T}), loom::test::i32_view(targets, {1, T}));
      if (step == 1) r->first_loss = loss;
      r->last_loss = loss;
      m.backward();
      const float lr = 5e-2f * std::min(1.f, static_cast<float>(step) / kWarmup);
      kernels::adamw_step(m.params(), mom, var, m.grads(), Tensor(),
                          {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.f, .step = step});
    }
    r->params = r->pools[MemTag::params].empty(DType::f32, {P});
    kernels::copy(r->params, m.params());
    return r;
  }();
  return *t;
}

// Model::forward (no cache, B = 1) over a whole sequence, in the compute
// dtype `compute` with the f32 weights `params` rounded once to it (as the
// engine's are, kernels::cast). Row t of the result is the logits (V) after
// tokens 0 ..= t: causal attention reads nothing later, so one forward over
// the final sequence gives every prefix's next-token logits.
class Reference {
 public:
  Reference(const model::ModelConfig& cfg, const Tensor& params, DType compute)
      : cfg_(cfg), model_(cfg, 1, cfg.max_seq_len, pools_, {.compute = compute}) {
    kernels::copy(model_.master_params(), params);
    model_.sync_params();
  }
  // The logits rows 0 .. tokens.size() - 1 as f32 (the Model's are in its
  // compute dtype). The sequence is padded with token 0 to the model's
  // length; the padding comes after every row read.
  std::vector<std::vector<float>> logits(std::vector<int32_t> tokens) {
    const auto n = static_cast<int64_t>(tokens.size());
    EXPECT_LE(n, cfg_.max_seq_len);
    tokens.resize(static_cast<size_t>(cfg_.max_seq_len), 0);
    model_.forward(loom::test::i32_view(tokens, {1, cfg_.max_seq_len}));
    const std::vector<float> all = loom::test::to_floats(model_.logits().slice(1, 0, n));
    const int64_t V = cfg_.vocab_size;
    std::vector<std::vector<float>> rows;
    for (int64_t t = 0; t < n; ++t) rows.emplace_back(all.begin() + t * V, all.begin() + (t + 1) * V);
    return rows;
  }

 private:
  model::ModelConfig cfg_;
  Pools pools_;
  model::Model model_;
};

// log_softmax of one row, in double (as the sampler computes log-probabilities).
inline std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  const double log_z = top + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_z;
  return out;
}

}  // namespace loom::infer::quickstart
