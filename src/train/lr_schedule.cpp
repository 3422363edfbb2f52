#include "train/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace loom::train {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= steps) return min_lr;
  const double r = static_cast<double>(step - warmup_steps) / static_cast<double>(steps - warmup_steps);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * r));
}

}  // namespace loom::train
