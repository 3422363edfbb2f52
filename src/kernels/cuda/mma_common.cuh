// Device helpers of the tensor-core attention kernels (attention_mma.cu):
// cp.async, ldmatrix, mma.sync m16n8k16 and the 16-bit packing of f32
// pairs. Internal to src/kernels/cuda.
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

}  // namespace loom::kernels::cuda
