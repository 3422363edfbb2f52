// The scalars of one AdamW step (ops.h adamw_step), formed once on the host
// as torch.optim.AdamW forms them (in double, then used as f32 by its f32
// kernels): one source for every backend, so each computes the same update.
// Internal to src/kernels.
#pragma once

#include <cmath>

#include "kernels/ops.h"

namespace loom::kernels {

struct AdamWScalars {
  float decay;          // 1 - lr * wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float neg_step_size;  // -lr / (1 - beta1^t)
  float eps, grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWConfig& c) {
  const double t = static_cast<double>(c.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
  return {static_cast<float>(1.0 - static_cast<double>(c.lr) * c.weight_decay),
          c.beta1,
          static_cast<float>(1.0 - c.beta1),
          c.beta2,
          static_cast<float>(1.0 - c.beta2),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(-static_cast<double>(c.lr) / bc1),
          c.eps,
          c.grad_scale};
}

}  // namespace loom::kernels
