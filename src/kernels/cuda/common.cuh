// What every CUDA kernel file of the backend shares: error checks, the
// stream, stream-ordered temporaries, 16-bit float loads and stores, dtype
// dispatch and the device-side id checks. Internal to src/kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace loom::kernels::cuda {

// loom::Error "CUDA: <what> failed: <error name>: <description> (<file>:<line>)".
[[noreturn]] void fail_cuda(cudaError_t e, const char* what, const char* file, int line);

#define LOOM_CUDA_CHECK(expr)                                                          \
  do {                                                                                 \
    const cudaError_t loom_cuda_error_ = (expr);                                       \
    if (loom_cuda_error_ != cudaSuccess)                                               \
      ::loom::kernels::cuda::fail_cuda(loom_cuda_error_, #expr, __FILE__, __LINE__);   \
  } while (0)
// After a kernel launch: a bad configuration is reported at once.
#define LOOM_CUDA_LAUNCHED() LOOM_CUDA_CHECK(cudaGetLastError())

// The device's compute stream (cuda_backend.h: cuda_stream), made by
// register_cuda_backend; null, the legacy default stream, before it.
extern cudaStream_t g_stream;
// The stream every op, temporary and copy of the backend is enqueued on.
inline cudaStream_t stream() { return g_stream; }

// Device memory for the length of one op: cudaMallocAsync on the op's stream,
// freed on it (stream ordered, so kernels enqueued before the free may still
// use it). Move-only.
class DeviceTemp {
 public:
  DeviceTemp() = default;
  explicit DeviceTemp(size_t bytes);
  DeviceTemp(DeviceTemp&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  DeviceTemp& operator=(DeviceTemp&& o) noexcept {
    if (this != &o) {
      this->~DeviceTemp();
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  DeviceTemp(const DeviceTemp&) = delete;
  ~DeviceTemp();
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// t (contiguous) converted to dtype `to` in `temp`, one rounding a value
// (stream-ordered, freed with temp; gemm.cu). temp must be empty.
Tensor converted(const Tensor& t, DType to, DeviceTemp& temp);

// Copies n values from the device to the host and waits for them.
void read_back(void* host, const void* device, size_t bytes);

// A grid for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535 * 16));
}

// ---- 16-bit floats: arithmetic in f32, one RNE rounding on store ----------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// The device type of a float DType.
template <DType D> struct device_type;
template <> struct device_type<DType::f32> { using type = float; };
template <> struct device_type<DType::bf16> { using type = __nv_bfloat16; };
template <> struct device_type<DType::f16> { using type = __half; };

// f(T{}) with T the device type of float dtype t (float, __nv_bfloat16,
// __half). ops.h has checked t; another dtype is a bug (LOOM_CHECK).
template <typename F>
decltype(auto) with_float_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::f16: return f(__half{});
    default: break;
  }
  LOOM_CHECK(false, "a float dtype (f32, bf16, f16) was expected, not ", dtype_name(t));
  return f(float{});
}

template <typename T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data()); }

// Grid-stride loops: for (int64_t i = first_index(); i < n; i += grid_stride()).
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// A float storage type chosen at run time, for kernels whose operands may
// mix them without a template per combination; loads and stores go through
// f32 (one RNE rounding on store).
enum FloatKind : int { kF32 = 0, kBF16 = 1, kF16 = 2 };
inline FloatKind float_kind(DType t) {
  switch (t) {
    case DType::f32: return kF32;
    case DType::bf16: return kBF16;
    case DType::f16: return kF16;
    default: break;
  }
  LOOM_CHECK(false, "a float dtype (f32, bf16, f16) was expected, not ", dtype_name(t));
  return kF32;
}
__device__ __forceinline__ float load_as(const void* p, int kind, int64_t i) {
  if (kind == kBF16) return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (kind == kF16) return to_float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_as(void* p, int kind, int64_t i, float x) {
  if (kind == kBF16) static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(x);
  else if (kind == kF16) static_cast<__half*>(p)[i] = from_float<__half>(x);
  else static_cast<float*>(p)[i] = x;
}

// ---- ids checked on the device ---------------------------------------------

// The first bad id a kernel found: kernels call report(i) for flat index i;
// first() waits for the GPU and returns the smallest index reported, or -1.
class BadIdFlag {
 public:
  BadIdFlag();
  unsigned long long* device() const { return flag_.as<unsigned long long>(); }
  int64_t first() const;

 private:
  DeviceTemp flag_;
};

__device__ __forceinline__ void report_bad_id(unsigned long long* flag, int64_t index) {
  atomicMin(flag, static_cast<unsigned long long>(index));
}

// ---- block reductions -------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over the block (blockDim.x a multiple of 32, at most 1024) of each
// thread's v, returned to every thread; a fixed tree, so the same inputs give
// the same bits. Uses 32 values of shared memory; synchronises the block.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_sum(total);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(m);
}

}  // namespace loom::kernels::cuda
