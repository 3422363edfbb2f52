// Thread-count setup for the OpenMP parallel regions of the CPU kernels.
#pragma once

namespace loom {

// A sensible default: the cores this process may run on, divided among the
// ranks_per_node processes that share the machine, at least 1. The library
// reads no environment (DESIGN.md §1.5): main() learns ranks_per_node from
// the launcher (local_ranks_from_launcher, cli/main.cpp) and passes it down.
int default_num_threads(int ranks_per_node = 1);
// Sets the OpenMP thread count for this process (n >= 1).
void set_num_threads(int n);
int num_threads();

}  // namespace loom
