// Thread-count setup for the OpenMP parallel regions of the CPU kernels.
#pragma once

namespace loom {

// A sensible default: the cores this process may run on, divided among the
// ranks that share the machine (ranks_per_node >= 1), at least 1.
int default_num_threads(int ranks_per_node = 1);
// Sets the OpenMP thread count for this process (n >= 1).
void set_num_threads(int n);
int num_threads();

}  // namespace loom
