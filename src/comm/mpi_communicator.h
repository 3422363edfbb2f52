// MpiCommunicator: the Communicator of the MPI backend (mpi_backend.h).
//
// Each communicator owns three duplicates of its MPI communicator: comm_
// for user point-to-point messages and MPI's collectives, ring_ for the
// ring algorithms' messages (so they never match a user's send/recv), and
// ctl_ for watchdog queries (split_ serves split). Issue methods run on the
// caller's thread (one thread at a time per communicator):
// they validate, number the op and hand it to the engine; the run_* bodies
// (mpi_collectives.cpp) run on the engine thread.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/engine.h"

namespace loom::comm {

enum class CollKind : int32_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, all_to_all_v, barrier };

// What a rank issues at one sequence number, compared across ranks by
// check_collectives.
struct CollDesc {
  int64_t seq = 0;
  int64_t count = 0;  // elements of the full buffer; -1 where ranks may differ (all_to_all_v)
  int32_t kind = 0;
  int32_t dtype = -1;
  int32_t op = -1;    // reductions only
  int32_t root = -1;  // broadcast only
};
std::string describe(const CollDesc& d);

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction).
  MpiCommunicator(MPI_Comm comm, std::string name, const Options& options);
  ~MpiCommunicator() override;

  int rank() const override { return info_->rank; }
  int size() const override { return info_->size; }
  const std::string& name() const override { return info_->name; }
  Device device() const override { return Device::cpu(); }
  const Options& options() const override { return info_->options; }

  WorkPtr all_reduce(Tensor buf, ReduceOp op) override;
  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override;
  WorkPtr all_gather(Tensor out, Tensor in) override;
  WorkPtr broadcast(Tensor buf, int root) override;
  WorkPtr send(Tensor buf, int peer, int tag) override;
  WorkPtr recv(Tensor buf, int peer, int tag) override;
  WorkPtr all_to_all(Tensor out, Tensor in) override;
  WorkPtr all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                       std::span<const int64_t> in_counts) override;
  WorkPtr barrier() override;
  WorkPtr send_unguarded(Tensor buf, int peer, int tag) override;
  WorkPtr recv_unguarded(Tensor buf, int peer, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  WorkPtr issue(CollDesc desc, std::string what, std::function<void()> body);
  WorkPtr issue_p2p(bool is_send, Tensor buf, int peer, int tag, bool guarded = true);
  // Engine thread.
  void check_same_call(const CollDesc& mine);
  void run_all_reduce(Tensor buf, ReduceOp op);
  void run_reduce_scatter(Tensor out, Tensor in, ReduceOp op);
  void run_all_gather(Tensor out, Tensor in);
  void check_all_to_all_v_counts(const std::vector<int64_t>& out_counts, const std::vector<int64_t>& in_counts);
  void run_all_to_all_v(Tensor out, std::vector<int64_t> out_counts, Tensor in, std::vector<int64_t> in_counts);
  // Runs req's MPI collective to completion on the engine.
  void complete(MPI_Request req);

  MPI_Comm comm_ = MPI_COMM_NULL, ring_ = MPI_COMM_NULL, ctl_ = MPI_COMM_NULL, split_ = MPI_COMM_NULL;
  std::shared_ptr<CommInfo> info_;
  int64_t coll_seq_ = 0;
  int64_t p2p_seq_ = 0;
  std::vector<std::byte> scratch_, ring_scratch_;  // engine thread: f32 copies, ring receive buffers
  std::unique_ptr<Engine> engine_;                 // last: its thread stops before the rest goes
};

}  // namespace loom::comm
