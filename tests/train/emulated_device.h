// A GPU without a GPU, for the device plumbing's tests: the CPU's own kernels
// registered a second time as the backend of Device::cuda, with memory from
// the host's allocator (register_emulated_device), and a communicator of
// that device (OnDeviceCommunicator): MPI underneath, but every tensor it is
// given must be on the device, as NCCL's must be in GPU memory, so a host
// tensor handed to a collective of a GPU run is an error here too. Used by
// test_device_emulated.cpp (one process) and mpi_test_device.cpp (dp, tp).
// What this cannot see is host code reading device memory directly (the
// memory is the host's here); tests/gpu runs the same scenarios on a GPU.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/backend.h"

namespace loom::test {

inline void* emulated_allocate(int, size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
inline void emulated_free(int, void* p) { std::free(p); }
inline void emulated_zero(int, void* p, size_t bytes) { std::memset(p, 0, bytes); }
inline void emulated_copy(int, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// Device::cuda(0)'s memory and kernels are the host's from here on.
inline void register_emulated_device() {
  static constexpr DeviceMemory memory{emulated_allocate, emulated_free, emulated_zero,
                                       emulated_copy,     emulated_copy, emulated_copy};
  static const kernels::Backend table = [] {
    kernels::Backend b = *kernels::find_backend(Device::cpu());
    b.name = "cpu kernels as cuda (test)";
    b.kind = Device::Kind::cuda;
    return b;
  }();
  register_device_memory(Device::Kind::cuda, memory);
  kernels::register_backend(table);
}

// `host`'s collectives for tensors on the emulated device: each tensor must
// be on Device::cuda(0) (loom::Error naming the op otherwise) and is passed
// on as the host tensor it really is.
class OnDeviceCommunicator final : public comm::Communicator {
 public:
  explicit OnDeviceCommunicator(std::unique_ptr<comm::Communicator> host) : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  Device device() const override { return Device::cuda(0); }
  const comm::Options& options() const override { return host_->options(); }

  comm::WorkPtr all_reduce(Tensor buf, comm::ReduceOp op) override {
    return host_->all_reduce(on_host(buf, "all_reduce"), op);
  }
  comm::WorkPtr reduce_scatter(Tensor out, Tensor in, comm::ReduceOp op) override {
    return host_->reduce_scatter(on_host(out, "reduce_scatter"), on_host(in, "reduce_scatter"), op);
  }
  comm::WorkPtr all_gather(Tensor out, Tensor in) override {
    return host_->all_gather(on_host(out, "all_gather"), on_host(in, "all_gather"));
  }
  comm::WorkPtr broadcast(Tensor buf, int root) override { return host_->broadcast(on_host(buf, "broadcast"), root); }
  // NCCL has no tags: the messages between two ranks match in the order
  // they are issued. So here every message travels with one tag, after a
  // header holding the tag its sender gave, which the receive checks: a
  // schedule that relies on tags to pair its messages fails here as it
  // would on GPUs, by name instead of with another message's bytes.
  comm::WorkPtr send(Tensor buf, int peer, int tag) override {
    auto header = std::make_shared<int32_t>(tag);
    comm::WorkPtr sent_header = host_->send(Tensor(header.get(), DType::i32, {1}), peer, kTagless);
    return std::make_shared<Tagless>(sent_header, host_->send(on_host(buf, "send"), peer, kTagless), header, tag,
                                     std::string());
  }
  comm::WorkPtr recv(Tensor buf, int peer, int tag) override {
    auto header = std::make_shared<int32_t>(-1);
    comm::WorkPtr got_header = host_->recv(Tensor(header.get(), DType::i32, {1}), peer, kTagless);
    return std::make_shared<Tagless>(got_header, host_->recv(on_host(buf, "recv"), peer, kTagless), header, tag,
                                     concat("communicator ", name(), " (emulated cuda): recv from ", peer));
  }
  comm::WorkPtr all_to_all(Tensor out, Tensor in) override {
    return host_->all_to_all(on_host(out, "all_to_all"), on_host(in, "all_to_all"));
  }
  comm::WorkPtr all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                             std::span<const int64_t> in_counts) override {
    return host_->all_to_all_v(on_host(out, "all_to_all_v"), out_counts, on_host(in, "all_to_all_v"), in_counts);
  }
  comm::WorkPtr barrier() override { return host_->barrier(); }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override {
    return std::make_unique<OnDeviceCommunicator>(host_->split(color, key, name));
  }

 private:
  static constexpr int kTagless = 0;
  // A message and its header; a receive checks the header's tag once it is here.
  class Tagless final : public comm::Work {
   public:
    Tagless(comm::WorkPtr header, comm::WorkPtr body, std::shared_ptr<int32_t> tag_sent, int tag, std::string recv_at)
        : header_(std::move(header)), body_(std::move(body)), tag_sent_(std::move(tag_sent)), tag_(tag),
          recv_at_(std::move(recv_at)) {}
    void wait() override {
      header_->wait();
      LOOM_REQUIRE(recv_at_.empty() || *tag_sent_ == tag_, recv_at_, " with tag ", tag_,
                   " is matched, in NCCL's issue order, with the message sent with tag ", *tag_sent_,
                   ": the two ranks post their messages in different orders");
      body_->wait();
    }
    bool test() override { return header_->test() && body_->test(); }

   private:
    comm::WorkPtr header_, body_;
    std::shared_ptr<int32_t> tag_sent_;
    int tag_;
    std::string recv_at_;  // empty for a send
  };

  Tensor on_host(const Tensor& t, const char* op) const {
    LOOM_REQUIRE(t.device() == Device::cuda(0), "communicator ", name(), " (emulated cuda): ", op, " was given a ",
                 "tensor on ", device_name(t.device()), "; a GPU's communicator (NCCL) takes device memory only");
    LOOM_REQUIRE(t.is_contiguous(), "communicator ", name(), ": ", op, " of a strided view ", t.str());
    return Tensor(t.data(), t.dtype(), t.shape(), Device::cpu());
  }
  std::unique_ptr<comm::Communicator> host_;
};

}  // namespace loom::test
