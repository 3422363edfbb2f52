// Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed
// Precision Training", 2018; the policy of torch.cuda.amp.GradScaler and
// Megatron's DynamicGradScaler without hysteresis).
//
// fp16 keeps 5 exponent bits: small gradients (the dlogits of a large batch
// are O(1e-6)) flush to zero. The loss is multiplied by scale() before
// backward, so every gradient is too; the step then checks the gradients:
//   - any Inf/NaN: the update is skipped and the scale halved (min 1);
//   - else the update uses the gradients divided by scale(), and after
//     `window` applied steps in a row the scale doubles.
#pragma once

#include <cstdint>

namespace loom::train {

class DynamicLossScaler {
 public:
  // initial > 0 (train.loss_scale), window >= 1 (train.loss_scale_window).
  DynamicLossScaler(double initial, int64_t window);

  double scale() const { return scale_; }
  // Consecutive applied steps since the scale last changed.
  int64_t good_steps() const { return good_steps_; }
  int64_t window() const { return window_; }

  // Call once per step with whether every gradient is finite. Returns whether
  // the step's update may be applied, and adjusts the scale for the next step.
  bool update(bool finite);

  // The state a checkpoint restores (train/checkpoint.h).
  void restore(double scale, int64_t good_steps);

 private:
  double scale_;
  int64_t window_;
  int64_t good_steps_ = 0;
};

}  // namespace loom::train
