// The scalar reference dot products of quantized rows (quant.h gives the
// formulas). The integer loops are written for the compiler to vectorise.
#include "kernels/quant.h"

#include <cstring>

#include "core/error.h"

namespace loom::kernels {
namespace {

// Sub-block sums of x's 4-bit values times y's 8-bit ones, for a run of 32
// bytes: lo over the low nibbles against y[0..32), hi over the high ones
// against y[32..64).
inline void nibble_dots(const uint8_t* q, const int8_t* y, int* lo, int* hi) {
  int s_lo = 0, s_hi = 0;
  for (int l = 0; l < kQK; ++l) {
    s_lo += (q[l] & 0xf) * y[l];
    s_hi += (q[l] >> 4) * y[l + kQK];
  }
  *lo = s_lo;
  *hi = s_hi;
}

// q6_K: sum over one super-block of scales[j] * sum_{i in j} (q[i] - 32) * y[i],
// the 6-bit values unpacked first (quant.h gives the layout).
int q6_K_isum(const block_q6_K& x, const int8_t* y) {
  int8_t q[kQKK];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = x.ql + 64 * h;
    const uint8_t* qh = x.qh + 32 * h;
    int8_t* qv = q + 128 * h;
    for (int l = 0; l < kQK; ++l) {
      qv[l] = static_cast<int8_t>(((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32);
      qv[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
      qv[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      qv[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
  int32_t lanes[16] = {};
  for (int j = 0; j < kQKK / 16; ++j)
    for (int l = 0; l < 16; ++l) lanes[l] += x.scales[j] * (q[16 * j + l] * y[16 * j + l]);
  int isum = 0;
  for (int32_t v : lanes) isum += v;
  return isum;
}

}  // namespace

float vec_dot_q8_0_q8_0(const block_q8_0* x, const block_q8_0* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += x[i].qs[j] * y[i].qs[j];
    s += static_cast<float>(isum) * (from_f16(x[i].d) * from_f16(y[i].d));
  }
  return s;
}

float vec_dot_q4_0_q8_0(const block_q4_0* x, const block_q8_0* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[kQK];
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = static_cast<int8_t>((x[i].qs[j] & 0xf) - 8);
      q[j + kQK / 2] = static_cast<int8_t>((x[i].qs[j] >> 4) - 8);
    }
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += q[j] * y[i].qs[j];
    s += static_cast<float>(isum) * (from_f16(x[i].d) * from_f16(y[i].d));
  }
  return s;
}

float vec_dot_q4_K_q8_K(const block_q4_K* x, const block_q8_K* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0, msum = 0;
    for (int r = 0; r < 4; ++r) {
      uint8_t sc_lo, m_lo, sc_hi, m_hi;
      q4_K_scale_min(2 * r, x[i].scales, &sc_lo, &m_lo);
      q4_K_scale_min(2 * r + 1, x[i].scales, &sc_hi, &m_hi);
      int lo, hi;
      nibble_dots(x[i].qs + kQK * r, y[i].qs + 64 * r, &lo, &hi);
      isum += sc_lo * lo + sc_hi * hi;
      msum += m_lo * (y[i].bsums[4 * r] + y[i].bsums[4 * r + 1]) + m_hi * (y[i].bsums[4 * r + 2] + y[i].bsums[4 * r + 3]);
    }
    const float d = from_f16(x[i].d) * y[i].d;
    const float dmin = from_f16(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return s;
}

float vec_dot_q6_K_q8_K(const block_q6_K* x, const block_q8_K* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQKK; ++i)
    s += (from_f16(x[i].d) * y[i].d) * static_cast<float>(q6_K_isum(x[i], y[i].qs));
  return s;
}

namespace {

// A q5_0 / q5_1 block's 32 values (0..31) from its nibbles and fifth bits.
template <class Block>
void unpack5(const Block& x, int8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, x.qh, sizeof qh);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = static_cast<int8_t>((x.qs[j] & 0xf) | ((qh >> j) & 1) << 4);
    q[j + kQK / 2] = static_cast<int8_t>((x.qs[j] >> 4) | ((qh >> (j + kQK / 2)) & 1) << 4);
  }
}

}  // namespace

float vec_dot_q5_0_q8_0(const block_q5_0* x, const block_q8_0* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[kQK];
    unpack5(x[i], q);
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += (q[j] - 16) * y[i].qs[j];
    s += static_cast<float>(isum) * (from_f16(x[i].d) * from_f16(y[i].d));
  }
  return s;
}

namespace {

// s += (dx * dy) * isum + mx * sy over blocks whose values are q (0..31).
template <class Block, class Unpack>
float dot_with_min(const Block* x, const block_q8_1* y, int64_t n, Unpack unpack) {
  float s = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[kQK];
    unpack(x[i], q);
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += q[j] * y[i].qs[j];
    s += (from_f16(x[i].d) * from_f16(y[i].d)) * static_cast<float>(isum) + from_f16(x[i].m) * from_f16(y[i].s);
  }
  return s;
}

}  // namespace

float vec_dot_q4_1_q8_1(const block_q4_1* x, const block_q8_1* y, int64_t n) {
  return dot_with_min(x, y, n, [](const block_q4_1& b, int8_t* q) {
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = static_cast<int8_t>(b.qs[j] & 0xf);
      q[j + kQK / 2] = static_cast<int8_t>(b.qs[j] >> 4);
    }
  });
}

float vec_dot_q5_1_q8_1(const block_q5_1* x, const block_q8_1* y, int64_t n) {
  return dot_with_min(x, y, n, [](const block_q5_1& b, int8_t* q) { unpack5(b, q); });
}

float vec_dot_q2_K_q8_K(const block_q2_K* x, const block_q8_K* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0, msum = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      // sub-block j: values 128h + 32k + 16 half + l, bits 2k of qs[32h + 16 half + l]
      const int h = j / 8, k = j % 8 / 2, half = j % 2;
      const uint8_t* q = x[i].qs + 32 * h + 16 * half;
      const int8_t* qy = y[i].qs + 16 * j;
      int sub = 0;
      for (int l = 0; l < 16; ++l) sub += ((q[l] >> (2 * k)) & 3) * qy[l];
      isum += (x[i].scales[j] & 0xf) * sub;
      msum += (x[i].scales[j] >> 4) * y[i].bsums[j];
    }
    const float d = from_f16(x[i].d) * y[i].d;
    const float dmin = from_f16(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return s;
}

float vec_dot_q3_K_q8_K(const block_q3_K* x, const block_q8_K* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t sc[16];
    q3_K_scales(x[i].scales, sc);
    int isum = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      const int h = j / 8, k = j % 8 / 2, half = j % 2;
      const uint8_t* q = x[i].qs + 32 * h + 16 * half;
      const uint8_t* hm = x[i].hmask + 16 * half;
      const int8_t* qy = y[i].qs + 16 * j;
      int sub = 0;
      for (int l = 0; l < 16; ++l) sub += (((q[l] >> (2 * k)) & 3) + 4 * ((hm[l] >> (4 * h + k)) & 1) - 4) * qy[l];
      isum += (sc[j] - 32) * sub;
    }
    s += (from_f16(x[i].d) * y[i].d) * static_cast<float>(isum);
  }
  return s;
}

float vec_dot_q5_K_q8_K(const block_q5_K* x, const block_q8_K* y, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0, msum = 0;
    for (int j = 0; j < kQKK / 32; ++j) {
      uint8_t sc, m;
      q4_K_scale_min(j, x[i].scales, &sc, &m);
      const uint8_t* ql = x[i].qs + kQK * (j / 2);
      const int8_t* qy = y[i].qs + kQK * j;
      int sub = 0;
      for (int l = 0; l < kQK; ++l) {
        const int low = j % 2 == 0 ? ql[l] & 0xf : ql[l] >> 4;
        sub += (low | ((x[i].qh[l] >> j) & 1) << 4) * qy[l];
      }
      isum += sc * sub;
      msum += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = from_f16(x[i].d) * y[i].d;
    const float dmin = from_f16(x[i].dmin) * y[i].d;
    s += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return s;
}

float vec_dot(QuantType weight, const void* w, const void* a, int64_t n) {
  LOOM_REQUIRE(n >= 0 && n % quant_block_size(weight) == 0, "vec_dot ", quant_name(weight), ": ", n,
               " values is not a multiple of the block size ", quant_block_size(weight));
  switch (weight) {
    case QuantType::q8_0: return vec_dot_q8_0_q8_0(static_cast<const block_q8_0*>(w), static_cast<const block_q8_0*>(a), n);
    case QuantType::q4_0: return vec_dot_q4_0_q8_0(static_cast<const block_q4_0*>(w), static_cast<const block_q8_0*>(a), n);
    case QuantType::q4_K: return vec_dot_q4_K_q8_K(static_cast<const block_q4_K*>(w), static_cast<const block_q8_K*>(a), n);
    case QuantType::q6_K: return vec_dot_q6_K_q8_K(static_cast<const block_q6_K*>(w), static_cast<const block_q8_K*>(a), n);
    case QuantType::q5_0: return vec_dot_q5_0_q8_0(static_cast<const block_q5_0*>(w), static_cast<const block_q8_0*>(a), n);
    case QuantType::q4_1: return vec_dot_q4_1_q8_1(static_cast<const block_q4_1*>(w), static_cast<const block_q8_1*>(a), n);
    case QuantType::q5_1: return vec_dot_q5_1_q8_1(static_cast<const block_q5_1*>(w), static_cast<const block_q8_1*>(a), n);
    case QuantType::q2_K: return vec_dot_q2_K_q8_K(static_cast<const block_q2_K*>(w), static_cast<const block_q8_K*>(a), n);
    case QuantType::q3_K: return vec_dot_q3_K_q8_K(static_cast<const block_q3_K*>(w), static_cast<const block_q8_K*>(a), n);
    case QuantType::q5_K: return vec_dot_q5_K_q8_K(static_cast<const block_q5_K*>(w), static_cast<const block_q8_K*>(a), n);
    case QuantType::q8_K:
    case QuantType::q8_1: break;
  }
  fail("vec_dot: ", quant_name(weight), " is an activation type, not a weight type");
}

}  // namespace loom::kernels
