// Thread-count setup for the OpenMP parallel regions of the CPU kernels.
#pragma once

namespace loom {

// A sensible default: the cores this process may run on, divided among the
// ranks that share the machine, at least 1. ranks_per_node = 0: as many as
// mpirun started here (OMPI_COMM_WORLD_LOCAL_SIZE), or 1 without mpirun.
int default_num_threads(int ranks_per_node = 0);
// Sets the OpenMP thread count for this process (n >= 1).
void set_num_threads(int n);
int num_threads();

}  // namespace loom
