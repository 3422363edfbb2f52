// Causal flash attention on the GPU (ops.h): attention_forward (FlashAttention
// (Dao et al. 2022), Algorithm 1), attention_backward (FlashAttention-2 (Dao
// 2023), Algorithm 2, made deterministic) and attention_merge.
//
// Every kernel works on f32 tiles in shared memory: a tile is KB rows of one
// head (queries or keys) by HSP = 16 NJ columns (HS padded with zeros), rows
// LD = HSP + 1 floats apart so that 16 rows read at one column hit 16 banks.
// A block is 256 threads, (ty, tx) in 16 x 16; a thread owns rows ty + 16 i
// (i < KB / 16) of every tile and, of a score tile, columns tx + 16 j, of an
// output tile, columns tx + 16 j (j < NJ): the rows of its scores are the rows
// of its outputs, so the softmax statistics it needs are its own. Arithmetic
// is f32 FMA whatever the storage (f32 must meet 1e-4; no tensor cores). The
// forward and backward of 16-bit q, k, v at head sizes 64 and 128 go to the
// tensor-core kernels of attention_mma.cu and attention_mma_bwd.cu instead
// (attention_mma_applies, attention_mma_backward_applies say when).
//
// Determinism: no float atomics. The backward computes D = rowsum(dO * O),
// then dK, dV with one block per (b, kv head, key tile) looping over the
// query tiles of every query head of its group, then dQ with one block per
// (b, head, query tile) looping over the key tiles; both recompute P from
// lse. Each gradient element is summed by one thread in a fixed order.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxHeadSize = 256;  // HSP <= 256: shared memory and registers
constexpr int64_t kMaxGrid = 65535;    // grid.y and grid.z

// Operands of one call may mix storage kinds (dout f32 with bf16 out, f32
// dk with bf16 dq): common.cuh's FloatKind, loaded and stored once per tile
// element, outside the inner loops.
// p[i] += x, rounded once (backward ops accumulate).
__device__ __forceinline__ void add_as(void* p, int kind, int64_t i, float x) {
  store_as(p, kind, i, load_as(p, kind, i) + x);
}

// dst[r * LD + d] = src[off + r * rs + d] * mul for r < n, d < HS; 0 in the
// rest of the (KB, HSP) tile. Consecutive threads take consecutive d.
template <typename T, int KB, int HSP, int LD>
__device__ void load_rows_t(float* dst, const T* src, int64_t rs, int n, int HS, float mul) {
  for (int i = threadIdx.x; i < KB * HSP; i += kThreads) {
    const int r = i / HSP, d = i % HSP;
    dst[r * LD + d] = r < n && d < HS ? to_float(src[r * rs + d]) * mul : 0.f;
  }
}
template <int KB, int HSP, int LD>
__device__ void load_rows(float* dst, const void* base, int kind, int64_t off, int64_t rs, int n, int HS,
                          float mul) {
  if (kind == kBF16) load_rows_t<__nv_bfloat16, KB, HSP, LD>(dst, static_cast<const __nv_bfloat16*>(base) + off, rs, n, HS, mul);
  else if (kind == kF16) load_rows_t<__half, KB, HSP, LD>(dst, static_cast<const __half*>(base) + off, rs, n, HS, mul);
  else load_rows_t<float, KB, HSP, LD>(dst, static_cast<const float*>(base) + off, rs, n, HS, mul);
}
// Rows of the scalars lse and D: dst[r] = src[r] for r < n, 0 up to KB.
template <int KB>
__device__ void load_vec(float* dst, const float* src, int n) {
  for (int r = threadIdx.x; r < KB; r += kThreads) dst[r] = r < n ? src[r] : 0.f;
}

// s[i][j] = A row (ty + 16 i) . B row (tx + 16 j) over the HSP columns. The
// 16 B rows a half-warp reads are LD (odd) apart: distinct banks; the A rows
// are broadcast.
template <int R, int HSP, int LD>
__device__ __forceinline__ void dot_tile(float (&s)[R][R], const float* A, const float* B, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < R; ++j) s[i][j] = 0.f;
#pragma unroll 8
  for (int d = 0; d < HSP; ++d) {
    float a[R], b[R];
#pragma unroll
    for (int i = 0; i < R; ++i) a[i] = A[(ty + 16 * i) * LD + d];
#pragma unroll
    for (int j = 0; j < R; ++j) b[j] = B[(tx + 16 * j) * LD + d];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
  }
}

// acc[i][j] += sum over c < KB of P[ty + 16 i][c] * X[c][tx + 16 j]: P (KB,
// KB) rows LDP apart (zero where masked), X a (KB, HSP) tile.
template <int R, int NJ, int KB, int LD, int LDP>
__device__ __forceinline__ void acc_tile(float (&acc)[R][NJ], const float* P, const float* X, int ty, int tx) {
#pragma unroll 4
  for (int c = 0; c < KB; ++c) {
    float p[R], x[NJ];
#pragma unroll
    for (int i = 0; i < R; ++i) p[i] = P[(ty + 16 * i) * LDP + c];
#pragma unroll
    for (int j = 0; j < NJ; ++j) x[j] = X[c * LD + tx + 16 * j];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(p[i], x[j], acc[i][j]);
  }
}

// Over the 16 lanes of a half-warp (one ty): xor butterflies, so every lane
// gets the same bits (a + b == b + a).
__device__ __forceinline__ float half_warp_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The problem: q (B, Tq, NH, HS), k, v (B, Tk, NKV, HS) strided along B, T.
// Query t sits at position off + t and sees keys 0 ..= off + t.
struct Geo {
  const void *q, *k, *v;
  int kind;  // of q, k, v
  int64_t qsb, qst, ksb, kst, vsb, vst;
  int64_t B, Tq, Tk, NH, NKV, HS, off;
  float scale;
};

// Tile rows: 64, or 32 where 64 would not fit an A100's 163 KB of shared
// memory (or the registers). Forward: Q, K, V and P tiles; backward: four
// (KB, HSP) tiles, two (KB, KB) and lse, D.
template <int NJ> constexpr int kFwdRows = NJ >= 16 ? 32 : 64;
template <int NJ> constexpr int kBwdRows = NJ >= 8 ? 32 : 64;
template <int NJ, int KB>
constexpr size_t fwd_smem() { return sizeof(float) * (3 * KB * (16 * NJ + 1) + KB * (KB + 16)); }
template <int NJ, int KB>
constexpr size_t bwd_smem() { return sizeof(float) * (4 * KB * (16 * NJ + 1) + 2 * KB * (KB + 16) + 2 * KB); }

// Grid (query tiles, NH, B); the late tiles (most keys) are launched first.
template <int NJ, int KB>
__global__ void __launch_bounds__(kThreads) forward_kernel(Geo g, void* out, float* lse) {
  constexpr int R = KB / 16, HSP = 16 * NJ, LD = HSP + 1, LDP = KB + 16;
  extern __shared__ float smem[];
  float* Qs = smem;  // (KB, LD), q * scale
  float* Ks = Qs + KB * LD;
  float* Vs = Ks + KB * LD;
  float* Ps = Vs + KB * LD;  // (KB, LDP): P of the tile, queries x keys
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, HS = static_cast<int>(g.HS);
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (g.NH / g.NKV);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * KB;
  const int rows = static_cast<int>(min(int64_t{KB}, g.Tq - q0));
  load_rows<KB, HSP, LD>(Qs, g.q, g.kind, b * g.qsb + q0 * g.qst + h * g.HS, g.qst, rows, HS, g.scale);
  float acc[R][NJ] = {}, m[R], l[R];
#pragma unroll
  for (int i = 0; i < R; ++i) m[i] = -INFINITY, l[i] = 0.f;
  const int64_t last = min(g.off + q0 + rows - 1, g.Tk - 1);  // the last key a row of the tile sees
  for (int64_t j0 = 0; j0 <= last; j0 += KB) {
    const int cols = static_cast<int>(min(int64_t{KB}, last + 1 - j0));
    __syncthreads();  // the previous tile's Ks, Vs, Ps are no longer read
    load_rows<KB, HSP, LD>(Ks, g.k, g.kind, b * g.ksb + j0 * g.kst + kvh * g.HS, g.kst, cols, HS, 1.f);
    load_rows<KB, HSP, LD>(Vs, g.v, g.kind, b * g.vsb + j0 * g.vst + kvh * g.HS, g.vst, cols, HS, 1.f);
    __syncthreads();
    float s[R][R];
    dot_tile<R, HSP, LD>(s, Qs, Ks, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      // Key j0 + c is visible to row r iff c <= see. The first tile holds key
      // 0, which every row (padding rows too) sees: m is finite after it, and
      // alpha = exp(-inf - m) = 0 there.
      const int64_t see = g.off + q0 + ty + 16 * i - j0;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int c = tx + 16 * j;
        if (c >= cols || c > see) s[i][j] = -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], half_warp_max(mx));
      const float alpha = expf(m[i] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const float p = expf(s[i][j] - m_new);  // 0 where masked
        Ps[(ty + 16 * i) * LDP + tx + 16 * j] = p;
        sum += p;
      }
      l[i] = l[i] * alpha + half_warp_sum(sum);
      m[i] = m_new;
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] *= alpha;
    }
    __syncthreads();
    acc_tile<R, NJ, KB, LD, LDP>(acc, Ps, Vs, ty, tx);
  }
  // No key at all (Tk = 0): 0 / 0 and lse -inf, as the CPU backend.
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t t = q0 + r, o = ((b * g.Tq + t) * g.NH + h) * g.HS;
    const float inv = 1.f / l[i];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      if (tx + 16 * j < HS) store_as(out, g.kind, o + tx + 16 * j, acc[i][j] * inv);
    if (lse != nullptr && tx == 0) lse[(b * g.NH + h) * g.Tq + t] = m[i] + logf(l[i]);
  }
}

// The backward's extra operands. dout, out (B, Tq, NH, HS) contiguous; lse,
// D (B, NH, Tq) f32; dq, dk, dv contiguous or null.
struct Grads {
  const void* dout;
  int dout_kind;
  const float *lse, *D;
  void *dq, *dk, *dv;
  int dq_kind, dk_kind, dv_kind;
};

// D[b, h, t] = sum over d of dout * out: one warp per (b, t, h) row.
__global__ void rowdot_kernel(float* D, const void* dout, int dout_kind, const void* out, int out_kind, int64_t B,
                              int64_t Tq, int64_t NH, int64_t HS) {
  const int64_t n = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b * Tq + t) * NH + h
  const int lane = threadIdx.x % 32;
  if (n >= B * Tq * NH) return;  // whole warps
  float s = 0.f;
  for (int64_t d = lane; d < HS; d += 32) s += load_as(dout, dout_kind, n * HS + d) * load_as(out, out_kind, n * HS + d);
  s = warp_sum(s);
  const int64_t h = n % NH, bt = n / NH, t = bt % Tq, b = bt / Tq;
  if (lane == 0) D[(b * NH + h) * Tq + t] = s;
}

// P and dS of one (row, col) pair of a tile: visible pairs only, else 0
// (padding rows have no lse: never exp of them).
__device__ __forceinline__ void p_ds(bool visible, float s, float dp, float lse, float D, float& p, float& ds) {
  p = visible ? expf(s - lse) : 0.f;
  ds = visible ? p * (dp - D) : 0.f;
}

// Grid (key tiles, NKV, B): dK, dV of one key tile, summed over the query
// tiles that see it, of every query head of the kv head's group.
// dV += P^T dO   dK += dS^T (Q * scale)   dS = P * (dO V^T - D)
template <int NJ, int KB>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(Geo g, Grads gr) {
  constexpr int R = KB / 16, HSP = 16 * NJ, LD = HSP + 1, LDP = KB + 16;
  extern __shared__ float smem[];
  float* Ks = smem;  // (KB, LD) each
  float* Vs = Ks + KB * LD;
  float* Qs = Vs + KB * LD;   // q * scale
  float* dOs = Qs + KB * LD;
  float* Pt = dOs + KB * LD;  // (KB, LDP) each: keys x queries
  float* dSt = Pt + KB * LDP;
  float* Ls = dSt + KB * LDP;  // (KB): lse, D of the query tile
  float* Ds = Ls + KB;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, HS = static_cast<int>(g.HS);
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * KB;
  const int cols = static_cast<int>(min(int64_t{KB}, g.Tk - j0));
  load_rows<KB, HSP, LD>(Ks, g.k, g.kind, b * g.ksb + j0 * g.kst + kvh * g.HS, g.kst, cols, HS, 1.f);
  load_rows<KB, HSP, LD>(Vs, g.v, g.kind, b * g.vsb + j0 * g.vst + kvh * g.HS, g.vst, cols, HS, 1.f);
  float dk[R][NJ] = {}, dv[R][NJ] = {};
  const int64_t group = g.NH / g.NKV;
  const int64_t first = max(int64_t{0}, j0 - g.off) / KB * KB;  // earlier queries see none of these keys
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t q0 = first; q0 < g.Tq; q0 += KB) {
      const int rows = static_cast<int>(min(int64_t{KB}, g.Tq - q0));
      const int64_t row0 = (b * g.NH + h) * g.Tq + q0;  // of lse and D
      __syncthreads();  // the previous tile's Qs, dOs, Pt, dSt are no longer read
      load_rows<KB, HSP, LD>(Qs, g.q, g.kind, b * g.qsb + q0 * g.qst + h * g.HS, g.qst, rows, HS, g.scale);
      load_rows<KB, HSP, LD>(dOs, gr.dout, gr.dout_kind, ((b * g.Tq + q0) * g.NH + h) * g.HS, g.NH * g.HS, rows,
                             HS, 1.f);
      load_vec<KB>(Ls, gr.lse + row0, rows);
      load_vec<KB>(Ds, gr.D + row0, rows);
      __syncthreads();
      float st[R][R], dpt[R][R];
      dot_tile<R, HSP, LD>(st, Ks, Qs, ty, tx);   // S^T: keys x queries
      dot_tile<R, HSP, LD>(dpt, Vs, dOs, ty, tx);  // dP^T
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const int c = ty + 16 * i, r = tx + 16 * j;  // key, query
          const bool visible = c < cols && r < rows && j0 + c <= g.off + q0 + r;
          float p, ds;
          p_ds(visible, st[i][j], dpt[i][j], Ls[r], Ds[r], p, ds);
          Pt[c * LDP + r] = p;
          dSt[c * LDP + r] = ds;
        }
      __syncthreads();
      if (gr.dv) acc_tile<R, NJ, KB, LD, LDP>(dv, Pt, dOs, ty, tx);
      if (gr.dk) acc_tile<R, NJ, KB, LD, LDP>(dk, dSt, Qs, ty, tx);
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int c = ty + 16 * i;
    if (c >= cols) continue;
    const int64_t o = ((b * g.Tk + j0 + c) * g.NKV + kvh) * g.HS;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      if (tx + 16 * j >= HS) continue;
      if (gr.dk) add_as(gr.dk, gr.dk_kind, o + tx + 16 * j, dk[i][j]);
      if (gr.dv) add_as(gr.dv, gr.dv_kind, o + tx + 16 * j, dv[i][j]);
    }
  }
}

// Grid (query tiles, NH, B): dQ of one query tile over the key tiles it
// sees.  dQ += dS K * scale
template <int NJ, int KB>
__global__ void __launch_bounds__(kThreads) dq_kernel(Geo g, Grads gr) {
  constexpr int R = KB / 16, HSP = 16 * NJ, LD = HSP + 1, LDP = KB + 16;
  extern __shared__ float smem[];
  float* Qs = smem;  // (KB, LD) each; q * scale
  float* dOs = Qs + KB * LD;
  float* Ks = dOs + KB * LD;
  float* Vs = Ks + KB * LD;
  float* dS = Vs + KB * LD;  // (KB, LDP): queries x keys
  float* Ls = dS + KB * LDP;  // (KB): lse, D of the query tile
  float* Ds = Ls + KB;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, HS = static_cast<int>(g.HS);
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (g.NH / g.NKV);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * KB;
  const int rows = static_cast<int>(min(int64_t{KB}, g.Tq - q0));
  const int64_t row0 = (b * g.NH + h) * g.Tq + q0;
  load_rows<KB, HSP, LD>(Qs, g.q, g.kind, b * g.qsb + q0 * g.qst + h * g.HS, g.qst, rows, HS, g.scale);
  load_rows<KB, HSP, LD>(dOs, gr.dout, gr.dout_kind, ((b * g.Tq + q0) * g.NH + h) * g.HS, g.NH * g.HS, rows, HS,
                         1.f);
  load_vec<KB>(Ls, gr.lse + row0, rows);
  load_vec<KB>(Ds, gr.D + row0, rows);
  float dq[R][NJ] = {};
  const int64_t last = min(g.off + q0 + rows - 1, g.Tk - 1);
  for (int64_t j0 = 0; j0 <= last; j0 += KB) {
    const int cols = static_cast<int>(min(int64_t{KB}, last + 1 - j0));
    __syncthreads();  // the previous tile's Ks, Vs, dS are no longer read
    load_rows<KB, HSP, LD>(Ks, g.k, g.kind, b * g.ksb + j0 * g.kst + kvh * g.HS, g.kst, cols, HS, 1.f);
    load_rows<KB, HSP, LD>(Vs, g.v, g.kind, b * g.vsb + j0 * g.vst + kvh * g.HS, g.vst, cols, HS, 1.f);
    __syncthreads();
    float s[R][R], dp[R][R];
    dot_tile<R, HSP, LD>(s, Qs, Ks, ty, tx);
    dot_tile<R, HSP, LD>(dp, dOs, Vs, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int r = ty + 16 * i, c = tx + 16 * j;  // query, key
        const bool visible = r < rows && c < cols && j0 + c <= g.off + q0 + r;
        float p, ds;
        p_ds(visible, s[i][j], dp[i][j], Ls[r], Ds[r], p, ds);
        dS[r * LDP + c] = ds;
      }
    __syncthreads();
    acc_tile<R, NJ, KB, LD, LDP>(dq, dS, Ks, ty, tx);
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t o = ((b * g.Tq + q0 + r) * g.NH + h) * g.HS;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      if (tx + 16 * j < HS) add_as(gr.dq, gr.dq_kind, o + tx + 16 * j, dq[i][j] * g.scale);
  }
}

// f(std::integral_constant<int, NJ>) with 16 NJ >= HS, NJ a power of two.
template <typename F>
void with_head_tiles(const char* op, int64_t HS, F&& f) {
  if (HS > kMaxHeadSize)
    fail(op, ": head size ", HS, " exceeds the CUDA backend's limit of ", kMaxHeadSize);
  if (HS <= 16) f(std::integral_constant<int, 1>{});
  else if (HS <= 32) f(std::integral_constant<int, 2>{});
  else if (HS <= 64) f(std::integral_constant<int, 4>{});
  else if (HS <= 128) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

Geo geometry(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  Geo g{q.data(), k.data(), v.data(), float_kind(q.dtype()), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), 0, 0.f};
  g.off = q_pos == kQueriesLast ? g.Tk - g.Tq : q_pos;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.HS)));
  if (g.B > kMaxGrid || g.NH > kMaxGrid)
    fail(op, ": batch ", g.B, " and heads ", g.NH, " must each be at most ", kMaxGrid, " on the CUDA backend");
  return g;
}

template <typename K>
void allow_smem(K* kernel, size_t bytes) {
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int kb) { return static_cast<unsigned>((n + kb - 1) / kb); }

}  // namespace

// out: (B, Tq, NH, HS) like q, contiguous   lse: (B, NH, Tq) f32 or undefined
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  constexpr const char* op = "attention_forward";
  const Geo g = geometry(op, q, k, v, q_pos);
  if (g.B == 0 || g.Tq == 0 || g.NH == 0) return;
  if (attention_mma_applies(out, q, k, v)) return attention_forward_mma(out, lse, q, k, v, g.off);
  float* lse_p = lse.defined() ? lse.data_as<float>() : nullptr;
  with_head_tiles(op, g.HS, [&](auto nj) {
    constexpr int NJ = decltype(nj)::value, KB = kFwdRows<NJ>;
    constexpr size_t smem = fwd_smem<NJ, KB>();
    allow_smem(forward_kernel<NJ, KB>, smem);
    const dim3 grid(tiles(g.Tq, KB), static_cast<unsigned>(g.NH), static_cast<unsigned>(g.B));
    forward_kernel<NJ, KB><<<grid, kThreads, smem, stream()>>>(g, out.data(), lse_p);
    LOOM_CUDA_LAUNCHED();
  });
}

// dq: like q  dk, dv: like k  (f32 or the input's dtype, contiguous, or undefined)
// dout, out: (B, Tq, NH, HS) contiguous   lse: (B, NH, Tq) f32 from attention_forward
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t q_pos) {
  constexpr const char* op = "attention_backward";
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  const Geo g = geometry(op, q, k, v, q_pos);
  // No query or no key: every gradient is zero, nothing to add.
  if (g.B == 0 || g.Tq == 0 || g.NH == 0 || g.Tk == 0) return;
  const auto opt = [](const Tensor& t) { return t.defined() ? t.data() : nullptr; };
  const auto opt_kind = [](const Tensor& t) { return t.defined() ? float_kind(t.dtype()) : kF32; };
  // An f32 dout of bf16 q, k, v (a bf16 run's activation gradients) is
  // rounded to bf16 once, as linear_backward rounds dy, so that the tensor
  // cores take it (FlashAttention-2's dO is 16-bit too); D below is then
  // rowsum of the rounded dout times out, the dO the products see. Not f16:
  // an fp16 run's loss-scaled gradient may overflow its range, so it keeps
  // the f32 kernels (gemm.cu likewise widens f16 paired with f32).
  DeviceTemp dout_16;
  const Tensor dO = dout.dtype() == DType::f32 && q.dtype() == DType::bf16 && attention_mma_applies(out, q, k, v)
                        ? converted(dout, DType::bf16, dout_16)
                        : dout;
  const int64_t rows = g.B * g.Tq * g.NH;
  DeviceTemp D(static_cast<size_t>(rows) * sizeof(float));
  const Grads gr{dO.data(), float_kind(dO.dtype()), lse.data_as<const float>(), D.as<const float>(),
                 opt(dq), opt(dk), opt(dv), opt_kind(dq), opt_kind(dk), opt_kind(dv)};
  const unsigned warps_per_block = kThreads / 32;
  rowdot_kernel<<<static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block), kThreads, 0, stream()>>>(
      D.as<float>(), dO.data(), float_kind(dO.dtype()), out.data(), float_kind(out.dtype()), g.B, g.Tq, g.NH, g.HS);
  LOOM_CUDA_LAUNCHED();
  if (attention_mma_backward_applies(dO, q, k, v))
    return attention_backward_mma(dq, dk, dv, dO, q, k, v, lse, D.as<const float>(), g.off);
  with_head_tiles(op, g.HS, [&](auto nj) {
    constexpr int NJ = decltype(nj)::value, KB = kBwdRows<NJ>;
    constexpr size_t smem = bwd_smem<NJ, KB>();
    if (dk.defined() || dv.defined()) {
      allow_smem(dkdv_kernel<NJ, KB>, smem);
      const dim3 grid(tiles(g.Tk, KB), static_cast<unsigned>(g.NKV), static_cast<unsigned>(g.B));
      dkdv_kernel<NJ, KB><<<grid, kThreads, smem, stream()>>>(g, gr);
      LOOM_CUDA_LAUNCHED();
    }
    if (dq.defined()) {
      allow_smem(dq_kernel<NJ, KB>, smem);
      const dim3 grid(tiles(g.Tq, KB), static_cast<unsigned>(g.NH), static_cast<unsigned>(g.B));
      dq_kernel<NJ, KB><<<grid, kThreads, smem, stream()>>>(g, gr);
      LOOM_CUDA_LAUNCHED();
    }
  });
}

namespace {

// One warp per (b, h, t) row: every lane reads the row's two lse before lane
// 0 rewrites acc_lse.
__global__ void merge_kernel(float* acc, float* acc_lse, const float* out, const float* lse, int64_t B, int64_t T,
                             int64_t NH, int64_t HS) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b * NH + h) * T + t
  const int lane = threadIdx.x % 32;
  if (w >= B * NH * T) return;
  const float La = acc_lse[w], Lb = lse[w], m = fmaxf(La, Lb);
  if (m == -INFINITY) return;  // neither part has keys yet: stays empty
  // La = -inf (no keys so far) gives wa = 0: the row becomes out's.
  const float wa = expf(La - m), wb = expf(Lb - m), s = wa + wb;
  const int64_t t = w % T, bh = w / T, h = bh % NH, b = bh / NH, o = ((b * T + t) * NH + h) * HS;
  for (int64_t d = lane; d < HS; d += 32) acc[o + d] = (acc[o + d] * wa + out[o + d] * wb) / s;
  __syncwarp();
  if (lane == 0) acc_lse[w] = m + logf(s);
}

}  // namespace

// acc, out: (B, T, NH, HS)  acc_lse, lse: (B, NH, T), all f32 contiguous.
void attention_merge(Tensor acc, Tensor acc_lse, const Tensor& out, const Tensor& lse) {
  const int64_t B = acc.size(0), T = acc.size(1), NH = acc.size(2), HS = acc.size(3), rows = B * NH * T;
  if (rows == 0) return;
  const int64_t warps_per_block = kThreads / 32;
  merge_kernel<<<static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block), kThreads, 0, stream()>>>(
      acc.data_as<float>(), acc_lse.data_as<float>(), out.data_as<const float>(), lse.data_as<const float>(), B, T,
      NH, HS);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::kernels::cuda
