// Per-thread scratch (scratch.h): a thread_local array of aligned buffers,
// and one atomic byte count over all threads.
#include "kernels/cpu/scratch.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace loom::kernels {
namespace {

constexpr size_t kAlign = 64;  // a cache line, and an AVX-512 vector

std::atomic<size_t> g_scratch_bytes{0};

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
};

// One per thread; its destructor runs when the thread exits.
struct ThreadScratch {
  Buffer slots[kScratchSlots];
  ~ThreadScratch() {
    for (Buffer& b : slots) {
      std::free(b.p);
      g_scratch_bytes.fetch_sub(b.bytes, std::memory_order_relaxed);
    }
  }
};

thread_local ThreadScratch t_scratch;

}  // namespace

void* thread_scratch_raw(ScratchSlot slot, size_t count, size_t size) {
  const int i = static_cast<int>(slot);
  LOOM_CHECK(i >= 0 && i < kScratchSlots, "scratch slot ", i);
  LOOM_CHECK(size == 0 || count <= (SIZE_MAX - kAlign) / size, "scratch request of ", count, " x ", size, " bytes");
  // At least one line, so that a request of 0 still gets a distinct pointer;
  // a multiple of kAlign, as std::aligned_alloc requires.
  const size_t bytes = count * size == 0 ? kAlign : (count * size + kAlign - 1) / kAlign * kAlign;
  Buffer& b = t_scratch.slots[i];
  if (bytes > b.bytes) {
    // Allocate before freeing: if it throws, the slot still holds its old buffer.
    void* p = std::aligned_alloc(kAlign, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::free(b.p);
    g_scratch_bytes.fetch_add(bytes - b.bytes, std::memory_order_relaxed);
    b.p = p;
    b.bytes = bytes;
  }
#ifndef NDEBUG
  std::memset(b.p, 0xff, bytes);
#endif
  return b.p;
}

size_t scratch_bytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

}  // namespace loom::kernels
