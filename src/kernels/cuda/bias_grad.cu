// The linear ops' bias gradient (bias_grad.h).
#include <algorithm>

#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {

// dbias (OC) += column sums of dy (rows, OC): blocks of rows_per_part rows
// (256, more when that would need over 65535 blocks along y) give f32
// partials, summed in part order by the second kernel (fixed order: the
// same bits every run).
template <typename TD>
__global__ void bias_grad_partials(float* partials, const TD* dy, int64_t rows, int64_t oc, int64_t rows_per_part) {
  const int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_part, r1 = min(rows, r0 + rows_per_part);
  if (col >= oc) return;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_float(dy[r * oc + col]);
  partials[blockIdx.y * oc + col] = acc;
}

template <typename TB>
__global__ void bias_grad_finish(TB* dbias, const float* partials, int64_t parts, int64_t oc) {
  const int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (col >= oc) return;
  float acc = 0.f;
  for (int64_t p = 0; p < parts; ++p) acc += partials[p * oc + col];
  dbias[col] = from_float<TB>(to_float(dbias[col]) + acc);
}

}  // namespace

void bias_grad(Tensor dbias, const Tensor& dy2) {
  const int64_t rows = dy2.size(0), oc = dy2.size(1);
  if (oc == 0) return;
  const int64_t rows_per_part = std::max<int64_t>(256, (rows + 65534) / 65535);
  const int64_t parts = std::max<int64_t>(1, (rows + rows_per_part - 1) / rows_per_part);
  DeviceTemp partials(static_cast<size_t>(parts * oc) * sizeof(float));
  const unsigned col_blocks = static_cast<unsigned>((oc + 255) / 256);
  with_float_type(dy2.dtype(), [&](auto d) {
    using TD = decltype(d);
    if (rows == 0) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(partials.as<void>(), 0, oc * sizeof(float), stream()));
    } else {
      bias_grad_partials<<<dim3(col_blocks, static_cast<unsigned>(parts)), 256, 0, stream()>>>(
          partials.as<float>(), ptr<const TD>(dy2), rows, oc, rows_per_part);
      LOOM_CUDA_LAUNCHED();
    }
  });
  with_float_type(dbias.dtype(), [&](auto b) {
    using TB = decltype(b);
    bias_grad_finish<<<col_blocks, 256, 0, stream()>>>(ptr<TB>(dbias), partials.as<const float>(), parts, oc);
    LOOM_CUDA_LAUNCHED();
  });
}

}  // namespace loom::kernels::cuda
