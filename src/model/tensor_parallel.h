// Tensor and sequence parallelism as the model sees them (DESIGN.md §5 TP,
// SP; Shoeybi et al. 2019 "Megatron-LM", Korthikanti et al. 2022 "Reducing
// Activation Recomputation in Large Transformer Models").
//
// A tp rank holds a slice of every sharded parameter (params.h TpSplit):
// attention heads (q, k, v rows; with GQA the KV heads too), the MLP's hidden
// units (fc / gate / up rows) and the matching input columns of the output
// projections (c_proj / o_proj / down_proj), and 1/tp of the (padded)
// vocabulary rows of the embedding and lm head. A block is then
//
//   x --f--> column-parallel linears --> local heads / hidden units
//     --> row-parallel linear (partial sums) --g--> y
//
// where f and g are conjugate operators (Megatron's "f" and "g"):
//
//                  forward                        backward
//   f  no SP       identity: x is replicated      all-reduce: dx = sum over ranks
//                                                 of the partial input gradients
//   g  no SP       all-reduce: y = sum of the     identity: dy is replicated
//                  ranks' partial outputs
//   f  SP          all-gather the ranks' row      reduce-scatter: each rank keeps
//                  shards of x                    its rows of the summed dx
//   g  SP          reduce-scatter: each rank      all-gather the row shards of dy
//                  keeps its rows of the sum
//
// Why it is exact: a column-parallel linear Y_r = X A_r needs all of X and
// gives rank r its columns of Y; the row-parallel Z = sum_r Y_r B_r needs only
// rank r's Y_r and gives a partial sum. So one sum (g) per block half gives
// the full output, and in backward dX = sum_r dY_r A_r^T is the mirror sum (f).
// Sequence parallelism splits the all-reduce into its two halves,
// reduce-scatter + all-gather, and keeps the rows (tokens) between them
// sharded: the norms, residual adds (and dropout) run on N / tp rows, same
// communication volume, 1/tp of that region's activations.
//
// Overlap (Megatron's): in backward, f's sum of a column-parallel input
// gradient does not block the weight gradients, which need only dY and X:
// the input gradient is computed first, its sum started, the weight
// gradients computed, then the sum waited for (blocks.h
// column_parallel_backward). Under SP the gather of X's rows is started
// before the input gradient (which does not read X) and waited for after.
// Forward's f and g block: their results are needed at once.
//
// Under SP a rank holds rows [r N/tp, (r + 1) N/tp) of the micro-batch's
// N = B x T tokens (B-major), which needs T divisible by tp (Megatron's rule).
// Replicated parameters: the row-parallel biases are added by rank 0 only,
// before the sum, and their gradients come from the full dy every rank sees
// (identical on all ranks). The norm weights' gradients are identical without
// SP; with SP each rank's come from its rows and the model sums them over tp.
//
// The vocabulary: rank r holds rows [r Vl, (r + 1) Vl) of the embedding
// padded to tp x Vl rows. The embedding is a partial sum (each token found on
// one rank) reduced by g; the logits stay sharded (N, Vl) and the loss is the
// vocab-parallel cross-entropy: each rank's log-sum-exp and target logit over
// its columns (kernels::cross_entropy_shard_stats), combined over tp; no
// rank ever holds the full logits.
#pragma once

#include <memory>

#include "core/tensor.h"
#include "model/params.h"

namespace loom::model {

// A collective started by TensorParallelOps::start_reduce / start_gather:
// wait() blocks until its result is in place (a second call returns at
// once). Destroying it unwaited waits first.
class TpPending {
 public:
  virtual ~TpPending() = default;
  virtual void wait() = 0;
};

// The collectives over the tp group; parallel/tp.h implements them on a
// comm::Communicator. Tensors are contiguous, f32 or the compute dtype.
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  // reduce / gather started without waiting, so the caller computes while
  // they run (Megatron's overlap: a column-parallel input gradient is summed
  // while the weight gradients are computed; under SP the input rows are
  // gathered while the input gradient is). Until wait(), the inputs must not
  // change and the outputs not be read. One of each may be in flight.
  virtual std::unique_ptr<TpPending> start_reduce(Tensor out, Tensor partial) = 0;
  virtual std::unique_ptr<TpPending> start_gather(Tensor full, const Tensor& shard) = 0;
  // g forward and f backward: the sum over the tp ranks of partial (N, C).
  // Without SP, out is partial itself (all-reduce in place); with SP, out
  // (N / tp, C) receives this rank's rows of the sum (reduce-scatter).
  virtual void reduce(Tensor out, Tensor partial) = 0;
  // SP only, f forward and g backward: full (N, C) = the ranks' row shards
  // (N / tp, C) in rank order (all-gather).
  virtual void gather(Tensor full, const Tensor& shard) = 0;
  // In place sum over the tp ranks (SP: the norm weights' gradients).
  virtual void all_reduce_sum(Tensor t) = 0;
  // Vocab-parallel cross-entropy: on entry each rank's (N) f32 log-sum-exp
  // and target logit over its columns; on return the full rows' (the same on
  // every rank): lse = log-sum-exp over the ranks, target_logit = their sum.
  virtual void combine_cross_entropy(Tensor lse, Tensor target_logit) = 0;
};

// How a Model is split: its tp rank and group size, sequence parallelism
// (ignored with tp = 1, as Megatron does), and the collectives (required for
// forward and backward when tp > 1; a model built only to count bytes may
// leave them null).
struct TpOptions {
  TpRank tp;
  bool sequence_parallel = false;
  TensorParallelOps* ops = nullptr;

  bool active() const { return tp.size > 1; }
  bool sp() const { return sequence_parallel && tp.size > 1; }
};

}  // namespace loom::model
