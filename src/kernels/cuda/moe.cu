// Mixture-of-experts routing and row movement (ops.h) on the GPU: the
// router's top-k, and gathers and scatters of whole rows by the (N, k) row
// table. One block per token (or per token and choice), its threads across
// the C columns, so row reads and writes are coalesced; the sums over a
// token's choices run in j order in f32 with each product and sum rounded
// on its own (__fmul_rn, __fadd_rn: no FMA contraction), the CPU's
// arithmetic (cpu/moe.cpp), so those results are the CPU's bits.
//
// Row ids are checked on the device before anything is written: a bad one
// is the CPU's loom::Error for the first bad entry in flat order.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;


// Threads of a block that walks one row of C columns.
int row_threads(int64_t C) { return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, 256)); }

// ---- row id checks ----------------------------------------------------------

// Reports every id that is neither -1 nor in [0, R); first[row] = the
// smallest flat index that holds row.
__global__ void rows_range_kernel(const int32_t* rows, int64_t n, int64_t R, unsigned long long* first,
                                  unsigned long long* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t r = rows[i];
    if (r == -1) continue;
    if (r < 0 || r >= R) report_bad_id(flag, i);
    else atomicMin(first + r, static_cast<unsigned long long>(i));
  }
}

// Reports every entry that holds a row an earlier entry holds: the CPU's
// second use.
__global__ void rows_reuse_kernel(const int32_t* rows, int64_t n, int64_t R, const unsigned long long* first,
                                  unsigned long long* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t r = rows[i];
    if (r >= 0 && r < R && first[r] != static_cast<unsigned long long>(i)) report_bad_id(flag, i);
  }
}

// Every row id is -1 or in [0, R), and no row is used twice; else the CPU's
// loom::Error for the first bad entry. Waits for the GPU.
void check_row_ids(const char* op, const Tensor& rows, int64_t R) {
  const int64_t n = rows.numel(), k = rows.size(1);
  if (n == 0) return;
  const int32_t* r = ptr<const int32_t>(rows);
  BadIdFlag flag;
  DeviceTemp first(static_cast<size_t>(R) * sizeof(unsigned long long));
  if (R > 0)
    LOOM_CUDA_CHECK(
        cudaMemsetAsync(first.as<void>(), 0xff, static_cast<size_t>(R) * sizeof(unsigned long long), stream()));
  rows_range_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(r, n, R, first.as<unsigned long long>(),
                                                                      flag.device());
  LOOM_CUDA_LAUNCHED();
  rows_reuse_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(r, n, R, first.as<const unsigned long long>(),
                                                                      flag.device());
  LOOM_CUDA_LAUNCHED();
  const int64_t i = flag.first();
  if (i < 0) return;
  int32_t row = 0;
  read_back(&row, r + i, sizeof row);
  if (row < 0 || row >= R)
    fail(op, ": rows[", i / k, ", ", i % k, "] = ", row, " is outside the ", R,
         "-row buffer: allowed -1 (dropped) or [0, ", R, ")");
  fail(op, ": rows[", i / k, ", ", i % k, "] = ", row, " is used by two choices: each row holds one");
}

// ---- top-k ---------------------------------------------------------------------

// The order of the choice: the larger key first, ties to the lower id; a
// NaN key counts as -inf, so the order is total and k distinct experts are
// always found.
__device__ __forceinline__ bool before(float key_a, int64_t a, float key_b, int64_t b) {
  return key_a > key_b || (key_a == key_b && a < b);
}

// One thread per token: k passes over its E experts, each taking the first
// expert (in the order above) after the previous choice, so no chosen set
// is kept. E is small (8 to 256) and the scores stay in L1 across passes.
__global__ void top_k_kernel(int32_t* sel, float* weight, const float* scores, const float* bias, int64_t N,
                             int64_t E, int64_t k, bool normalise) {
  for (int64_t t = first_index(); t < N; t += grid_stride()) {
    const float* p = scores + t * E;
    int32_t* s = sel + t * k;
    float* w = weight + t * k;
    int64_t prev = -1;
    float prev_key = 0.f;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      float best_key = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        float key = p[e] + (bias != nullptr ? bias[e] : 0.f);
        if (key != key) key = -INFINITY;
        if (prev >= 0 && !before(prev_key, prev, key, e)) continue;  // already chosen
        if (best < 0 || before(key, e, best_key, best)) best = e, best_key = key;
      }
      s[j] = static_cast<int32_t>(best);
      sum += p[best];
      prev = best, prev_key = best_key;
    }
    for (int64_t j = 0; j < k; ++j) {
      const float pj = p[s[j]];
      w[j] = normalise ? static_cast<float>(static_cast<double>(pj) / sum) : pj;
    }
  }
}

// ---- row movement -------------------------------------------------------------------

// One block per (token, choice) b = t * k + j: xs[rows[b]] = x[t].
template <typename T>
__global__ void dispatch_kernel(T* xs, const T* x, const int32_t* rows, int64_t k, int64_t C) {
  const int64_t b = blockIdx.x;
  const int32_t row = rows[b];
  if (row < 0) return;
  const T* src = x + (b / k) * C;
  T* dst = xs + static_cast<int64_t>(row) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// One block per token t: dx[t] += dxs[rows[t, j]] for j in order, each add
// rounded (the CPU's order).
__global__ void dispatch_backward_kernel(float* dx, const float* dxs, const int32_t* rows, int64_t k, int64_t C) {
  const int64_t t = blockIdx.x;
  const int32_t* r = rows + t * k;
  float* o = dx + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = o[c];
    for (int64_t j = 0; j < k; ++j)
      if (r[j] >= 0) acc = __fadd_rn(acc, dxs[static_cast<int64_t>(r[j]) * C + c]);
    o[c] = acc;
  }
}

// One block per token t: y[t] = sum over kept j of weight[t, j] * ys[rows[t, j]].
template <typename T>
__global__ void combine_kernel(T* y, const T* ys, const int32_t* rows, const float* weight, int64_t k, int64_t C) {
  const int64_t t = blockIdx.x;
  const int32_t* r = rows + t * k;
  const float* w = weight + t * k;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j)
      if (r[j] >= 0) acc = __fadd_rn(acc, __fmul_rn(w[j], to_float(ys[static_cast<int64_t>(r[j]) * C + c])));
    y[t * C + c] = from_float<T>(acc);
  }
}

// One block per (token, choice) b = t * k + j with row = rows[b]:
// dys[row] = weight[b] * dy[t]; dweight[b] = dot(dy[t], ys[row]) in double
// (a fixed tree over the block), 0 where the choice was dropped.
template <typename T>
__global__ void combine_backward_kernel(float* dys, float* dweight, const float* dy, const T* ys,
                                        const int32_t* rows, const float* weight, int64_t k, int64_t C) {
  const int64_t b = blockIdx.x;
  const int32_t row = rows[b];
  if (row < 0) {  // the whole block
    if (threadIdx.x == 0) dweight[b] = 0.f;
    return;
  }
  const float* g = dy + (b / k) * C;
  const T* v = ys + static_cast<int64_t>(row) * C;
  float* o = dys + static_cast<int64_t>(row) * C;
  const float wb = weight[b];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dot += static_cast<double>(g[c]) * static_cast<double>(to_float(v[c]));
    o[c] = __fmul_rn(wb, g[c]);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dweight[b] = static_cast<float>(dot);
}

}  // namespace

// scores: (N, E)  bias: (E) or undefined  sel, weight: (N, k)
void moe_top_k(Tensor sel, Tensor weight, const Tensor& scores, const Tensor& bias, bool normalise) {
  const int64_t N = scores.size(0), E = scores.size(1), k = sel.size(1);
  if (N == 0) return;
  top_k_kernel<<<grid_for(N, 128), 128, 0, stream()>>>(ptr<int32_t>(sel), ptr<float>(weight),
                                                       ptr<const float>(scores),
                                                       bias.defined() ? ptr<const float>(bias) : nullptr, N, E, k,
                                                       normalise);
  LOOM_CUDA_LAUNCHED();
}

// x: (N, C)  xs: (R, C)  rows: (N, k)
void moe_dispatch(Tensor xs, const Tensor& x, const Tensor& rows) {
  check_row_ids("moe_dispatch", rows, xs.size(0));
  const int64_t C = x.size(1), k = rows.size(1), choices = rows.numel();
  if (choices == 0 || C == 0) return;
  with_float_type(x.dtype(), [&]<typename T>(T) {
    dispatch_kernel<<<static_cast<unsigned>(choices), row_threads(C), 0, stream()>>>(
        ptr<T>(xs), ptr<const T>(x), ptr<const int32_t>(rows), k, C);
    LOOM_CUDA_LAUNCHED();
  });
}

// dxs: (R, C)  dx: (N, C)  rows: (N, k), f32
void moe_dispatch_backward(Tensor dx, const Tensor& dxs, const Tensor& rows) {
  check_row_ids("moe_dispatch_backward", rows, dxs.size(0));
  const int64_t N = dx.size(0), C = dx.size(1), k = rows.size(1);
  if (N == 0 || C == 0) return;
  dispatch_backward_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
      ptr<float>(dx), ptr<const float>(dxs), ptr<const int32_t>(rows), k, C);
  LOOM_CUDA_LAUNCHED();
}

// ys: (R, C)  y: (N, C)  rows, weight: (N, k)
void moe_combine(Tensor y, const Tensor& ys, const Tensor& rows, const Tensor& weight) {
  check_row_ids("moe_combine", rows, ys.size(0));
  const int64_t N = y.size(0), C = y.size(1), k = rows.size(1);
  if (N == 0 || C == 0) return;
  with_float_type(y.dtype(), [&]<typename T>(T) {
    combine_kernel<<<static_cast<unsigned>(N), row_threads(C), 0, stream()>>>(
        ptr<T>(y), ptr<const T>(ys), ptr<const int32_t>(rows), ptr<const float>(weight), k, C);
    LOOM_CUDA_LAUNCHED();
  });
}

// dy: (N, C) f32  ys: (R, C)  dys: (R, C) f32  rows, weight, dweight: (N, k)
void moe_combine_backward(Tensor dys, Tensor dweight, const Tensor& dy, const Tensor& ys, const Tensor& rows,
                          const Tensor& weight) {
  check_row_ids("moe_combine_backward", rows, ys.size(0));
  const int64_t C = dy.size(1), k = rows.size(1), choices = rows.numel();
  if (choices == 0) return;
  with_float_type(ys.dtype(), [&]<typename T>(T) {
    combine_backward_kernel<<<static_cast<unsigned>(choices), row_threads(C), 0, stream()>>>(
        ptr<float>(dys), ptr<float>(dweight), ptr<const float>(dy), ptr<const T>(ys), ptr<const int32_t>(rows),
        ptr<const float>(weight), k, C);
    LOOM_CUDA_LAUNCHED();
  });
}

}  // namespace loom::kernels::cuda
