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
// and the types loom reads from llama.cpp's files and multiplies in their
// blocks (quant_more.cpp; quantize_row writes all but q3_K, which only
// llama.cpp's writers make):
//   q4_1  x = d * q[i] + m, q in 0..15                   (32 values)
//   q5_0  x = d * (q[i] - 16), q in 0..31                (32 values)
//   q5_1  x = d * q[i] + m, q in 0..31                   (32 values)
//   q2_K  x = d * sc[j] * q[i] - dmin * m[j], q in 0..3  (256 values, 16 sub-blocks of 16,
//         sc and m 4-bit)
//   q3_K  x = d * (sc[j] - 32) * (q[i] - 4), q in 0..7   (256 values, 16 sub-blocks of 16,
//         sc 6-bit)
//   q5_K  x = d * sc[j] * q[i] - dmin * m[j], q in 0..31 (256 values, 8 sub-blocks of 32,
//         q4_K's scales)
//   q8_1  x = d * qs[i], s = d * sum(qs) as f16          (32 values; activations only)
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
// q4_1 (20 bytes), q5_0 (22), q5_1 (24): q4_0's nibbles; q5's fifth bit of
// value j in bit j of qh (little-endian).
struct block_q4_1 {
  f16 d;
  f16 m;
  uint8_t qs[kQK / 2];
};
struct block_q5_0 {
  f16 d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct block_q5_1 {
  f16 d;
  f16 m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// q8_1 (36 bytes): q8_0 with s = d * sum(qs) (an f16), for q4_1 and q5_1's minima.
struct block_q8_1 {
  f16 d;
  f16 s;
  int8_t qs[kQK];
};
// q2_K (84 bytes). For each half h (128 values), k < 4 and l < 32, value
// 128h + 32k + l is (qs[32h + l] >> 2k) & 3; scales[j] holds sub-block j's
// (16 values) scale in its low nibble and its min in its high one.
struct block_q2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  f16 d;
  f16 dmin;
};
// q3_K (110 bytes). Value 128h + 32k + l: low bits (qs[32h + l] >> 2k) & 3,
// high bit (hmask[l] >> (4h + k)) & 1, q = low + 4 high. scales[12] packs 16
// six-bit scales (q3_K_scales unpacks them), each biased by 32.
struct block_q3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  f16 d;
};
// q5_K (176 bytes): q4_K's scales and nibble runs, value 64r + l (run r,
// l < 32) and 64r + 32 + l taking their fifth bits from qh[l] bits 2r and
// 2r + 1.
struct block_q5_K {
  f16 d;
  f16 dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_1) == 36);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q5_K) == 176);
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

// q3_K's 16 six-bit scales (0..63, before the bias of 32) from its scales[12]:
// scale j's low 4 bits are nibble j % 8 of bytes 0..7 (low nibbles first),
// its high 2 bits bits 2 (j / 4) of byte 8 + j % 4.
inline void q3_K_scales(const uint8_t* packed, uint8_t* scales) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xf : packed[j - 8] >> 4;
    scales[j] = static_cast<uint8_t>(low | ((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
  }
}

enum class QuantType : uint8_t { q8_0, q4_0, q4_K, q6_K, q8_K, q4_1, q5_0, q5_1, q2_K, q3_K, q5_K, q8_1 };

// Values per block: 32 (q8_0, q4_0, q4_1, q5_0, q5_1, q8_1) or 256.
int64_t quant_block_size(QuantType t);
// Bytes per block (sizeof of its block struct above).
size_t quant_block_bytes(QuantType t);
// "q8_0", "q4_0", "q4_K", ... (llama.cpp's spelling).
std::string_view quant_name(QuantType t);
// Bytes of n values; n a multiple of the block size, else a loom::Error.
size_t quant_row_bytes(QuantType t, int64_t n);
// The type a weight of type t is multiplied against (ggml's vec_dot_type):
// q8_0 for q8_0, q4_0 and q5_0; q8_1 for q4_1 and q5_1; q8_K for the K types.
// An activation type (q8_K, q8_1) is a loom::Error.
QuantType quant_dot_type(QuantType weight);
// The byte offsets in a block of type t of its f16 scales (d, then dmin, m
// or s where it has one; q8_K's f32 d is none): how many, in offsets.
int quant_f16_offsets(QuantType t, size_t (&offsets)[2]);
// Whether t is an activation type (q8_K, q8_1): never a weight's.
bool quant_is_activation_type(QuantType t);
// Whether quantize_row writes t (every type but q3_K).
bool quant_can_write(QuantType t);

// x: (n) f32 -> n / block_size blocks of type t. n a multiple of the block
// size; a NaN or Inf in x is a loom::Error naming its index (callers add the
// tensor's name), as is a type quant_can_write refuses.
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
//   q5_0 . q8_0:  s += isum * (dx * dy),  isum = sum_i (q[i] - 16) * qy[i]
//   q4_1, q5_1 . q8_1:  s += (dx * dy) * isum + mx * sy,  isum = sum_i q[i] * qy[i]
//   q2_K . q8_K:  s += (dx * dy) * isum - (dminx * dy) * msum,
//                 isum = sum_j sc[j] * sum_{i in j} q[i] * qy[i],  msum = sum_j m[j] * bsums[j]
//   q3_K . q8_K:  s += (dx * dy) * isum,  isum = sum_j (sc[j] - 32) * sum_{i in j} (q[i] - 4) * qy[i]
//   q5_K . q8_K:  as q4_K, q in 0..31
// (llama.cpp's integer sums; its float steps differ by path, so s can differ
// from llama.cpp's in the last bits.) q8_K's bsums must match its qs, as
// quantize_row writes them. A vector version may order the integer part
// freely and keeps the float steps as written: it gives the same bits.
float vec_dot_q8_0_q8_0(const block_q8_0* x, const block_q8_0* y, int64_t n);
float vec_dot_q4_0_q8_0(const block_q4_0* x, const block_q8_0* y, int64_t n);
float vec_dot_q4_K_q8_K(const block_q4_K* x, const block_q8_K* y, int64_t n);
float vec_dot_q6_K_q8_K(const block_q6_K* x, const block_q8_K* y, int64_t n);
float vec_dot_q5_0_q8_0(const block_q5_0* x, const block_q8_0* y, int64_t n);
float vec_dot_q4_1_q8_1(const block_q4_1* x, const block_q8_1* y, int64_t n);
float vec_dot_q5_1_q8_1(const block_q5_1* x, const block_q8_1* y, int64_t n);
float vec_dot_q2_K_q8_K(const block_q2_K* x, const block_q8_K* y, int64_t n);
float vec_dot_q3_K_q8_K(const block_q3_K* x, const block_q8_K* y, int64_t n);
float vec_dot_q5_K_q8_K(const block_q5_K* x, const block_q8_K* y, int64_t n);
// The one above for a weight of type t against activations of
// quant_dot_type(t); n a multiple of the block size, else a loom::Error.
float vec_dot(QuantType weight, const void* w, const void* a, int64_t n);

}  // namespace loom::kernels
