// Softmax over the last dim, forward and backward (ops.h). Each row is loaded
// as f32 (the tensor's own memory when f32, a per-thread buffer when bf16/f16),
// computed in f32 and stored in the operand's dtype; rows run in parallel.
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// One row: out = exp(x - max(x)) / sum(exp(x - max(x))). out may be x.
// Subtracting the max keeps every exponent <= 0, so nothing overflows.
void softmax_row(float* out, const float* x, int64_t D) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < D; ++i) m = x[i] > m ? x[i] : m;  // std::max does not vectorise here
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) out[i] = exp_f32(x[i] - m);
  double sum = 0.;  // double: a vocabulary-sized row (D = 50257) sums to 1e-7 relative
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < D; ++i) sum += out[i];
  const float inv = static_cast<float>(1. / sum);
  for (int64_t i = 0; i < D; ++i) out[i] *= inv;
}

}  // namespace

// x, y: (..., D), same dtype and shape; y may be x.
void softmax_forward(Tensor y, const Tensor& x) {
  const int64_t N = rows(x), D = x.size(-1);
  const bool direct = y.dtype() == DType::f32;  // write straight into y
  const ThreadSlices<float> bufs(ScratchSlot::a, direct ? 0 : static_cast<size_t>(D));
#pragma omp parallel if (N * D >= kMinParallel)
  {
    float* buf = bufs.mine();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const float* xr = load_row(x, r, D, buf);
      if (direct) {
        softmax_row(y.data_as<float>() + r * D, xr, D);
      } else {
        softmax_row(buf, xr, D);
        store_span(y, r * D, D, buf, Store::write);
      }
    }
  }
}

// dx += y * (dy - sum(dy * y))     y: (..., D)  dy, dx: like y, f32 or y's dtype.
void softmax_backward(Tensor dx, const Tensor& dy, const Tensor& y) {
  if (!dx.defined()) return;
  const int64_t N = rows(y), D = y.size(-1);
  const ThreadSlices<float> bufs(ScratchSlot::a, 3 * static_cast<size_t>(D));  // y, dy, dx
#pragma omp parallel if (N * D >= kMinParallel)
  {
    float* buf = bufs.mine();
    float* g = buf + 2 * D;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const float* yr = load_row(y, r, D, buf);
      const float* dyr = load_row(dy, r, D, buf + D);
      double dot = 0.;  // double, as the forward's sum
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < D; ++i) dot += dyr[i] * yr[i];
      const float dotf = static_cast<float>(dot);
      for (int64_t i = 0; i < D; ++i) g[i] = yr[i] * (dyr[i] - dotf);
      store_span(dx, r * D, D, g, Store::add);
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
