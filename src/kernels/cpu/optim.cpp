// AdamW and the reductions the optimizer step needs (ops.h): gradient norm
// for clipping, the finiteness check for fp16 loss scaling, in-place scale.
//
// Reductions are deterministic and independent of the thread count: the
// elements are cut into a fixed number of blocks (not one per thread), each
// block is summed in a fixed vectorised order in double, and the block sums
// are added serially: the same bits whatever the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw_scalars.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {


// ---- adamw -------------------------------------------------------------------

// The step's scalars: kernels/adamw_scalars.h (one source for every backend).

constexpr int64_t kAdamChunk = 512;  // elements per parallel work item

// One chunk of n <= kAdamChunk elements, in torch.optim.AdamW's order of
// operations. G: grad storage (float, bf16, f16). P: param_copy storage, or
// void. std::sqrt vectorises here because loom builds with -fno-math-errno.
// f16 has no per-element conversion GCC vectorises, so an f16 grad is
// widened into a buffer first and an f16 copy is rounded from p afterwards:
// the same values.
template <typename G, typename P>
void adamw_chunk(float* p, float* m, float* v, const G* grad, P* copy, int64_t n, const AdamWScalars& s) {
  if constexpr (std::is_same_v<G, f16>) {
    alignas(64) float g32[kAdamChunk];
    span_to_f32(g32, grad, n);
    if constexpr (std::is_same_v<P, f16>) {
      adamw_chunk<float, void>(p, m, v, g32, nullptr, n, s);
      span_from_f32(copy, p, n);
    } else {
      adamw_chunk<float, P>(p, m, v, g32, copy, n, s);
    }
  } else if constexpr (std::is_same_v<P, f16>) {
    adamw_chunk<G, void>(p, m, v, grad, nullptr, n, s);
    span_from_f32(copy, p, n);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float g = to_f32(grad[i]) * s.grad_scale;
      m[i] = m[i] * s.beta1 + s.one_minus_beta1 * g;
      v[i] = v[i] * s.beta2 + s.one_minus_beta2 * g * g;
      const float denom = std::sqrt(v[i]) / s.bc2_sqrt + s.eps;
      const float pn = p[i] * s.decay + s.neg_step_size * m[i] / denom;
      p[i] = pn;
      if constexpr (!std::is_void_v<P>) copy[i] = from_f32<P>(pn);
    }
  }
}

template <typename G, typename P>
void adamw_loop(float* p, float* m, float* v, const G* grad, P* copy, int64_t n, const AdamWScalars& s) {
  const int64_t chunks = (n + kAdamChunk - 1) / kAdamChunk;
#pragma omp parallel for schedule(static) if (n > kMinParallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i = c * kAdamChunk, len = std::min(kAdamChunk, n - i);
    P* copy_c = nullptr;
    if constexpr (!std::is_void_v<P>) copy_c = copy + i;
    adamw_chunk<G, P>(p + i, m + i, v + i, grad + i, copy_c, len, s);
  }
}

// ---- reductions --------------------------------------------------------------

constexpr int kBlocks = 64;  // fixed block count: the sum order never depends on threads

template <typename T>
double block_sum_squares(const T* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double xi = to_f32(x[i]);
    s += xi * xi;
  }
  return s;
}

template <typename T>
double sum_squares_of(const T* x, int64_t n) {
  if (n < kMinParallel) return block_sum_squares(x, n);
  double partial[kBlocks];
  const int64_t block = (n + kBlocks - 1) / kBlocks;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t lo = std::min(n, b * block), hi = std::min(n, lo + block);
    partial[b] = block_sum_squares(x + lo, hi - lo);
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

// The bits of the exponent field: all ones means Inf or NaN.
template <typename T> struct ExpMask;
template <> struct ExpMask<float> { using U = uint32_t; static constexpr U value = 0x7f800000u; };
template <> struct ExpMask<bf16> { using U = uint16_t; static constexpr U value = 0x7f80u; };
template <> struct ExpMask<f16> { using U = uint16_t; static constexpr U value = 0x7c00u; };

template <typename T>
bool all_finite_of(const T* x, int64_t n) {
  using U = typename ExpMask<T>::U;
  constexpr U mask = ExpMask<T>::value;
  int bad = 0;  // an OR is order-independent, so this is deterministic too
  // if (parallel : ...): a bare if would also turn off the simd (elementwise.cpp).
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (parallel : n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) bad |= (std::bit_cast<U>(x[i]) & mask) == mask;
  return bad == 0;
}


}  // namespace

void adamw_step(Tensor param, Tensor m, Tensor v, const Tensor& grad, Tensor param_copy, const AdamWConfig& cfg) {
  const AdamWScalars s = adamw_scalars(cfg);
  float* p = param.data_as<float>();
  dispatch_float(grad.dtype(), [&]<typename G>() {
    const G* g = grad.data_as<const G>();
    if (!param_copy.defined())
      return adamw_loop<G, void>(p, m.data_as<float>(), v.data_as<float>(), g, nullptr, param.numel(), s);
    dispatch_float(param_copy.dtype(), [&]<typename P>() {
      adamw_loop<G, P>(p, m.data_as<float>(), v.data_as<float>(), g, param_copy.data_as<P>(), param.numel(), s);
    });
  });
}

double sum_squares(const Tensor& t) {
  return dispatch_float(t.dtype(), [&]<typename T>() { return sum_squares_of(t.data_as<const T>(), t.numel()); });
}

// Each block as sum_squares sums it alone (the same code on the same
// addresses: the same bits); small blocks, each on one thread, spread over
// the threads, larger ones each over all of them.
void sum_squares_blocks(std::span<double> sums, std::span<const Tensor> tensors, int64_t block) {
  double* out = sums.data();
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel(), count = n / block + (n % block != 0);  // not n + block - 1: block may be huge
    dispatch_float(t.dtype(), [&]<typename T>() {
      const T* x = t.data_as<const T>();
      if (block >= kMinParallel) {
        for (int64_t i = 0; i < count; ++i) out[i] = sum_squares_of(x + i * block, std::min(block, n - i * block));
        return;
      }
#pragma omp parallel for schedule(static) if (parallel : n > kMinParallel)
      for (int64_t i = 0; i < count; ++i) out[i] = block_sum_squares(x + i * block, std::min(block, n - i * block));
    });
    out += count;
  }
}

double global_norm(std::span<const Tensor> tensors) {
  double s = 0;
  for (const Tensor& t : tensors) s += sum_squares(t);
  return std::sqrt(s);
}

bool all_finite(const Tensor& t) {
  return dispatch_float(t.dtype(), [&]<typename T>() { return all_finite_of(t.data_as<const T>(), t.numel()); });
}

void scale(Tensor t, float s) {
  dispatch_float(t.dtype(), [&]<typename T>() {
    T* x = t.data_as<T>();
    const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kMinParallel)
    for (int64_t i = 0; i < n; ++i) x[i] = from_f32<T>(to_f32(x[i]) * s);
  });
}

}  // namespace loom::kernels::cpu::LOOM_ISA
