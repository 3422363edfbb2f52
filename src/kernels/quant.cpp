// llama.cpp's block quantizers, dequantizers and scalar dot products
// (quant.h). Every float expression below keeps the operand order of
// ggml-quants.c's reference code: the bytes written depend on it.
#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/error.h"
#include "kernels/quant_detail.h"

namespace loom::kernels {
namespace quant_detail {

static float weighted_error(const float* x, const float* w, const uint8_t* L, int n, float scale, float min, bool use_mad) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    err += w[i] * diff;
  }
  return err;
}

// ggml-quants.c make_qkx2_quants: an affine fit x ~ scale * L - the_min of n
// values to L in 0..nmax, minimising the weighted error (|.| if use_mad, else
// squared) over nstep + 1 trial inverse scales (rmin + rdelta * is + nmax) /
// (max - min), each refined by weighted least squares. Returns scale.
float make_qkx2_quants(int n, const Qkx2Search& s, const float* x, const float* w, uint8_t* L, float* the_min) {
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *the_min = -min;
    return 0.f;
  }
  float iscale = s.nmax / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - min)), 0, s.nmax));
  float best_error = weighted_error(x, w, L, n, scale, min, s.use_mad);
  uint8_t Laux[kQK];
  for (int is = 0; is <= s.nstep; ++is) {
    iscale = (s.rmin + s.rdelta * is + s.nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, s.nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    const float cur_error = weighted_error(x, w, Laux, n, this_scale, this_min, s.use_mad);
    if (cur_error < best_error) {
      std::copy(Laux, Laux + n, L);
      best_error = cur_error;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

namespace {

void q4_K_pack_scales(const float* scales, const float* mins, float max_scale, float max_min, uint8_t* out) {
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQKK / 32; ++j) {
    // ggml stores nearest_int's int into a uint8_t before the min: modulo 256.
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = static_cast<uint8_t>((ls & 0xf) | ((lm & 0xf) << 4));
      out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      out[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
}

}  // namespace

void fit_k_super_block(const float* x, const Qkx2Search& search, uint8_t* L, f16* d, f16* dmin, uint8_t* scales) {
  float weights[kQK], sub_scales[kQKK / 32], mins[kQKK / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    const float* xs = x + kQK * j;
    float sum_x2 = 0;
    for (int l = 0; l < kQK; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / kQK);
    for (int l = 0; l < kQK; ++l) weights[l] = av_x + std::fabs(xs[l]);
    sub_scales[j] = make_qkx2_quants(kQK, search, xs, weights, L + kQK * j, &mins[j]);
    if (sub_scales[j] > max_scale) max_scale = sub_scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  q4_K_pack_scales(sub_scales, mins, max_scale, max_min, scales);
  *d = to_f16(max_scale / 63.f);
  *dmin = to_f16(max_min / 63.f);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t sc, m;
    q4_K_scale_min(j, scales, &sc, &m);
    const float dj = from_f16(*d) * sc;
    if (dj == 0.f) continue;  // keeps the fit's L, as ggml does
    const float dm = from_f16(*dmin) * m;
    for (int l = 0; l < kQK; ++l)
      L[kQK * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[kQK * j + l] + dm) / dj), 0, search.nmax));
  }
}

}  // namespace quant_detail

namespace {

using namespace quant_detail;


// ---- q8_0, q4_0 ------------------------------------------------------------

// d = max|x| / 127, q = round(x / d) half away from zero (roundf).
void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = round_to_int8_as_x86(x[j] * id);
  }
}

// d = signed max / -8 (the value of largest magnitude maps to q = 0, i.e. -8),
// q = min(15, trunc(x / d + 8.5)).
void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;  // all zero: -0.0, as in ggml
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint8_t>(std::min(15, int{to_int8_as_x86(x[j] * id + 8.5f)}));
      const auto q1 = static_cast<uint8_t>(std::min(15, int{to_int8_as_x86(x[j + kQK / 2] * id + 8.5f)}));
      y[i].qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
  }
}

void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = from_f16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = x[i].qs[j] * d;
  }
}

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = from_f16(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = ((x[i].qs[j] & 0xf) - 8) * d;
      y[j + kQK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// ---- q4_K ------------------------------------------------------------------

// One super-block (ggml quantize_row_q4_K_ref): fit_k_super_block's values
// 0..15, nibbles of runs of 64.
void quantize_q4_K_block(const float* x, block_q4_K* y) {
  uint8_t L[kQKK];
  fit_k_super_block(x, Qkx2Search{15, -1.f, 0.1f, 20, false}, L, &y->d, &y->dmin, y->scales);
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < kQK; ++l) y->qs[kQK * r + l] = static_cast<uint8_t>(L[64 * r + l] | (L[64 * r + l + 32] << 4));
}

void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = from_f16(x[i].d), min = from_f16(x[i].dmin);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* q = x[i].qs + kQK * r;
      uint8_t sc, m;
      q4_K_scale_min(2 * r, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      q4_K_scale_min(2 * r + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < kQK; ++l) *y++ = d1 * (q[l] & 0xf) - m1;
      for (int l = 0; l < kQK; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

// ---- q6_K ------------------------------------------------------------------

// ggml-quants.c make_qx_quants with rmse_type 1 and no importance weights:
// a symmetric fit x ~ scale * (L - nmax), L in 0..2 nmax - 1, the signed max
// mapping to L = 0, weights x^2, over 19 trial inverse scales
// -(nmax + 0.1 is) / max. Returns scale (its sign opposes max's).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {  // ggml's GROUP_MAX_EPS: an all-zero group
    std::fill(L, L + n, int8_t{0});
    return 0.f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto store = [&](float iscale) {
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
  };
  float sumlx, suml2;
  float iscale = -nmax / max;
  fit(iscale, &sumlx, &suml2);
  store(iscale);
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      store(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void q6_K_pack(const int8_t* L, block_q6_K* y) {
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    uint8_t* ql = y->ql + 64 * h;
    uint8_t* qh = y->qh + 32 * h;
    for (int l = 0; l < kQK; ++l) {
      ql[l] = static_cast<uint8_t>((Lh[l] & 0xf) | ((Lh[l + 64] & 0xf) << 4));
      ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xf) | ((Lh[l + 96] & 0xf) << 4));
      qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                   ((Lh[l + 96] >> 4) << 6));
    }
  }
}

// One super-block: fit each sub-block of 16, quantize the 16 scales to int8
// against the one of largest magnitude (which maps to -128), then requantize
// every value against the rounded scales (ggml quantize_row_q6_K_ref).
void quantize_q6_K_block(const float* x, block_q6_K* y) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < kQKK / 16; ++j) {
    scales[j] = make_qx_quants(16, 32, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  if (max_abs_scale < 1e-15f) {
    std::memset(y, 0, sizeof(*y));
    return;
  }
  const float iscale = -128.f / max_scale;
  y->d = to_f16(1 / iscale);
  for (int j = 0; j < kQKK / 16; ++j) y->scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
  for (int j = 0; j < kQKK / 16; ++j) {
    const float d = from_f16(y->d) * y->scales[j];
    if (d == 0.f) continue;  // keeps the fit's L, as ggml does
    for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
  }
  q6_K_pack(L, y);
}

void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = from_f16(x[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[i].ql + 64 * h;
      const uint8_t* qh = x[i].qh + 32 * h;
      const int8_t* sc = x[i].scales + 8 * h;
      for (int l = 0; l < kQK; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

// ---- q8_K ------------------------------------------------------------------

// d = signed max / -127 (f32), q = min(127, nearest(x / d)); bsums per 16.
// ggml leaves an all-zero block's bsums unwritten; here they are 0.
void quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    std::memset(&y[i], 0, sizeof(y[i]));
    if (amax == 0.f) continue;
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < kQKK / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

void dequantize_q8_K(const block_q8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK)
    for (int j = 0; j < kQKK; ++j) y[j] = x[i].d * x[i].qs[j];
}

void require_blocks(const char* op, QuantType t, int64_t n) {
  LOOM_REQUIRE(n >= 0 && n % quant_block_size(t) == 0, op, " ", quant_name(t), ": ", n,
               " values is not a multiple of the block size ", quant_block_size(t));
}

}  // namespace

int64_t quant_block_size(QuantType t) {
  switch (t) {
    case QuantType::q8_0:
    case QuantType::q4_0:
    case QuantType::q4_1:
    case QuantType::q5_0:
    case QuantType::q5_1:
    case QuantType::q8_1: return kQK;
    default: return kQKK;
  }
}

size_t quant_block_bytes(QuantType t) {
  switch (t) {
    case QuantType::q8_0: return sizeof(block_q8_0);
    case QuantType::q4_0: return sizeof(block_q4_0);
    case QuantType::q4_K: return sizeof(block_q4_K);
    case QuantType::q6_K: return sizeof(block_q6_K);
    case QuantType::q8_K: return sizeof(block_q8_K);
    case QuantType::q4_1: return sizeof(block_q4_1);
    case QuantType::q5_0: return sizeof(block_q5_0);
    case QuantType::q5_1: return sizeof(block_q5_1);
    case QuantType::q2_K: return sizeof(block_q2_K);
    case QuantType::q3_K: return sizeof(block_q3_K);
    case QuantType::q5_K: return sizeof(block_q5_K);
    case QuantType::q8_1: return sizeof(block_q8_1);
  }
  LOOM_CHECK(false, "unknown quant type ", static_cast<int>(t));
}

std::string_view quant_name(QuantType t) {
  switch (t) {
    case QuantType::q8_0: return "q8_0";
    case QuantType::q4_0: return "q4_0";
    case QuantType::q4_K: return "q4_K";
    case QuantType::q6_K: return "q6_K";
    case QuantType::q8_K: return "q8_K";
    case QuantType::q4_1: return "q4_1";
    case QuantType::q5_0: return "q5_0";
    case QuantType::q5_1: return "q5_1";
    case QuantType::q2_K: return "q2_K";
    case QuantType::q3_K: return "q3_K";
    case QuantType::q5_K: return "q5_K";
    case QuantType::q8_1: return "q8_1";
  }
  LOOM_CHECK(false, "unknown quant type ", static_cast<int>(t));
}

size_t quant_row_bytes(QuantType t, int64_t n) {
  require_blocks("quant_row_bytes", t, n);
  return static_cast<size_t>(n / quant_block_size(t)) * quant_block_bytes(t);
}

int quant_f16_offsets(QuantType t, size_t (&offsets)[2]) {
  offsets[0] = 0, offsets[1] = 2;  // d, then the second f16 of the 32-value types and q4_K / q5_K
  switch (t) {
    case QuantType::q8_0:
    case QuantType::q4_0:
    case QuantType::q5_0: return 1;
    case QuantType::q6_K: return offsets[0] = offsetof(block_q6_K, d), 1;
    case QuantType::q3_K: return offsets[0] = offsetof(block_q3_K, d), 1;
    case QuantType::q2_K: return offsets[0] = offsetof(block_q2_K, d), offsets[1] = offsetof(block_q2_K, dmin), 2;
    case QuantType::q8_K: return 0;
    default: return 2;  // q4_1, q5_1, q8_1, q4_K, q5_K
  }
}

bool quant_is_activation_type(QuantType t) { return t == QuantType::q8_K || t == QuantType::q8_1; }

bool quant_can_write(QuantType t) { return t != QuantType::q3_K; }

QuantType quant_dot_type(QuantType weight) {
  switch (weight) {
    case QuantType::q8_0:
    case QuantType::q4_0:
    case QuantType::q5_0: return QuantType::q8_0;
    case QuantType::q4_1:
    case QuantType::q5_1: return QuantType::q8_1;
    case QuantType::q8_K:
    case QuantType::q8_1:
      fail("quant_dot_type: ", quant_name(weight), " is an activation type, not a weight type (allowed: q8_0, ",
           "q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K)");
    default: return QuantType::q8_K;
  }
}

void quantize_row(QuantType t, const float* x, void* blocks, int64_t n) {
  require_blocks("quantize_row", t, n);
  for (int64_t i = 0; i < n; ++i)
    LOOM_REQUIRE(std::isfinite(x[i]), "quantize_row ", quant_name(t), ": value ", i, " is ", x[i],
                 " (NaN and Inf cannot be quantized)");
  const int64_t nb = n / quant_block_size(t);
  switch (t) {
    case QuantType::q8_0: return quantize_q8_0(x, static_cast<block_q8_0*>(blocks), nb);
    case QuantType::q4_0: return quantize_q4_0(x, static_cast<block_q4_0*>(blocks), nb);
    case QuantType::q4_K:
      for (int64_t i = 0; i < nb; ++i) quantize_q4_K_block(x + kQKK * i, static_cast<block_q4_K*>(blocks) + i);
      return;
    case QuantType::q6_K:
      for (int64_t i = 0; i < nb; ++i) quantize_q6_K_block(x + kQKK * i, static_cast<block_q6_K*>(blocks) + i);
      return;
    case QuantType::q8_K: return quantize_q8_K(x, static_cast<block_q8_K*>(blocks), nb);
    default:
      LOOM_REQUIRE(quantize_more(t, x, blocks, nb), "quantize_row: loom reads ", quant_name(t),
                   " but does not write it (llama-quantize does)");
  }
}

void dequantize_row(QuantType t, const void* blocks, float* y, int64_t n) {
  require_blocks("dequantize_row", t, n);
  const int64_t nb = n / quant_block_size(t);
  switch (t) {
    case QuantType::q8_0: return dequantize_q8_0(static_cast<const block_q8_0*>(blocks), y, nb);
    case QuantType::q4_0: return dequantize_q4_0(static_cast<const block_q4_0*>(blocks), y, nb);
    case QuantType::q4_K: return dequantize_q4_K(static_cast<const block_q4_K*>(blocks), y, nb);
    case QuantType::q6_K: return dequantize_q6_K(static_cast<const block_q6_K*>(blocks), y, nb);
    case QuantType::q8_K: return dequantize_q8_K(static_cast<const block_q8_K*>(blocks), y, nb);
    default: LOOM_CHECK(dequantize_more(t, blocks, y, nb), "dequantize_row: unknown type ", quant_name(t));
  }
}

}  // namespace loom::kernels
