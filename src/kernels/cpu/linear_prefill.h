// The batch-invariant linear's path for many rows (linear_prefill.cpp),
// called by linear_invariant.cpp. Internal to src/kernels/cpu; compiled per
// instruction-set level like cpu_ops.h.
#pragma once

#include "core/tensor.h"

#ifndef LOOM_ISA
#error "kernels/cpu/linear_prefill.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

// The first rows of y = x @ w^T + bias, with the bits of linear_invariant.cpp's
// dot-product tiles, for operands ops.h has checked (K, N > 0): a multiple
// of the tile's rows, or none where there are few rows or this level has no
// such path (the generic level). Returns how many.
int64_t linear_prefill(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias);

}  // namespace loom::kernels::cpu::LOOM_ISA
