// Causal flash attention backward on tensor cores, for q, k, v, dout all
// bf16 or all f16 at head sizes 64 and 128 (FlashAttention-2 (Dao 2023),
// Algorithm 2, without atomics); attention.cu computes D = rowsum(dout * out)
// and calls in here when attention_mma_backward_applies, keeping its f32
// kernels for every other case.
//
// Two kernels, so that every gradient element is summed by one thread in a
// fixed order (deterministic, as attention.cu's):
//   dK, dV: a block per (b, kv head, 64 keys); each of its 4 warps owns 16
//     keys and walks the query tiles that see them, of every query head of
//     the group: S^T = K Q^T and dP^T = V dO^T (16 keys x QT queries), then
//     P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D), and
//     dV += P^T dO, dK += dS^T Q (scaled once at the end).
//   dQ: a block per (b, head, 64 queries); each warp owns 16 queries and
//     walks the key tiles they see: S = Q K^T, dP = dO V^T, dS as above,
//     dQ += dS K (scaled at the end).
// The products are mma.sync m16n8k16 with f32 accumulators; P and dS are
// rounded to the storage type for the second product of each pair (FA2
// does the same); exp, the masks and the gradients' sums stay f32. Query
// (QT) and key (KT) tiles are 64 at head size 64 and 32 at 128, which keeps
// the f32 accumulators of a warp in registers. Tiles go through shared
// memory with cp.async (mma_common.cuh's layout).
#include <cmath>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mma_common.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBlockRows = 16 * kWarps;  // keys (dK, dV) or queries (dQ) of a block
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr int kInner = D == 64 ? 64 : 32;  // the tile walked: queries (dK, dV) or keys (dQ)

// q (B, Tq, NH, D), k, v (B, Tk, NKV, D): element strides along B and T.
// dout (B, Tq, NH, D) contiguous; lse, D (B, NH, Tq). Query t sits at
// position off + t and sees keys 0 ..= off + t.
struct BwdGeo {
  const uint16_t *q, *k, *v, *dout;
  const float *lse, *D;
  void *dq, *dk, *dv;  // null: not wanted
  int dq_kind, dk_kind, dv_kind;
  int64_t qsb, qst, ksb, kst, vsb, vst;
  int64_t Tq, Tk, NH, NKV, off;
  float scale;
};

// P and dS of one score: exp(scale s - lse) and P (dp - D) where visible, else 0.
__device__ __forceinline__ void p_and_ds(bool visible, float s, float dp, float lse_log2, float d, float scale_log2,
                                         float& p, float& ds) {
  p = visible ? exp2f(fmaf(s, scale_log2, -lse_log2)) : 0.f;
  ds = visible ? p * (dp - d) : 0.f;
}

// s (16 x N) = the warp's 16 rows from Aw . the N rows of Bs, transposed.
template <int D, int N, bool kBf16>
__device__ __forceinline__ void rows_dot_rows(float (&s)[N / 8][4], const uint16_t* Aw, const uint16_t* Bs, int lane) {
  uint32_t af[D / 16][4];
  load_a_frags<D>(af, Aw, lane);
  frags_dot_rows<D, N, kBf16>(s, af, Bs, lane);
}

// p[i] += x, rounded once.
__device__ __forceinline__ void add_to(void* p, int kind, int64_t i, float x) {
  store_as(p, kind, i, load_as(p, kind, i) + x);
}

// Adds acc * mul (16 rows of the warp from row0, D columns) into the rows
// (B, T, heads, D) of p at (b, row0 + r, head), rows < n only.
template <int D>
__device__ __forceinline__ void add_rows(void* p, int kind, const float (&acc)[D / 8][4], float mul, int64_t b,
                                         int64_t T, int64_t heads, int64_t head, int64_t row0, int n, int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lane / 4 + 8 * i;
    if (r >= n) continue;
    const int64_t o = ((b * T + row0 + r) * heads + head) * D + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      add_to(p, kind, o + 8 * c, acc[c][2 * i] * mul);
      add_to(p, kind, o + 8 * c + 1, acc[c][2 * i + 1] * mul);
    }
  }
}

// Grid (key tiles, NKV, B), 4 warps. Shared: K, V (64, D + 8), Q, dO
// (QT, D + 8), then QT floats each of lse (log2 units) and D.
template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads) dkdv_mma_kernel(BwdGeo g) {
  constexpr int LD = D + 8, QT = kInner<D>;
  extern __shared__ __align__(16) uint16_t smem_bwd[];
  uint16_t *Ks = smem_bwd, *Vs = Ks + kBlockRows * LD, *Qs = Vs + kBlockRows * LD, *dOs = Qs + QT * LD;
  float* Ls = reinterpret_cast<float*>(dOs + QT * LD);
  float* Ds = Ls + QT;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int cols = static_cast<int>(min(int64_t{kBlockRows}, g.Tk - j0));
  load_tile<D, kBlockRows, kThreads>(Ks, g.k + b * g.ksb + j0 * g.kst + kvh * D, g.kst, cols);
  load_tile<D, kBlockRows, kThreads>(Vs, g.v + b * g.vsb + j0 * g.vst + kvh * D, g.vst, cols);
  cp_async_commit();
  const float scale_log2 = g.scale * kLog2e;
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int64_t group = g.NH / g.NKV;
  const int64_t first = max(int64_t{0}, j0 - g.off) / QT * QT;  // earlier queries see none of these keys
  const int key0 = warp * 16 + lane / 4;                          // the thread's keys: key0, key0 + 8
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t q0 = first; q0 < g.Tq; q0 += QT) {
      const int rows = static_cast<int>(min(int64_t{QT}, g.Tq - q0));
      const int64_t row0 = (b * g.NH + h) * g.Tq + q0;  // of lse and D
      __syncthreads();  // every warp is done with the previous Qs, dOs, Ls, Ds
      load_tile<D, QT, kThreads>(Qs, g.q + b * g.qsb + q0 * g.qst + h * D, g.qst, rows);
      load_tile<D, QT, kThreads>(dOs, g.dout + ((b * g.Tq + q0) * g.NH + h) * D, g.NH * D, rows);
      cp_async_commit();
      for (int i = threadIdx.x; i < QT; i += kThreads) {
        Ls[i] = i < rows ? g.lse[row0 + i] * kLog2e : 0.f;
        Ds[i] = i < rows ? g.D[row0 + i] : 0.f;
      }
      cp_async_wait<0>();
      __syncthreads();
      float st[QT / 8][4], dpt[QT / 8][4];  // keys x queries
      rows_dot_rows<D, QT, kBf16>(st, Ks + warp * 16 * LD, Qs, lane);
      rows_dot_rows<D, QT, kBf16>(dpt, Vs + warp * 16 * LD, dOs, lane);
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = key0 + 8 * (e / 2), r = 8 * n + 2 * (lane % 4) + e % 2;  // key, query
          const bool visible = c < cols && r < rows && j0 + c <= g.off + q0 + r;
          p_and_ds(visible, st[n][e], dpt[n][e], Ls[r], Ds[r], scale_log2, st[n][e], dpt[n][e]);
        }
      uint32_t pf[QT / 16][4], dsf[QT / 16][4];
      c_to_a_frags<QT, kBf16>(pf, st);
      c_to_a_frags<QT, kBf16>(dsf, dpt);
      if (g.dv) frags_times_rows<D, QT, kBf16>(dv, pf, dOs, lane);
      if (g.dk) frags_times_rows<D, QT, kBf16>(dk, dsf, Qs, lane);
    }
  }
  cp_async_wait<0>();  // no query tile: K and V were loaded for nothing
  const int n = cols - warp * 16;
  const int64_t j = j0 + warp * 16;
  if (g.dk) add_rows<D>(g.dk, g.dk_kind, dk, g.scale, b, g.Tk, g.NKV, kvh, j, n, lane);
  if (g.dv) add_rows<D>(g.dv, g.dv_kind, dv, 1.f, b, g.Tk, g.NKV, kvh, j, n, lane);
}

// Grid (query tiles, NH, B), the late tiles (most keys) first; 4 warps.
// Shared: Q, dO (64, D + 8), K, V (KT, D + 8).
template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads) dq_mma_kernel(BwdGeo g) {
  constexpr int LD = D + 8, KT = kInner<D>;
  extern __shared__ __align__(16) uint16_t smem_bwd[];
  uint16_t *Qs = smem_bwd, *dOs = Qs + kBlockRows * LD, *Ks = dOs + kBlockRows * LD, *Vs = Ks + KT * LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (g.NH / g.NKV);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int rows = static_cast<int>(min(int64_t{kBlockRows}, g.Tq - q0));
  load_tile<D, kBlockRows, kThreads>(Qs, g.q + b * g.qsb + q0 * g.qst + h * D, g.qst, rows);
  load_tile<D, kBlockRows, kThreads>(dOs, g.dout + ((b * g.Tq + q0) * g.NH + h) * D, g.NH * D, rows);
  cp_async_commit();
  const float scale_log2 = g.scale * kLog2e;
  const int row_a = warp * 16 + lane / 4;  // the thread's queries: row_a, row_a + 8
  float lse_log2[2], d_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_a + 8 * i;
    const int64_t at = (b * g.NH + h) * g.Tq + q0 + r;
    lse_log2[i] = r < rows ? g.lse[at] * kLog2e : 0.f;
    d_row[i] = r < rows ? g.D[at] : 0.f;
  }
  float dq[D / 8][4] = {};
  const int64_t last = min(g.off + q0 + rows - 1, g.Tk - 1);  // the last key a query of the block sees
  for (int64_t j0 = 0; j0 <= last; j0 += KT) {
    const int cols = static_cast<int>(min(int64_t{KT}, last + 1 - j0));
    __syncthreads();  // every warp is done with the previous Ks, Vs
    load_tile<D, KT, kThreads>(Ks, g.k + b * g.ksb + j0 * g.kst + kvh * D, g.kst, cols);
    load_tile<D, KT, kThreads>(Vs, g.v + b * g.vsb + j0 * g.vst + kvh * D, g.vst, cols);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[KT / 8][4], dp[KT / 8][4];  // queries x keys
    rows_dot_rows<D, KT, kBf16>(s, Qs + warp * 16 * LD, Ks, lane);
    rows_dot_rows<D, KT, kBf16>(dp, dOs + warp * 16 * LD, Vs, lane);
#pragma unroll
    for (int n = 0; n < KT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row_a + 8 * (e / 2), c = 8 * n + 2 * (lane % 4) + e % 2;  // query, key
        const bool visible = r < rows && c < cols && j0 + c <= g.off + q0 + r;
        float p;
        p_and_ds(visible, s[n][e], dp[n][e], lse_log2[e / 2], d_row[e / 2], scale_log2, p, s[n][e]);
      }
    uint32_t dsf[KT / 16][4];
    c_to_a_frags<KT, kBf16>(dsf, s);
    frags_times_rows<D, KT, kBf16>(dq, dsf, Ks, lane);
  }
  add_rows<D>(g.dq, g.dq_kind, dq, g.scale, b, g.Tq, g.NH, h, q0 + warp * 16, rows - warp * 16, lane);
}

template <int D>
constexpr size_t dkdv_smem() {
  return sizeof(uint16_t) * (2 * kBlockRows + 2 * kInner<D>) * (D + 8) + 2 * sizeof(float) * kInner<D>;
}
template <int D>
constexpr size_t dq_smem() { return sizeof(uint16_t) * (2 * kBlockRows + 2 * kInner<D>) * (D + 8); }

template <typename K>
void launch(K* kernel, size_t smem, dim3 grid, const BwdGeo& g) {
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem, stream()>>>(g);
  LOOM_CUDA_LAUNCHED();
}

unsigned tiles(int64_t n) { return static_cast<unsigned>((n + kBlockRows - 1) / kBlockRows); }

template <int D, bool kBf16>
void launch_backward(const BwdGeo& g, int64_t B) {
  if (g.dk != nullptr || g.dv != nullptr)
    launch(dkdv_mma_kernel<D, kBf16>, dkdv_smem<D>(),
           dim3(tiles(g.Tk), static_cast<unsigned>(g.NKV), static_cast<unsigned>(B)), g);
  if (g.dq != nullptr)
    launch(dq_mma_kernel<D, kBf16>, dq_smem<D>(),
           dim3(tiles(g.Tq), static_cast<unsigned>(g.NH), static_cast<unsigned>(B)), g);
}

}  // namespace

void attention_backward_mma(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& lse, const float* D, int64_t off) {
  const auto opt = [](const Tensor& t) { return t.defined() ? t.data() : nullptr; };
  const auto kind = [](const Tensor& t) { return t.defined() ? static_cast<int>(float_kind(t.dtype())) : 0; };
  const BwdGeo g{static_cast<const uint16_t*>(q.data()), static_cast<const uint16_t*>(k.data()),
                 static_cast<const uint16_t*>(v.data()), static_cast<const uint16_t*>(dout.data()),
                 lse.data_as<const float>(), D, opt(dq), opt(dk), opt(dv), kind(dq), kind(dk), kind(dv),
                 q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), q.size(1), k.size(1),
                 q.size(2), k.size(2), off, static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3))))};
  const bool bf16 = q.dtype() == DType::bf16;
  if (q.size(3) == 64) bf16 ? launch_backward<64, true>(g, q.size(0)) : launch_backward<64, false>(g, q.size(0));
  else bf16 ? launch_backward<128, true>(g, q.size(0)) : launch_backward<128, false>(g, q.size(0));
}

}  // namespace loom::kernels::cuda
