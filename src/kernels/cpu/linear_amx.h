// The amx level's batch-invariant linear (linear_amx.cpp) and quantized
// linear: its CPU backend table is avx512_bf16's with these entries
// (backend.cpp). Internal to src/kernels/cpu; compiled per instruction-set
// level like cpu_ops.h, and a tile path only where AVX512_BF16 is (the
// avx512_bf16 objects).
#pragma once

#include "core/tensor.h"
#include "kernels/quant.h"

#ifndef LOOM_ISA
#error "kernels/cpu/linear_amx.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

// linear_forward_invariant (ops.h) with bf16 operands in AMX tiles, any
// row count; other dtypes, and levels below avx512_bf16, take
// linear_forward_invariant itself. Call only where the CPU has AMX-BF16 and
// the process may use its tiles (cpu_isa.cpp's amx level).
void linear_forward_invariant_amx(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias);

// linear_forward_quantized (ops.h) with q8_0 and q4_0 weights' integer sums
// in AMX tiles for many rows (quant_prefill_amx.cpp; quant_linear.cpp);
// the same bits as every level. Same condition as above.
void linear_forward_quantized_amx(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias);

}  // namespace loom::kernels::cpu::LOOM_ISA
