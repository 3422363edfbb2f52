// NcclCommunicator: the Communicator of the NCCL backend (nccl_backend.h
// says how it maps the contract). Internal to src/comm/nccl.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "comm/p2p_links.h"

namespace loom::comm {

// Throws loom::Error naming `what` when a CUDA / NCCL call fails at issue.
void cuda_require(cudaError_t err, const std::string& what);
void nccl_require(ncclResult_t res, ncclComm_t comm, const std::string& what);

// One NCCL communicator and the stream its operations run on.
struct NcclLink {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// What a communicator shares with its pending Works (which may outlive it).
struct NcclState {
  int device = 0;
  int rank = 0;
  int size = 1;
  std::string name;
  Options options;
  NcclLink coll;  // collectives
  // Point-to-point, indexed by P2pLink (p2p_links.h): up (lower to higher
  // rank) and down over all ranks, made with the communicator; at size > 2
  // the four neighbour links, each an NCCL communicator of the two ranks of
  // one pair and one direction, made at the first point-to-point op.
  std::array<NcclLink, kP2pLinks> p2p;
  bool p2p_connected = false;
  // Device floats: [0] barrier()'s word and the connecting sends' source,
  // [1..4] the connecting receives' destinations.
  float* scratch = nullptr;
  cudaStream_t compute = nullptr;      // the stream ops wait for (null: the legacy default stream)
  cudaEvent_t compute_done = nullptr;  // recorded on `compute` by order_after_compute
  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState();  // drains the streams, then frees everything
};

// Creates a link's stream: non-blocking (cudaStreamNonBlocking), so compute
// (on the legacy default stream or a blocking one) never waits for it.
cudaError_t create_link_stream(cudaStream_t* stream);
// Queues on link's stream a wait for everything enqueued so far on
// state.compute (the CUDA backend's ops): an op reads and writes its buffers
// only after the compute issued before it.
void order_after_compute(NcclState& state, NcclLink& link, const std::string& what);

// For a Watchdog (comm/watchdog.h) over a blocking set-up or teardown step
// of state's communicator: reports `what` as not done within
// options.timeout_s and aborts the job.
std::function<void()> abort_when_late(const NcclState& state, std::string what);

// A Work for the ops just enqueued on link's stream: a CUDA event recorded
// after them; seq and what name the op in watchdog messages.
WorkPtr make_nccl_work(std::shared_ptr<NcclState> state, NcclLink& link, std::string what, int64_t seq);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (whose ranks it takes, and its name unless
  // `name` is given: nccl_world's "world", as MPI's world is named): creates
  // the NCCL communicators over all ranks (collectives, up, down) from unique
  // ids made on rank 0; the neighbour links wait for the first send or recv.
  // Ops wait for `compute` (nccl_world's).
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, int device, const Options& options,
                   cudaStream_t compute, std::string name = {});

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  const std::string& name() const override { return state_->name; }
  Device device() const override { return Device::cuda(state_->device); }
  const Options& options() const override { return state_->options; }

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
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  // A collective's identity, compared across ranks by check_collectives.
  using CollDesc = std::array<int64_t, 5>;  // seq, kind, count, dtype, op or root
  // Runs `enqueue` (the NCCL calls) on link's stream, records the Work's event.
  template <typename F>
  WorkPtr issue(NcclLink& link, std::string what, int64_t seq, F&& enqueue);
  void check_same_collective(CollDesc mine, const std::string& what);
  void check_counts(const std::string& what, std::span<const int64_t> out_counts, std::span<const int64_t> in_counts);
  WorkPtr issue_p2p(bool is_send, Tensor buf, int peer, int tag);
  // The first point-to-point op's set-up (nccl_backend.h): the neighbour
  // links made and every link to a neighbour connected.
  void connect_p2p();

  std::unique_ptr<Communicator> bootstrap_;  // same ranks; for split and checks
  std::shared_ptr<NcclState> state_;
  int64_t coll_seq_ = 0;
  int64_t p2p_seq_ = 0;
};

}  // namespace loom::comm
