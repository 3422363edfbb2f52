// AdamW over a model's flat f32 master parameters (Model::master_params()),
// with fp32 first and second moments from pools[optimizer] laid out like the
// parameters (one (P) buffer each). Under bf16 compute each update also
// writes the bf16 compute weights (kernels::adamw_step's param_copy).
//
// Weight decay applies to 2-D weights only (linear weights and the
// embeddings), not to norm weights or biases, as nanoGPT and llm.c do: the
// update runs kernels::adamw_step once per parameter tensor, with
// weight_decay set to 0 for tensors of fewer than 2 dims.
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "model/model.h"

namespace loom::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;  // GPT-3 / llm.c / nanoGPT
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  // Moments are zeroed.
  AdamW(const model::Model& model, Pools& pools, const AdamWOptions& options);

  // One update of every parameter from its gradient times grad_scale (clipping
  // folded in); step_ is incremented first (bias correction is 1-based).
  void step(model::Model& model, double lr, float grad_scale);
  int64_t steps_taken() const { return step_; }
  const AdamWOptions& options() const { return opt_; }

  // The state a checkpoint saves and restores (train/checkpoint.h): the
  // moments, (P) f32 laid out like Model::master_params(), and the update count.
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  AdamWOptions opt_;
  OwnedTensor m_, v_;  // (P) f32
  int64_t step_ = 0;
};

}  // namespace loom::train
