// Cross-entropy and its vocab-parallel pieces (ops.h): operand checks, then
// the backend's op. Target values are checked by the backend, which reads
// them.
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// logits (N, V) float with N = targets' elements; losses (N) f32 and dlogits
// (logits' gradient, in place allowed) when defined. op names the caller.
void validate(const char* op, const Tensor& dlogits, const Tensor& losses, const Tensor& logits,
              const Tensor& targets) {
  require_contiguous(op, {{"logits", logits}, {"targets", targets}});
  require_float(op, {"logits", logits});
  if (logits.ndim() < 2) op_fail(op, {{"logits", logits}}, "logits must be (N, V) with at least 2 dims");
  if (logits.size(-1) == 0) op_fail(op, {{"logits", logits}}, "logits has an empty vocabulary");
  require_dtype(op, {"targets", targets}, DType::i32);
  const int64_t N = rows(logits);
  if (targets.numel() != N)
    op_fail(op, {{"logits", logits}, {"targets", targets}}, "targets has ", targets.numel(),
            " elements but logits has ", N, " rows");
  if (losses.defined()) {
    require_contiguous(op, {{"losses", losses}});
    require_dtype(op, {"losses", losses}, DType::f32);
    if (losses.numel() != N)
      op_fail(op, {{"logits", logits}, {"losses", losses}}, "losses has ", losses.numel(),
              " elements but logits has ", N, " rows");
    require_no_overlap(op, {"losses", losses}, {"logits", logits});
  }
  if (dlogits.defined()) {
    require_grad(op, {"dlogits", dlogits}, {"logits", logits});
    require_no_partial_overlap(op, {"dlogits", dlogits}, {"logits", logits});
    if (losses.defined()) require_no_overlap(op, {"losses", losses}, {"dlogits", dlogits});
  }
}

// logits (N, V_local) and targets (N) as for the full op; vocab_begin >= 0,
// 0 <= valid <= V_local. (The backend checks that every target is
// ignore_index or >= 0.)
void validate_shard(const char* op, const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                    int64_t valid) {
  validate(op, Tensor(), Tensor(), logits, targets);
  const int64_t V_local = logits.size(-1);
  if (vocab_begin < 0) op_fail(op, {{"logits", logits}}, "vocab_begin ", vocab_begin, " is negative");
  if (valid < 0 || valid > V_local)
    op_fail(op, {{"logits", logits}}, "valid ", valid, " is outside [0, V_local = ", V_local, "]");
}

// A per-row statistic: (N) f32, sharing no memory with the inputs.
void check_row_stat(const char* op, Operand stat, const Tensor& logits, const Tensor& targets) {
  require_contiguous(op, {stat});
  require_dtype(op, stat, DType::f32);
  if (stat.t.numel() != rows(logits))
    op_fail(op, {{"logits", logits}, stat}, stat.name, " has ", stat.t.numel(), " elements but logits has ",
            rows(logits), " rows");
  require_no_overlap(op, stat, {"logits", logits});
  require_no_overlap(op, stat, {"targets", targets});
}

// A combined per-row statistic: (N) f32, contiguous.
void check_stat_n(const char* op, Operand stat, int64_t N) {
  require_contiguous(op, {stat});
  require_dtype(op, stat, DType::f32);
  if (stat.t.numel() != N) op_fail(op, {stat}, stat.name, " has ", stat.t.numel(), " elements, expected N = ", N);
}

void check_targets(const char* op, const Tensor& targets) {
  require_contiguous(op, {{"targets", targets}});
  require_dtype(op, {"targets", targets}, DType::i32);
}

}  // namespace

float cross_entropy_forward_backward(Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index, float dloss) {
  constexpr const char* op = "cross_entropy_forward_backward";
  validate(op, dlogits, losses, logits, targets);
  return backend_of(op, {{"dlogits", dlogits}, {"losses", losses}, {"logits", logits}, {"targets", targets}})
      .cross_entropy_forward_backward(dlogits, losses, logits, targets, ignore_index, dloss);
}

// logits: (N, V_local)  targets: (N) i32  lse, target_logit: (N) f32
void cross_entropy_shard_stats(Tensor lse, Tensor target_logit, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_begin, int64_t valid, int32_t ignore_index) {
  constexpr const char* op = "cross_entropy_shard_stats";
  validate_shard(op, logits, targets, vocab_begin, valid);
  check_row_stat(op, {"lse", lse}, logits, targets);
  check_row_stat(op, {"target_logit", target_logit}, logits, targets);
  require_no_overlap(op, {"target_logit", target_logit}, {"lse", lse});
  backend_of(op, {{"lse", lse}, {"target_logit", target_logit}, {"logits", logits}, {"targets", targets}})
      .cross_entropy_shard_stats(lse, target_logit, logits, targets, vocab_begin, valid, ignore_index);
}

// logits, dlogits: (N, V_local) (dlogits f32 or logits' dtype, may be logits)  lse: (N) f32  targets: (N) i32
void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                  int64_t vocab_begin, int64_t valid, float scale, int32_t ignore_index) {
  constexpr const char* op = "cross_entropy_shard_backward";
  validate_shard(op, logits, targets, vocab_begin, valid);
  check_row_stat(op, {"lse", lse}, logits, targets);
  require_contiguous(op, {{"dlogits", dlogits}});
  require_grad(op, {"dlogits", dlogits}, {"logits", logits});
  require_no_partial_overlap(op, {"dlogits", dlogits}, {"logits", logits});
  require_no_overlap(op, {"dlogits", dlogits}, {"lse", lse});
  require_no_overlap(op, {"dlogits", dlogits}, {"targets", targets});
  backend_of(op, {{"dlogits", dlogits}, {"logits", logits}, {"lse", lse}, {"targets", targets}})
      .cross_entropy_shard_backward(dlogits, logits, lse, targets, vocab_begin, valid, scale, ignore_index);
}

// stats: (P, 2, N) f32  lse, target_logit: (N) f32, apart from stats and each other
void cross_entropy_shard_combine(Tensor lse, Tensor target_logit, const Tensor& stats) {
  constexpr const char* op = "cross_entropy_shard_combine";
  require_contiguous(op, {{"stats", stats}});
  require_dtype(op, {"stats", stats}, DType::f32);
  if (stats.ndim() != 3 || stats.size(1) != 2)
    op_fail(op, {{"stats", stats}}, "stats must be (P, 2, N): each rank's lse and target_logit rows");
  const int64_t N = stats.size(2);
  check_stat_n(op, {"lse", lse}, N);
  check_stat_n(op, {"target_logit", target_logit}, N);
  require_no_overlap(op, {"lse", lse}, {"stats", stats});
  require_no_overlap(op, {"target_logit", target_logit}, {"stats", stats});
  require_no_overlap(op, {"target_logit", target_logit}, {"lse", lse});
  backend_of(op, {{"lse", lse}, {"target_logit", target_logit}, {"stats", stats}})
      .cross_entropy_shard_combine(lse, target_logit, stats);
}

// lse, target_logit: (N) f32  targets: (N) i32
float cross_entropy_shard_loss(const Tensor& lse, const Tensor& target_logit, const Tensor& targets,
                               int32_t ignore_index) {
  constexpr const char* op = "cross_entropy_shard_loss";
  check_targets(op, targets);
  check_stat_n(op, {"lse", lse}, targets.numel());
  check_stat_n(op, {"target_logit", target_logit}, targets.numel());
  return backend_of(op, {{"lse", lse}, {"target_logit", target_logit}, {"targets", targets}})
      .cross_entropy_shard_loss(lse, target_logit, targets, ignore_index);
}

int64_t cross_entropy_count_valid(const Tensor& targets, int32_t ignore_index) {
  constexpr const char* op = "cross_entropy_count_valid";
  check_targets(op, targets);
  return backend_of(op, {{"targets", targets}}).cross_entropy_count_valid(targets, ignore_index);
}

}  // namespace loom::kernels
