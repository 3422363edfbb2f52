// Device helpers of the tensor-core attention kernels (attention_mma.cu,
// attention_mma_bwd.cu): cp.async, ldmatrix, mma.sync m16n8k16, the 16-bit
// packing of f32 pairs and the warp-tile products built on them. Internal to
// src/kernels/cuda.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"): g = lane / 4, t = lane % 4; a
// C fragment holds rows g, g + 8 and columns 2t, 2t + 1, which is also the A
// fragment layout of those rows over 8 of the 16 k columns: so the C
// fragments of two adjacent 8-column tiles are an A fragment as they stand.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace loom::kernels::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled where !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// dst (R, D + 8) = rows 0 .. n - 1 of src (rs elements apart), zero rows
// after them: 16-byte cp.async chunks, consecutive threads along a row; NT
// threads, the block's.
template <int D, int R = 64, int NT = 128>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t rs, int n) {
  constexpr int C = D / 8;
  for (int i = threadIdx.x; i < R * C; i += NT) {
    const int r = i / C, c = i % C;
    cp_async16(dst + r * (D + 8) + c * 8, r < n ? src + r * rs + c * 8 : src, r < n);
  }
}

// Four 8x8 b16 matrices; lanes 8i .. 8i + 7 give the row addresses of matrix
// i, and r[i] gets (row g, columns 2t, 2t + 1) of it, or with .trans (rows
// 2t, 2t + 1, column g).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a (16x16, row) * b (16x8, col), f32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// lo in the low half (the lower column of a fragment pair), RNE.
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, sizeof u);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, sizeof u);
  }
  return u;
}

// ---- 16-row warp tiles over shared-memory tiles ----------------------------
// Tiles in shared memory are rows of D 16-bit elements, D + 8 apart (so the
// 8 rows of one ldmatrix phase start 4 banks apart and cover all 32). A warp
// multiplies its 16 rows (A, m16) by a tile of N rows (N a multiple of 16).

// The warp's 16 rows (Aw: row 0 of them) as A fragments, one per 16 columns
// of D: matrices (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8) = a0 .. a3.
template <int D>
__device__ __forceinline__ void load_a_frags(uint32_t (&af)[D / 16][4], const uint16_t* Aw, int lane) {
  const uint16_t* p = Aw + (lane % 8 + 8 * ((lane / 8) % 2)) * (D + 8) + 8 * (lane / 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(af[kk], p + 16 * kk);
}

// s (16 x N, C fragments of N / 8 column tiles) = A (16 x D) . B^T, B the
// N rows of Bs (N x D): column j of s is the dot product with B's row j.
template <int D, int N, bool kBf16>
__device__ __forceinline__ void frags_dot_rows(float (&s)[N / 8][4], const uint32_t (&af)[D / 16][4],
                                               const uint16_t* Bs, int lane) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  // Matrices (rows +0, d +0), (rows +0, d +8), (rows +8, d +0), (rows +8, d +8):
  // b0, b1 of column tile 2p, then of 2p + 1.
  const uint16_t* p = Bs + (lane % 8 + 8 * (lane / 16)) * (D + 8) + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int pr = 0; pr < N / 16; ++pr) {
      uint32_t b[4];
      ldsm_x4(b, p + 16 * pr * (D + 8) + 16 * kk);
      mma16816<kBf16>(s[2 * pr], af[kk], b[0], b[1]);
      mma16816<kBf16>(s[2 * pr + 1], af[kk], b[2], b[3]);
    }
}

// acc (16 x D) += A (16 x N, A fragments) . B, B the N rows of Bs (N x D).
template <int D, int N, bool kBf16>
__device__ __forceinline__ void frags_times_rows(float (&acc)[D / 8][4], const uint32_t (&af)[N / 16][4],
                                                 const uint16_t* Bs, int lane) {
  // Matrices (rows +0, d +0), (rows +8, d +0), (rows +0, d +8), (rows +8, d +8),
  // transposed: b0, b1 of d tile 2p, then of 2p + 1.
  const uint16_t* p = Bs + (lane % 8 + 8 * ((lane / 8) % 2)) * (D + 8) + 8 * (lane / 16);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int pr = 0; pr < D / 16; ++pr) {
      uint32_t b[4];
      ldsm_x4_trans(b, p + 16 * kk * (D + 8) + 16 * pr);
      mma16816<kBf16>(acc[2 * pr], af[kk], b[0], b[1]);
      mma16816<kBf16>(acc[2 * pr + 1], af[kk], b[2], b[3]);
    }
}

// C fragments (16 x N) rounded to A fragments of the same 16 x N: column
// tiles 2kk, 2kk + 1 are k columns 0-7, 8-15 of A fragment kk.
template <int N, bool kBf16>
__device__ __forceinline__ void c_to_a_frags(uint32_t (&af)[N / 16][4], const float (&c)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    af[kk][0] = pack2<kBf16>(c[2 * kk][0], c[2 * kk][1]);
    af[kk][1] = pack2<kBf16>(c[2 * kk][2], c[2 * kk][3]);
    af[kk][2] = pack2<kBf16>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    af[kk][3] = pack2<kBf16>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

}  // namespace loom::kernels::cuda
