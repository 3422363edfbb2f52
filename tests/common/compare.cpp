#include "common/compare.h"

#include <cmath>

#include "core/error.h"

namespace loom::test {

::testing::AssertionResult all_close(std::span<const float> actual, std::span<const float> expected, double rtol,
                                     double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  size_t misses = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double diff = std::abs(a - e);
    const double allowed = atol + rtol * std::abs(e);
    const bool ok = (std::isnan(a) && std::isnan(e)) || (a == e) || diff <= allowed;
    if (!ok) {
      ++misses;
      const double excess = std::isfinite(diff) ? diff / allowed : INFINITY;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << actual.size() << " elements differ; worst at " << worst
                                       << ": actual " << actual[worst] << " expected " << expected[worst]
                                       << " (rtol " << rtol << ", atol " << atol << ")";
}

std::vector<float> to_floats(const Tensor& t) {
  LOOM_CHECK(t.is_contiguous(), "to_floats needs a contiguous tensor");
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::f32: out[i] = t.data_as<float>()[i]; break;
      case DType::bf16: out[i] = load_f32(t.data_as<bf16>()[i]); break;
      case DType::f16: out[i] = load_f32(t.data_as<f16>()[i]); break;
      default: LOOM_CHECK(false, "to_floats of ", t.str());
    }
  }
  return out;
}

std::vector<float> finite_difference(const std::function<double()>& loss, std::span<float> x, float h) {
  std::vector<float> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    grad[i] = static_cast<float>((up - down) / (2.0 * static_cast<double>(h)));
  }
  return grad;
}

double weighted_sum(std::span<const float> y, std::span<const float> w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

}  // namespace loom::test
