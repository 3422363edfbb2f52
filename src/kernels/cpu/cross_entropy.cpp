// Fused cross-entropy forward + backward (ops.h), streamed over the vocabulary,
// and its vocab-parallel halves (Megatron's VocabParallelCrossEntropy).
//
// Per row, pass 1 reads the logits once in L1-sized chunks and keeps a running
// (max, sum of exp): the online log-sum-exp (Milakov & Gimelshein 2018, "Online
// normalizer calculation for softmax"). Pass 2 reads them again and writes
//   dlogits = dloss * (softmax - onehot(target)) / n_valid
// element by element, so no V-sized temporary exists and dlogits may be
// logits itself (each element is read before it is overwritten).
//
// A tp shard holds columns [vocab_begin, vocab_begin + V_local) of the logits,
// the last ones possibly padding. Its stats half is pass 1 over the valid
// columns (plus the target's logit if the shard holds it); the ranks combine
// lse_full = log(sum_r exp(lse_r)) and x_target = sum_r target_logit_r. Its
// backward half is pass 2 against lse_full, with the padding's gradient 0.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/validate.h"

namespace loom::kernels::cpu::LOOM_ISA {
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

// d_j = scale * softmax_j over one row, then d_target -= scale (no target
// when target < 0: a shard that does not hold it). x_target is
// passed in because d may be x (in place) and overwrites it. lse is split in
// f32 hi + lo so that its rounding to f32 does not add to the exponent's
// error (that error is the relative error of softmax_j).
template <typename T, typename G>
void row_dlogits(G* d, const T* x, int64_t V, double lse, int64_t target, float x_target, float scale) {
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
  if (target >= 0) d[target] = from_f32<G>(scale * (exp_f32((x_target - hi) - lo) - 1.f));
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

// ---- vocab-parallel shard ---------------------------------------------------

struct ShardArgs {
  int64_t N, V_local;
  int64_t vocab_begin, valid;  // columns [0, valid) are real, [valid, V_local) padding
  const int32_t* targets;
  int32_t ignore_index;
};

// Row r's target as a column of the shard, or -1 when the row is ignored or
// its target is not among the shard's valid columns.
inline int64_t shard_target(const ShardArgs& a, int64_t r) {
  const int32_t t = a.targets[r];
  if (t == a.ignore_index) return -1;
  const int64_t j = static_cast<int64_t>(t) - a.vocab_begin;
  return j >= 0 && j < a.valid ? j : -1;
}

template <typename T>
void shard_stats_rows(float* lse, float* target_logit, const T* logits, const ShardArgs& a) {
#pragma omp parallel for schedule(static) if (a.N * a.valid > 65536)
  for (int64_t r = 0; r < a.N; ++r) {
    const T* x = logits + r * a.V_local;
    const bool skip = a.targets[r] == a.ignore_index || a.valid == 0;
    lse[r] = skip ? -INFINITY : static_cast<float>(row_logsumexp(x, a.valid));
    const int64_t j = shard_target(a, r);
    target_logit[r] = j >= 0 ? to_f32(x[j]) : 0.f;
  }
}

template <typename T, typename G>
void shard_backward_rows(G* dlogits, const T* logits, const float* lse, float scale, const ShardArgs& a) {
#pragma omp parallel for schedule(static) if (a.N * a.V_local > 65536)
  for (int64_t r = 0; r < a.N; ++r) {
    const T* x = logits + r * a.V_local;
    G* d = dlogits + r * a.V_local;
    if (a.targets[r] == a.ignore_index) {
      row_zero(d, a.V_local);
      continue;
    }
    const int64_t j = shard_target(a, r);
    row_dlogits(d, x, a.valid, static_cast<double>(lse[r]), j, j >= 0 ? to_f32(x[j]) : 0.f, scale);
    row_zero(d + a.valid, a.V_local - a.valid);
  }
}

// Every target is ignore_index or >= 0 (a negative one would be silently
// absent from every shard; the caller checks the upper end against the whole
// vocabulary). Returns the rows' arguments.
ShardArgs check_shard_targets(const char* op, const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                              int64_t valid, int32_t ignore_index) {
  const int32_t* t = targets.data_as<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    if (t[r] < 0 && t[r] != ignore_index)
      op_fail(op, {{"targets", targets}}, "target ", t[r], " at row ", r, " is negative and is not ignore_index ",
              ignore_index);
  }
  return {rows(logits), logits.size(-1), vocab_begin, valid, t, ignore_index};
}

}  // namespace

float cross_entropy_forward_backward(Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index, float dloss) {
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

// lse[n] = log sum_{j < valid} exp(logits[n, j]); target_logit[n] = the target's logit if this shard holds it, else 0.
// logits: (N, V_local)  targets: (N) i32  lse, target_logit: (N) f32
void cross_entropy_shard_stats(Tensor lse, Tensor target_logit, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_begin, int64_t valid, int32_t ignore_index) {
  const ShardArgs args =
      check_shard_targets("cross_entropy_shard_stats", logits, targets, vocab_begin, valid, ignore_index);
  dispatch_float(logits.dtype(), [&]<typename T>() {
    shard_stats_rows<T>(lse.data_as<float>(), target_logit.data_as<float>(), logits.data_as<const T>(), args);
  });
}

// dlogits = scale * (softmax against the full rows' lse - onehot(target)) on the valid columns, 0 elsewhere.
// logits, dlogits: (N, V_local) (dlogits f32 or logits' dtype, may be logits)  lse: (N) f32  targets: (N) i32
void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                  int64_t vocab_begin, int64_t valid, float scale, int32_t ignore_index) {
  const ShardArgs args =
      check_shard_targets("cross_entropy_shard_backward", logits, targets, vocab_begin, valid, ignore_index);
  dispatch_float(logits.dtype(), [&]<typename T>() {
    const T* x = logits.data_as<const T>();
    dispatch_float(dlogits.dtype(), [&]<typename G>() {
      shard_backward_rows<T, G>(dlogits.data_as<G>(), x, lse.data_as<float>(), scale, args);
    });
  });
}

// The combine of Megatron's vocab-parallel cross-entropy, per row, over the
// ranks in order: m = max lse_r; lse = m + log(sum exp(lse_r - m)) in double;
// target = sum target_r in double.   stats: (P, 2, N)  lse, target_logit: (N)
void cross_entropy_shard_combine(Tensor lse, Tensor target_logit, const Tensor& stats) {
  const int64_t P = stats.size(0), N = stats.size(2);
  const float* pairs = stats.data_as<const float>();
  float* out_lse = lse.data_as<float>();
  float* out_target = target_logit.data_as<float>();
  for (int64_t i = 0; i < N; ++i) {
    float m = -INFINITY;
    for (int64_t r = 0; r < P; ++r) m = std::max(m, pairs[2 * N * r + i]);
    double s = 0, t = 0;
    for (int64_t r = 0; r < P; ++r) {
      const float* pair = pairs + 2 * N * r;
      if (m != -INFINITY) s += std::exp(static_cast<double>(pair[i]) - m);
      t += pair[N + i];
    }
    out_lse[i] = m == -INFINITY ? m : static_cast<float>(m + std::log(s));
    out_target[i] = static_cast<float>(t);
  }
}

// Serial, in row order, in double: the same bits on every rank and for any
// thread count.
float cross_entropy_shard_loss(const Tensor& lse, const Tensor& target_logit, const Tensor& targets,
                               int32_t ignore_index) {
  const int32_t* tg = targets.data_as<const int32_t>();
  const float* l = lse.data_as<const float>();
  const float* tl = target_logit.data_as<const float>();
  double sum = 0;
  int64_t n_valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i)
    if (tg[i] != ignore_index) sum += static_cast<double>(l[i]) - tl[i], ++n_valid;
  return n_valid == 0 ? 0.f : static_cast<float>(sum / static_cast<double>(n_valid));
}

int64_t cross_entropy_count_valid(const Tensor& targets, int32_t ignore_index) {
  const int32_t* tg = targets.data_as<const int32_t>();
  int64_t n_valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n_valid += tg[i] != ignore_index;
  return n_valid;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
