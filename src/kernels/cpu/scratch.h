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
// slot, so none is held across a call to another kernel. A buffer that a
// thread obtains before an OpenMP region may be used by the region's threads
// (the caller owns it; workers touch disjoint parts of it); a buffer obtained
// inside the region belongs to the thread that asked. OpenMP keeps its worker
// threads between regions, so their buffers are reused too.
#pragma once

#include <cstddef>
#include <type_traits>

namespace loom::kernels {

enum class ScratchSlot : int { a, b, c, d };
inline constexpr int kScratchSlots = 4;  // the number of ScratchSlot values

// count elements of `size` bytes (count may be 0), 64-byte aligned, in the
// calling thread's slot. Debug builds (no NDEBUG) fill it with 0xff bytes
// (NaN as floats) so that a caller relying on zeros or on old contents fails
// its tests.
void* thread_scratch_raw(ScratchSlot slot, size_t count, size_t size);

template <typename T>
T* thread_scratch(ScratchSlot slot, size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64, "scratch holds plain values");
  return static_cast<T*>(thread_scratch_raw(slot, n, sizeof(T)));
}

// Bytes held by the scratch of every live thread together (memory reports).
size_t scratch_bytes();

}  // namespace loom::kernels
