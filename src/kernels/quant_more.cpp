// The block types loom reads from llama.cpp's files beyond the ones it was
// written with (quant.h): q4_1, q5_0, q5_1, q2_K, q3_K, q5_K and the q8_1
// activations q4_1 and q5_1 multiply against. Quantizers and dequantizers
// keep the operand order of ggml-quants.c's reference code (quantize_row_*_ref,
// dequantize_row_*), so bytes and floats equal ggml's (tests/kernels/
// test_quant_ggml.cpp). q3_K has no quantizer here: loom reads it only.
#include <cfloat>
#include <cstring>

#include "core/error.h"
#include "kernels/quant.h"
#include "kernels/quant_detail.h"

namespace loom::kernels::quant_detail {
namespace {

// ---- q4_1, q5_0, q5_1, q8_1 -----------------------------------------------

// min and max of a block of 32 (q4_1, q5_1 start from FLT_MAX / -FLT_MAX).
void min_max(const float* x, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    y[i].m = to_f16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint8_t>(std::min(15, int{to_int8_as_x86((x[j] - min) * id + 0.5f)}));
      const auto q1 = static_cast<uint8_t>(std::min(15, int{to_int8_as_x86((x[j + kQK / 2] - min) * id + 0.5f)}));
      y[i].qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
  }
}

// Five-bit values q[0..32) into nibbles and the fifth bits' word.
template <class Block>
void pack5(const uint8_t* q, Block* y) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    y->qs[j] = static_cast<uint8_t>((q[j] & 0xf) | ((q[j + kQK / 2] & 0xf) << 4));
    qh |= ((q[j] & 0x10u) >> 4) << j;
    qh |= ((q[j + kQK / 2] & 0x10u) >> 4) << (j + kQK / 2);
  }
  std::memcpy(y->qh, &qh, sizeof qh);
}

// d = signed max / -16, q = min(31, trunc(x / d + 16.5)).
void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>(std::min(31, int{to_int8_as_x86(x[j] * id + 16.5f)}));
    pack5(q, &y[i]);
  }
}

// d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5) (ggml does
// not clamp: at most 31 for finite x).
void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    y[i].m = to_f16(min);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>(to_int8_as_x86((x[j] - min) * id + 0.5f));
    pack5(q, &y[i]);
  }
}

// q8_0's values and scale, and s = d * sum(qs) rounded to f16.
void quantize_q8_1(const float* x, block_q8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = round_to_int8_as_x86(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = to_f16(static_cast<float>(sum) * d);
  }
}

// The fifth bit of value j (0..31) of a q5_0 / q5_1 block, as 0 or 16.
inline int fifth_bit(uint32_t qh, int j) { return static_cast<int>((qh >> j) << 4 & 0x10); }

template <class Block, bool kMin>
void dequantize_q5(const Block* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = from_f16(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (x[i].qs[j] & 0xf) | fifth_bit(qh, j);
      const int q1 = (x[i].qs[j] >> 4) | fifth_bit(qh, j + kQK / 2);
      if constexpr (kMin) {
        const float m = from_f16(x[i].m);
        y[j] = q0 * d + m;
        y[j + kQK / 2] = q1 * d + m;
      } else {
        y[j] = (q0 - 16) * d;
        y[j + kQK / 2] = (q1 - 16) * d;
      }
    }
  }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = from_f16(x[i].d), m = from_f16(x[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = (x[i].qs[j] & 0xf) * d + m;
      y[j + kQK / 2] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q8_1(const block_q8_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = from_f16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = x[i].qs[j] * d;
  }
}

// ---- q2_K, q3_K ------------------------------------------------------------

// 256 two-bit values into q2_K / q3_K's qs: value 128h + 32k + l at bits 2k
// of byte 32h + l.
void pack2(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
    }
}

// One super-block (ggml quantize_row_q2_K_ref): each sub-block of 16 fitted
// with weights |x| (absolute error), scales and mins to 4 bits against their
// maxima, every value requantized against the rounded ones.
void quantize_q2_K_block(const float* x, block_q2_K* y) {
  static constexpr Qkx2Search kSearch{3, -0.5f, 0.1f, 15, true};
  uint8_t L[kQKK];
  float weights[16], scales[kQKK / 16], mins[kQKK / 16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, kSearch, x + 16 * j, weights, L + 16 * j, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  // ggml stores nearest_int's int into the uint8_t: modulo 256, as here.
  std::memset(y->scales, 0, sizeof y->scales);
  y->d = to_f16(0.f);
  y->dmin = to_f16(0.f);
  if (max_scale > 0) {
    const float iscale = 15.f / max_scale;
    for (int j = 0; j < kQKK / 16; ++j) y->scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
    y->d = to_f16(max_scale / 15.f);
  }
  if (max_min > 0) {
    const float iscale = 15.f / max_min;
    for (int j = 0; j < kQKK / 16; ++j) y->scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
    y->dmin = to_f16(max_min / 15.f);
  }
  for (int j = 0; j < kQKK / 16; ++j) {
    const float d = from_f16(y->d) * (y->scales[j] & 0xf);
    if (d == 0.f) continue;  // keeps the fit's L, as ggml does
    const float dm = from_f16(y->dmin) * (y->scales[j] >> 4);
    for (int l = 0; l < 16; ++l)
      L[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
  }
  pack2(L, y->qs);
}

void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = from_f16(x[i].d), min = from_f16(x[i].dmin);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[i].scales[8 * h + 2 * k + half];
          const float dl = d * (sc & 0xf), ml = min * (sc >> 4);
          const uint8_t* q = x[i].qs + 32 * h + 16 * half;
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l] >> (2 * k)) & 3) - ml;
        }
  }
}

void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = from_f16(x[i].d);
    uint8_t sc[16];
    q3_K_scales(x[i].scales, sc);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * (sc[8 * h + 2 * k + half] - 32);
          const uint8_t* q = x[i].qs + 32 * h + 16 * half;
          const uint8_t* hm = x[i].hmask + 16 * half;
          const int bit = 4 * h + k;
          for (int l = 0; l < 16; ++l) *y++ = dl * (((q[l] >> (2 * k)) & 3) - ((hm[l] >> bit & 1) ? 0 : 4));
        }
  }
}

// ---- q5_K ------------------------------------------------------------------

// One super-block (ggml quantize_row_q5_K_ref): fit_k_super_block's values
// 0..31, their fifth bits into qh.
void quantize_q5_K_block(const float* x, block_q5_K* y) {
  uint8_t L[kQKK];
  fit_k_super_block(x, Qkx2Search{31, -0.5f, 0.1f, 15, false}, L, &y->d, &y->dmin, y->scales);
  std::memset(y->qh, 0, sizeof y->qh);
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < kQK; ++l) {
      const int lo = L[64 * r + l], hi = L[64 * r + 32 + l];
      y->qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * r) | (hi >> 4) << (2 * r + 1));
      y->qs[kQK * r + l] = static_cast<uint8_t>((lo & 0xf) | (hi & 0xf) << 4);
    }
}

void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = from_f16(x[i].d), min = from_f16(x[i].dmin);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* ql = x[i].qs + kQK * r;
      uint8_t sc, m;
      q4_K_scale_min(2 * r, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      q4_K_scale_min(2 * r + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < kQK; ++l) *y++ = d1 * ((ql[l] & 0xf) + ((x[i].qh[l] >> (2 * r)) & 1) * 16) - m1;
      for (int l = 0; l < kQK; ++l) *y++ = d2 * ((ql[l] >> 4) + ((x[i].qh[l] >> (2 * r + 1)) & 1) * 16) - m2;
    }
  }
}

}  // namespace

bool quantize_more(QuantType t, const float* x, void* blocks, int64_t nb) {
  switch (t) {
    case QuantType::q4_1: return quantize_q4_1(x, static_cast<block_q4_1*>(blocks), nb), true;
    case QuantType::q5_0: return quantize_q5_0(x, static_cast<block_q5_0*>(blocks), nb), true;
    case QuantType::q5_1: return quantize_q5_1(x, static_cast<block_q5_1*>(blocks), nb), true;
    case QuantType::q8_1: return quantize_q8_1(x, static_cast<block_q8_1*>(blocks), nb), true;
    case QuantType::q2_K:
      for (int64_t i = 0; i < nb; ++i) quantize_q2_K_block(x + kQKK * i, static_cast<block_q2_K*>(blocks) + i);
      return true;
    case QuantType::q5_K:
      for (int64_t i = 0; i < nb; ++i) quantize_q5_K_block(x + kQKK * i, static_cast<block_q5_K*>(blocks) + i);
      return true;
    default: return false;
  }
}

bool dequantize_more(QuantType t, const void* blocks, float* y, int64_t nb) {
  switch (t) {
    case QuantType::q4_1: return dequantize_q4_1(static_cast<const block_q4_1*>(blocks), y, nb), true;
    case QuantType::q5_0: return dequantize_q5<block_q5_0, false>(static_cast<const block_q5_0*>(blocks), y, nb), true;
    case QuantType::q5_1: return dequantize_q5<block_q5_1, true>(static_cast<const block_q5_1*>(blocks), y, nb), true;
    case QuantType::q8_1: return dequantize_q8_1(static_cast<const block_q8_1*>(blocks), y, nb), true;
    case QuantType::q2_K: return dequantize_q2_K(static_cast<const block_q2_K*>(blocks), y, nb), true;
    case QuantType::q3_K: return dequantize_q3_K(static_cast<const block_q3_K*>(blocks), y, nb), true;
    case QuantType::q5_K: return dequantize_q5_K(static_cast<const block_q5_K*>(blocks), y, nb), true;
    default: return false;
  }
}

}  // namespace loom::kernels::quant_detail
