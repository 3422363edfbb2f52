#include "core/memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <new>
#include <sstream>

#include "core/error.h"

namespace loom {

std::string_view mem_tag_name(MemTag t) {
  static constexpr std::string_view names[kNumMemTags] = {
      "params", "grads", "master", "optimizer", "activations", "comm", "kv_cache", "workspace"};
  return names[static_cast<int>(t)];
}

Storage& Storage::operator=(Storage&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Storage::release() {
  if (pool_) pool_->free(data_, bytes_);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

namespace {
void update_peak(std::atomic<size_t>& peak, size_t value) {
  size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void MemoryTracker::add(MemTag tag, size_t bytes) {
  const int i = static_cast<int>(tag);
  update_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  update_peak(peak_total_, current_total_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryTracker::sub(MemTag tag, size_t bytes) {
  current_[static_cast<int>(tag)].fetch_sub(bytes, std::memory_order_relaxed);
  current_total_.fetch_sub(bytes, std::memory_order_relaxed);
}

MemoryReport MemoryTracker::report() const {
  MemoryReport r;
  for (int i = 0; i < kNumMemTags; ++i) {
    r.tags[i].current = current_[i].load(std::memory_order_relaxed);
    r.tags[i].peak = peak_[i].load(std::memory_order_relaxed);
  }
  r.current_total = current_total_.load(std::memory_order_relaxed);
  r.peak_total = peak_total_.load(std::memory_order_relaxed);
  return r;
}

void MemoryTracker::reset_peaks() {
  for (int i = 0; i < kNumMemTags; ++i) peak_[i].store(current_[i].load());
  peak_total_.store(current_total_.load());
}

namespace {
std::string mib(size_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1024.0 * 1024.0);
  return os.str();
}
}  // namespace

std::string MemoryReport::table() const {
  std::ostringstream os;
  os << std::left << std::setw(12) << "tag" << std::right << std::setw(14) << "current MiB" << std::setw(14)
     << "peak MiB" << "\n";
  for (int i = 0; i < kNumMemTags; ++i)
    os << std::left << std::setw(12) << mem_tag_name(static_cast<MemTag>(i)) << std::right << std::setw(14)
       << mib(tags[i].current) << std::setw(14) << mib(tags[i].peak) << "\n";
  os << std::left << std::setw(12) << "total" << std::right << std::setw(14) << mib(current_total) << std::setw(14)
     << mib(peak_total) << "\n";
  return os.str();
}

std::string MemoryReport::json() const {
  std::ostringstream os;
  os << "{";
  auto entry = [&os](std::string_view name, size_t current, size_t peak) {
    os << "\"" << name << "\":{\"current_bytes\":" << current << ",\"peak_bytes\":" << peak << "}";
  };
  for (int i = 0; i < kNumMemTags; ++i) {
    entry(mem_tag_name(static_cast<MemTag>(i)), tags[i].current, tags[i].peak);
    os << ",";
  }
  entry("total", current_total, peak_total);
  os << "}";
  return os.str();
}

namespace {
constinit std::atomic<const DeviceMemory*> g_device_memory[2]{nullptr, nullptr};  // by Device::Kind
}  // namespace

void register_device_memory(Device::Kind kind, const DeviceMemory& m) {
  LOOM_REQUIRE(kind != Device::Kind::cpu, "register_device_memory: the host's memory is built in");
  LOOM_REQUIRE(m.allocate && m.free && m.zero && m.to_device && m.to_host && m.within,
               "register_device_memory: every function of the table is required");
  LOOM_REQUIRE((m.pin_host == nullptr) == (m.unpin_host == nullptr),
               "register_device_memory: pin_host and unpin_host come as a pair");
  const DeviceMemory* expected = nullptr;
  auto& slot = g_device_memory[static_cast<size_t>(kind)];
  if (!slot.compare_exchange_strong(expected, &m) && expected != &m)
    fail("register_device_memory: ", device_name(Device{kind, 0}), " memory is already registered");
}

const DeviceMemory& device_memory(Device d) {
  LOOM_REQUIRE(!d.is_cpu(), "device_memory: ", device_name(d), " is the host");
  const DeviceMemory* m = g_device_memory[static_cast<size_t>(d.kind)].load(std::memory_order_acquire);
  LOOM_REQUIRE(m != nullptr, "no memory allocator for device ", device_name(d),
               ": this build or this process has no backend for it (is the GPU backend built and registered?)");
  return *m;
}

Stream device_stream(Device d) {
  if (d.is_cpu()) return Stream{d};
  const DeviceMemory& m = device_memory(d);
  return Stream{d, m.stream ? m.stream(d.index) : nullptr};
}

void copy_between_host_and_device(Tensor dst, const Tensor& src) {
  LOOM_REQUIRE(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy_between_host_and_device: dst ",
               dst.str(), " and src ", src.str(), " differ in dtype or shape");
  LOOM_REQUIRE(dst.is_contiguous() && src.is_contiguous(), "copy_between_host_and_device: dst ", dst.str(),
               " and src ", src.str(), " must be contiguous");
  LOOM_REQUIRE(dst.device().is_cpu() != src.device().is_cpu(), "copy_between_host_and_device: dst on ",
               device_name(dst.device()), " and src on ", device_name(src.device()),
               ": exactly one must be the host");
  if (dst.nbytes() == 0) return;
  if (dst.device().is_cpu()) {
    device_memory(src.device()).to_host(src.device().index, dst.data(), src.data(), src.nbytes());
  } else {
    device_memory(dst.device()).to_device(dst.device().index, dst.data(), src.data(), src.nbytes());
  }
}

void copy_tensor(Tensor dst, const Tensor& src) {
  const bool dst_host = dst.device().is_cpu(), src_host = src.device().is_cpu();
  if (dst_host != src_host) return copy_between_host_and_device(dst, src);
  LOOM_REQUIRE(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy_tensor: dst ", dst.str(), " and src ",
               src.str(), " differ in dtype or shape");
  LOOM_REQUIRE(dst.is_contiguous() && src.is_contiguous(), "copy_tensor: dst ", dst.str(), " and src ", src.str(),
               " must be contiguous");
  LOOM_REQUIRE(dst.device() == src.device(), "copy_tensor: dst on ", device_name(dst.device()), " and src on ",
               device_name(src.device()), ": copies between two devices go through the host");
  if (dst.data() == src.data() || src.nbytes() == 0) return;
  if (dst_host) std::memcpy(dst.data(), src.data(), src.nbytes());
  else device_memory(dst.device()).within(dst.device().index, dst.data(), src.data(), src.nbytes());
}

namespace {
// Said once per process: the copies work, only slower.
void warn_unpinned(Device d, size_t bytes) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::fprintf(stderr, "warning: %zu MiB of host memory could not be page-locked for %s: copies to and from it "
                       "stay pageable (slower)\n", bytes >> 20, device_name(d).c_str());
}
}  // namespace

Storage Pool::allocate(size_t bytes) {
  LOOM_REQUIRE(bytes <= SIZE_MAX - kAlignment, "pool ", mem_tag_name(tag_), ": cannot allocate ", bytes, " bytes");
  Storage s;
  if (!device_.is_cpu()) {
    if (bytes > 0) s.data_ = device_memory(device_).allocate(device_.index, bytes);
  } else if (pins(bytes)) {  // whole pages, none shared with another buffer
    const size_t align = bytes >= kHugeBytes ? kHugeBytes : kPageBytes;
    const size_t rounded = (bytes + align - 1) / align * align;
    if (posix_memalign(&s.data_, align, rounded) != 0) s.data_ = nullptr;
    if (s.data_ && !device_memory(pin_for_).pin_host(pin_for_.index, s.data_, rounded)) warn_unpinned(pin_for_, bytes);
  } else if (bytes >= kHugeBytes) {
    // Big buffers (weights, the KV cache, activations) start on a huge-page
    // boundary and ask the kernel for huge pages (Debian's transparent huge
    // pages default to madvise): a 2 MiB page needs one TLB entry where 4 KiB
    // pages need 512, and the kernels that stream them (decode's GEMV over
    // every weight, paged attention over blocks scattered in a GiB-sized
    // cache) otherwise walk page tables all the time. The advice is a hint:
    // where huge pages are off it changes nothing.
    if (posix_memalign(&s.data_, kHugeBytes, bytes) != 0) s.data_ = nullptr;
    if (s.data_) madvise(s.data_, bytes, MADV_HUGEPAGE);
  } else if (bytes > 0) {
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    s.data_ = std::aligned_alloc(kAlignment, rounded);
  }
  if (bytes > 0) {
    if (!s.data_)
      fail("out of memory: pool ", mem_tag_name(tag_), " could not allocate ", bytes, " bytes (",
           mib(bytes), " MiB)");
  }
  s.pool_ = this;
  s.bytes_ = bytes;
  tracker_->add(tag_, bytes);
  return s;
}

bool Pool::pins(size_t bytes) const {
  return device_.is_cpu() && !pin_for_.is_cpu() && bytes > 0 && device_memory(pin_for_).pin_host;
}

void Pool::free(void* data, size_t bytes) {
  if (!device_.is_cpu()) {
    if (data) device_memory(device_).free(device_.index, data);
  } else {
    if (data && pins(bytes)) device_memory(pin_for_).unpin_host(pin_for_.index, data);
    std::free(data);
  }
  tracker_->sub(tag_, bytes);
}

OwnedTensor Pool::empty(DType dtype, Shape shape) {
  shape.validate();
  size_t bytes = 0;
  LOOM_REQUIRE(!__builtin_mul_overflow(static_cast<size_t>(shape.numel()), dtype_size(dtype), &bytes), "pool ",
               mem_tag_name(tag_), ": a ", dtype_name(dtype), shape.str(), " tensor does not fit in memory");
  return OwnedTensor(allocate(bytes), dtype, shape, device_);
}

OwnedTensor Pool::zeros(DType dtype, Shape shape) {
  OwnedTensor t = empty(dtype, shape);
  if (t.nbytes() == 0) return t;
  if (device_.is_cpu()) {
    std::memset(t.data(), 0, t.nbytes());
  } else {
    device_memory(device_).zero(device_.index, t.data(), t.nbytes());
  }
  return t;
}

Pools::Pools(Device device, Device pin_for) {
  LOOM_REQUIRE(pin_for.is_cpu() || device.is_cpu(), "Pools: memory of ", device_name(device),
               " cannot be pinned for ", device_name(pin_for), " (only host memory is page-locked)");
  for (int i = 0; i < kNumMemTags; ++i)
    pools_[i] = std::make_unique<Pool>(static_cast<MemTag>(i), device, tracker_, pin_for);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

namespace {

int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(field)) return std::strtoll(line.c_str() + std::strlen(field), nullptr, 10) * 1024;  // kB
  return 0;
}

}  // namespace

int64_t process_resident_bytes() { return proc_status_bytes("VmRSS:"); }
int64_t process_peak_resident_bytes() { return proc_status_bytes("VmHWM:"); }

}  // namespace loom
