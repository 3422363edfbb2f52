// Fused cross-entropy forward + backward (ops.h), streamed over the vocabulary.
//
// Per row, pass 1 reads the logits once in L1-sized chunks and keeps a running
// (max, sum of exp): the online log-sum-exp (Milakov & Gimelshein 2018, "Online
// normalizer calculation for softmax"). Pass 2 reads them again and writes
//   dlogits = dloss * (softmax - onehot(target)) / n_valid
// element by element, so no V-sized temporary exists and dlogits may be
// logits itself (each element is read before it is overwritten).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/half.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace loom::kernels {
namespace {

constexpr const char* kOp = "cross_entropy_forward_backward";
constexpr int64_t kChunk = 2048;  // floats per chunk: 8 KiB, stays in L1

// A chunk of a row as f32: the row itself for f32, a converted copy for
// bf16 and f16.
template <typename T>
inline const float* chunk_f32(const T* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    span_to_f32(buf, src, n);
    return buf;
  }
}

// log(sum_j exp(x_j)) over one row of V logits, in one streaming pass.
template <typename T>
double row_logsumexp(const T* x, int64_t V) {
  alignas(64) float buf[kChunk];
  float m = -INFINITY;  // running max
  double s = 0;         // running sum of exp(x - m)
  for (int64_t c = 0; c < V; c += kChunk) {
    const int64_t n = std::min(kChunk, V - c);
    const float* xc = chunk_f32(x + c, n, buf);
    float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
    for (int64_t i = 0; i < n; ++i) cm = std::max(cm, xc[i]);
    if (cm > m) {  // rescale the sum to the new max; exp(-inf) = 0 on the first chunk
      s *= std::exp(static_cast<double>(m) - static_cast<double>(cm));
      m = cm;
    }
    float cs = 0;
#pragma omp simd reduction(+ : cs)
    for (int64_t i = 0; i < n; ++i) cs += exp_f32(xc[i] - m);
    s += cs;
  }
  return static_cast<double>(m) + std::log(s);
}

// d_j = scale * softmax_j over one row, then d_target -= scale. x_target is
// passed in because d may be x (in place) and overwrites it. lse is split in
// f32 hi + lo so that its rounding to f32 does not add to the exponent's
// error (that error is the relative error of softmax_j).
template <typename T, typename G>
void row_dlogits(G* d, const T* x, int64_t V, double lse, int32_t target, float x_target, float scale) {
  const float hi = static_cast<float>(lse);
  const float lo = static_cast<float>(lse - static_cast<double>(hi));
  alignas(64) float buf[kChunk];
  for (int64_t c = 0; c < V; c += kChunk) {
    const int64_t n = std::min(kChunk, V - c);
    const float* xc = chunk_f32(x + c, n, buf);
    G* dc = d + c;
    if constexpr (std::is_same_v<G, f16>) {
      // f16 has no vectorised per-element store: the chunk goes through buf
      // (xc is read before buf is written: it may be buf itself).
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) buf[i] = scale * exp_f32((xc[i] - hi) - lo);
      span_from_f32(dc, buf, n);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dc[i] = from_f32<G>(scale * exp_f32((xc[i] - hi) - lo));
    }
  }
  d[target] = from_f32<G>(scale * (exp_f32((x_target - hi) - lo) - 1.f));
}

template <typename G>
void row_zero(G* d, int64_t V) {
  const G zero = from_f32<G>(0.f);
  std::fill(d, d + V, zero);
}

struct CeArgs {
  int64_t N, V;
  const int32_t* targets;
  int32_t ignore_index;
  float scale;        // dloss / n_valid
  double* row_loss;   // (N) out
};

// Both passes over every row, rows in parallel. G is void for loss only.
template <typename T, typename G>
void ce_rows(G* dlogits, const T* logits, const CeArgs& a) {
#pragma omp parallel for schedule(static) if (a.N * a.V > 65536)
  for (int64_t r = 0; r < a.N; ++r) {
    const T* x = logits + r * a.V;
    const int32_t t = a.targets[r];
    if (t == a.ignore_index) {
      a.row_loss[r] = 0;
      if constexpr (!std::is_void_v<G>) row_zero(dlogits + r * a.V, a.V);
      continue;
    }
    const float x_t = to_f32(x[t]);
    const double lse = row_logsumexp(x, a.V);
    a.row_loss[r] = lse - static_cast<double>(x_t);
    if constexpr (!std::is_void_v<G>)
      row_dlogits(dlogits + r * a.V, x, a.V, lse, t, x_t, a.scale);
  }
}

void validate(const Tensor& dlogits, const Tensor& losses, const Tensor& logits, const Tensor& targets) {
  require_cpu_contiguous(kOp, {{"logits", logits}, {"targets", targets}});
  require_float(kOp, {"logits", logits});
  if (logits.ndim() < 2) op_fail(kOp, {{"logits", logits}}, "logits must be (N, V) with at least 2 dims");
  if (logits.size(-1) == 0) op_fail(kOp, {{"logits", logits}}, "logits has an empty vocabulary");
  require_dtype(kOp, {"targets", targets}, DType::i32);
  const int64_t N = rows(logits);
  if (targets.numel() != N)
    op_fail(kOp, {{"logits", logits}, {"targets", targets}}, "targets has ", targets.numel(),
            " elements but logits has ", N, " rows");
  if (losses.defined()) {
    require_cpu_contiguous(kOp, {{"losses", losses}});
    require_dtype(kOp, {"losses", losses}, DType::f32);
    if (losses.numel() != N)
      op_fail(kOp, {{"logits", logits}, {"losses", losses}}, "losses has ", losses.numel(),
              " elements but logits has ", N, " rows");
    require_no_overlap(kOp, {"losses", losses}, {"logits", logits});
  }
  if (dlogits.defined()) {
    require_grad(kOp, {"dlogits", dlogits}, {"logits", logits});
    require_no_partial_overlap(kOp, {"dlogits", dlogits}, {"logits", logits});
    if (losses.defined()) require_no_overlap(kOp, {"losses", losses}, {"dlogits", dlogits});
  }
}

// Every target is ignore_index or in [0, V); returns how many are not ignored.
// Checked before any output is written, so a bad target leaves them intact.
int64_t count_valid_targets(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  const int32_t* t = targets.data_as<int32_t>();
  const int64_t V = logits.size(-1);
  int64_t n_valid = 0;
  for (int64_t r = 0; r < targets.numel(); ++r) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= V)
      op_fail(kOp, {{"logits", logits}, {"targets", targets}}, "target ", t[r], " at row ", r, " is outside [0, ", V,
              ") and is not ignore_index ", ignore_index);
    ++n_valid;
  }
  return n_valid;
}

}  // namespace

float cross_entropy_forward_backward(Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index, float dloss) {
  validate(dlogits, losses, logits, targets);
  const int64_t n_valid = count_valid_targets(logits, targets, ignore_index);
  const int64_t N = rows(logits);
  // Per-row losses in double, summed serially below: the mean does not depend
  // on the thread count (bitwise reproducible runs, DESIGN.md §6).
  double* row_loss = thread_scratch<double>(ScratchSlot::a, static_cast<size_t>(N));  // every row written
  CeArgs args{N, logits.size(-1), targets.data_as<int32_t>(), ignore_index,
              n_valid ? static_cast<float>(static_cast<double>(dloss) / static_cast<double>(n_valid)) : 0.f,
              row_loss};
  dispatch_float(logits.dtype(), [&]<typename T>() {
    const T* x = logits.data_as<const T>();
    if (!dlogits.defined()) return ce_rows<T, void>(nullptr, x, args);
    dispatch_float(dlogits.dtype(), [&]<typename G>() { ce_rows<T, G>(dlogits.data_as<G>(), x, args); });
  });
  if (losses.defined()) {
    float* l = losses.data_as<float>();
    for (int64_t r = 0; r < N; ++r) l[r] = static_cast<float>(row_loss[r]);
  }
  if (n_valid == 0) return 0.f;
  double total = 0;
  for (int64_t r = 0; r < N; ++r) total += row_loss[r];
  return static_cast<float>(total / static_cast<double>(n_valid));
}

}  // namespace loom::kernels
