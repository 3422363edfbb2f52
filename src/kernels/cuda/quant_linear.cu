// linear_forward_quantized on the GPU (ops.h): the CPU's scheme, written to
// be obviously correct rather than fast. x's rows are quantized on the
// device to the weight type's dot type with quant.cpp's arithmetic (same
// bytes: IEEE division, round-half-away and nearest-even as written there,
// no FMA contraction under --fmad=false); then one warp per output: lane l
// computes the integer sums of blocks l, l + 32, ... as quant_dot.cpp does
// and the block's float term, and the terms are added in block order
// (shuffled to every lane one at a time). Every step is the CPU's, so the
// result equals the CPU's bit for bit (test_backend_ops allows f32 rounding).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // warps per thread block
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float f16_value(f16 h) { return __half2float(__ushort_as_half(h.bits)); }
__device__ __forceinline__ f16 f16_of(float v) { return f16{__half_as_ushort(__float2half_rn(v))}; }

// Not NaN nor Inf.
__device__ __forceinline__ bool finite(float v) { return fabsf(v) <= 3.40282347e38f; }

// quant.cpp's round_to_int8_as_x86 (roundf, then x86's float -> int8).
__device__ int8_t round_to_int8(float v) {
  if (!(fabsf(v) < 2147483648.f)) return 0;
  int32_t i = static_cast<int32_t>(v);
  const float frac = v - static_cast<float>(i);
  i += (frac >= 0.5f) - (frac <= -0.5f);
  return static_cast<int8_t>(i);
}

// quant.cpp's nearest_int: ties to even for |f| <= 2^22.
__device__ int nearest_int(float f) {
  const float v = f + 12582912.f;
  return static_cast<int>(__float_as_uint(v) & 0x7fffffu) - 0x400000;
}

// One warp per 32-value block: d = max|x| / 127 (f16), q = roundf(x / d).
__global__ void quantize_q8_0_kernel(block_q8_0* a, const float* x, int64_t blocks, unsigned long long* bad) {
  const int lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (b >= blocks) return;
  const float v = x[b * kQK + lane];
  if (!finite(v)) report_bad_id(bad, b * kQK + lane);
  const float d = warp_max(fabsf(v)) / 127;
  const float id = d != 0.f ? 1.f / d : 0.f;
  a[b].qs[lane] = round_to_int8(v * id);
  if (lane == 0) a[b].d = f16_of(d);
}

// One warp per 256-value block, lane l holding values 8l .. 8l + 7: the
// first value of largest magnitude sets d = max / -127 (f32).
__global__ void quantize_q8_K_kernel(block_q8_K* a, const float* x, int64_t blocks, unsigned long long* bad) {
  const int lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (b >= blocks) return;
  const float* xb = x + b * kQKK;
  float amax = 0.f;
  int at = kQKK;  // index of the first largest |x| (kQKK: all zero)
  for (int k = 8 * lane; k < 8 * lane + 8; ++k) {
    if (!finite(xb[k])) report_bad_id(bad, b * kQKK + k);
    if (fabsf(xb[k]) > amax) amax = fabsf(xb[k]), at = k;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float oa = __shfl_xor_sync(kFull, amax, o);
    const int ot = __shfl_xor_sync(kFull, at, o);
    if (oa > amax || (oa == amax && ot < at)) amax = oa, at = ot;
  }
  block_q8_K& out = a[b];
  if (at == kQKK) {
    for (int k = 8 * lane; k < 8 * lane + 8; ++k) out.qs[k] = 0;
    if (lane < kQKK / 16) out.bsums[lane] = 0;
    if (lane == 0) out.d = 0.f;
    return;
  }
  const float iscale = -127.f / xb[at];
  int sum = 0;
  for (int k = 8 * lane; k < 8 * lane + 8; ++k) {
    const int q = min(127, nearest_int(iscale * xb[k]));
    out.qs[k] = static_cast<int8_t>(q);
    sum += q;
  }
  sum += __shfl_xor_sync(kFull, sum, 1);  // lanes 2j, 2j + 1 hold values 16j .. 16j + 15
  if (lane % 2 == 0) out.bsums[lane / 2] = static_cast<int16_t>(sum);
  if (lane == 0) out.d = 1 / iscale;
}

// ---- one block's term of the dot product (quant_dot.cpp) --------------------

__device__ float block_term(const block_q8_0& x, const block_q8_0& y) {
  int isum = 0;
  for (int j = 0; j < kQK; ++j) isum += x.qs[j] * y.qs[j];
  return static_cast<float>(isum) * (f16_value(x.d) * f16_value(y.d));
}

__device__ float block_term(const block_q4_0& x, const block_q8_0& y) {
  int isum = 0;
  for (int j = 0; j < kQK / 2; ++j)
    isum += ((x.qs[j] & 0xf) - 8) * y.qs[j] + ((x.qs[j] >> 4) - 8) * y.qs[j + kQK / 2];
  return static_cast<float>(isum) * (f16_value(x.d) * f16_value(y.d));
}

__device__ void q4_K_scale_min_dev(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

__device__ float block_term(const block_q4_K& x, const block_q8_K& y) {
  int isum = 0, msum = 0;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    q4_K_scale_min_dev(j, x.scales, &sc, &m);
    const uint8_t* q = x.qs + kQK * (j / 2);
    const int shift = 4 * (j % 2);
    int dot = 0;
    for (int l = 0; l < kQK; ++l) dot += ((q[l] >> shift) & 0xf) * y.qs[kQK * j + l];
    isum += sc * dot;
    msum += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
  }
  const float d = f16_value(x.d) * y.d;
  const float dmin = f16_value(x.dmin) * y.d;
  return d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
}

__device__ float block_term(const block_q6_K& x, const block_q8_K& y) {
  int isum = 0;
  for (int j = 0; j < kQKK / 16; ++j) {  // value i = 128h + 32k + l lies in sub-block i / 16
    int dot = 0;
    for (int i = 16 * j; i < 16 * j + 16; ++i) {
      const int h = i / 128, k = i % 128 / 32, l = i % 32;
      const uint8_t ql = x.ql[64 * h + l + 32 * (k % 2)];
      const int low = k < 2 ? ql & 0xf : ql >> 4;
      const int high = (x.qh[32 * h + l] >> (2 * k)) & 3;
      dot += ((low | high << 4) - 32) * y.qs[i];
    }
    isum += x.scales[j] * dot;
  }
  return (f16_value(x.d) * y.d) * static_cast<float>(isum);
}

// y[m][n] (+ bias[n]) by one warp: the terms of blocks base + lane, added
// to s in block order by every lane alike.
template <typename W, typename A>
__global__ void quant_dot_kernel(float* y, const W* w, const A* a, const float* bias, int64_t rows, int64_t oc,
                                 int64_t nb) {
  const int lane = threadIdx.x % 32;
  const int64_t out = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (out >= rows * oc) return;
  const int64_t m = out / oc, n = out % oc;
  const W* wr = w + n * nb;
  const A* ar = a + m * nb;
  float s = 0.f;
  for (int64_t base = 0; base < nb; base += 32) {
    const float t = base + lane < nb ? block_term(wr[base + lane], ar[base + lane]) : 0.f;
    const int count = nb - base < 32 ? static_cast<int>(nb - base) : 32;
    for (int i = 0; i < count; ++i) s += __shfl_sync(kFull, t, i);
  }
  if (lane == 0) y[out] = bias ? s + bias[n] : s;
}

unsigned warps_grid(int64_t warps) { return static_cast<unsigned>((warps + kWarps - 1) / kWarps); }

// x's rows quantized to `type` into a (N rows of row_bytes); a NaN or Inf is
// the CPU's loom::Error, naming its row and index.
void quantize_rows(void* a, const float* x, int64_t N, int64_t IC, QuantType type) {
  const int64_t blocks = N * IC / quant_block_size(type);
  BadIdFlag bad;
  if (type == QuantType::q8_0)
    quantize_q8_0_kernel<<<warps_grid(blocks), 32 * kWarps, 0, stream()>>>(static_cast<block_q8_0*>(a), x, blocks,
                                                                           bad.device());
  else
    quantize_q8_K_kernel<<<warps_grid(blocks), 32 * kWarps, 0, stream()>>>(static_cast<block_q8_K*>(a), x, blocks,
                                                                           bad.device());
  LOOM_CUDA_LAUNCHED();
  if (const int64_t i = bad.first(); i >= 0) {
    float v = 0.f;
    read_back(&v, x + i, sizeof v);
    fail("linear_forward_quantized: row ", i / IC, " of x: quantize_row ", quant_name(type), ": value ", i % IC,
         " is ", v, " (NaN and Inf cannot be quantized)");
  }
}

template <typename W, typename A>
void quant_dot(float* y, const void* w, const void* a, const float* bias, int64_t N, int64_t OC, int64_t nb) {
  quant_dot_kernel<W, A><<<warps_grid(N * OC), 32 * kWarps, 0, stream()>>>(
      y, static_cast<const W*>(w), static_cast<const A*>(a), bias, N, OC, nb);
  LOOM_CUDA_LAUNCHED();
}

// Bit 0 or 16: the fifth bit of value j (0..31) of a q5_0 / q5_1 block.
__device__ __forceinline__ int fifth_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8) & 1) << 4; }

// Value i of a row of the types read from llama.cpp's files, as
// quant_more.cpp's dequantizers compute it.
__device__ float dequant_more(QuantType t, const uint8_t* row, int64_t i) {
  switch (t) {
    case QuantType::q4_1: case QuantType::q5_1: case QuantType::q5_0: {
      const int j = static_cast<int>(i % kQK), l = j % (kQK / 2);
      const uint8_t* qs = t == QuantType::q4_1   ? reinterpret_cast<const block_q4_1*>(row)[i / kQK].qs
                          : t == QuantType::q5_1 ? reinterpret_cast<const block_q5_1*>(row)[i / kQK].qs
                                                 : reinterpret_cast<const block_q5_0*>(row)[i / kQK].qs;
      int q = j < kQK / 2 ? (qs[l] & 0xf) : (qs[l] >> 4);
      if (t == QuantType::q4_1) {
        const block_q4_1& b = reinterpret_cast<const block_q4_1*>(row)[i / kQK];
        return q * f16_value(b.d) + f16_value(b.m);
      }
      if (t == QuantType::q5_1) {
        const block_q5_1& b = reinterpret_cast<const block_q5_1*>(row)[i / kQK];
        return (q | fifth_bit(b.qh, j)) * f16_value(b.d) + f16_value(b.m);
      }
      const block_q5_0& b = reinterpret_cast<const block_q5_0*>(row)[i / kQK];
      return ((q | fifth_bit(b.qh, j)) - 16) * f16_value(b.d);
    }
    case QuantType::q2_K: {
      const block_q2_K& b = reinterpret_cast<const block_q2_K*>(row)[i / kQKK];
      const int j = static_cast<int>(i % kQKK), sub = j / 16, h = j / 128, k = (j % 128) / 32, l = j % 32;
      const uint8_t sc = b.scales[sub];
      const float dl = f16_value(b.d) * (sc & 0xf), ml = f16_value(b.dmin) * (sc >> 4);
      return dl * ((b.qs[32 * h + l] >> (2 * k)) & 3) - ml;
    }
    case QuantType::q3_K: {
      const block_q3_K& b = reinterpret_cast<const block_q3_K*>(row)[i / kQKK];
      const int j = static_cast<int>(i % kQKK), sub = j / 16, h = j / 128, k = (j % 128) / 32, l = j % 32;
      const int low = sub < 8 ? b.scales[sub] & 0xf : b.scales[sub - 8] >> 4;
      const int sc = low | ((b.scales[8 + sub % 4] >> (2 * (sub / 4))) & 3) << 4;
      const int q = ((b.qs[32 * h + l] >> (2 * k)) & 3) - ((b.hmask[l] >> (4 * h + k) & 1) ? 0 : 4);
      return f16_value(b.d) * (sc - 32) * q;
    }
    case QuantType::q5_K: {
      const block_q5_K& b = reinterpret_cast<const block_q5_K*>(row)[i / kQKK];
      const int j = static_cast<int>(i % kQKK), sub = j / 32, l = j % 32;
      const uint8_t byte = b.qs[32 * (sub / 2) + l];
      const int q = (sub % 2 == 0 ? (byte & 0xf) : (byte >> 4)) + ((b.qh[l] >> sub) & 1) * 16;
      int sc = 0, m = 0;
      q4_K_scale_min_dev(sub, b.scales, &sc, &m);
      return f16_value(b.d) * sc * q - f16_value(b.dmin) * m;
    }
    default: return 0.f;  // activation types: refused by ops.h
  }
}

// Value i of a row of blocks of type t, as quant.cpp's dequantize_row computes it.
__device__ float dequant_value(QuantType t, const uint8_t* row, int64_t i) {
  switch (t) {
    case QuantType::q8_0: {
      const block_q8_0& b = reinterpret_cast<const block_q8_0*>(row)[i / kQK];
      return b.qs[i % kQK] * f16_value(b.d);
    }
    case QuantType::q4_0: {
      const block_q4_0& b = reinterpret_cast<const block_q4_0*>(row)[i / kQK];
      const int j = static_cast<int>(i % kQK);
      const int q = j < kQK / 2 ? (b.qs[j] & 0xf) : (b.qs[j - kQK / 2] >> 4);
      return (q - 8) * f16_value(b.d);
    }
    case QuantType::q4_K: {
      const block_q4_K& b = reinterpret_cast<const block_q4_K*>(row)[i / kQKK];
      const int j = static_cast<int>(i % kQKK), sub = j / 32, l = j % 32;
      const uint8_t byte = b.qs[32 * (sub / 2) + l];
      const int q = sub % 2 == 0 ? (byte & 0xf) : (byte >> 4);
      int sc = 0, m = 0;
      q4_K_scale_min_dev(sub, b.scales, &sc, &m);
      return f16_value(b.d) * sc * q - f16_value(b.dmin) * m;
    }
    case QuantType::q6_K: {
      const block_q6_K& b = reinterpret_cast<const block_q6_K*>(row)[i / kQKK];
      const int j = static_cast<int>(i % kQKK), h = j / 128, k = (j % 128) / 32, l = j % 32;
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      const int lo = (k % 2 == 0 ? ql[l] : ql[l + 32]) >> (k < 2 ? 0 : 4) & 0xf;
      const int q = (lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
      return f16_value(b.d) * b.scales[j / 16] * q;
    }
    default: return dequant_more(t, row, i);
  }
}

__global__ void dequantize_rows_kernel(float* out, const uint8_t* w, QuantType t, int64_t rows, int64_t ic,
                                       int64_t row_bytes) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * ic) return;
  out[i] = dequant_value(t, w + (i / ic) * row_bytes, i % ic);
}

// The weight types this backend multiplies in their blocks; the others
// (q4_1, q5_0, q5_1, q2_K, q3_K, q5_K) it only dequantizes (dequantize_rows:
// QLoRA's tiles).
void require_cuda_type(const char* op, QuantType t) {
  if (t == QuantType::q8_0 || t == QuantType::q4_0 || t == QuantType::q4_K || t == QuantType::q6_K) return;
  fail(op, ": weight type ", quant_name(t), " has no CUDA kernel (the CUDA backend multiplies q8_0, q4_0, q4_K and ",
       "q6_K blocks); run this model on the CPU");
}

}  // namespace

void dequantize_rows(Tensor out, const Tensor& w, QuantType wtype, int64_t first_row) {
  const int64_t R = out.size(0), IC = out.size(1), row_bytes = w.size(1);
  if (R * IC == 0) return;
  const auto* src = static_cast<const uint8_t*>(w.data()) + first_row * row_bytes;
  dequantize_rows_kernel<<<static_cast<unsigned>((R * IC + 255) / 256), 256, 0, stream()>>>(ptr<float>(out), src,
                                                                                          wtype, R, IC, row_bytes);
  LOOM_CUDA_LAUNCHED();
}

void linear_forward_quantized(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  const int64_t OC = w.size(0), IC = x.size(-1), N = IC > 0 ? x.numel() / IC : y.numel() / std::max<int64_t>(OC, 1);
  if (N == 0 || OC == 0) return;
  require_cuda_type("linear_forward_quantized", wtype);
  const QuantType at = quant_dot_type(wtype);
  DeviceTemp a(static_cast<size_t>(N) * quant_row_bytes(at, IC));
  if (IC > 0) quantize_rows(a.as<void>(), ptr<const float>(x), N, IC, at);
  const int64_t nb = IC / quant_block_size(wtype);
  float* yp = ptr<float>(y);
  const float* bp = bias.defined() ? ptr<const float>(bias) : nullptr;
  switch (wtype) {
    case QuantType::q8_0: return quant_dot<block_q8_0, block_q8_0>(yp, w.data(), a.as<void>(), bp, N, OC, nb);
    case QuantType::q4_0: return quant_dot<block_q4_0, block_q8_0>(yp, w.data(), a.as<void>(), bp, N, OC, nb);
    case QuantType::q4_K: return quant_dot<block_q4_K, block_q8_K>(yp, w.data(), a.as<void>(), bp, N, OC, nb);
    case QuantType::q6_K: return quant_dot<block_q6_K, block_q8_K>(yp, w.data(), a.as<void>(), bp, N, OC, nb);
    default: break;
  }
  LOOM_CHECK(false, "linear_forward_quantized: weight type ", quant_name(wtype), " reached the CUDA kernel");
}

}  // namespace loom::kernels::cuda
