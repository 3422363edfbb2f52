// The ModelConfig a reference model case was written with (tests/ref/
// ref_model.py's config tensor: family, n_layer, n_embd, n_head, n_kv_head,
// d_ff, vocab_size, max_seq_len, tie; and norm_eps, rope_theta). Header only:
// the tests that read it link loom_model, the common test library does not.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ref.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"

namespace loom::test {

inline model::ModelConfig model_config_of(RefCase& rc) {
  const std::vector<float> v = rc["config"].floats();
  model::ModelConfig c;
  c.family = v[0] == 0 ? model::Family::gpt2 : model::Family::llama;
  c.n_layer = int64_t(v[1]), c.n_embd = int64_t(v[2]), c.n_head = int64_t(v[3]), c.n_kv_head = int64_t(v[4]);
  c.d_ff = int64_t(v[5]), c.vocab_size = int64_t(v[6]), c.max_seq_len = int64_t(v[7]);
  c.tie_embeddings = v[8] != 0;
  c.norm_eps = rc["norm_eps"].scalar();
  c.rope_theta = rc["rope_theta"].scalar();
  return c;
}

// The losses (before each step) of m trained by kernels::adamw_step with
// rc's "adamw" settings (lr, beta1, beta2, eps, weight_decay) for as many
// steps as rc's "adamw_losses" holds: what ref_model.py's adamw_reference
// computes with torch.optim.AdamW over the same parameters.
inline std::vector<float> adamw_losses(model::Model& m, Pools& pools, RefCase& rc, const Tensor& tokens,
                                       const Tensor& targets) {
  const std::vector<float> h = rc["adamw"].floats();
  const int64_t steps = static_cast<int64_t>(rc["adamw_losses"].floats().size()), P = m.num_params();
  OwnedTensor mom = pools[MemTag::optimizer].zeros(DType::f32, {P});
  OwnedTensor var = pools[MemTag::optimizer].zeros(DType::f32, {P});
  std::vector<float> losses;
  for (int64_t step = 1; step <= steps; ++step) {
    m.zero_grads();
    losses.push_back(m.forward(tokens, targets));
    m.backward();
    kernels::AdamWConfig cfg{.lr = h[0], .beta1 = h[1], .beta2 = h[2], .eps = h[3], .weight_decay = h[4],
                             .step = step};
    kernels::adamw_step(m.params(), mom, var, m.grads(), Tensor(), cfg);
  }
  return losses;
}

}  // namespace loom::test
