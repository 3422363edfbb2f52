#include "train/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::train {

DynamicLossScaler::DynamicLossScaler(double initial, int64_t window) : scale_(initial), window_(window) {
  LOOM_REQUIRE(std::isfinite(initial) && initial > 0, "loss scale ", initial, " is invalid: allowed are finite numbers > 0");
  LOOM_REQUIRE(window >= 1, "loss scale window ", window, " is invalid: allowed are integers >= 1");
}

bool DynamicLossScaler::update(bool finite) {
  if (!finite) {
    scale_ = std::max(1.0, scale_ / 2);
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ == window_) {
    scale_ *= 2;
    good_steps_ = 0;
  }
  return true;
}

void DynamicLossScaler::restore(double scale, int64_t good_steps) {
  LOOM_REQUIRE(std::isfinite(scale) && scale > 0 && good_steps >= 0 && good_steps < window_, "loss scale state (scale ",
               scale, ", good steps ", good_steps, ") is invalid: the scale must be > 0 and good steps in [0, ",
               window_, ")");
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace loom::train
