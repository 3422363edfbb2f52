// The CPU backend: every op of the backend table (kernels/backend.h), with
// the signature and meaning ops.h gives it, for operands ops.h has checked.
// Implemented in src/kernels/cpu/*.cpp, which are compiled once per
// instruction-set level (src/kernels/CMakeLists.txt): LOOM_ISA names the
// level (generic, avx2, avx512, avx512_bf16) and its namespace, so the
// functions below are loom::kernels::cpu::avx2::matmul and so on. Each
// level's table (backend.cpp here) is reached only through
// kernels/cpu_isa.h, which picks one at start-up.
//
// Only the per-level kernel sources include this header: the rest of loom
// calls ops.h, and tests reach a level's table with cpu_backend(level).
#pragma once

#include "kernels/backend.h"

#ifndef LOOM_ISA
#error "kernels/cpu/cpu_ops.h is included only by the per-level CPU kernel sources (src/kernels/CMakeLists.txt)"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#define LOOM_KERNEL_OP_DECLARE(op, ret, params) ret op params;
LOOM_KERNEL_OPS(LOOM_KERNEL_OP_DECLARE)
#undef LOOM_KERNEL_OP_DECLARE

}  // namespace loom::kernels::cpu::LOOM_ISA
