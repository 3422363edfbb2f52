// Per-thread scratch memory for the CPU kernels, so that the step loop does
// not allocate (DESIGN.md §1.4). Internal to src/kernels/cpu.
//
// A kernel asks for n elements of T in one of its calling thread's slots and
// gets 64-byte aligned memory, valid until the same thread asks for that slot
// again. The contents are unspecified (not zeroed, not kept across requests):
// callers that need zeros fill them. A slot's buffer only grows, to exactly
// the largest request rounded up to 64 bytes, so once every shape of a step
// has been seen no call allocates.
//
// Slot rules, within one thread: two buffers alive at the same time need
// different slots, and a helper must not ask for a slot its caller still
// holds. A buffer lives within one kernel call: every kernel may use any
// slot, so none is held across a call to another kernel.
//
// OpenMP: never call thread_scratch inside a parallel region. A request can
// fail (loom::Error), and an exception cannot leave a region: it would call
// std::terminate. The calling thread obtains every buffer before the region
// (ThreadSlices below for per-thread buffers); the region's threads use it,
// touching disjoint parts.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "core/error.h"

namespace loom::kernels {

enum class ScratchSlot : int { a, b, c, d };
inline constexpr int kScratchSlots = 4;  // the number of ScratchSlot values

// count elements of `size` bytes (count may be 0), 64-byte aligned, in the
// calling thread's slot. Throws loom::Error if count * size (rounded up to
// 64 bytes) overflows or cannot be allocated; the slot then keeps its old
// buffer. Debug builds (no NDEBUG) fill it with 0xff bytes (NaN as floats)
// so that a caller relying on zeros or on old contents fails its tests.
void* thread_scratch_raw(ScratchSlot slot, size_t count, size_t size);

// count * size rounded up to a multiple of 64 bytes, at least 64 (so that a
// request of 0 still gets its own memory); loom::Error if that overflows.
size_t scratch_round_bytes(size_t count, size_t size);

template <typename T>
T* thread_scratch(ScratchSlot slot, size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64, "scratch holds plain values");
  return static_cast<T*>(thread_scratch_raw(slot, n, sizeof(T)));
}

// Per-thread slices of one scratch buffer, reserved by the calling thread
// before an OpenMP region (so an allocation failure is an exception the
// caller can catch, never a throw inside the region): thread i of the region
// uses slice i. Each slice holds per_thread elements and starts 64-byte
// aligned. The buffer is the calling thread's slot, under the slot rules.
//
// threads defaults to omp_get_max_threads(), the most threads the next region
// at this level can have. A caller that reserves fewer gives its region a
// num_threads(slices.threads()) clause.
template <typename T>
class ThreadSlices {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64, "scratch holds plain values");

 public:
  ThreadSlices(ScratchSlot slot, size_t per_thread, int threads = omp_get_max_threads())
      : threads_(std::max(threads, 1)), stride_(scratch_round_bytes(per_thread, sizeof(T))) {
    base_ = static_cast<std::byte*>(thread_scratch_raw(slot, static_cast<size_t>(threads_), stride_));
  }

  int threads() const { return threads_; }
  // Bytes from one slice to the next: per_thread elements rounded up to 64.
  size_t stride_bytes() const { return stride_; }
  T* slice(int i) const {
    // Inside a region a failed check terminates: it can only be a loom bug
    // (a region with more threads than were reserved).
    LOOM_CHECK(i >= 0 && i < threads_, "thread slice ", i, " of ", threads_);
    return reinterpret_cast<T*>(base_ + static_cast<size_t>(i) * stride_);
  }
  // The calling thread's slice, inside the region.
  T* mine() const { return slice(omp_get_thread_num()); }

 private:
  int threads_;
  size_t stride_;
  std::byte* base_;
};

// Bytes held by the scratch of every live thread together (memory reports).
size_t scratch_bytes();

}  // namespace loom::kernels
