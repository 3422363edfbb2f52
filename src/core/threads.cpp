#include "core/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace loom {

CpuMask this_process_cpus() {
  CpuMask mask{};
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < static_cast<int>(mask.size()) * 64 && cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) mask[static_cast<size_t>(cpu / 64)] |= uint64_t{1} << (cpu % 64);
  }
  return mask;
}

int default_num_threads() {
  const CpuMask mine = this_process_cpus();
  return share_of_cpus(std::span<const CpuMask>(&mine, 1), 0);
}

int share_of_cpus(std::span<const CpuMask> masks, int me) {
  LOOM_CHECK(me >= 0 && static_cast<size_t>(me) < masks.size(), "share_of_cpus: process ", me, " of ", masks.size());
  const CpuMask& mine = masks[static_cast<size_t>(me)];
  double share = 0;
  for (size_t word = 0; word < mine.size(); ++word)
    for (int bit = 0; bit < 64; ++bit) {
      const uint64_t b = uint64_t{1} << bit;
      if ((mine[word] & b) == 0) continue;
      int sharing = 0;
      for (const CpuMask& m : masks) sharing += (m[word] & b) != 0;
      share += 1.0 / sharing;
    }
  // No mask at all (sched_getaffinity failed): the machine's count.
  if (share == 0) share = static_cast<double>(std::thread::hardware_concurrency()) / static_cast<double>(masks.size());
  return std::max(1, static_cast<int>(share + 1e-9));
}

void set_num_threads(int n) {
  LOOM_REQUIRE(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom
