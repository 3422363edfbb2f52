// Stage: what a pipeline runtime (parallel/pp_runtime.h) drives — one
// pipeline stage's forward and backward over activation slots and the
// tensors that cross between stages — without the concrete Model (model.h),
// which implements it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "core/tensor.h"

namespace loom::model {

class Stage {
 public:
  virtual ~Stage() = default;

  // The stage's layers [first_layer, first_layer + num_layers); whether it
  // holds the embeddings (the first stage) and the head (the last).
  virtual int64_t first_layer() const = 0;
  virtual int64_t num_layers() const = 0;
  virtual bool has_embedding() const = 0;
  virtual bool has_head() const = 0;
  // Micro-batches whose activations it keeps at once: forward(..., slot)
  // writes slot `slot`, backward(..., slot) reads it.
  virtual int slots() const = 0;

  // The residual stream entering the stage (not the first stage; filled by
  // the caller before forward), and leaving it (not the last), per slot.
  virtual Tensor stage_input(int slot) const = 0;
  virtual Tensor stage_output(int slot) const = 0;
  // f32, the residual stream's shape, shared by every slot: before backward
  // the output's gradient (not the last stage); after it the input's.
  virtual Tensor stage_grad() const = 0;

  // tokens (first stage) and targets (last stage): (B, T) i32, else
  // undefined. Returns the mean loss on the last stage with targets, else 0.
  // dloss: that of the backward(dloss, slot) that will follow, when it is
  // known now (training). The last stage then writes the loss's gradient in
  // the same pass over the logits as the loss (llm.c's fused classifier)
  // instead of reading them again in backward. Empty: evaluation, or a
  // backward whose dloss is not known yet.
  virtual float forward(const Tensor& tokens, const Tensor& targets, int slot, std::optional<float> dloss) = 0;
  // Gradients += d(dloss * loss) / d params for slot's forward.
  virtual void backward(float dloss, int slot) = 0;
  // The global index of each of the B sequences the next forward of `slot`
  // computes (the data loader's samples: the same under every layout),
  // which key what training draws per element (LoRA dropout's masks);
  // empty: nothing is drawn (evaluation). Kept until set again.
  virtual void set_samples(std::span<const int64_t> samples, int slot) = 0;
};

}  // namespace loom::model
