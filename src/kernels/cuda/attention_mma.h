// The tensor-core attention forward (attention_mma.cu) and backward
// (attention_mma_bwd.cu), which attention.cu's attention_forward and
// attention_backward hand the calls they apply to. Internal to kernels/cuda.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::kernels::cuda {

// True for q, k, v, out all bf16 or all f16, head size 64 or 128, at least
// one key, 16-byte aligned bases and batch / time strides of q, k, v that
// are multiples of 8 elements.
bool attention_mma_applies(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v);
// ops.h's attention_forward for such operands; off: the position of query 0
// (Geo::off of attention.cu).
void attention_forward_mma(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t off);

// attention_mma_applies with dout in out's place: dout of q's 16-bit type.
bool attention_mma_backward_applies(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v);
// ops.h's attention_backward for such operands, given D = rowsum(dout * out)
// (B, NH, Tq) f32 on the device; dq, dk, dv (any float type, each optional)
// accumulate.
void attention_backward_mma(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& lse, const float* D, int64_t off);

}  // namespace loom::kernels::cuda
