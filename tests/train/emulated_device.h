// A GPU without a GPU, for the device plumbing's tests: the CPU's own kernels
// registered a second time as the backend of Device::cuda, with memory from
// the host's allocator (register_emulated_device), and a communicator of
// that device (OnDeviceCommunicator): MPI underneath, but every tensor it is
// given must be on the device, as NCCL's must be in GPU memory, so a host
// tensor handed to a collective of a GPU run is an error here too. Used by
// test_device_emulated.cpp (one process) and mpi_test_device.cpp (every
// layout over ranks).
// What this cannot see is host code reading device memory directly (the
// memory is the host's here); tests/gpu runs the same scenarios on a GPU.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "emulated_p2p.h"
#include "kernels/backend.h"

namespace loom::test {

inline void* emulated_allocate(int, size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
inline void emulated_free(int, void* p) { std::free(p); }
inline void emulated_zero(int, void* p, size_t bytes) { std::memset(p, 0, bytes); }
inline void emulated_copy(int, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
// The device's stream: a handle to hand around (the work runs when called).
inline void* emulated_stream(int) {
  static char queue;
  return &queue;
}

// Page-locking, as the tests see it: what is pinned now, and how often
// pin_host was called (a pool that pins per step would show here).
struct EmulatedPins {
  std::mutex mutex;
  std::map<void*, size_t> pinned;  // data -> bytes
  int64_t calls = 0;
};
inline EmulatedPins& emulated_pins() {
  static EmulatedPins pins;
  return pins;
}
inline bool emulated_pin(int, void* data, size_t bytes) {
  EmulatedPins& p = emulated_pins();
  std::lock_guard lock(p.mutex);
  ++p.calls;
  if (reinterpret_cast<uintptr_t>(data) % 4096 != 0 || bytes % 4096 != 0) return false;  // whole pages only
  return p.pinned.emplace(data, bytes).second;  // twice: refused, as cudaHostRegister does
}
inline void emulated_unpin(int, void* data) {
  EmulatedPins& p = emulated_pins();
  std::lock_guard lock(p.mutex);
  p.pinned.erase(data);
}

// The device clock of the op tracer (kernels/op_trace.h): a mark is the
// host's time, the device having run each op before it returned.
inline void* emulated_mark() {
  return new std::chrono::steady_clock::time_point(std::chrono::steady_clock::now());
}
inline double emulated_elapsed_us(void* from, void* to) {
  using T = std::chrono::steady_clock::time_point;
  return std::chrono::duration<double, std::micro>(*static_cast<T*>(to) - *static_cast<T*>(from)).count();
}
inline void emulated_release(void* mark) { delete static_cast<std::chrono::steady_clock::time_point*>(mark); }

// Device::cuda(0)'s memory and kernels are the host's from here on.
inline void register_emulated_device() {
  static constexpr DeviceMemory memory{emulated_allocate, emulated_free,   emulated_zero, emulated_copy,
                                       emulated_copy,     emulated_copy,   emulated_stream, emulated_pin,
                                       emulated_unpin};
  static constexpr kernels::DeviceClock clock{emulated_mark, emulated_elapsed_us, emulated_release};
  static const kernels::Backend table = [] {
    kernels::Backend b = *kernels::find_backend(Device::cpu());
    b.name = "cpu kernels as cuda (test)";
    b.kind = Device::Kind::cuda;
    b.clock = &clock;
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

  // The collectives: MPI's, issued one caller at a time (the p2p threads
  // issue on host_ too; split is blocking, so it is not issued under the lock,
  // and touches nothing those threads use).
  comm::WorkPtr all_reduce(Tensor buf, comm::ReduceOp op) override {
    const Tensor b = on_host(buf, "all_reduce");
    return locked([&] { return host_->all_reduce(b, op); });
  }
  comm::WorkPtr reduce_scatter(Tensor out, Tensor in, comm::ReduceOp op) override {
    const Tensor o = on_host(out, "reduce_scatter"), i = on_host(in, "reduce_scatter");
    return locked([&] { return host_->reduce_scatter(o, i, op); });
  }
  comm::WorkPtr all_gather(Tensor out, Tensor in) override {
    const Tensor o = on_host(out, "all_gather"), i = on_host(in, "all_gather");
    return locked([&] { return host_->all_gather(o, i); });
  }
  comm::WorkPtr broadcast(Tensor buf, int root) override {
    const Tensor b = on_host(buf, "broadcast");
    return locked([&] { return host_->broadcast(b, root); });
  }
  // Queued per stream as NCCL queues them: emulated_p2p.h.
  comm::WorkPtr send(Tensor buf, int peer, int tag) override {
    return p2p_.submit(true, on_host(buf, "send"), peer, tag);
  }
  comm::WorkPtr recv(Tensor buf, int peer, int tag) override {
    return p2p_.submit(false, on_host(buf, "recv"), peer, tag);
  }
  comm::WorkPtr all_to_all(Tensor out, Tensor in) override {
    const Tensor o = on_host(out, "all_to_all"), i = on_host(in, "all_to_all");
    return locked([&] { return host_->all_to_all(o, i); });
  }
  comm::WorkPtr all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                             std::span<const int64_t> in_counts) override {
    const Tensor o = on_host(out, "all_to_all_v"), i = on_host(in, "all_to_all_v");
    return locked([&] { return host_->all_to_all_v(o, out_counts, i, in_counts); });
  }
  comm::WorkPtr barrier() override {
    return locked([&] { return host_->barrier(); });
  }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override {
    return std::make_unique<OnDeviceCommunicator>(host_->split(color, key, name));  // blocking: unlocked
  }

 private:
  template <typename F>
  comm::WorkPtr locked(F&& f) {
    std::lock_guard lock(issue_);
    return f();
  }
  Tensor on_host(const Tensor& t, const char* op) const {
    LOOM_REQUIRE(t.device() == Device::cuda(0), "communicator ", name(), " (emulated cuda): ", op, " was given a ",
                 "tensor on ", device_name(t.device()), "; a GPU's communicator (NCCL) takes device memory only");
    LOOM_REQUIRE(t.is_contiguous(), "communicator ", name(), ": ", op, " of a strided view ", t.str());
    return Tensor(t.data(), t.dtype(), t.shape(), Device::cpu());
  }
  std::unique_ptr<comm::Communicator> host_;
  std::mutex issue_;  // held for every call into host_
  EmulatedP2p p2p_{*host_, issue_};  // before host_ goes: its threads drain into it
};

}  // namespace loom::test
