// Expert parallelism (DESIGN.md §5 EP): the collectives of
// model::ExpertParallelOps (model/expert_parallel.h: the MoE layers' count
// exchange, dispatch and combine) on the mesh's ep communicator, with the
// seconds a step waited for them (for `loom bench train --ep`): the row
// exchanges run on the communicator's progress thread while the layer
// computes (overlap), and only the time spent starting them and waiting in
// finish_rows counts.
#pragma once

#include <span>

#include "comm/communicator.h"
#include "model/expert_parallel.h"

namespace loom::parallel {

class ExpertParallel final : public model::ExpertParallelOps {
 public:
  // ep: the group (mesh.ep()); must outlive this object. overlap
  // (parallel.ep_overlap): start_rows returns at once and the exchange runs
  // while the layer computes; false: start_rows waits for it (finish_rows
  // then has nothing left to wait for).
  explicit ExpertParallel(comm::Communicator& ep, bool overlap = true);

  // What a Model of this rank is built with.
  model::EpOptions options() { return {{ep_.size(), ep_.rank()}, this}; }
  comm::Communicator& group() { return ep_; }

  void exchange_counts(Tensor out, const Tensor& in) override;
  void start_rows(Tensor out, std::span<const int64_t> recv_rows, const Tensor& in,
                  std::span<const int64_t> send_rows) override;
  void finish_rows() override;

  // Since the last reset: seconds waiting for the exchanges (counts, and
  // rows: starting them and in finish_rows) and the bytes this rank sent.
  double seconds() const { return seconds_; }
  int64_t bytes_sent() const { return bytes_; }
  void reset_stats() { seconds_ = 0, bytes_ = 0; }

 private:
  comm::Communicator& ep_;
  bool overlap_ = true;
  bool started_ = false;  // start_rows called, finish_rows not yet
  comm::WorkPtr rows_;    // the exchange in flight (overlap only)
  double seconds_ = 0;
  int64_t bytes_ = 0;
};

// A MoE model's routing groups under context parallelism
// (model::RoutingGroupOps) on the mesh's cp communicator.
class RoutingGroups final : public model::RoutingGroupOps {
 public:
  explicit RoutingGroups(comm::Communicator& cp) : cp_(cp) {}
  int rank() const override { return cp_.rank(); }
  int size() const override { return cp_.size(); }
  void all_gather(Tensor out, const Tensor& in) override;
  void all_reduce_sum(Tensor t) override;

 private:
  comm::Communicator& cp_;
};

}  // namespace loom::parallel
