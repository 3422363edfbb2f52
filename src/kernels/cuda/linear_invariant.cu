// The CUDA backend's batch-invariant linear (ops.h linear_forward_invariant):
// a GEMV a warp per output, not cuBLASLt, whose kernel choice depends on M.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

// y[m][n] by one warp: lane l sums x[m][k] w[n][k] over k = l, l + 32, ...
// with FMAs in k order, then the warp adds its 32 lanes by a fixed butterfly,
// then the bias: the sequence depends on IC alone, so a row's bits do not
// depend on the other rows or the launch shape.
constexpr int kInvariantWarps = 8;

template <typename T, typename TY, typename TB>
__global__ void linear_invariant_kernel(TY* y, const T* x, const T* w, const TB* bias, int64_t rows, int64_t oc,
                                        int64_t ic) {
  const int lane = threadIdx.x % 32;
  const int64_t out = blockIdx.x * int64_t{kInvariantWarps} + threadIdx.x / 32;
  if (out >= rows * oc) return;
  const int64_t m = out / oc, n = out % oc;
  const T* xr = x + m * ic;
  const T* wr = w + n * ic;
  float acc = 0.f;
  for (int64_t k = lane; k < ic; k += 32) acc = fmaf(to_float(xr[k]), to_float(wr[k]), acc);
  acc = warp_sum(acc);
  if (lane == 0) {
    if (bias) acc += to_float(bias[n]);
    y[out] = from_float<TY>(acc);
  }
}

}  // namespace

void linear_forward_invariant(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t oc = w.size(0), ic = w.size(1), rows = oc ? y.numel() / oc : 0, outs = rows * oc;
  if (outs == 0) return;
  const auto blocks = static_cast<unsigned>((outs + kInvariantWarps - 1) / kInvariantWarps);
  with_float_type(x.dtype(), [&](auto xt) {
    with_float_type(y.dtype(), [&](auto yt) {
      with_float_type(bias.defined() ? bias.dtype() : DType::f32, [&](auto bt) {
        using T = decltype(xt);
        using TY = decltype(yt);
        using TB = decltype(bt);
        linear_invariant_kernel<<<blocks, 32 * kInvariantWarps, 0, stream()>>>(
            ptr<TY>(y), ptr<const T>(x), ptr<const T>(w), bias.defined() ? ptr<const TB>(bias) : nullptr, rows, oc,
            ic);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
}

}  // namespace loom::kernels::cuda
