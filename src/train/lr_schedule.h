// Learning rate: linear warmup, then cosine decay to min_lr (llm.c, nanoGPT).
#pragma once

#include <cstdint>

namespace loom::train {

struct LrSchedule {
  double lr = 6e-4;      // peak
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  int64_t steps = 1;     // total

  // step: 0-based index of the update.
  //   step < warmup:  lr * (step + 1) / warmup
  //   then:           min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2,
  //                   r = (step - warmup) / (steps - warmup) in [0, 1)
  double at(int64_t step) const;
};

}  // namespace loom::train
