// bf16 <-> f32 conversion on the GPU, for the NCCL backend's f32 path of bf16
// sums (nccl_backend.h). Plain C++ declarations of the launchers in
// convert.cu, so the C++ side needs no CUDA compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::comm {

// out[i] = in[i] widened to f32 (exact), i in [0, n): in is n bf16 values
// (any 2-byte alignment), out n floats. Enqueued on `stream`; returns the
// launch's error (cudaSuccess when n == 0: nothing is launched).
cudaError_t widen_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t stream);

// out[i] = in[i] narrowed to bf16, round to nearest even (NaN stays NaN, as
// the device's canonical NaN), i in [0, n). Enqueued on `stream`; returns the
// launch's error.
cudaError_t narrow_f32_to_bf16(const float* in, void* out, int64_t n, cudaStream_t stream);

}  // namespace loom::comm
