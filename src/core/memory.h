// Tagged memory pools with current and peak bytes per tag (DESIGN.md §3).
//
// Every byte loom allocates for tensors comes from a Pool named by what it
// holds, so a run can say where its memory went (`--memory-report`) and the
// memory model in plan/ can be held to measured numbers.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <memory>
#include <string_view>

#include "core/tensor.h"

namespace loom {

enum class MemTag : uint8_t { params, grads, master, optimizer, activations, comm, kv_cache, workspace };
inline constexpr int kNumMemTags = 8;
std::string_view mem_tag_name(MemTag t);

inline constexpr size_t kAlignment = 64;  // bytes: a cache line, and an AVX-512 vector
inline constexpr size_t kHugeBytes = size_t{2} << 20;  // a huge page: buffers this big start on one (memory.cpp)
inline constexpr size_t kPageBytes = 4096;            // a base page: pinned host memory is rounded to whole ones

class Pool;

// Bytes owned by a pool; returned to it on destruction. Move-only.
class Storage {
 public:
  Storage() = default;
  Storage(Storage&& o) noexcept { *this = std::move(o); }
  Storage& operator=(Storage&& o) noexcept;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() { release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void release();

 private:
  friend class Pool;
  Pool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A tensor that owns its storage: usable wherever a Tensor view is expected.
class OwnedTensor : public Tensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(Storage storage, DType dtype, Shape shape, Device device)
      : Tensor(storage.data(), dtype, shape, device), storage_(std::move(storage)) {}
  // A moved-from OwnedTensor is undefined (no dangling view of the storage).
  OwnedTensor(OwnedTensor&& o) noexcept : Tensor(o), storage_(std::move(o.storage_)) {
    static_cast<Tensor&>(o) = Tensor();
  }
  OwnedTensor& operator=(OwnedTensor&& o) noexcept {
    if (this != &o) {
      static_cast<Tensor&>(*this) = o;
      storage_ = std::move(o.storage_);
      static_cast<Tensor&>(o) = Tensor();
    }
    return *this;
  }

 private:
  Storage storage_;
};

struct TagUsage {
  size_t current = 0;
  size_t peak = 0;
};

// MemAvailable of /proc/meminfo in bytes: what the machine has left; 0
// where it cannot be read.
int64_t available_memory_bytes();
// This process's resident memory now (VmRSS of /proc/self/status) and its
// peak so far (VmHWM), in bytes: what the OS counts, loom's buffers or
// not; 0 where it cannot be read.
int64_t process_resident_bytes();
int64_t process_peak_resident_bytes();

// A snapshot of bytes per tag: printable as a table and as JSON.
struct MemoryReport {
  std::array<TagUsage, kNumMemTags> tags{};
  size_t current_total = 0;
  size_t peak_total = 0;  // peak of the sum, not the sum of peaks

  const TagUsage& operator[](MemTag t) const { return tags[static_cast<int>(t)]; }
  std::string table() const;
  std::string json() const;  // {"params":{"current_bytes":..,"peak_bytes":..},...,"total":{...}}
};

// Counts current and peak bytes per tag for one device. Thread-safe.
class MemoryTracker {
 public:
  void add(MemTag tag, size_t bytes);
  void sub(MemTag tag, size_t bytes);
  MemoryReport report() const;
  void reset_peaks();

 private:
  std::array<std::atomic<size_t>, kNumMemTags> current_{};
  std::array<std::atomic<size_t>, kNumMemTags> peak_{};
  std::atomic<size_t> current_total_{0};
  std::atomic<size_t> peak_total_{0};
};

// Where a device's work is queued (DESIGN.md §3: the Context carries it):
// the backend of a device enqueues every op, and its memory's frees and
// copies, on one stream per device and process, in call order from any
// thread. handle is the backend's queue (a cudaStream_t for Device::cuda);
// null on the host, whose ops run when called, and on a device whose
// backend names none. Owned by the backend, alive for the process; other
// queues (NCCL's) order their work after it through events.
struct Stream {
  Device device;
  void* handle = nullptr;
  friend bool operator==(const Stream&, const Stream&) = default;
};

// The memory of a device other than the host. core knows no device API: the
// backend of a device kind (kernels/cuda) registers these, once per process,
// before a pool of that kind allocates. Each function throws loom::Error on
// failure; `index` is the Device's index. Copies are synchronous.
struct DeviceMemory {
  void* (*allocate)(int index, size_t bytes) = nullptr;
  void (*free)(int index, void* data) = nullptr;
  void (*zero)(int index, void* data, size_t bytes) = nullptr;
  void (*to_device)(int index, void* dst, const void* src, size_t bytes) = nullptr;
  void (*to_host)(int index, void* dst, const void* src, size_t bytes) = nullptr;
  void (*within)(int index, void* dst, const void* src, size_t bytes) = nullptr;  // device to the same device
  // The device's stream (Stream::handle) that the functions above and the
  // backend's ops are ordered on; optional (null: none is named).
  void* (*stream)(int index) = nullptr;
  // Page-locks whole pages of host memory [data, data + bytes) for faster
  // copies to and from the device (DMA without a bounce buffer); false where
  // it cannot (the memory stays pageable, copies stay correct). unpin_host
  // undoes it before the memory is freed and ignores memory never pinned.
  // Optional, as a pair.
  bool (*pin_host)(int index, void* data, size_t bytes) = nullptr;
  void (*unpin_host)(int index, void* data) = nullptr;
};
// m must outlive every allocation (a static table). A second registration for
// the same kind with another table is a loom::Error.
void register_device_memory(Device::Kind kind, const DeviceMemory& m);
// The memory functions of d's kind; loom::Error naming d if none is registered.
const DeviceMemory& device_memory(Device d);
// d's stream: Stream{cpu} for the host; for a device, the registered
// memory's stream (loom::Error as device_memory's when none is registered).
Stream device_stream(Device d);
// dst = src between the host and a device, either way (the same dtype and
// shape, both contiguous; exactly one of them on the host).
void copy_between_host_and_device(Tensor dst, const Tensor& src);
// dst = src wherever each lives (host, a device, or the same device: what a
// one-rank communicator's "collective" or a staging copy needs); same dtype
// and shape, both contiguous. A no-op when they are the same memory.
void copy_tensor(Tensor dst, const Tensor& src);

// Allocates 64-byte-aligned host memory (or a registered device's memory,
// DeviceMemory) for one tag and counts it. A host pool made to pin for a
// device (pin_for, not the host) page-locks each buffer, rounded to whole
// pages (2 MiB ones from 2 MiB), for that device's copies
// (DeviceMemory::pin_host): ZeRO-Offload's state beside a GPU's model,
// copied every step. Keep such buffers long-lived: pinning costs about as
// much as a copy.
class Pool {
 public:
  Pool(MemTag tag, Device device, MemoryTracker& tracker, Device pin_for = Device::cpu())
      : tag_(tag), device_(device), pin_for_(pin_for), tracker_(&tracker) {}
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  MemTag tag() const { return tag_; }
  Device device() const { return device_; }
  Device pin_for() const { return pin_for_; }
  Storage allocate(size_t bytes);
  // A contiguous tensor with uninitialised (allocate) or zeroed (zeros) data.
  OwnedTensor empty(DType dtype, Shape shape);
  OwnedTensor zeros(DType dtype, Shape shape);

 private:
  friend class Storage;
  void free(void* data, size_t bytes);

  bool pins(size_t bytes) const;

  MemTag tag_;
  Device device_;
  Device pin_for_;
  MemoryTracker* tracker_;
};

// One pool per tag on a device, sharing a tracker.
class Pools {
 public:
  // pin_for: host pools only (see Pool).
  explicit Pools(Device device = Device::cpu(), Device pin_for = Device::cpu());
  Device device() const { return pools_[0]->device(); }
  Pool& operator[](MemTag tag) { return *pools_[static_cast<int>(tag)]; }
  MemoryReport report() const { return tracker_.report(); }
  void reset_peaks() { tracker_.reset_peaks(); }

 private:
  MemoryTracker tracker_;
  std::array<std::unique_ptr<Pool>, kNumMemTags> pools_;
};

}  // namespace loom
