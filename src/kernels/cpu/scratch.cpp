// Per-thread scratch (scratch.h): a thread_local array of aligned buffers,
// and one atomic byte count over all threads.
#include "kernels/cpu/scratch.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"

namespace loom::kernels {
namespace {

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

size_t scratch_round_bytes(size_t count, size_t size) {
  LOOM_REQUIRE(size == 0 || count <= (SIZE_MAX - kAlignment) / size, "out of memory: kernel scratch needs ", count,
               " x ", size, " bytes, more than the address space");
  // A multiple of kAlignment, as std::aligned_alloc requires.
  return count * size == 0 ? kAlignment : (count * size + kAlignment - 1) / kAlignment * kAlignment;
}

void* thread_scratch_raw(ScratchSlot slot, size_t count, size_t size) {
  const int i = static_cast<int>(slot);
  LOOM_CHECK(i >= 0 && i < kScratchSlots, "scratch slot ", i);
  const size_t bytes = scratch_round_bytes(count, size);
  Buffer& b = t_scratch.slots[i];
  if (bytes > b.bytes) {
    // Allocate before freeing: if it fails, the slot still holds its old buffer.
    void* p = std::aligned_alloc(kAlignment, bytes);
    LOOM_REQUIRE(p != nullptr, "out of memory: kernel scratch needs ", bytes, " bytes (", bytes >> 20, " MiB)");
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
