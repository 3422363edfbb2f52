// The machine's memory read bandwidth as loom measures it, for the figures
// that are bounded by it: `loom bench serve --mode decode-bound` (decoding
// reads every weight once a step) and `loom plan --calibrate` (a device's
// memory bandwidth, plan/calibrate.h).
#pragma once

#include <cstdint>

namespace loom {

// Bytes per second of reading a buffer of `bytes` (rounded down to whole
// 64-bit words, at least one): the sum of its words, read by the caller's
// OpenMP threads (num_threads(), core/threads.h), each its static share and
// first touched by that thread (local memory on a NUMA machine); the best of
// `passes` passes (a shared machine's bandwidth drifts: the best is the
// bound). A buffer far bigger than the last-level cache measures memory, a
// smaller one the cache. The buffer comes from a workspace pool of its own
// and is freed on return.
double measure_read_bandwidth(int64_t bytes, int passes);

}  // namespace loom
