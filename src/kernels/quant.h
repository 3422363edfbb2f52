// llama.cpp's quantized block formats (ggml-common.h), bit for bit: the
// layouts GGUF files hold, the quantizers that write them and the scalar
// reference dot products inference builds on.
//
// quantize_row gives the bytes of ggml's reference quantizers
// (ggml-quants.c quantize_row_{q8_0,q4_0,q4_K,q6_K,q8_K}_ref), which are what
// llama-quantize runs for these types when it has no importance matrix
// (ggml_quantize_chunk -> quantize_q4_K / quantize_q6_K / quantize_q4_0 with
// quant_weights == NULL call the _ref functions; quantize_q8_0 always does).
// ggml builds that file for the x86-64 baseline (no FMA: ggml-base gets no
// -march), and loom's baseline build with -ffp-contract=off evaluates every
// float operation in the same order, so the bytes agree.
//
// Value of element i of a block, with every scale an f16 widened to f32:
//   q8_0  x = d * qs[i]                                  (32 values)
//   q4_0  x = d * (q[i] - 8), q in 0..15                 (32 values)
//   q4_K  x = d * sc[j] * q[i] - dmin * m[j], q in 0..15 (256 values, 8 sub-blocks of 32,
//         sc and m 6-bit)
//   q6_K  x = d * scales[j] * (q[i] - 32), q in 0..63    (256 values, 16 sub-blocks of 16)
//   q8_K  x = d * qs[i], d an f32                        (256 values; activations only)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace loom::kernels {

inline constexpr int64_t kQK = 32;    // values per q8_0 / q4_0 block
inline constexpr int64_t kQKK = 256;  // values per K-quant super-block

// q8_0 (34 bytes).
struct block_q8_0 {
  f16 d;
  int8_t qs[kQK];
};
// q4_0 (18 bytes): byte j holds q[j] in its low nibble and q[j + 16] in its high one.
struct block_q4_0 {
  f16 d;
  uint8_t qs[kQK / 2];
};
// q4_K (144 bytes). scales[12] packs 8 six-bit scales sc and 8 mins m:
//   j < 4:  sc[j] = scales[j] & 63,  m[j] = scales[j + 4] & 63
//   j >= 4: sc[j] = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
//           m[j]  = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4.
// qs: 4 runs of 32 bytes; run r holds sub-block 2r in the low nibbles and
// sub-block 2r + 1 in the high ones.
struct block_q4_K {
  f16 d;
  f16 dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
// q6_K (210 bytes). For each half h (128 values) and l < 32, with
// ql_h = ql + 64h, qh_h = qh + 32h, value 128h + 32k + l has
//   low 4 bits:  k=0: ql_h[l] & 15,  k=1: ql_h[l + 32] & 15,
//                k=2: ql_h[l] >> 4,  k=3: ql_h[l + 32] >> 4
//   high 2 bits: (qh_h[l] >> 2k) & 3.
// scales[j] (signed) applies to values 16j .. 16j + 15.
struct block_q6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  f16 d;
};
// q8_K (292 bytes): bsums[j] = sum of qs[16j .. 16j + 15].
struct block_q8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);

// q4_K sub-block j's (0..7) 6-bit scale and min from block_q4_K::scales.
inline void q4_K_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

enum class QuantType : uint8_t { q8_0, q4_0, q4_K, q6_K, q8_K };

// Values per block: 32 or 256.
int64_t quant_block_size(QuantType t);
// Bytes per block: 34, 18, 144, 210, 292.
size_t quant_block_bytes(QuantType t);
// "q8_0", "q4_0", "q4_K", "q6_K", "q8_K" (llama.cpp's spelling).
std::string_view quant_name(QuantType t);
// Bytes of n values; n a multiple of the block size, else a loom::Error.
size_t quant_row_bytes(QuantType t, int64_t n);
// The type a weight of type t is multiplied against (ggml's vec_dot_type):
// q8_0 for q8_0 and q4_0, q8_K for q4_K and q6_K.
QuantType quant_dot_type(QuantType weight);

// x: (n) f32 -> n / block_size blocks of type t. n a multiple of the block
// size; a NaN or Inf in x is a loom::Error naming its index (callers add the
// tensor's name).
void quantize_row(QuantType t, const float* x, void* blocks, int64_t n);
// blocks of type t -> y: (n) f32, as ggml's dequantize_row_* computes it.
void dequantize_row(QuantType t, const void* blocks, float* y, int64_t n);

// Dot products of n values (n a multiple of the block size; checked by the
// caller). Each block's products are summed exactly in int32, then scaled in
// f32 and accumulated block by block, in block order:
//   q8_0 . q8_0:  s += isum * (dx * dy),  isum = sum_i qx[i] * qy[i]
//   q4_0 . q8_0:  s += isum * (dx * dy),  isum = sum_i (q[i] - 8) * qy[i]
//   q4_K . q8_K:  s += (dx * dy) * isum - (dminx * dy) * msum,
//                 isum = sum_j sc[j] * sum_{i in j} q[i] * qy[i],
//                 msum = sum_j m[j] * (bsums[2j] + bsums[2j + 1])
//   q6_K . q8_K:  s += (dx * dy) * isum,  isum = sum_j scales[j] * sum_{i in j} (q[i] - 32) * qy[i]
// (llama.cpp's integer sums; its float steps differ by path, so s can differ
// from llama.cpp's in the last bits.) q8_K's bsums must match its qs, as
// quantize_row writes them. A vector version may order the integer part
// freely and keeps the float steps as written: it gives the same bits.
float vec_dot_q8_0_q8_0(const block_q8_0* x, const block_q8_0* y, int64_t n);
float vec_dot_q4_0_q8_0(const block_q4_0* x, const block_q8_0* y, int64_t n);
float vec_dot_q4_K_q8_K(const block_q4_K* x, const block_q8_K* y, int64_t n);
float vec_dot_q6_K_q8_K(const block_q6_K* x, const block_q8_K* y, int64_t n);
// The one above for a weight of type t against activations of
// quant_dot_type(t); n a multiple of the block size, else a loom::Error.
float vec_dot(QuantType weight, const void* w, const void* a, int64_t n);

}  // namespace loom::kernels
