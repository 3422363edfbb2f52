// A communicator of one rank, in process: what a run without mpirun uses for
// every group of its mesh (DESIGN.md §3: no nullptr groups). Each collective
// over one rank is a copy or nothing (a sum, average or max of one value is
// that value, bitwise); a send to itself is received by its matching recv
// (same tag, in issue order). Arguments are validated as every backend does
// (comm/validate.h), so code that misuses a collective fails on one process
// the way it would on many. Every Work is complete when returned, except a
// recv posted before its send, which completes at the send.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/validate.h"

namespace loom::comm {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name = "self", Options options = {});

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cpu(); }  // and any other a call's tensors are on
  const Options& options() const override { return options_; }

  WorkPtr all_reduce(Tensor buf, ReduceOp op) override;
  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override;
  WorkPtr all_gather(Tensor out, Tensor in) override;
  WorkPtr broadcast(Tensor buf, int root) override;
  WorkPtr send(Tensor buf, int peer, int tag = 0) override;
  WorkPtr recv(Tensor buf, int peer, int tag = 0) override;
  WorkPtr all_to_all(Tensor out, Tensor in) override;
  WorkPtr all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                       std::span<const int64_t> in_counts) override;
  WorkPtr barrier() override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  struct Pending;  // a send or recv waiting for its match
  CallSite at(const char* op, const Tensor& t) const;

  std::string name_;
  Options options_;
  std::deque<std::shared_ptr<Pending>> sends_, recvs_;
};

}  // namespace loom::comm
