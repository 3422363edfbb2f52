// The bias gradient of the linear ops (gemm.cu): a column sum in a
// fixed order. Internal to src/kernels/cuda.
#pragma once

#include "core/tensor.h"

namespace loom::kernels::cuda {

// dbias (OC) += the column sums of dy2 (rows, OC), summed in f32 in blocks
// of rows, then the blocks in order: the same bits every run.
void bias_grad(Tensor dbias, const Tensor& dy2);

}  // namespace loom::kernels::cuda
