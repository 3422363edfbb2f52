// Thread-count setup for the OpenMP parallel regions of the CPU kernels.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace loom {

// The CPUs a process may run on (its affinity mask), one bit each, CPUs
// 0..1023 (glibc's CPU_SETSIZE).
using CpuMask = std::array<uint64_t, 16>;
CpuMask this_process_cpus();

// A sensible default for one process alone: the cores it may run on, at least 1.
int default_num_threads();

// The threads of process `me` of a machine whose processes may run on
// `masks` (masks[me] its own): each CPU is split evenly among the processes
// allowed on it, and this process's shares are summed, rounded down, at
// least 1. So N unbound processes on C cores get C / N each, and processes
// a launcher bound to disjoint sets (srun --cpus-per-task with task/affinity,
// mpirun --bind-to) get their own set's size. The library reads no
// environment (DESIGN.md §1.5): main() gathers the masks of the job's
// processes on this machine (comm/mpi_runtime.h) and passes them in.
int share_of_cpus(std::span<const CpuMask> masks, int me);
// Sets the OpenMP thread count for this process (n >= 1).
void set_num_threads(int n);
int num_threads();

}  // namespace loom
