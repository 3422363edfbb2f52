#include "core/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace loom {

int default_num_threads(int ranks_per_node) {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, ranks_per_node));
}

void set_num_threads(int n) {
  LOOM_REQUIRE(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom
