// Internal to model/: the head's loss over one micro-batch — cross-entropy
// of the logits against the targets (-100 ignored), or under tensor
// parallelism the vocab-parallel cross-entropy (tensor_parallel.h): each
// rank's log-sum-exp and target logit over its vocabulary columns, combined
// over tp, so no rank ever holds the full logits.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/blocks.h"

namespace loom::model {

// The vocabulary rows a tp rank holds: its first row, and how many of its
// rows are real (not padding).
struct VocabShard {
  int64_t begin = 0, valid = 0;
};

struct HeadLoss {
  Tensor logits;               // (B, T, V), or this tp rank's (B, T, Vl); backward overwrites them with dlogits
  Tensor targets;              // (B, T) i32
  Tensor lse, target_logit;    // tp: (N) f32 of the full rows, written by forward, read by backward
};

// The mean loss over the targets that are not -100 (0 when there are none).
float loss_forward(const Dims& d, const VocabShard& vocab, const HeadLoss& l);
// logits = d(dloss * loss) / d logits, in place.
void loss_backward(const Dims& d, const VocabShard& vocab, const HeadLoss& l, float dloss);
// Both: loss_forward's loss, and the logits overwritten as loss_backward
// does, with the same bits. Without tensor parallelism in one pass fewer
// over the logits than the two.
float loss_forward_backward(const Dims& d, const VocabShard& vocab, const HeadLoss& l, float dloss);

// Vocab-parallel pieces: the targets that count (not -100), and the loss
// from the combined rows' statistics: mean of lse - target_logit over them.
int64_t count_valid_targets(const Tensor& targets);
float vocab_parallel_loss_mean(const Tensor& lse, const Tensor& target_logit, const Tensor& targets);

}  // namespace loom::model
