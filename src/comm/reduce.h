// Element-wise reductions and conversions the collectives run on host memory.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace loom::comm {

// dst[i] = op(dst[i], src[i]) for i < n; dtype f32, i32 or i64 (bf16 is
// reduced through an f32 copy, see to_f32). avg reduces as a sum: the caller
// divides once at the end (divide_by).
void reduce_into(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op);
// buf[i] /= divisor; float dtypes (avg is refused for integers at issue).
void divide_by(void* buf, int64_t n, DType dtype, int divisor);
void bf16_to_f32(float* dst, const bf16* src, int64_t n);
void f32_to_bf16(bf16* dst, const float* src, int64_t n);

}  // namespace loom::comm
