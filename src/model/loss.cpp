#include "model/loss.h"

#include "kernels/ops.h"

namespace loom::model {

using namespace loom::kernels;

int64_t count_valid_targets(const Tensor& targets) { return cross_entropy_count_valid(targets); }

// In double, in row order: the same bits on every tp rank (kernels/ops.h).
float vocab_parallel_loss_mean(const Tensor& lse, const Tensor& target_logit, const Tensor& targets) {
  return cross_entropy_shard_loss(lse, target_logit, targets);
}

float loss_forward(const Dims& d, const VocabShard& vocab, const HeadLoss& l) {
  const TpContext& tp = d.par.tp;
  if (!tp.ops) return cross_entropy_forward_backward(Tensor(), Tensor(), l.logits, l.targets);
  const int64_t V = l.logits.size(2);
  const Tensor targets_n = l.targets.reshape({d.N()});
  cross_entropy_shard_stats(l.lse, l.target_logit, rows_of(l.logits, V), targets_n, vocab.begin, vocab.valid);
  tp.ops->combine_cross_entropy(l.lse, l.target_logit);
  return vocab_parallel_loss_mean(l.lse, l.target_logit, targets_n);
}

void loss_backward(const Dims& d, const VocabShard& vocab, const HeadLoss& l, float dloss) {
  if (!d.par.tp.ops) {
    cross_entropy_forward_backward(l.logits, Tensor(), l.logits, l.targets, -100, dloss);
    return;
  }
  const int64_t V = l.logits.size(2);
  const Tensor targets_n = l.targets.reshape({d.N()});
  const int64_t n_valid = count_valid_targets(targets_n);
  const float scale = n_valid == 0 ? 0.f : dloss / static_cast<float>(n_valid);
  cross_entropy_shard_backward(rows_of(l.logits, V), rows_of(l.logits, V), l.lse, targets_n, vocab.begin, vocab.valid,
                               scale);
}

float loss_forward_backward(const Dims& d, const VocabShard& vocab, const HeadLoss& l, float dloss) {
  if (!d.par.tp.ops) return cross_entropy_forward_backward(l.logits, Tensor(), l.logits, l.targets, -100, dloss);
  const float loss = loss_forward(d, vocab, l);  // the statistics pass, whose lse the backward needs
  loss_backward(d, vocab, l, dloss);
  return loss;
}

}  // namespace loom::model
