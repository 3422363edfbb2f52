// Activations (GELU tanh form, SiLU, SwiGLU), rotary position embedding and
// softmax over the last dim (ops.h), with the CPU backend's formulas
// (cpu/activations.cpp, cpu/rope.cpp, cpu/softmax.cpp): f32 arithmetic,
// one RNE rounding on store, gradients added as T(f32(dx) + g).
//
// In place: a forward may have y == x (ops.h checked there is no partial
// overlap). Every kernel here reads an element and writes it from the same
// thread, reads first, so no pointer is __restrict__ and in place is safe.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // elements per thread per step of the elementwise kernels

// ---- elementwise driver -----------------------------------------------------

// kVec consecutive elements, loaded or stored as one access where allowed.
template <typename T>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// True when every pointer can be read as Packs (16 bytes covers f32's Pack,
// and a 16-bit type's 8).
inline bool packable(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Elements [i, i + kVec) of p as f32; those at or past n read as 0.
template <typename T>
__device__ __forceinline__ void load_vec(float (&out)[kVec], const T* p, int64_t i, int64_t n, bool vec) {
  if (vec && i + kVec <= n) {
    const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(p + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = to_float(pk.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = i + j < n ? to_float(p[i + j]) : 0.f;
  }
}

// p[i + j] = v[j] (kAdd: p[i + j] = T(f32(p[i + j]) + v[j])) for i + j < n.
template <bool kAdd, typename T>
__device__ __forceinline__ void store_vec(T* p, int64_t i, int64_t n, bool vec, const float (&v)[kVec]) {
  if (vec && i + kVec <= n) {
    Pack<T> pk;
    if constexpr (kAdd) pk = *reinterpret_cast<const Pack<T>*>(p + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) pk.v[j] = from_float<T>(kAdd ? to_float(pk.v[j]) + v[j] : v[j]);
    *reinterpret_cast<Pack<T>*>(p + i) = pk;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (i + j < n) p[i + j] = from_float<T>(kAdd ? to_float(p[i + j]) + v[j] : v[j]);
  }
}

// The first element of this thread's first step and the stride between steps.
__device__ __forceinline__ int64_t first_elem() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
}
__device__ __forceinline__ int64_t elem_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x * kVec; }

inline unsigned grid_for_vec(int64_t n) { return grid_for((n + kVec - 1) / kVec, kThreads); }

// y = op(x)
template <typename TY, typename TX, typename Op>
__global__ void unary_kernel(TY* y, const TX* x, int64_t n, bool vec, Op op) {
  for (int64_t i = first_elem(); i < n; i += elem_stride()) {
    float v[kVec];
    load_vec(v, x, i, n, vec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = op(v[j]);
    store_vec<false>(y, i, n, vec, v);
  }
}

// out = op(a, b), or out += op(a, b) with kAdd
template <bool kAdd, typename TO, typename TA, typename TB, typename Op>
__global__ void binary_kernel(TO* out, const TA* a, const TB* b, int64_t n, bool vec, Op op) {
  for (int64_t i = first_elem(); i < n; i += elem_stride()) {
    float va[kVec], vb[kVec], r[kVec];
    load_vec(va, a, i, n, vec);
    load_vec(vb, b, i, n, vec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) r[j] = op(va[j], vb[j]);
    store_vec<kAdd>(out, i, n, vec, r);
  }
}

// f(T{}) for T = float when the gradient g is f32, else TX (ops.h: a
// gradient is f32 or its operand's dtype).
template <typename TX, typename F>
void with_grad_type(const Tensor& g, F&& f) {
  if (g.dtype() == DType::f32) f(float{});
  else f(TX{});
}

// ---- math (cpu/activations.cpp's formulas) -----------------------------------

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// 0.5 x (1 + tanh(u)) written as x sigmoid(2u): no cancellation for x << 0.
struct GeluForward {
  __device__ float operator()(float x) const {
    const float u = kGeluK * (x + kGeluC * x * x * x);
    return x * sigmoid(2.0f * u);
  }
};

// dy * d/dx; x clamped to +-20 as the CPU does (s (1 - s) = 0 would meet
// u' = inf). The comparisons are std::max / std::min's, so NaN stays NaN.
struct GeluGrad {
  __device__ float operator()(float dy, float x) const {
    float xc = x < -20.0f ? -20.0f : x;
    xc = 20.0f < xc ? 20.0f : xc;
    const float x2 = xc * xc;
    const float u = kGeluK * (xc + kGeluC * x2 * xc);
    const float s = sigmoid(2.0f * u);
    const float du = kGeluK * (1.0f + 3.0f * kGeluC * x2);
    return dy * (s + xc * s * (1.0f - s) * 2.0f * du);
  }
};

struct SiluForward {
  __device__ float operator()(float x) const { return x * sigmoid(x); }
};

// d/dx [x s(x)] = s (1 + x (1 - s)).
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

struct SiluGrad {
  __device__ float operator()(float dy, float x) const { return dy * silu_grad(x); }
};

struct SwigluForward {
  __device__ float operator()(float gate, float up) const { return gate * sigmoid(gate) * up; }
};

// dgate += dy * up * silu'(gate)   dup += dy * silu(gate); either may be null.
template <typename TDG, typename TDU, typename TDY, typename T>
__global__ void swiglu_backward_kernel(TDG* dgate, TDU* dup, const TDY* dy, const T* gate, const T* up, int64_t n,
                                       bool vec) {
  for (int64_t i = first_elem(); i < n; i += elem_stride()) {
    float d[kVec], g[kVec], u[kVec], rg[kVec], ru[kVec];
    load_vec(d, dy, i, n, vec);
    load_vec(g, gate, i, n, vec);
    load_vec(u, up, i, n, vec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      rg[j] = d[j] * u[j] * silu_grad(g[j]);
      ru[j] = d[j] * g[j] * sigmoid(g[j]);
    }
    if (dgate) store_vec<true>(dgate, i, n, vec, rg);
    if (dup) store_vec<true>(dup, i, n, vec, ru);
  }
}

// y = op(x), y in x's dtype.
template <typename Op>
void unary_forward(Tensor y, const Tensor& x, Op op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const bool vec = packable({y.data(), x.data()});
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<<<grid_for_vec(n), kThreads, 0, stream()>>>(ptr<T>(y), ptr<T>(x), n, vec, op);
    LOOM_CUDA_LAUNCHED();
  });
}

// dx += op(dy, x); dx and dy f32 or x's dtype; an undefined dx is skipped.
template <typename Op>
void unary_backward(Tensor dx, const Tensor& dy, const Tensor& x, Op op) {
  const int64_t n = x.numel();
  if (!dx.defined() || n == 0) return;
  const bool vec = packable({dx.data(), dy.data(), x.data()});
  with_float_type(x.dtype(), [&](auto tx) {
    using TX = decltype(tx);
    with_grad_type<TX>(dx, [&](auto tdx) {
      with_grad_type<TX>(dy, [&](auto tdy) {
        using TDX = decltype(tdx);
        using TDY = decltype(tdy);
        binary_kernel<true><<<grid_for_vec(n), kThreads, 0, stream()>>>(ptr<TDX>(dx), ptr<TDY>(dy), ptr<TX>(x), n,
                                                                        vec, op);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
}

// ---- rope (cpu/rope.cpp) --------------------------------------------------------

// One block per (b, t) row of x: (B, T, NH, HS). The block first forms the
// row's h = HS / 2 angles pos * theta^(-2i / HS) in double, as the CPU does
// (an f32 angle is off by ~5e-4 rad at pos 8192), keeps cos and sin as f32
// in shared memory, then rotates every pair (i, i + h) of every head:
//   forward  (kSign = +1, write): y1 = x1 c - x2 s,  y2 = x2 c + x1 s
//   backward (kSign = -1, add):   the rotation by -angle, R^T.
template <int kSign, typename TO, typename TI>
__global__ void rope_kernel(TO* out, const TI* in, const int32_t* pos, bool pos_per_batch, int64_t T, int64_t NH,
                            int64_t HS, double theta) {
  extern __shared__ float cs[];  // cos[h], sin[h]
  const int64_t h = HS / 2;
  const int64_t row = blockIdx.x;  // b * T + t
  const double position = pos[pos_per_batch ? row : row % T];
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const double angle = position * pow(theta, -2.0 * i / HS);
    double s, c;
    sincos(angle, &s, &c);
    cs[i] = static_cast<float>(c);
    cs[h + i] = static_cast<float>(s);
  }
  __syncthreads();
  const int64_t base = row * NH * HS;
  for (int64_t p = threadIdx.x; p < NH * h; p += blockDim.x) {
    const int64_t head = p / h, i = p % h;
    const int64_t o1 = base + head * HS + i, o2 = o1 + h;
    const float x1 = to_float(in[o1]), x2 = to_float(in[o2]);
    const float c = cs[i], sn = kSign * cs[h + i];
    const float y1 = x1 * c - x2 * sn, y2 = x2 * c + x1 * sn;
    if constexpr (kSign > 0) {
      out[o1] = from_float<TO>(y1);
      out[o2] = from_float<TO>(y2);
    } else {
      out[o1] = from_float<TO>(to_float(out[o1]) + y1);
      out[o2] = from_float<TO>(to_float(out[o2]) + y2);
    }
  }
}

template <int kSign, typename TO, typename TI>
void launch_rope(const Tensor& out, const Tensor& in, const Tensor& pos, float theta) {
  const int64_t B = in.size(0), T = in.size(1), NH = in.size(2), HS = in.size(3), h = HS / 2;
  if (B * T == 0 || NH * h == 0) return;
  const int threads = static_cast<int>(std::clamp<int64_t>((NH * h + 31) / 32 * 32, 32, kThreads));
  const size_t smem = 2 * static_cast<size_t>(h) * sizeof(float);
  rope_kernel<kSign><<<static_cast<unsigned>(B * T), threads, smem, stream()>>>(
      ptr<TO>(out), ptr<TI>(in), ptr<int32_t>(pos), pos.ndim() == 2, T, NH, HS, static_cast<double>(theta));
  LOOM_CUDA_LAUNCHED();
}

// ---- softmax (cpu/softmax.cpp) ---------------------------------------------------

// Threads for one block per row of n elements: about 8 elements each, a
// multiple of 32 in [32, 1024].
int row_threads(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + 255) / 256 * 32, 32, 1024)); }

// One block per row of D: max, then the sum of exp(x - max) (each thread's
// share in double as the CPU's sum, then a fixed tree), then y = e * (1 / sum).
template <typename T>
__global__ void softmax_forward_kernel(T* y, const T* x, int64_t D) {
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * D;
  T* yr = y + static_cast<int64_t>(blockIdx.x) * D;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) m = fmaxf(m, to_float(xr[i]));
  m = block_max(m);
  double sum = 0.;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += expf(to_float(xr[i]) - m);
  sum = block_sum(sum);
  const float inv = static_cast<float>(1. / sum);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = from_float<T>(expf(to_float(xr[i]) - m) * inv);
}

// dx += y * (dy - dot(dy, y)), the dot of f32 products summed in double.
template <typename TDX, typename TDY, typename T>
__global__ void softmax_backward_kernel(TDX* dx, const TDY* dy, const T* y, int64_t D) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * D;
  double dot = 0.;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float p = to_float(dy[off + i]) * to_float(y[off + i]);
    dot += p;
  }
  const float dotf = static_cast<float>(block_sum(dot));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float g = to_float(y[off + i]) * (to_float(dy[off + i]) - dotf);
    dx[off + i] = from_float<TDX>(to_float(dx[off + i]) + g);
  }
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) { unary_forward(y, x, GeluForward{}); }
void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) { unary_backward(dx, dy, x, GeluGrad{}); }
void silu_forward(Tensor y, const Tensor& x) { unary_forward(y, x, SiluForward{}); }
void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x) { unary_backward(dx, dy, x, SiluGrad{}); }

// y = silu(gate) * up     gate, up, y: (N, F), one dtype
void swiglu_forward(Tensor y, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  const bool vec = packable({y.data(), gate.data(), up.data()});
  with_float_type(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<false><<<grid_for_vec(n), kThreads, 0, stream()>>>(ptr<T>(y), ptr<T>(gate), ptr<T>(up), n, vec,
                                                                     SwigluForward{});
    LOOM_CUDA_LAUNCHED();
  });
}

// dgate, dup (each may be undefined), dy: f32 or gate's dtype
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dy, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if ((!dgate.defined() && !dup.defined()) || n == 0) return;
  const bool vec = packable({dgate.data(), dup.data(), dy.data(), gate.data(), up.data()});
  with_float_type(gate.dtype(), [&](auto tg) {
    using T = decltype(tg);
    with_grad_type<T>(dy, [&](auto tdy) {
      with_grad_type<T>(dgate, [&](auto tdg) {
        with_grad_type<T>(dup, [&](auto tdu) {
          using TDY = decltype(tdy);
          using TDG = decltype(tdg);
          using TDU = decltype(tdu);
          swiglu_backward_kernel<<<grid_for_vec(n), kThreads, 0, stream()>>>(
              ptr<TDG>(dgate), ptr<TDU>(dup), ptr<TDY>(dy), ptr<T>(gate), ptr<T>(up), n, vec);
          LOOM_CUDA_LAUNCHED();
        });
      });
    });
  });
}

// x, y: (B, T, NH, HS), one dtype; y may be x   pos: (T) or (B, T) i32
void rope_forward(Tensor y, const Tensor& x, const Tensor& pos, float theta) {
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_rope<1, T, T>(y, x, pos, theta);
  });
}

// dx += R(pos)^T dy; dx and dy any float dtypes.
void rope_backward(Tensor dx, const Tensor& dy, const Tensor& pos, float theta) {
  if (!dx.defined()) return;
  with_float_type(dy.dtype(), [&](auto ti) {
    with_float_type(dx.dtype(), [&](auto to) {
      using TI = decltype(ti);
      using TO = decltype(to);
      launch_rope<-1, TO, TI>(dx, dy, pos, theta);
    });
  });
}

// x, y: (..., D), same dtype; y may be x.
void softmax_forward(Tensor y, const Tensor& x) {
  const int64_t D = x.size(-1), N = D ? x.numel() / D : 0;
  if (N == 0) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_forward_kernel<<<static_cast<unsigned>(N), row_threads(D), 0, stream()>>>(ptr<T>(y), ptr<T>(x), D);
    LOOM_CUDA_LAUNCHED();
  });
}

// dx += y * (dy - sum(dy * y))     dy, dx: like y, f32 or y's dtype.
void softmax_backward(Tensor dx, const Tensor& dy, const Tensor& y) {
  const int64_t D = y.size(-1), N = D ? y.numel() / D : 0;
  if (!dx.defined() || N == 0) return;
  with_float_type(y.dtype(), [&](auto ty) {
    using T = decltype(ty);
    with_grad_type<T>(dx, [&](auto tdx) {
      with_grad_type<T>(dy, [&](auto tdy) {
        using TDX = decltype(tdx);
        using TDY = decltype(tdy);
        softmax_backward_kernel<<<static_cast<unsigned>(N), row_threads(D), 0, stream()>>>(
            ptr<TDX>(dx), ptr<TDY>(dy), ptr<T>(y), D);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
}

}  // namespace loom::kernels::cuda
