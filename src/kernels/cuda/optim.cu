// AdamW and the reductions of the optimizer step (ops.h) on the GPU: the
// gradient norm for clipping, the finiteness check for fp16 loss scaling,
// in-place scale.
//
// AdamW's update is the CPU's (cpu/optim.cpp) operation for operation, each
// rounded on its own (__fmul_rn and friends: nvcc would otherwise contract
// a * b + c into one FMA, which the CPU build, -ffp-contract=off, never
// does), so the two give the same bits.
//
// Sums of squares are deterministic: a grid whose size depends only on the
// element count, each block's double partial by a fixed tree (block_sum),
// and the partials summed by one block in a second pass.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/adamw_scalars.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;


// ---- adamw -------------------------------------------------------------------

// The step's scalars: kernels/adamw_scalars.h (one source for every backend).

// param, m, v: (N) f32; grad: (N) G; copy: (N) P when kCopy.
template <typename G, typename P, bool kCopy>
__global__ void adamw_kernel(float* param, float* m, float* v, const G* grad, P* copy, int64_t n, AdamWScalars s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(to_float(grad[i]), s.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(s.one_minus_beta1, g));
    const float vi = __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    const float pn = __fadd_rn(__fmul_rn(param[i], s.decay), __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
    param[i] = pn;
    if constexpr (kCopy) copy[i] = from_float<P>(pn);
  }
}

// ---- reductions --------------------------------------------------------------

constexpr int kSumThreads = 256;
constexpr int64_t kSumMaxBlocks = 1024;

// The partial sums of n elements: a function of n alone, so the summation
// order (and the bits) never depend on the device.
__host__ __device__ inline int64_t sum_blocks(int64_t n) {
  constexpr int64_t per_block = kSumThreads * 8;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return blocks < kSumMaxBlocks ? blocks : kSumMaxBlocks;
}

// Part `part` of `parts` of x[0, n)'s sum of x^2 in double: the elements
// part * blockDim.x + thread, then a stride of parts * blockDim.x, summed
// over the block. Every thread of the block gets it.
template <typename T>
__device__ double partial_sum_squares(const T* x, int64_t n, int64_t part, int64_t parts) {
  double s = 0;
  for (int64_t i = part * blockDim.x + threadIdx.x; i < n; i += parts * blockDim.x) {
    const double xi = to_float(x[i]);
    s += xi * xi;
  }
  return block_sum(s);
}

// partial[blockIdx.x] = the block's part of x's sum of x^2.
template <typename T>
__global__ void sum_squares_partial_kernel(const T* x, int64_t n, double* partial) {
  const double s = partial_sum_squares(x, n, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// sum_squares_blocks' first pass: slice blockIdx.y (`block` elements of x
// from first * block, the last one shorter) cut into sum_blocks(its length)
// parts as sum_squares_partial_kernel cuts a tensor of that length; part
// blockIdx.x of it into partial[slice * max_parts + blockIdx.x].
template <typename T>
__global__ void sum_squares_slices_kernel(const T* x, int64_t n, int64_t block, int64_t first, int64_t max_parts,
                                          double* partial) {
  const int64_t slice = first + blockIdx.y, begin = slice * block;
  const int64_t len = min(block, n - begin);
  const int64_t parts = sum_blocks(len);
  if (blockIdx.x >= parts) return;  // the whole block: block_sum's barriers are not split
  const double s = partial_sum_squares(x + begin, len, blockIdx.x, parts);
  if (threadIdx.x == 0) partial[blockIdx.y * max_parts + blockIdx.x] = s;
}

// One block: each group's partials [offsets[g], offsets[g + 1]) summed by a
// fixed tree, the groups' sums added in group order; *out = that total, or
// its square root.
__global__ void sum_groups_kernel(const double* partial, const int64_t* offsets, int64_t groups, bool take_sqrt,
                                  double* out) {
  double total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    double s = 0;
    for (int64_t i = offsets[g] + threadIdx.x; i < offsets[g + 1]; i += blockDim.x) s += partial[i];
    total += block_sum(s);  // the same value in every thread
  }
  if (threadIdx.x == 0) *out = take_sqrt ? sqrt(total) : total;
}

// sum_squares_blocks' second pass, one block of 1024 threads a slice: its
// parts summed as sum_groups_kernel sums one group's (the same bits).
__global__ void sum_slices_kernel(const double* partial, int64_t n, int64_t block, int64_t first, int64_t max_parts,
                                  double* sums) {
  const int64_t slice = first + blockIdx.x, len = min(block, n - slice * block);
  const int64_t parts = sum_blocks(len);
  double s = 0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) s += partial[blockIdx.x * max_parts + i];
  const double total = 0.0 + block_sum(s);
  if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

// sum_groups over the tensors' sums of squares, in their order: sum_squares
// for one tensor, the square of global_norm for several (the same bits as
// adding sum_squares of each, as the CPU does). Waits for the GPU.
double sum_of_squares(std::span<const Tensor> tensors, bool take_sqrt) {
  std::vector<int64_t> offsets(1, 0);
  for (const Tensor& t : tensors) offsets.push_back(offsets.back() + sum_blocks(t.numel()));
  DeviceTemp partial(static_cast<size_t>(std::max<int64_t>(offsets.back(), 1)) * sizeof(double));
  for (size_t g = 0; g < tensors.size(); ++g) {
    const Tensor& t = tensors[g];
    const int64_t blocks = offsets[g + 1] - offsets[g];
    if (blocks == 0) continue;
    with_float_type(t.dtype(), [&]<typename T>(T) {
      sum_squares_partial_kernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream()>>>(
          ptr<const T>(t), t.numel(), partial.as<double>() + offsets[g]);
      LOOM_CUDA_LAUNCHED();
    });
  }
  DeviceTemp dev_offsets(offsets.size() * sizeof(int64_t)), out(sizeof(double));
  // From pageable memory the copy is staged before it returns: offsets may go.
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dev_offsets.as<void>(), offsets.data(), offsets.size() * sizeof(int64_t),
                                  cudaMemcpyHostToDevice, stream()));
  sum_groups_kernel<<<1, 1024, 0, stream()>>>(partial.as<const double>(), dev_offsets.as<const int64_t>(),
                                              static_cast<int64_t>(tensors.size()), take_sqrt, out.as<double>());
  LOOM_CUDA_LAUNCHED();
  double result = 0;
  read_back(&result, out.as<void>(), sizeof result);
  return result;
}

// The exponent field's bits: all ones is Inf or NaN.
template <typename T> struct ExpMask;
template <> struct ExpMask<float> { using U = uint32_t; static constexpr U value = 0x7f800000u; };
template <> struct ExpMask<__nv_bfloat16> { using U = uint16_t; static constexpr U value = 0x7f80u; };
template <> struct ExpMask<__half> { using U = uint16_t; static constexpr U value = 0x7c00u; };

// *bad = 1 if any element is Inf or NaN (every writer stores the same 1).
template <typename T>
__global__ void all_finite_kernel(const T* x, int64_t n, int* bad) {
  using U = typename ExpMask<T>::U;
  constexpr U mask = ExpMask<T>::value;
  const U* bits = reinterpret_cast<const U*>(x);
  bool found = false;
  for (int64_t i = first_index(); i < n; i += grid_stride()) found |= (bits[i] & mask) == mask;
  if (found) *bad = 1;
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = from_float<T>(to_float(x[i]) * s);
}

}  // namespace

void adamw_step(Tensor param, Tensor m, Tensor v, const Tensor& grad, Tensor param_copy, const AdamWConfig& cfg) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const AdamWScalars s = adamw_scalars(cfg);
  with_float_type(grad.dtype(), [&]<typename G>(G) {
    const G* g = ptr<const G>(grad);
    if (!param_copy.defined()) {
      adamw_kernel<G, float, false><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
          ptr<float>(param), ptr<float>(m), ptr<float>(v), g, nullptr, n, s);
      LOOM_CUDA_LAUNCHED();
      return;
    }
    with_float_type(param_copy.dtype(), [&]<typename P>(P) {
      adamw_kernel<G, P, true><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
          ptr<float>(param), ptr<float>(m), ptr<float>(v), g, ptr<P>(param_copy), n, s);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

double sum_squares(const Tensor& t) { return sum_of_squares({&t, 1}, false); }

double global_norm(std::span<const Tensor> tensors) { return sum_of_squares(tensors, true); }

// Every slice's sum as sum_squares computes it for that slice alone, each
// tensor's in rounds of at most 65535 slices (a grid's y extent), one read
// back at the end.
void sum_squares_blocks(std::span<double> sums, std::span<const Tensor> tensors, int64_t block) {
  constexpr int64_t kRound = 65535;
  int64_t most = 0;  // the partials of the largest round
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel(), count = n / block + (n % block != 0);  // not n + block - 1: block may be huge
    most = std::max(most, std::min(kRound, count) * sum_blocks(std::min(block, n)));
  }
  DeviceTemp partial(static_cast<size_t>(std::max<int64_t>(most, 1)) * sizeof(double));
  DeviceTemp out(sums.size() * sizeof(double));
  int64_t at = 0;  // the first sum of this tensor
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel(), count = n / block + (n % block != 0), max_parts = sum_blocks(std::min(block, n));
    for (int64_t first = 0; first < count; first += kRound) {
      const int64_t slices = std::min(kRound, count - first);
      with_float_type(t.dtype(), [&]<typename T>(T) {
        const dim3 grid(static_cast<unsigned>(max_parts), static_cast<unsigned>(slices));
        sum_squares_slices_kernel<<<grid, kSumThreads, 0, stream()>>>(ptr<const T>(t), n, block, first, max_parts,
                                                                      partial.as<double>());
        LOOM_CUDA_LAUNCHED();
      });
      sum_slices_kernel<<<static_cast<unsigned>(slices), 1024, 0, stream()>>>(
          partial.as<const double>(), n, block, first, max_parts, out.as<double>() + at + first);
      LOOM_CUDA_LAUNCHED();
    }
    at += count;
  }
  read_back(sums.data(), out.as<void>(), sums.size() * sizeof(double));
}

bool all_finite(const Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return true;
  DeviceTemp bad(sizeof(int));
  LOOM_CUDA_CHECK(cudaMemsetAsync(bad.as<void>(), 0, sizeof(int), stream()));
  with_float_type(t.dtype(), [&]<typename T>(T) {
    all_finite_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<const T>(t), n, bad.as<int>());
    LOOM_CUDA_LAUNCHED();
  });
  int result = 0;
  read_back(&result, bad.as<void>(), sizeof result);
  return result == 0;
}

void scale(Tensor t, float s) {
  const int64_t n = t.numel();
  if (n == 0) return;
  with_float_type(t.dtype(), [&]<typename T>(T) {
    scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<T>(t), n, s);
    LOOM_CUDA_LAUNCHED();
  });
}

}  // namespace loom::kernels::cuda
