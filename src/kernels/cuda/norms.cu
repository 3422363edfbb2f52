// LayerNorm (GPT-2) and RMSNorm (Llama) over the last dim, forward and
// backward (ops.h), with cpu/norms.cpp's formulas: rows loaded as f32,
// computed in f32, stored in the operand's dtype (one RNE rounding; a
// gradient is added as T(f32(dx) + g)).
//
// Forward and dx: one block per row, its sums by block_sum's fixed tree;
// LayerNorm's backward of rows up to 1024 wide: one warp per row, its sums
// by xor butterflies (layernorm_backward_warps_kernel).
// dw / db are sums over rows, reduced without atomics: the rows are cut into
// at most kRowBlocks fixed row blocks (a function of N alone), the block that
// owns a row block sums its rows in order, each thread its own columns, into
// shared memory (or, for rows too wide for it, straight into its slice of the
// partials), and writes them to its row of a (n_blocks, n_grads, C) f32
// temporary; a second kernel adds the partials in block order and adds the
// total into dw / db once. So every run gives the same bits.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int64_t kRowBlocks = 256;  // enough blocks to fill an H100/H200 (132 SMs) twice
constexpr int kColThreads = 256;     // threads per block of the partials' final sum

// Threads for one block per row of n elements: about 8 elements each, a
// multiple of 32 in [32, 1024].
int row_threads(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + 255) / 256 * 32, 32, 1024)); }

// f(T{}) for T = float when the gradient g is f32, else TX (ops.h: a
// gradient is f32 or its operand's dtype).
template <typename TX, typename F>
void with_grad_type(const Tensor& g, F&& f) {
  if (g.dtype() == DType::f32) f(float{});
  else f(TX{});
}

// Row block k of N rows cut into n_blocks: rows [begin(k), begin(k + 1)).
__host__ __device__ __forceinline__ int64_t block_begin(int64_t k, int64_t N, int64_t n_blocks) {
  return k * N / n_blocks;
}

// Whether `bytes` of dynamic shared memory can be given to `kernel`
// (asking for the opt-in above the default 48 KiB where needed).
template <typename Kernel>
bool fits_shared(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  int device = 0, optin = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes + 1024 > static_cast<size_t>(optin)) return false;  // 1 KiB for block_sum's static arrays
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return true;
}

// grad[c] += sum over k in order of partial[k * stride + c].   grad: (C)
template <typename TG>
__global__ void add_partials_kernel(TG* grad, const float* partial, int64_t n_blocks, int64_t stride, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int64_t k = 0; k < n_blocks; ++k) acc += partial[k * stride + c];
  grad[c] = from_float<TG>(to_float(grad[c]) + acc);
}

// grad += partials g of (n_blocks, n_grads, C); an undefined grad is skipped.
void add_partials(const Tensor& grad, const float* partial, int64_t g, int64_t n_grads, int64_t n_blocks,
                  int64_t C) {
  if (!grad.defined()) return;
  with_float_type(grad.dtype(), [&](auto tag) {
    using TG = decltype(tag);
    add_partials_kernel<<<static_cast<unsigned>((C + kColThreads - 1) / kColThreads), kColThreads, 0, stream()>>>(
        ptr<TG>(grad), partial + g * C, n_blocks, n_grads * C, C);
    LOOM_CUDA_LAUNCHED();
  });
}

// The accumulators of row block k, n_grads rows of C: shared memory, or its
// slice of the partials when acc_in_shared is false. A thread owns columns
// i = threadIdx.x (mod blockDim.x) of every row, zeroes them here and is the
// only one to touch them, so no barrier is needed.
__device__ __forceinline__ float* row_block_acc(float* shared, float* partial, bool acc_in_shared, int n_grads,
                                                int64_t C) {
  float* acc = acc_in_shared ? shared : partial + static_cast<int64_t>(blockIdx.x) * n_grads * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    for (int g = 0; g < n_grads; ++g) acc[g * C + i] = 0.f;
  return acc;
}

// The shared accumulators to row block k's partials (this thread's columns).
__device__ __forceinline__ void save_acc(const float* acc, float* partial, bool acc_in_shared, int n_grads,
                                         int64_t C) {
  if (!acc_in_shared) return;
  float* out = partial + static_cast<int64_t>(blockIdx.x) * n_grads * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    for (int g = 0; g < n_grads; ++g) out[g * C + i] = acc[g * C + i];
}

// ---- LayerNorm -----------------------------------------------------------------

// One block per row: two-pass mean and variance (no cancellation for rows
// with a large mean).   x, y: (N, C)  w, b: (C) (b may be null)  mean, rstd: (N) or null
template <typename T>
__device__ void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, float eps,
                              int64_t C) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* yr = y + r * C;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += to_float(xr[i]);
  const float m = block_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = to_float(xr[i]) - m;
    v += d * d;
  }
  const float var = block_sum(v);
  const float rs = 1.f / sqrtf(var / static_cast<float>(C) + eps);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float bi = b ? to_float(b[i]) : 0.f;
    yr[i] = from_float<T>((to_float(xr[i]) - m) * rs * to_float(w[i]) + bi);
  }
  if (threadIdx.x == 0) {
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b,
                                         float eps, int64_t C) {
  layernorm_row(y, mean, rstd, x, w, b, eps, C);
}

// The fused residual's row blockIdx.x: sum = a + b, rounded as add rounds
// it. Each thread adds the columns it then normalises (layernorm_row's and
// rmsnorm_row's columns: threadIdx.x, then a stride of blockDim.x), so it
// reads back only what it wrote itself: no barrier.
template <typename T>
__device__ void residual_row(T* sum, const T* a, const T* b, int64_t C) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    sum[base + i] = from_float<T>(to_float(a[base + i]) + to_float(b[base + i]));
}

template <typename T>
__global__ void add_layernorm_forward_kernel(T* sum, T* y, float* mean, float* rstd, const T* a, const T* b,
                                             const T* w, const T* bias, float eps, int64_t C) {
  residual_row(sum, a, b, C);
  layernorm_row(y, mean, rstd, static_cast<const T*>(sum), w, bias, eps, C);
}

// Block k owns rows [block_begin(k), block_begin(k + 1)). xhat = (x - mean) rstd, g = w dy:
//   dx += rstd (g - mean(g) - xhat mean(g xhat))   (dx may be null)
//   partial[k] = (sum dy xhat, sum dy) over the block's rows (partial null: not wanted)
template <typename T, typename TDY, typename TDX>
__global__ void layernorm_backward_kernel(TDX* dx, float* partial, bool acc_in_shared, const TDY* dy, const T* x,
                                          const T* w, const float* mean, const float* rstd, int64_t N,
                                          int64_t n_blocks, int64_t C) {
  extern __shared__ float shared[];
  const int64_t k = blockIdx.x;
  float* acc = partial ? row_block_acc(shared, partial, acc_in_shared, 2, C) : nullptr;  // dw: [0, C), db: [C, 2C)
  for (int64_t r = block_begin(k, N, n_blocks); r < block_begin(k + 1, N, n_blocks); ++r) {
    const T* xr = x + r * C;
    const TDY* dyr = dy + r * C;
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      const float xi = to_float(xr[i]), dyi = to_float(dyr[i]);
      const float xhat = (xi - m) * rs;
      if (acc) {
        acc[i] += dyi * xhat;
        acc[C + i] += dyi;
      }
      const float gi = to_float(w[i]) * dyi;
      sum_g += gi;
      sum_gx += gi * xhat;
    }
    if (!dx) continue;  // the same for every thread: no block_sum is skipped by some
    const float mg = block_sum(sum_g) / static_cast<float>(C);
    const float mgx = block_sum(sum_gx) / static_cast<float>(C);
    TDX* dxr = dx + r * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      const float xi = to_float(xr[i]), dyi = to_float(dyr[i]);
      const float g = rs * (to_float(w[i]) * dyi - mg - (xi - m) * rs * mgx);
      dxr[i] = from_float<TDX>(to_float(dxr[i]) + g);
    }
  }
  if (acc) save_acc(acc, partial, acc_in_shared, 2, C);
}

// The same for rows of at most 32 CPL elements, one warp per row: the row's
// x and dy stay in registers (lane l holds columns l + 32 j; w is read
// through L1, where the block's rows keep it), its two sums
// are xor butterflies (no block barrier per row), and each warp adds its
// rows' dw, db terms into registers. Block k (8 warps) owns rows
// [block_begin(k), block_begin(k + 1)), warp v every 8th from the v-th; the
// warps' sums are then added in warp order through shared memory (2 C
// floats) into partial[k]. Every sum has a fixed order: reproducible.
constexpr int kRowWarps = 8;
template <typename T, typename TDY, typename TDX, int CPL>
__global__ void __launch_bounds__(32 * kRowWarps)
    layernorm_backward_warps_kernel(TDX* dx, float* partial, const TDY* dy, const T* x, const T* w, const float* mean,
                                    const float* rstd, int64_t N, int64_t n_blocks, int64_t C) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k = blockIdx.x;
  float dw[CPL] = {}, db[CPL] = {};
  for (int64_t r = block_begin(k, N, n_blocks) + warp; r < block_begin(k + 1, N, n_blocks); r += kRowWarps) {
    const float m = mean[r], rs = rstd[r];
    float xv[CPL], dyv[CPL], sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int64_t c = lane + 32 * j;
      xv[j] = c < C ? to_float(x[r * C + c]) : 0.f;
      dyv[j] = c < C ? to_float(dy[r * C + c]) : 0.f;
      const float xhat = (xv[j] - m) * rs;  // past C, dy is 0: adds nothing
      dw[j] += dyv[j] * xhat;
      db[j] += dyv[j];
      const float g = (c < C ? to_float(w[c]) : 0.f) * dyv[j];  // w from L1: registers go to the row
      sum_g += g;
      sum_gx += g * xhat;
    }
    if (!dx) continue;
    const float mg = warp_sum(sum_g) / static_cast<float>(C);
    const float mgx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int64_t c = lane + 32 * j;
      if (c >= C) continue;
      const float g = rs * (to_float(w[c]) * dyv[j] - mg - (xv[j] - m) * rs * mgx);
      dx[r * C + c] = from_float<TDX>(to_float(dx[r * C + c]) + g);
    }
  }
  if (!partial) return;
  for (int v = 0; v < kRowWarps; ++v) {  // the warps' sums in warp order
    if (warp == v)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int64_t c = lane + 32 * j;
        if (c >= C) continue;
        shared[c] = v == 0 ? dw[j] : shared[c] + dw[j];
        shared[C + c] = v == 0 ? db[j] : shared[C + c] + db[j];
      }
    __syncthreads();
  }
  float* out = partial + k * 2 * C;
  for (int64_t i = threadIdx.x; i < 2 * C; i += blockDim.x) out[i] = shared[i];
}

// ---- RMSNorm -------------------------------------------------------------------

// One block per row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T>
__device__ void rmsnorm_row(T* y, float* rstd, const T* x, const T* w, float eps, int64_t C) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* yr = y + r * C;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float xi = to_float(xr[i]);
    s += xi * xi;
  }
  const float ss = block_sum(s);
  const float rs = 1.f / sqrtf(ss / static_cast<float>(C) + eps);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = from_float<T>(to_float(w[i]) * (to_float(xr[i]) * rs));
  if (threadIdx.x == 0 && rstd) rstd[r] = rs;
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, float eps, int64_t C) {
  rmsnorm_row(y, rstd, x, w, eps, C);
}

template <typename T>
__global__ void add_rmsnorm_forward_kernel(T* sum, T* y, float* rstd, const T* a, const T* b, const T* w, float eps,
                                           int64_t C) {
  residual_row(sum, a, b, C);
  rmsnorm_row(y, rstd, static_cast<const T*>(sum), w, eps, C);
}

// Block k owns rows [block_begin(k), block_begin(k + 1)):
//   dx += rstd w dy - x rstd^3 mean(w dy x)   (dx may be null)
//   partial[k] = sum dy x rstd over the block's rows (partial null: not wanted)
template <typename T, typename TDY, typename TDX>
__global__ void rmsnorm_backward_kernel(TDX* dx, float* partial, bool acc_in_shared, const TDY* dy, const T* x,
                                        const T* w, const float* rstd, int64_t N, int64_t n_blocks, int64_t C) {
  extern __shared__ float shared[];
  const int64_t k = blockIdx.x;
  float* acc = partial ? row_block_acc(shared, partial, acc_in_shared, 1, C) : nullptr;
  for (int64_t r = block_begin(k, N, n_blocks); r < block_begin(k + 1, N, n_blocks); ++r) {
    const T* xr = x + r * C;
    const TDY* dyr = dy + r * C;
    const float rs = rstd[r];
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      const float xi = to_float(xr[i]), dyi = to_float(dyr[i]);
      if (acc) acc[i] += dyi * (xi * rs);
      sum += to_float(w[i]) * dyi * xi;
    }
    if (!dx) continue;  // the same for every thread
    const float k3 = rs * rs * rs * block_sum(sum) / static_cast<float>(C);
    TDX* dxr = dx + r * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      const float xi = to_float(xr[i]), dyi = to_float(dyr[i]);
      const float g = rs * to_float(w[i]) * dyi - xi * k3;
      dxr[i] = from_float<TDX>(to_float(dxr[i]) + g);
    }
  }
  if (acc) save_acc(acc, partial, acc_in_shared, 1, C);
}

// The row blocks of a backward: N blocks of one row when no parameter
// gradient is wanted (no partials), else at most kRowBlocks.
int64_t backward_blocks(int64_t N, bool want_params) { return want_params ? std::min(N, kRowBlocks) : N; }

}  // namespace

// x, y: (..., C)  w: (C)  b: (C) or undefined  mean, rstd: one f32 per row, or undefined.
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (N == 0) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
        ptr<T>(y), ptr<float>(mean), ptr<float>(rstd), ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, C);
    LOOM_CUDA_LAUNCHED();
  });
}

void add_layernorm_forward(Tensor sum, Tensor y, Tensor mean, Tensor rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, float eps) {
  const int64_t C = sum.size(-1), N = C ? sum.numel() / C : 0;
  if (N == 0) return;
  with_float_type(sum.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_layernorm_forward_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
        ptr<T>(sum), ptr<T>(y), ptr<float>(mean), ptr<float>(rstd), ptr<T>(a), ptr<T>(b), ptr<T>(w), ptr<T>(bias), eps,
        C);
    LOOM_CUDA_LAUNCHED();
  });
}

// dx, dy: f32 or x's dtype; dw, db: f32 or w's dtype; dx, dw, db may be undefined.
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  const bool want_params = dw.defined() || db.defined();
  if (N == 0 || (!dx.defined() && !want_params)) return;
  // Rows of up to 1024 (GPT-2 to 350m): a warp per row; wider, a block.
  const int cpl = static_cast<int>((C + 255) / 256 * 8);  // columns per lane, a multiple of 8
  const bool by_warps = cpl <= 32;
  const int64_t n_blocks = by_warps ? std::min((N + kRowWarps - 1) / kRowWarps, want_params ? kRowBlocks : N)
                                    : backward_blocks(N, want_params);
  DeviceTemp partial(want_params ? static_cast<size_t>(n_blocks * 2 * C) * sizeof(float) : 0);
  with_float_type(x.dtype(), [&](auto tx) {
    using T = decltype(tx);
    with_grad_type<T>(dy, [&](auto tdy) {
      with_grad_type<T>(dx, [&](auto tdx) {
        using TDY = decltype(tdy);
        using TDX = decltype(tdx);
        const size_t bytes = want_params ? 2 * static_cast<size_t>(C) * sizeof(float) : 0;
        if (by_warps) {
          float* part = want_params ? partial.as<float>() : nullptr;
          const auto launch = [&](auto kernel) {
            kernel<<<static_cast<unsigned>(n_blocks), 32 * kRowWarps, bytes, stream()>>>(
                ptr<TDX>(dx), part, ptr<TDY>(dy), ptr<T>(x), ptr<T>(w), ptr<float>(mean), ptr<float>(rstd), N,
                n_blocks, C);
            LOOM_CUDA_LAUNCHED();
          };
          if (cpl == 8) launch(layernorm_backward_warps_kernel<T, TDY, TDX, 8>);
          else if (cpl == 16) launch(layernorm_backward_warps_kernel<T, TDY, TDX, 16>);
          else if (cpl == 24) launch(layernorm_backward_warps_kernel<T, TDY, TDX, 24>);
          else launch(layernorm_backward_warps_kernel<T, TDY, TDX, 32>);
          return;
        }
        const auto kernel = layernorm_backward_kernel<T, TDY, TDX>;
        const bool in_shared = fits_shared(kernel, bytes);
        kernel<<<static_cast<unsigned>(n_blocks), row_threads(C), in_shared ? bytes : 0, stream()>>>(
            ptr<TDX>(dx), partial.as<float>(), in_shared, ptr<TDY>(dy), ptr<T>(x), ptr<T>(w), ptr<float>(mean),
            ptr<float>(rstd), N, n_blocks, C);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
  if (!want_params) return;
  add_partials(dw, partial.as<float>(), 0, 2, n_blocks, C);
  add_partials(db, partial.as<float>(), 1, 2, n_blocks, C);
}

// x, y: (..., C)  w: (C)  rstd: one f32 per row, or undefined.
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (N == 0) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
        ptr<T>(y), ptr<float>(rstd), ptr<T>(x), ptr<T>(w), eps, C);
    LOOM_CUDA_LAUNCHED();
  });
}

void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                         float eps) {
  const int64_t C = sum.size(-1), N = C ? sum.numel() / C : 0;
  if (N == 0) return;
  with_float_type(sum.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_rmsnorm_forward_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
        ptr<T>(sum), ptr<T>(y), ptr<float>(rstd), ptr<T>(a), ptr<T>(b), ptr<T>(w), eps, C);
    LOOM_CUDA_LAUNCHED();
  });
}

// dx, dy: f32 or x's dtype; dw: f32 or w's dtype; dx, dw may be undefined.
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  const bool want_params = dw.defined();
  if (N == 0 || (!dx.defined() && !want_params)) return;
  const int64_t n_blocks = backward_blocks(N, want_params);
  DeviceTemp partial(want_params ? static_cast<size_t>(n_blocks * C) * sizeof(float) : 0);
  with_float_type(x.dtype(), [&](auto tx) {
    using T = decltype(tx);
    with_grad_type<T>(dy, [&](auto tdy) {
      with_grad_type<T>(dx, [&](auto tdx) {
        using TDY = decltype(tdy);
        using TDX = decltype(tdx);
        const auto kernel = rmsnorm_backward_kernel<T, TDY, TDX>;
        const size_t bytes = want_params ? static_cast<size_t>(C) * sizeof(float) : 0;
        const bool in_shared = fits_shared(kernel, bytes);
        kernel<<<static_cast<unsigned>(n_blocks), row_threads(C), in_shared ? bytes : 0, stream()>>>(
            ptr<TDX>(dx), partial.as<float>(), in_shared, ptr<TDY>(dy), ptr<T>(x), ptr<T>(w), ptr<float>(rstd), N,
            n_blocks, C);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
  if (want_params) add_partials(dw, partial.as<float>(), 0, 1, n_blocks, C);
}

}  // namespace loom::kernels::cuda
