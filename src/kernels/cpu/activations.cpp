// Elementwise activations: GELU (tanh approximation), SiLU, SwiGLU.
//
// Every op walks the flat element range in chunks of kChunk: each operand is
// read as f32 (in place for f32, converted into a buffer for bf16/f16), the math
// writes contiguous floats to a buffer (vectorised, with a polynomial exp),
// and the result is stored (=) or accumulated (+=). The output is written
// only from that buffer, so a forward may run in place (y is x, gate or up),
// and a gradient may be f32 or the operand's dtype with no template per
// combination.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

constexpr int64_t kChunk = 1024;  // floats per buffer: 4 KiB, stays in L1

// Calls body(off, n) for every chunk of [0, numel), in parallel when large.
template <typename Body>
void for_chunks(int64_t numel, const Body& body) {
  const int64_t nchunks = (numel + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (numel >= kMinParallel)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t off = c * kChunk;
    body(off, std::min(kChunk, numel - off));
  }
}

// ---- math ---------------------------------------------------------------------

inline float sigmoid(float z) { return 1.0f / (1.0f + exp_f32(-z)); }

// GELU tanh form 0.5 x (1 + tanh(u)), u = k (x + c x^3), written as
// x * sigmoid(2u) (1 + tanh(u) = 2 sigmoid(2u)): no cancellation for x << 0.
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

void gelu_chunk(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = kGeluK * (x[i] + kGeluC * x[i] * x[i] * x[i]);
    y[i] = x[i] * sigmoid(2.0f * u);
  }
}

// d/dx [x s(2u)] = s + x s (1 - s) 2 u',  u' = k (1 + 3 c x^2).   g = dy * that.
// x is clamped to +-20 first: beyond |x| ~ 10 the f32 derivative is exactly 1
// or 0 already, and the clamp keeps s (1 - s) = 0 from meeting u' = inf (NaN).
void gelu_grad_chunk(float* g, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xc = std::min(std::max(x[i], -20.0f), 20.0f);
    const float x2 = xc * xc;
    const float u = kGeluK * (xc + kGeluC * x2 * xc);
    const float s = sigmoid(2.0f * u);
    const float du = kGeluK * (1.0f + 3.0f * kGeluC * x2);
    g[i] = dy[i] * (s + xc * s * (1.0f - s) * 2.0f * du);
  }
}

void silu_chunk(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

// d/dx [x s(x)] = s (1 + x (1 - s)).
// silu'(x) from s = sigmoid(x).
inline float silu_grad(float x, float s) { return s * (1.0f + x * (1.0f - s)); }
inline float silu_grad(float x) { return silu_grad(x, sigmoid(x)); }

void silu_grad_chunk(float* g, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = dy[i] * silu_grad(x[i]);
}

// y = silu(gate) * up
void swiglu_chunk(float* y, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// dgate = dy * up * silu'(gate)   dup = dy * silu(gate)
// sigmoid(gate) once per element: written twice, the store to dgate (which
// might alias gate, for all the compiler knows) makes it reload gate and
// evaluate exp a second time.
void swiglu_grad_chunk(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dgate[i] = dy[i] * up[i] * silu_grad(g, s);
    dup[i] = dy[i] * g * s;
  }
}

// ---- shared drivers -------------------------------------------------------------

// y = f(x) for a unary op.
template <typename ChunkFn>
void unary_forward(Tensor y, const Tensor& x, ChunkFn fn) {
  for_chunks(x.numel(), [&](int64_t off, int64_t n) {
    float xb[kChunk], yb[kChunk];
    fn(yb, load_span(x, off, n, xb), n);
    store_span(y, off, n, yb, Store::write);
  });
}

// dx += dy * f'(x) for a unary op; skips an undefined dx.
template <typename ChunkFn>
void unary_backward(Tensor dx, const Tensor& dy, const Tensor& x, ChunkFn fn) {
  if (!dx.defined()) return;
  for_chunks(x.numel(), [&](int64_t off, int64_t n) {
    float xb[kChunk], dyb[kChunk], gb[kChunk];
    fn(gb, load_span(dy, off, n, dyb), load_span(x, off, n, xb), n);
    store_span(dx, off, n, gb, Store::add);
  });
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) { unary_forward(y, x, gelu_chunk); }

void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) { unary_backward(dx, dy, x, gelu_grad_chunk); }

void silu_forward(Tensor y, const Tensor& x) { unary_forward(y, x, silu_chunk); }

void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x) { unary_backward(dx, dy, x, silu_grad_chunk); }

void swiglu_forward(Tensor y, const Tensor& gate, const Tensor& up) {
  for_chunks(gate.numel(), [&](int64_t off, int64_t n) {
    float gb[kChunk], ub[kChunk], yb[kChunk];
    swiglu_chunk(yb, load_span(gate, off, n, gb), load_span(up, off, n, ub), n);
    store_span(y, off, n, yb, Store::write);
  });
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dy, const Tensor& gate, const Tensor& up) {
  if (!dgate.defined() && !dup.defined()) return;
  for_chunks(gate.numel(), [&](int64_t off, int64_t n) {
    float gb[kChunk], ub[kChunk], dyb[kChunk], dgb[kChunk], dub[kChunk];
    swiglu_grad_chunk(dgb, dub, load_span(dy, off, n, dyb), load_span(gate, off, n, gb), load_span(up, off, n, ub),
                      n);
    if (dgate.defined()) store_span(dgate, off, n, dgb, Store::add);
    if (dup.defined()) store_span(dup, off, n, dub, Store::add);
  });
}

}  // namespace loom::kernels::cpu::LOOM_ISA
