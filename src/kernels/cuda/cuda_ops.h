// The CUDA backend's ops: every entry of the backend table
// (kernels/backend.h), with the signature and meaning ops.h gives it, for
// operands ops.h has checked and that live on the registered GPU.
// Implemented in src/kernels/cuda/*.cu (one file per family, as cpu/);
// backend.cpp gathers them into the table.
#pragma once

#include "kernels/backend.h"

namespace loom::kernels::cuda {

#define LOOM_KERNEL_OP_DECLARE(op, ret, params) ret op params;
LOOM_KERNEL_OPS(LOOM_KERNEL_OP_DECLARE)
#undef LOOM_KERNEL_OP_DECLARE

}  // namespace loom::kernels::cuda
