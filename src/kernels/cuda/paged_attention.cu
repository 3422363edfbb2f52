// Paged attention on the GPU (ops.h): kv_cache_write and
// paged_attention_forward, the serving path's attention over K/V kept in
// fixed blocks (vLLM's PagedAttention, Kwon et al. 2023).
//
// Batch invariance (ops.h): one warp computes one (query row, head) by a
// procedure fixed by the row's position and the block size alone: it walks
// the sequence's cache blocks in logical order, each in chunks of at most 32
// keys, with an online softmax updated once per chunk; the dot products and
// sums are warp butterflies of a fixed shape. Which block or SM runs the warp,
// and what the other warps do, never enters its arithmetic.
//
// Both ops check the values ops.h leaves to the backend (slots, block
// tables, lengths) on the device first, then wait for the verdict, so a bad
// value is a loom::Error with the CPU backend's message, raised before
// anything is written.
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/validate.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxHeadSize = 256;  // 8 values per lane

// q and out share a dtype chosen at run time (they are read and written once
// per element); the caches' dtype is a template parameter (the inner loops).
// ---- kv_cache_write -----------------------------------------------------------

__global__ void slots_check_kernel(unsigned long long* flag, const int64_t* slots, int64_t N, int64_t total) {
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = slots[n];
    if (s != -1 && (s < 0 || s >= total)) report_bad_id(flag, n);
  }
}

// Same dtype: the bits as they are (the CPU backend copies bytes).
template <typename D, typename S>
__device__ __forceinline__ D convert(S x) {
  if constexpr (std::is_same_v<D, S>) return x;
  else return from_float<D>(to_float(x));
}

// One block per row n (k, v: (N, row)); a repeated slot keeps the last row:
// a row whose slot a later row also names writes nothing, so every cache row
// has one writer and the result does not depend on the order blocks run.
template <typename D, typename S>
__global__ void cache_write_kernel(D* k_cache, D* v_cache, const S* k, const S* v, const int64_t* slots, int64_t N,
                                   int64_t row) {
  const int64_t n = blockIdx.x, slot = slots[n];
  if (slot == -1) return;  // the whole block
  bool later = false;
  for (int64_t m = n + 1 + threadIdx.x; m < N; m += blockDim.x) later |= slots[m] == slot;
  if (__syncthreads_or(later)) return;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
    k_cache[slot * row + e] = convert<D>(k[n * row + e]);
    v_cache[slot * row + e] = convert<D>(v[n * row + e]);
  }
}

// ---- paged_attention_forward ----------------------------------------------------

struct Paged {
  void* out;
  const void* q;
  int q_kind;  // of q and out
  const void *k_cache, *v_cache;
  const int32_t *block_tables, *seq_lens, *query_start;
  int64_t N, NH, NKV, HS, BS, S, max_blocks;
  float scale;
};

// Any value ops.h leaves to the backend out of range: flag set. The exact
// message comes from check_batch_values on host copies.
__global__ void batch_check_kernel(unsigned long long* flag, Paged a, int64_t NB) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0 && (a.query_start[0] != 0 || a.query_start[a.S] != a.N)) report_bad_id(flag, 0);
  for (int64_t s = first; s < a.S; s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q_len = int64_t{a.query_start[s + 1]} - a.query_start[s], len = a.seq_lens[s];
    bool bad = q_len < 0 || len < q_len || len > a.max_blocks * a.BS;
    const int32_t* table = a.block_tables + s * a.max_blocks;
    for (int64_t b = 0; !bad && b * a.BS < len; ++b) bad = table[b] < 0 || table[b] >= NB;
    if (bad) report_bad_id(flag, s + 1);
  }
}

// The CPU backend's checks and messages (query_start from 0 to N, never
// decreasing; q_len <= seq_len <= max_blocks * BS; every block read in
// [0, NB)) on host copies of the values.
void check_batch_values(const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start, int64_t N,
                        int64_t NB, int64_t BS) {
  constexpr const char* op = "paged_attention_forward";
  const std::initializer_list<Operand> all = {
      {"block_tables", block_tables}, {"seq_lens", seq_lens}, {"query_start", query_start}};
  const int64_t S = block_tables.size(0), max_blocks = block_tables.size(1);
  std::vector<int32_t> qs(S + 1), lens(S), tables(S * max_blocks);
  const auto fetch = [](std::vector<int32_t>& dst, const Tensor& src) {
    if (!dst.empty()) read_back(dst.data(), src.data(), dst.size() * sizeof(int32_t));
  };
  fetch(qs, query_start), fetch(lens, seq_lens), fetch(tables, block_tables);
  if (qs[0] != 0) op_fail(op, all, "query_start[0] must be 0, got ", qs[0]);
  if (qs[S] != N) op_fail(op, all, "query_start[", S, "] must be N = ", N, " (q's rows), got ", qs[S]);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q_len = int64_t{qs[s + 1]} - qs[s], len = lens[s];
    if (q_len < 0) op_fail(op, all, "query_start decreases at ", s, ": ", qs[s], " then ", qs[s + 1]);
    if (len < q_len)
      op_fail(op, all, "sequence ", s, " has seq_lens ", len, ", fewer than its ", q_len, " query rows");
    if (len > max_blocks * BS)
      op_fail(op, all, "sequence ", s, " has seq_lens ", len, ", beyond its block table's ", max_blocks,
              " blocks of ", BS, " tokens");
    const int32_t* table = tables.data() + s * max_blocks;
    for (int64_t b = 0; b * BS < len; ++b)
      if (table[b] < 0 || table[b] >= NB)
        op_fail(op, all, "block_tables[", s, ", ", b, "] = ", table[b], " is not a block of the caches [0, ", NB,
                ")");
  }
}

constexpr int kWarpsPerBlock = 4;

// One warp per (row n, head h), flat w = n * NH + h; lane holds dims lane +
// 32 j (j < NJ) of q (scaled) and of the output accumulator. Scores of a
// chunk: lane c keeps key c's score (a warp sum per key); the chunk's P
// reaches every lane by shuffle for acc += p_c v_c, the V rows read along
// the lanes (coalesced).
template <typename T, int NJ>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) paged_kernel(Paged a) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= a.N * a.NH) return;  // whole warps
  const int64_t n = w / a.NH, h = w % a.NH, kvh = h / (a.NH / a.NKV), HS = a.HS;
  // The sequence of row n: the last s with query_start[s] <= n (checked:
  // query_start[0] = 0 <= n < N = query_start[S]).
  int64_t lo = 0, hi = a.S + 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a.query_start[mid] <= n) lo = mid + 1;
    else hi = mid;
  }
  const int64_t s = lo - 1, q0 = a.query_start[s], q_len = a.query_start[s + 1] - q0;
  const int64_t pos = a.seq_lens[s] - q_len + (n - q0);  // sees keys 0 ..= pos
  float q[NJ], acc[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int64_t d = lane + 32 * j;
    q[j] = d < HS ? load_as(a.q, a.q_kind, w * HS + d) * a.scale : 0.f;  // scores = k . (q * scale)
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int32_t* table = a.block_tables + s * a.max_blocks;
  const int64_t rs = a.NKV * HS;  // between the rows of one kv head in a block
  for (int64_t b = 0; b * a.BS <= pos; ++b) {
    const int64_t cnt = min(a.BS, pos + 1 - b * a.BS);
    const int64_t base = (static_cast<int64_t>(table[b]) * a.BS * a.NKV + kvh) * HS;  // key b * BS + o: base + o * rs
    for (int64_t o = 0; o < cnt; o += 32) {
      const int cc = static_cast<int>(min(int64_t{32}, cnt - o));
      float mine = -INFINITY;  // lane c: the score of key o + c
#pragma unroll 4
      for (int c = 0; c < cc; ++c) {
        const T* kr = kc + base + (o + c) * rs;
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          if (lane + 32 * j < HS) part = fmaf(q[j], to_float(kr[lane + 32 * j]), part);
        const float sc = warp_sum(part);
        if (lane == c) mine = sc;
      }
      // The first chunk holds key 0: m is finite after it, alpha = 0 there.
      const float m_new = fmaxf(m, warp_max(mine));
      const float alpha = expf(m - m_new), p = expf(mine - m_new);  // p = 0 on lanes >= cc
      l = l * alpha + warp_sum(p);
      m = m_new;
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[j] *= alpha;
#pragma unroll 4
      for (int c = 0; c < cc; ++c) {
        const float pc = __shfl_sync(0xffffffffu, p, c);
        const T* vr = vc + base + (o + c) * rs;
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          if (lane + 32 * j < HS) acc[j] = fmaf(pc, to_float(vr[lane + 32 * j]), acc[j]);
      }
    }
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
    if (lane + 32 * j < HS) store_as(a.out, a.q_kind, w * HS + lane + 32 * j, acc[j] * inv);
}

template <typename T, int NJ>
void launch_paged(const Paged& a) {
  const int64_t blocks = (a.N * a.NH + kWarpsPerBlock - 1) / kWarpsPerBlock;
  paged_kernel<T, NJ><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream()>>>(a);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

// k, v: (N, NKV, HS)  slots: (N) i64  caches: (NB, BS, NKV, HS)
void kv_cache_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& slots) {
  const int64_t N = k.size(0), row = k.size(1) * k.size(2), total = k_cache.size(0) * k_cache.size(1);
  if (N == 0) return;
  const int64_t* sl = slots.data_as<const int64_t>();
  {
    const BadIdFlag flag;
    slots_check_kernel<<<grid_for(N), kThreads, 0, stream()>>>(flag.device(), sl, N, total);
    LOOM_CUDA_LAUNCHED();
    if (const int64_t bad = flag.first(); bad >= 0) {
      int64_t value = 0;
      read_back(&value, sl + bad, sizeof value);
      op_fail("kv_cache_write", {{"slots", slots}}, "slots[", bad, "] = ", value, " is outside the caches' [0, ",
              total, ") slots (and not -1, padding)");
    }
  }
  LOOM_REQUIRE(N <= 0x7fffffff, "kv_cache_write: ", N, " rows exceed the CUDA backend's grid");
  with_float_type(k_cache.dtype(), [&](auto dt) {
    using D = decltype(dt);
    with_float_type(k.dtype(), [&](auto st) {
      using S = decltype(st);
      cache_write_kernel<D, S><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
          ptr<D>(k_cache), ptr<D>(v_cache), ptr<const S>(k), ptr<const S>(v), sl, N, row);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

// out, q: (N, NH, HS)  caches: (NB, BS, NKV, HS)  block_tables: (S, max_blocks)
// seq_lens: (S)  query_start: (S + 1), all i32
void paged_attention_forward(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start) {
  const Paged a{out.data(), q.data(), float_kind(q.dtype()), k_cache.data(), v_cache.data(),
                block_tables.data_as<const int32_t>(), seq_lens.data_as<const int32_t>(),
                query_start.data_as<const int32_t>(), q.size(0), q.size(1), k_cache.size(2), q.size(2),
                k_cache.size(1), block_tables.size(0), block_tables.size(1),
                static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(2))))};
  const int64_t NB = k_cache.size(0);
  {
    const BadIdFlag flag;
    batch_check_kernel<<<grid_for(a.S), kThreads, 0, stream()>>>(flag.device(), a, NB);
    LOOM_CUDA_LAUNCHED();
    if (flag.first() >= 0) {
      check_batch_values(block_tables, seq_lens, query_start, a.N, NB, a.BS);
      LOOM_CHECK(false, "paged_attention_forward: the device check found a bad value the host check did not");
    }
  }
  if (a.N == 0) return;
  if (a.HS > kMaxHeadSize)
    op_fail("paged_attention_forward", {{"q", q}}, "head size ", a.HS, " exceeds the CUDA backend's limit of ",
            kMaxHeadSize);
  with_float_type(k_cache.dtype(), [&](auto ct) {
    using T = decltype(ct);
    if (a.HS <= 32) launch_paged<T, 1>(a);
    else if (a.HS <= 64) launch_paged<T, 2>(a);
    else if (a.HS <= 128) launch_paged<T, 4>(a);
    else launch_paged<T, 8>(a);
  });
}

}  // namespace loom::kernels::cuda
