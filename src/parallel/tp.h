// Tensor and sequence parallelism (DESIGN.md §5 TP, SP): the collectives of
// model::TensorParallelOps (model/tensor_parallel.h: the f / g operators and
// the vocab-parallel cross-entropy) on the mesh's tp communicator, plus the
// gradient-norm bookkeeping a tp group needs.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/tensor_parallel.h"

namespace loom::parallel {

class TensorParallel final : public model::TensorParallelOps {
 public:
  // tp: the group (mesh.tp()); must outlive this object. reduce, gather,
  // all_reduce_sum and combine_cross_entropy block; start_reduce and
  // start_gather return while the communicator's progress thread runs them.
  explicit TensorParallel(comm::Communicator& tp, bool sequence_parallel = false);

  // What a Model of this rank is built with.
  model::TpOptions options() { return {{tp_.size(), tp_.rank()}, sequence_parallel_, this}; }
  comm::Communicator& group() { return tp_; }

  void reduce(Tensor out, Tensor partial) override;
  void gather(Tensor full, const Tensor& shard) override;
  std::unique_ptr<model::TpPending> start_reduce(Tensor out, Tensor partial) override;
  std::unique_ptr<model::TpPending> start_gather(Tensor full, const Tensor& shard) override;
  void all_reduce_sum(Tensor t) override;
  void combine_cross_entropy(Tensor lse, Tensor target_logit) override;

  // Seconds the caller spent in these collectives since the last reset:
  // blocking calls whole, started ones while issuing and in wait() (the
  // communication a step did not hide, for `loom bench train`).
  double seconds() const { return seconds_; }
  void reset_stats() { seconds_ = 0; }

 private:
  class Pending;

  comm::Communicator& tp_;
  bool sequence_parallel_;
  std::vector<float> wide_;   // f16 sums in f32
  bool wide_busy_ = false;    // an f16 sum in wide_ not yet waited for
  std::vector<float> stats_;  // (tp, 2, N): every rank's lse and target logit
  double seconds_ = 0;
};

}  // namespace loom::parallel
