// Causal flash attention forward on tensor cores, for q, k, v, out all bf16
// or all f16 and head sizes 64 and 128 (FlashAttention-2 (Dao 2023),
// Algorithm 1); attention.cu keeps the f32 kernels for every other case and
// calls in here only when attention_mma_applies.
//
// Layout. A block is 4 warps and 64 queries of one (b, head); each warp owns
// 16 query rows, so the softmax statistics of a row live in the 4 lanes of
// one quad and no shared memory is needed for them (FA2's split of the rows,
// not FA1's of the keys). Q's fragments stay in registers for the whole
// loop; 64-key tiles of K and V go through shared memory, rows D + 8
// elements apart so that the 8 rows of one ldmatrix phase start 4 banks
// apart and cover all 32. V's tile is loaded while the scores are computed,
// the next K tile while P·V is (cp.async, two groups in flight).
//
// Arithmetic. S = Q K^T and O += P V are mma.sync m16n8k16 with f32
// accumulators; softmax (max, exp2, sums) is f32 in registers; only P is
// rounded to the storage type, for the P·V product (FA2 does the same).
// Fragment layouts (PTX ISA, "mma.m16n8k16"): g = lane / 4, t = lane % 4; a
// C fragment holds rows g, g + 8 and columns 2t, 2t + 1, which is also the A
// fragment layout of those rows over 8 of the 16 k columns: so the score
// accumulators of two adjacent 8-key tiles are P's A fragment as they stand.
//
// Determinism: every sum is over a fixed order (mma's internal order is
// fixed by the hardware, the quad reductions are xor butterflies).
#include <cmath>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mma_common.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // queries per block
constexpr int kKeys = 64;           // keys per tile
static_assert(kRows == kKeys && kThreads == 128, "load_tile's defaults serve Q, K and V tiles alike");

// q (B, Tq, NH, D), k, v (B, Tk, NKV, D): element strides along B and T.
// Query t sits at position off + t and sees keys 0 ..= off + t.
struct MmaGeo {
  const uint16_t *q, *k, *v;
  uint16_t* out;  // (B, Tq, NH, D) contiguous
  float* lse;     // (B, NH, Tq) or null
  int64_t qsb, qst, ksb, kst, vsb, vst;
  int64_t Tq, Tk, NH, group, off;  // group: query heads per kv head
  float scale;
};

// Over the 4 lanes of a quad (one row of a C fragment); xor butterflies, so
// every lane gets the same bits.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The running softmax of the thread's two rows (g and g + 8 of the warp's
// 16): m the max of the raw scores seen, l this thread's share of the sum
// of exp(scale (s - m)) (summed over the quad at the end).
struct RowStats {
  float m[2], l[2];
};

// Masks the tile's scores (key j0 + c visible to query position pos iff
// j0 + c <= pos and j0 + c < Tk), updates m, l, rescales acc and writes P
// (16 x 64) as A fragments. see[i]: the last visible key of row g + 8 i,
// counted from j0.
template <int D, bool kBf16>
__device__ __forceinline__ void tile_softmax(float (&s)[kKeys / 8][4], RowStats& st, float (&acc)[D / 8][4],
                                             uint32_t (&pf)[kKeys / 16][4], bool mask, const int (&see)[2],
                                             float scale_log2, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[n][2 * i + e];
        if (mask && 8 * n + 2 * t + e > see[i]) x = -INFINITY;
        mx = fmaxf(mx, x);
      }
    const float m_new = fmaxf(st.m[i], quad_max(mx));
    // A row with no visible key yet keeps m = -inf: subtract 0, not -inf,
    // so that exp2 gives 0 rather than NaN (FA2's guard).
    const float base = m_new == -INFINITY ? 0.f : m_new * scale_log2;
    const float alpha = exp2f(fmaf(st.m[i], scale_log2, -base));
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[n][2 * i + e];
        x = exp2f(fmaf(x, scale_log2, -base));
        sum += x;
      }
    st.l[i] = fmaf(st.l[i], alpha, sum);
    st.m[i] = m_new;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][2 * i] *= alpha, acc[n][2 * i + 1] *= alpha;
  }
  c_to_a_frags<kKeys, kBf16>(pf, s);
}

// out rows = acc / l, lse = scale m + log l, for the thread's two rows.
template <int D, bool kBf16>
__device__ __forceinline__ void store_rows(const MmaGeo& g, int64_t b, int64_t h, int64_t row0, const RowStats& st,
                                           const float (&acc)[D / 8][4], int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t tq = row0 + lane / 4 + 8 * i;
    const float l = quad_sum(st.l[i]);  // every lane: shuffles need the whole warp
    if (tq >= g.Tq) continue;
    const float inv = 1.f / l;
    uint16_t* o = g.out + ((b * g.Tq + tq) * g.NH + h) * D + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(o + 8 * n) = pack2<kBf16>(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
    if (g.lse != nullptr && lane % 4 == 0) g.lse[(b * g.NH + h) * g.Tq + tq] = st.m[i] * g.scale + logf(l);
  }
}

// Grid (query tiles, NH, B), the late tiles (most keys) first; 4 warps.
// Shared: Q, K, V tiles (64, D + 8) each.
template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads) forward_mma_kernel(MmaGeo g) {
  constexpr int LDS = D + 8;
  extern __shared__ __align__(16) uint16_t smem_mma[];
  uint16_t *Qs = smem_mma, *Ks = Qs + kRows * LDS, *Vs = Ks + kKeys * LDS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / g.group;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int rows = static_cast<int>(min(int64_t{kRows}, g.Tq - q0));
  const int64_t last = min(g.off + q0 + rows - 1, g.Tk - 1);  // the last key a row of the block sees
  const uint16_t* k = g.k + b * g.ksb + kvh * D;
  const uint16_t* v = g.v + b * g.vsb + kvh * D;
  load_tile<D>(Qs, g.q + b * g.qsb + q0 * g.qst + h * D, g.qst, rows);
  cp_async_commit();
  load_tile<D>(Ks, k, g.kst, static_cast<int>(min(int64_t{kKeys}, last + 1)));
  cp_async_commit();
  load_tile<D>(Vs, v, g.vst, static_cast<int>(min(int64_t{kKeys}, last + 1)));
  cp_async_commit();
  cp_async_wait<2>();  // Q
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_a_frags<D>(qf, Qs + warp * 16 * LDS, lane);
  float acc[D / 8][4] = {};
  RowStats st{{-INFINITY, -INFINITY}, {0.f, 0.f}};
  const float scale_log2 = g.scale * 1.4426950408889634f;
  // Groups in flight at the top of each tile: K(j0), V(j0); every step
  // commits one group (empty past the last tile), so wait<1> always suffices.
  for (int64_t j0 = 0; j0 <= last; j0 += kKeys) {
    const int64_t next = j0 + kKeys;
    const int n_next = static_cast<int>(min(int64_t{kKeys}, last + 1 - next));
    cp_async_wait<1>();  // K(j0)
    __syncthreads();
    float s[kKeys / 8][4];
    frags_dot_rows<D, kKeys, kBf16>(s, qf, Ks, lane);
    __syncthreads();  // every warp is done with Ks
    if (n_next > 0) load_tile<D>(Ks, k + next * g.kst, g.kst, n_next);
    cp_async_commit();
    // Row r's position minus j0: its last visible key within the tile. Keys
    // >= Tk lie past every row's (last < Tk), so one test covers both.
    // Clamped to [-1, kKeys] so that the per-score test is on ints.
    const int64_t pos0 = g.off + q0 + warp * 16 + lane / 4 - j0, lim = min(int64_t{kKeys}, last - j0);
    const int see[2] = {static_cast<int>(max(int64_t{-1}, min(pos0, lim))),
                        static_cast<int>(max(int64_t{-1}, min(pos0 + 8, lim)))};
    const bool mask = j0 + kKeys - 1 > min(g.off + q0, last);
    uint32_t pf[kKeys / 16][4];
    tile_softmax<D, kBf16>(s, st, acc, pf, mask, see, scale_log2, lane);
    cp_async_wait<1>();  // V(j0)
    __syncthreads();
    frags_times_rows<D, kKeys, kBf16>(acc, pf, Vs, lane);
    __syncthreads();  // every warp is done with Vs
    if (n_next > 0) load_tile<D>(Vs, v + next * g.vst, g.vst, n_next);
    cp_async_commit();
  }
  cp_async_wait<0>();
  store_rows<D, kBf16>(g, b, h, q0 + warp * 16, st, acc, lane);
}

template <int D>
constexpr size_t forward_smem() { return sizeof(uint16_t) * (kRows + 2 * kKeys) * (D + 8); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// cp.async moves 16 bytes: every row start must be 16-byte aligned. The
// stride of a dim of extent 1 (B = 1, T = 1) is never stepped over.
bool rows_aligned(const Tensor& t) {
  return aligned16(t.data()) && (t.size(0) <= 1 || t.stride(0) % 8 == 0) && (t.size(1) <= 1 || t.stride(1) % 8 == 0);
}

template <int D, bool kBf16>
void launch_forward(const MmaGeo& g, int64_t B) {
  auto* kernel = forward_mma_kernel<D, kBf16>;
  constexpr size_t smem = forward_smem<D>();
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>((g.Tq + kRows - 1) / kRows), static_cast<unsigned>(g.NH),
                  static_cast<unsigned>(B));
  kernel<<<grid, kThreads, smem, stream()>>>(g);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

// ops.h has checked shapes, dtypes (k, v, out in q's) and that each (b, t)
// row of heads is contiguous; this path also wants 16-bit storage, a head
// size with a kernel, keys to attend to and 16-byte aligned rows.
bool attention_mma_applies(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v) {
  const DType dt = q.dtype();
  const int64_t HS = q.size(3);
  return (dt == DType::bf16 || dt == DType::f16) && out.dtype() == dt && (HS == 64 || HS == 128) &&
         k.size(1) > 0 && rows_aligned(q) && rows_aligned(k) && rows_aligned(v) && aligned16(out.data());
}

// The backward's kernels (attention_mma_bwd.cu) also read dout as tiles of
// q's type; dq, dk, dv may be of any float type (accumulated through f32).
bool attention_mma_backward_applies(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v) {
  return attention_mma_applies(dout, q, k, v);
}

// off: the resolved position of query 0 (>= 0); B, NH within the grid's limits.
void attention_forward_mma(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t off) {
  const MmaGeo g{static_cast<const uint16_t*>(q.data()), static_cast<const uint16_t*>(k.data()),
                 static_cast<const uint16_t*>(v.data()), static_cast<uint16_t*>(out.data()),
                 lse.defined() ? lse.data_as<float>() : nullptr, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                 v.stride(0), v.stride(1), q.size(1), k.size(1), q.size(2), q.size(2) / k.size(2), off,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(3))))};
  const bool bf16 = q.dtype() == DType::bf16;
  if (q.size(3) == 64) bf16 ? launch_forward<64, true>(g, q.size(0)) : launch_forward<64, false>(g, q.size(0));
  else bf16 ? launch_forward<128, true>(g, q.size(0)) : launch_forward<128, false>(g, q.size(0));
}

}  // namespace loom::kernels::cuda
