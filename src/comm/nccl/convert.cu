// The two element-wise kernels behind convert.h. Grid-stride loops with
// 64-bit indices: any n, with a grid capped well under CUDA's 2^31 - 1
// blocks; a thread handles ceil(n / (blocks * threads)) elements.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "convert.h"

namespace loom::comm {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; beyond this
// threads loop instead of the grid growing.
constexpr int64_t kMaxBlocks = 8192;

int blocks_for(int64_t n) { return static_cast<int>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks)); }

// bf16 is the top half of an f32's bits, so every bf16 widens exactly.
__global__ void widen_bf16_to_f32_kernel(const __nv_bfloat16* in, float* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __bfloat162float(in[i]);
}

// __float2bfloat16_rn: IEEE round to nearest even, subnormals kept (no
// -ftz), NaN -> NaN.
__global__ void narrow_f32_to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(in[i]);
}

}  // namespace

cudaError_t widen_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  widen_bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, n);
  return cudaGetLastError();
}

cudaError_t narrow_f32_to_bf16(const float* in, void* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  narrow_f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

}  // namespace loom::comm
