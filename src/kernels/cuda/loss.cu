// Fused cross-entropy forward + backward (ops.h) on the GPU, and its
// vocab-parallel halves (Megatron's VocabParallelCrossEntropy): the CPU's
// algorithm (cpu/cross_entropy.cpp) with one block per row.
//
// Pass 1 has each thread keep a running (max, sum of exp) over its columns
// of the row, the online log-sum-exp (Milakov & Gimelshein 2018); the block
// combines them at the row's max, in double, by fixed trees (block_max,
// block_sum), so the bits do not change run to run. Pass 2 reads the row
// again and writes dlogits = scale * (softmax - onehot) element by element:
// each element is read and written by the same thread, so dlogits may be the
// logits (in place). The target's logit is read before pass 1's barriers,
// hence before any element is overwritten.
//
// Target ids are checked (and counted) by a first kernel whose result is
// read back before anything is written, so a bad one is the CPU's
// loom::Error and leaves the outputs intact.
#include <cmath>
#include <cstdint>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/validate.h"

namespace loom::kernels::cuda {
namespace {

constexpr const char* kOp = "cross_entropy_forward_backward";
constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Threads of a row's block: enough to stream a large vocabulary, few for a
// small one.
int row_threads(int64_t V) { return V >= 4096 ? 512 : 128; }

// ---- targets -----------------------------------------------------------------

// *count += the targets that are not ignore_index (integer atomics: exact);
// with a flag, every one of those outside [0, hi) is reported.
__global__ void count_targets_kernel(const int32_t* targets, int64_t n, int32_t ignore_index, int64_t hi,
                                     unsigned long long* flag, unsigned long long* count) {
  unsigned int c = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t t = targets[i];
    if (t == ignore_index) continue;
    ++c;
    if (flag != nullptr && (t < 0 || t >= hi)) report_bad_id(flag, i);
  }
  c = __reduce_add_sync(0xffffffffu, c);  // every lane is here: the loop has no early exit
  if (threadIdx.x % 32 == 0 && c != 0) atomicAdd(count, static_cast<unsigned long long>(c));
}

struct Counted {
  int64_t valid = 0;       // targets that are not ignore_index
  int64_t first_bad = -1;  // with check: the first outside [0, hi), or -1
};

// Waits for the GPU.
Counted count_targets(const Tensor& targets, int32_t ignore_index, int64_t hi, bool check) {
  const int64_t n = targets.numel();
  if (n == 0) return {};
  DeviceTemp count(sizeof(unsigned long long));
  LOOM_CUDA_CHECK(cudaMemsetAsync(count.as<void>(), 0, sizeof(unsigned long long), stream()));
  std::optional<BadIdFlag> flag;
  if (check) flag.emplace();
  count_targets_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      ptr<const int32_t>(targets), n, ignore_index, hi, check ? flag->device() : nullptr,
      count.as<unsigned long long>());
  LOOM_CUDA_LAUNCHED();
  unsigned long long valid = 0;
  read_back(&valid, count.as<void>(), sizeof valid);
  return {static_cast<int64_t>(valid), check ? flag->first() : -1};
}

int32_t target_at(const Tensor& targets, int64_t r) {
  int32_t t = 0;
  read_back(&t, ptr<const int32_t>(targets) + r, sizeof t);
  return t;
}

// A shard's targets: each ignore_index or >= 0 (a negative one would be
// absent from every shard), else the CPU's loom::Error.
void check_shard_targets(const char* op, const Tensor& targets, int32_t ignore_index) {
  const int64_t r = count_targets(targets, ignore_index, INT64_MAX, true).first_bad;
  if (r >= 0)
    op_fail(op, {{"targets", targets}}, "target ", target_at(targets, r), " at row ", r,
            " is negative and is not ignore_index ", ignore_index);
}

// ---- rows ----------------------------------------------------------------------

// log(sum_{i < n} exp(x[i])) by the whole block (every thread gets it).
// Synchronises the block.
template <typename T>
__device__ double block_logsumexp(const T* x, int64_t n) {
  float m = -INFINITY, s = 0.f;  // this thread's running max and sum of exp(x - m)
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(x[i]);
    if (v > m) {
      s = s * expf(m - v) + 1.f;  // exp(-inf) = 0 on the thread's first element
      m = v;
    } else if (v != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN); NaN propagates
      s += expf(v - m);
    }
  }
  const float M = block_max(m);
  const double part = s == 0.f ? 0.0 : static_cast<double>(s) * exp(static_cast<double>(m) - static_cast<double>(M));
  return static_cast<double>(M) + log(block_sum(part));
}

// d[i] = scale * softmax_i over the row's n columns, d[target] -= scale (no
// target when target < 0). lse is split in f32 hi + lo so that its rounding
// to f32 does not add to the exponent's error (the CPU's row_dlogits).
template <typename T, typename G>
__device__ void row_dlogits(G* d, const T* x, int64_t n, double lse, int64_t target, float scale) {
  const float hi = static_cast<float>(lse);
  const float lo = static_cast<float>(lse - static_cast<double>(hi));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float p = expf((to_float(x[i]) - hi) - lo);
    d[i] = from_float<G>(scale * (i == target ? p - 1.f : p));
  }
}

template <typename G>
__device__ void row_zero(G* d, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = from_float<G>(0.f);
}

// One block per row r of logits (N, V): row_loss[r] = lse - x[target] in
// double (0 when ignored), losses[r] its f32 (when not null), and with
// kGrad the row's dlogits.
template <typename T, typename G, bool kGrad>
__global__ void ce_rows_kernel(G* dlogits, float* losses, double* row_loss, const T* logits, const int32_t* targets,
                               int64_t V, int32_t ignore_index, float scale) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * V;
  const int32_t t = targets[r];
  if (t == ignore_index) {  // the whole block takes this branch
    if (threadIdx.x == 0) {
      row_loss[r] = 0;
      if (losses != nullptr) losses[r] = 0.f;
    }
    if constexpr (kGrad) row_zero(dlogits + r * V, V);
    return;
  }
  const float x_t = to_float(x[t]);
  const double lse = block_logsumexp(x, V);
  if (threadIdx.x == 0) {
    const double loss = lse - static_cast<double>(x_t);
    row_loss[r] = loss;
    if (losses != nullptr) losses[r] = static_cast<float>(loss);
  }
  if constexpr (kGrad) row_dlogits(dlogits + r * V, x, V, lse, t, scale);
}

// One block: *out = the sum of v[0, n) in double by a fixed tree.
__global__ void sum_kernel(const double* v, int64_t n, double* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// ---- vocab-parallel shard --------------------------------------------------------

struct ShardArgs {
  int64_t V_local;                 // columns per row
  int64_t vocab_begin, valid;      // columns [0, valid) are real, [valid, V_local) padding
  const int32_t* targets;
  int32_t ignore_index;
};

// Row r's target as a column of the shard, or -1 when the row is ignored or
// its target is not among the shard's valid columns.
__device__ __forceinline__ int64_t shard_target(const ShardArgs& a, int64_t r) {
  const int32_t t = a.targets[r];
  if (t == a.ignore_index) return -1;
  const int64_t j = static_cast<int64_t>(t) - a.vocab_begin;
  return j >= 0 && j < a.valid ? j : -1;
}

template <typename T>
__global__ void shard_stats_kernel(float* lse, float* target_logit, const T* logits, ShardArgs a) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * a.V_local;
  const bool skip = a.targets[r] == a.ignore_index || a.valid == 0;  // the same for the whole block
  const double l = skip ? -INFINITY : block_logsumexp(x, a.valid);
  if (threadIdx.x == 0) {
    lse[r] = static_cast<float>(l);
    const int64_t j = shard_target(a, r);
    target_logit[r] = j >= 0 ? to_float(x[j]) : 0.f;
  }
}

template <typename T, typename G>
__global__ void shard_backward_kernel(G* dlogits, const T* logits, const float* lse, float scale, ShardArgs a) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * a.V_local;
  G* d = dlogits + r * a.V_local;
  if (a.targets[r] == a.ignore_index) {
    row_zero(d, a.V_local);
    return;
  }
  row_dlogits(d, x, a.valid, static_cast<double>(lse[r]), shard_target(a, r), scale);
  row_zero(d + a.valid, a.V_local - a.valid);
}

// Per row i, over the ranks r in order: the max of their lse, the log-sum-exp
// and the target logits' sum in double. stats: (P, 2, N).
__global__ void shard_combine_kernel(float* lse, float* target_logit, const float* stats, int64_t P, int64_t N) {
  for (int64_t i = first_index(); i < N; i += grid_stride()) {
    float m = -INFINITY;
    for (int64_t r = 0; r < P; ++r) {
      const float v = stats[2 * N * r + i];
      m = m < v ? v : m;  // std::max(m, v)
    }
    double s = 0, t = 0;
    for (int64_t r = 0; r < P; ++r) {
      const float* pair = stats + 2 * N * r;
      if (m != -INFINITY) s += exp(static_cast<double>(pair[i]) - static_cast<double>(m));
      t += static_cast<double>(pair[N + i]);
    }
    lse[i] = m == -INFINITY ? m : static_cast<float>(static_cast<double>(m) + log(s));
    target_logit[i] = static_cast<float>(t);
  }
}

// One block: out[0] = the sum over the non-ignored rows of double(lse) -
// target_logit, out[1] = their count, each by a fixed tree.
__global__ void shard_loss_kernel(const float* lse, const float* target_logit, const int32_t* targets, int64_t n,
                                  int32_t ignore_index, double* out) {
  double s = 0, c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (targets[i] != ignore_index) s += static_cast<double>(lse[i]) - static_cast<double>(target_logit[i]), c += 1;
  s = block_sum(s);
  c = block_sum(c);
  if (threadIdx.x == 0) out[0] = s, out[1] = c;
}

}  // namespace

float cross_entropy_forward_backward(Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index, float dloss) {
  const int64_t V = logits.size(-1), N = rows(logits);
  const Counted counted = count_targets(targets, ignore_index, V, true);
  if (counted.first_bad >= 0)
    op_fail(kOp, {{"logits", logits}, {"targets", targets}}, "target ", target_at(targets, counted.first_bad),
            " at row ", counted.first_bad, " is outside [0, ", V, ") and is not ignore_index ", ignore_index);
  const int64_t n_valid = counted.valid;
  if (N == 0) return 0.f;
  const float scale = n_valid ? static_cast<float>(static_cast<double>(dloss) / static_cast<double>(n_valid)) : 0.f;
  DeviceTemp row_loss(static_cast<size_t>(N) * sizeof(double)), total(sizeof(double));
  float* l = losses.defined() ? ptr<float>(losses) : nullptr;
  const int threads = row_threads(V);
  const auto blocks = static_cast<unsigned>(N);
  with_float_type(logits.dtype(), [&]<typename T>(T) {
    const T* x = ptr<const T>(logits);
    const int32_t* t = ptr<const int32_t>(targets);
    if (!dlogits.defined()) {
      ce_rows_kernel<T, float, false><<<blocks, threads, 0, stream()>>>(nullptr, l, row_loss.as<double>(), x, t, V,
                                                                        ignore_index, scale);
      LOOM_CUDA_LAUNCHED();
      return;
    }
    with_float_type(dlogits.dtype(), [&]<typename G>(G) {
      ce_rows_kernel<T, G, true><<<blocks, threads, 0, stream()>>>(ptr<G>(dlogits), l, row_loss.as<double>(), x, t,
                                                                   V, ignore_index, scale);
      LOOM_CUDA_LAUNCHED();
    });
  });
  if (n_valid == 0) return 0.f;
  sum_kernel<<<1, 1024, 0, stream()>>>(row_loss.as<const double>(), N, total.as<double>());
  LOOM_CUDA_LAUNCHED();
  double sum = 0;
  read_back(&sum, total.as<void>(), sizeof sum);
  return static_cast<float>(sum / static_cast<double>(n_valid));
}

void cross_entropy_shard_stats(Tensor lse, Tensor target_logit, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_begin, int64_t valid, int32_t ignore_index) {
  check_shard_targets("cross_entropy_shard_stats", targets, ignore_index);
  const int64_t N = rows(logits), V_local = logits.size(-1);
  if (N == 0) return;
  const ShardArgs args{V_local, vocab_begin, valid, ptr<const int32_t>(targets), ignore_index};
  with_float_type(logits.dtype(), [&]<typename T>(T) {
    shard_stats_kernel<<<static_cast<unsigned>(N), row_threads(valid), 0, stream()>>>(
        ptr<float>(lse), ptr<float>(target_logit), ptr<const T>(logits), args);
    LOOM_CUDA_LAUNCHED();
  });
}

void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                  int64_t vocab_begin, int64_t valid, float scale, int32_t ignore_index) {
  check_shard_targets("cross_entropy_shard_backward", targets, ignore_index);
  const int64_t N = rows(logits), V_local = logits.size(-1);
  if (N == 0) return;
  const ShardArgs args{V_local, vocab_begin, valid, ptr<const int32_t>(targets), ignore_index};
  with_float_type(logits.dtype(), [&]<typename T>(T) {
    with_float_type(dlogits.dtype(), [&]<typename G>(G) {
      shard_backward_kernel<<<static_cast<unsigned>(N), row_threads(V_local), 0, stream()>>>(
          ptr<G>(dlogits), ptr<const T>(logits), ptr<const float>(lse), scale, args);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

void cross_entropy_shard_combine(Tensor lse, Tensor target_logit, const Tensor& stats) {
  const int64_t P = stats.size(0), N = stats.size(2);
  if (N == 0) return;
  shard_combine_kernel<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(ptr<float>(lse), ptr<float>(target_logit),
                                                                         ptr<const float>(stats), P, N);
  LOOM_CUDA_LAUNCHED();
}

float cross_entropy_shard_loss(const Tensor& lse, const Tensor& target_logit, const Tensor& targets,
                               int32_t ignore_index) {
  const int64_t n = targets.numel();
  if (n == 0) return 0.f;
  DeviceTemp out(2 * sizeof(double));
  shard_loss_kernel<<<1, 1024, 0, stream()>>>(ptr<const float>(lse), ptr<const float>(target_logit),
                                              ptr<const int32_t>(targets), n, ignore_index, out.as<double>());
  LOOM_CUDA_LAUNCHED();
  double sum_count[2] = {0, 0};
  read_back(sum_count, out.as<void>(), sizeof sum_count);
  const auto n_valid = static_cast<int64_t>(sum_count[1]);
  return n_valid == 0 ? 0.f : static_cast<float>(sum_count[0] / static_cast<double>(n_valid));
}

int64_t cross_entropy_count_valid(const Tensor& targets, int32_t ignore_index) {
  return count_targets(targets, ignore_index, 0, false).valid;
}

}  // namespace loom::kernels::cuda
