// The MoE router's ops (ops.h) on the GPU: scores, capacity, the dispatch
// plan, the balancing statistics and the router's backward, with the CPU's
// arithmetic (cpu/moe_router.cpp: double per token, each result rounded
// once) and its decisions: the same experts kept and dropped, the same rows
// in the same order. Sums the CPU takes in sequence are fixed trees here
// (block_sum), so results are reproducible, and within docs/numerics.md's
// tolerance of the CPU's. Ids are checked on the device before anything
// is written: a bad one is the CPU's loom::Error for the first bad entry.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// ---- id checks ------------------------------------------------------------------

__global__ void sel_range_kernel(const int32_t* sel, int64_t n, int64_t E, unsigned long long* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    if (sel[i] < 0 || sel[i] >= E) report_bad_id(flag, i);
}

__global__ void keep_flag_kernel(const int32_t* keep, int64_t n, unsigned long long* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    if (keep[i] != 0 && keep[i] != 1) report_bad_id(flag, i);
}

// Every expert id of sel (N, k) is in [0, E); waits for the GPU.
void check_sel(const char* op, const Tensor& sel, int64_t E) {
  const int64_t n = sel.numel(), k = sel.size(1);
  if (n == 0) return;
  BadIdFlag flag;
  sel_range_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<const int32_t>(sel), n, E, flag.device());
  LOOM_CUDA_LAUNCHED();
  const int64_t i = flag.first();
  if (i < 0) return;
  int32_t id = 0;
  read_back(&id, ptr<const int32_t>(sel) + i, sizeof id);
  fail(op, ": sel[", i / k, ", ", i % k, "] = ", id, " is not an expert: allowed [0, ", E, ")");
}

// ---- scores ---------------------------------------------------------------------

// One thread per token: the row's max (the first largest, as
// std::max_element), its log-sum-exp and each score, in double.
__global__ void router_scores_kernel(float* scores, float* lse, const float* logits, int64_t N, int64_t E,
                                     bool sigmoid) {
  for (int64_t t = first_index(); t < N; t += grid_stride()) {
    const float* l = logits + t * E;
    float* p = scores + t * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e)
      if (mx < l[e]) mx = l[e];
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += exp(static_cast<double>(l[e]) - mx);
    lse[t] = static_cast<float>(mx + log(sum));
    for (int64_t e = 0; e < E; ++e)
      p[e] = sigmoid ? static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(l[e]))))
                     : static_cast<float>(exp(static_cast<double>(l[e]) - mx) / sum);
  }
}

// ---- capacity -------------------------------------------------------------------

__global__ void fill_i32_kernel(int32_t* out, int64_t n, int32_t value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = value;
}

// One block per (group, expert) b = g E + e. The expert's choices in the
// group are ranked by score (descending), ties to the earlier choice in flat
// order — the CPU's stable sort — and those ranked below `capacity` kept.
__global__ void capacity_kernel(int32_t* keep, const int32_t* sel, const float* scores, int64_t group_tokens,
                                int64_t k, int64_t E, int64_t capacity) {
  const int64_t g = blockIdx.x / E, e = blockIdx.x % E;
  const int64_t first = g * group_tokens * k, last = first + group_tokens * k;
  double mine = 0;
  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) mine += sel[i] == e ? 1.0 : 0.0;
  const bool crowded = block_sum(mine) > static_cast<double>(capacity);
  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    if (sel[i] != e) continue;
    if (!crowded) {
      keep[i] = 1;
      continue;
    }
    const float s = scores[(i / k) * E + e];
    int64_t above = 0;
    for (int64_t j = first; j < last && above < capacity; ++j) {
      if (sel[j] != e) continue;
      const float o = scores[(j / k) * E + e];
      above += o > s || (o == s && j < i);
    }
    keep[i] = above < capacity ? 1 : 0;
  }
}

// ---- the dispatch plan ------------------------------------------------------------

// One block per expert e: counts[e] = its kept choices.
__global__ void expert_counts_kernel(int64_t* counts, const int32_t* rows, const int32_t* sel, int64_t n) {
  const int64_t e = blockIdx.x;
  double mine = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mine += sel[i] == e && rows[i] == 1 ? 1.0 : 0.0;
  const double total = block_sum(mine);
  if (threadIdx.x == 0) counts[e] = static_cast<int64_t>(total);
}

// The exclusive prefix sum over the block of each thread's v (blockDim.x a
// multiple of 32); *total gets the block's sum. Synchronises the block.
__device__ int64_t block_exclusive_scan(int64_t v, int64_t* total) {
  __shared__ int64_t warp_totals[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int64_t inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  __syncthreads();  // warp_totals may still be read by a previous call
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += warp_totals[w];
    all += warp_totals[w];
  }
  *total = all;
  return before + inclusive - v;
}

// One block per expert e: its kept choices, in flat order, take the rows
// from the sum of the earlier experts' counts on; its dropped ones -1. A
// block reads and writes only its own expert's entries, so rows is
// rewritten in place.
__global__ void assign_rows_kernel(int32_t* rows, const int64_t* counts, const int32_t* sel, int64_t n) {
  const int64_t e = blockIdx.x;
  int64_t next = 0;
  for (int64_t x = 0; x < e; ++x) next += counts[x];
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool ours = i < n && sel[i] == e;
    const bool kept = ours && rows[i] == 1;
    int64_t total = 0;
    const int64_t place = block_exclusive_scan(kept ? 1 : 0, &total);
    if (ours) rows[i] = kept ? static_cast<int32_t>(next + place) : -1;
    next += total;
  }
}

// ---- balancing statistics ------------------------------------------------------------

// One thread per token: its row's sum of scores in double (a sigmoid
// router's normaliser), in e order as the CPU's.
__global__ void row_sums_kernel(double* sums, const float* scores, int64_t N, int64_t E) {
  for (int64_t t = first_index(); t < N; t += grid_stride()) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += scores[t * E + e];
    sums[t] = sum;
  }
}

// One thread per (group, expert) x = g E + e, over the group's tokens in order.
__global__ void group_stats_kernel(float* count, float* score_sum, const int32_t* sel, const float* scores,
                                   const double* row_sums, int64_t G, int64_t group_tokens, int64_t k, int64_t E) {
  for (int64_t x = first_index(); x < G * E; x += grid_stride()) {
    const int64_t g = x / E, e = x % E;
    double c = 0, sum = 0;
    for (int64_t t = g * group_tokens; t < (g + 1) * group_tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) c += sel[t * k + j] == e ? 1.0 : 0.0;
      const double norm = row_sums != nullptr ? row_sums[t] : 1.0;
      sum += scores[t * E + e] / norm;
    }
    count[x] = static_cast<float>(c);
    score_sum[x] = static_cast<float>(sum);
  }
}

// ---- the router's backward -------------------------------------------------------

struct RouterGradArgs {
  float* dlogits;
  const float *logits, *scores, *lse, *weight, *dweight, *count;
  const int32_t* sel;
  int64_t N, E, k, local_tokens;
  double c_aux, z_scale;
  bool sigmoid, normalise;
};

// One block per token (grid-stride), the gradient wrt its scores (ds: E
// doubles of dynamic shared memory) built as the CPU builds it: the combine
// weights' part by thread 0 in choice order, then the balancing terms and
// the chain through the scores across the block.
__global__ void router_backward_kernel(RouterGradArgs a) {
  extern __shared__ double ds[];
  const int64_t E = a.E, k = a.k;
  for (int64_t t = blockIdx.x; t < a.N; t += gridDim.x) {
    const float* p = a.scores + t * E;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) ds[e] = 0.0;
    __syncthreads();
    if (threadIdx.x == 0) {  // through the combine weights: w_j = p_j / S (normalised) or p_j
      double S = 0, wdw = 0;
      for (int64_t j = 0; j < k; ++j) {
        S += p[a.sel[t * k + j]];
        wdw += static_cast<double>(a.weight[t * k + j]) * a.dweight[t * k + j];
      }
      for (int64_t j = 0; j < k; ++j) {
        const double dw = a.dweight[t * k + j];
        ds[a.sel[t * k + j]] += a.normalise ? (dw - wdw) / S : dw;
      }
    }
    __syncthreads();
    if (a.count != nullptr) {
      const float* cnt = a.count + (t / a.local_tokens) * E;
      if (!a.sigmoid) {
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) ds[e] += a.c_aux * cnt[e];
      } else {  // P uses p_e / sum(p): its gradient wrt each p
        double part = 0;
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) part += p[e];
        const double sum = block_sum(part);
        part = 0;
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) part += cnt[e] * p[e] / sum;
        const double dot = block_sum(part);
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) ds[e] += a.c_aux * (cnt[e] - dot) / sum;
      }
    }
    __syncthreads();
    float* dl = a.dlogits + t * E;
    if (!a.sigmoid) {
      double part = 0;
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x) part += ds[e] * p[e];
      const double dot = block_sum(part);
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x) dl[e] = static_cast<float>(p[e] * (ds[e] - dot));
    } else {
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        dl[e] = static_cast<float>(ds[e] * p[e] * (1.0 - p[e]));
    }
    if (a.z_scale != 0) {  // d lse^2 / d logit_e = 2 lse softmax_e, averaged over N
      const double l = a.lse[t], c = a.z_scale * 2.0 * l / static_cast<double>(a.N);
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        dl[e] = __fadd_rn(dl[e], static_cast<float>(c * exp(static_cast<double>(a.logits[t * E + e]) - l)));
    }
    __syncthreads();  // ds is rewritten for the next token
  }
}

}  // namespace

// logits, scores: (N, E)  lse: (N)
void moe_router_scores(Tensor scores, Tensor lse, const Tensor& logits, bool sigmoid) {
  const int64_t N = logits.size(0), E = logits.size(1);
  if (N == 0 || E == 0) return;
  router_scores_kernel<<<grid_for(N, 128), 128, 0, stream()>>>(ptr<float>(scores), ptr<float>(lse),
                                                               ptr<const float>(logits), N, E, sigmoid);
  LOOM_CUDA_LAUNCHED();
}

// keep, sel: (N, k)  scores: (N, E)
void moe_capacity(Tensor keep, const Tensor& sel, const Tensor& scores, int64_t group_tokens, int64_t capacity) {
  const int64_t N = sel.size(0), k = sel.size(1), E = scores.size(1), n = sel.numel();
  check_sel("moe_capacity", sel, E);
  if (n == 0) return;
  if (capacity < 0) {
    fill_i32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<int32_t>(keep), n, 1);
    LOOM_CUDA_LAUNCHED();
    return;
  }
  const int64_t blocks = N / group_tokens * E;
  LOOM_REQUIRE(blocks <= 0x7fffffff, "moe_capacity: ", N / group_tokens, " groups x ", E,
               " experts is more blocks than one launch takes");
  capacity_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(
      ptr<int32_t>(keep), ptr<const int32_t>(sel), ptr<const float>(scores), group_tokens, k, E, capacity);
  LOOM_CUDA_LAUNCHED();
}

// rows, sel: (N, k)  counts: (E)
void moe_assign_rows(Tensor rows, Tensor counts, const Tensor& sel) {
  const int64_t n = sel.numel(), k = sel.size(1), E = counts.numel();
  check_sel("moe_assign_rows", sel, E);
  if (E == 0) return;
  if (n > 0) {
    BadIdFlag flag;
    keep_flag_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<const int32_t>(rows), n, flag.device());
    LOOM_CUDA_LAUNCHED();
    if (const int64_t i = flag.first(); i >= 0) {
      int32_t v = 0;
      read_back(&v, ptr<const int32_t>(rows) + i, sizeof v);
      fail("moe_assign_rows: rows[", i / k, ", ", i % k, "] = ", v, " on entry: allowed 1 (kept) or 0 (dropped)");
    }
  }
  expert_counts_kernel<<<static_cast<unsigned>(E), kThreads, 0, stream()>>>(
      ptr<int64_t>(counts), ptr<const int32_t>(rows), ptr<const int32_t>(sel), n);
  LOOM_CUDA_LAUNCHED();
  if (n == 0) return;
  assign_rows_kernel<<<static_cast<unsigned>(E), kThreads, 0, stream()>>>(ptr<int32_t>(rows),
                                                                          ptr<const int64_t>(counts),
                                                                          ptr<const int32_t>(sel), n);
  LOOM_CUDA_LAUNCHED();
}

// count, score_sum: (N / group_tokens, E)  sel: (N, k)  scores: (N, E)
void moe_group_stats(Tensor count, Tensor score_sum, const Tensor& sel, const Tensor& scores, int64_t group_tokens,
                     bool sigmoid) {
  const int64_t N = sel.size(0), k = sel.size(1), E = scores.size(1), G = N / group_tokens;
  check_sel("moe_group_stats", sel, E);
  if (G == 0 || E == 0) return;
  DeviceTemp sums;
  if (sigmoid) {
    sums = DeviceTemp(static_cast<size_t>(N) * sizeof(double));
    row_sums_kernel<<<grid_for(N, 128), 128, 0, stream()>>>(sums.as<double>(), ptr<const float>(scores), N, E);
    LOOM_CUDA_LAUNCHED();
  }
  group_stats_kernel<<<grid_for(G * E, 128), 128, 0, stream()>>>(
      ptr<float>(count), ptr<float>(score_sum), ptr<const int32_t>(sel), ptr<const float>(scores),
      sigmoid ? sums.as<const double>() : nullptr, G, group_tokens, k, E);
  LOOM_CUDA_LAUNCHED();
}

void moe_router_backward(Tensor dlogits, const MoeRouterGrad& g) {
  const int64_t N = g.scores.size(0), E = g.scores.size(1), k = g.sel.size(1);
  check_sel("moe_router_backward", g.sel, E);
  if (N == 0 || E == 0) return;
  const bool aux = g.aux_scale != 0;
  const int64_t groups = aux ? N / g.local_tokens : 0;
  RouterGradArgs a{ptr<float>(dlogits), ptr<const float>(g.logits), ptr<const float>(g.scores),
                   ptr<const float>(g.lse), ptr<const float>(g.weight), ptr<const float>(g.dweight),
                   aux ? ptr<const float>(g.count) : nullptr, ptr<const int32_t>(g.sel), N, E, k,
                   g.local_tokens, 0.0, g.z_scale, g.sigmoid, g.normalise};
  if (aux)
    a.c_aux = g.aux_scale * static_cast<double>(E) /
              (static_cast<double>(groups) * static_cast<double>(g.group_tokens) *
               static_cast<double>(g.group_tokens * k));
  const size_t shared = static_cast<size_t>(E) * sizeof(double);  // E <= 4096 (model config): 32 KiB at most
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(N, 65535));
  router_backward_kernel<<<blocks, 128, shared, stream()>>>(a);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::kernels::cuda
