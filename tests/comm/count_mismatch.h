// The planted all_to_all_v count mismatch of both backends' --check-collectives
// tests (MPI and NCCL): every rank sends one element to every rank, but the
// last rank expects two from rank 0, and every rank must throw the same
// message naming both ends.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::comm::test_values {

struct PlantedCountMismatch {
  std::vector<int64_t> in_counts, out_counts;
  int last = 0;
  int64_t out_elements() const { return std::accumulate(out_counts.begin(), out_counts.end(), int64_t{0}); }
};

inline PlantedCountMismatch planted_count_mismatch(int size, int rank) {
  PlantedCountMismatch m{std::vector<int64_t>(size, 1), std::vector<int64_t>(size, 1), size - 1};
  if (rank == m.last) m.out_counts[0] = 2;
  return m;
}

inline void expect_count_mismatch_named(const std::string& what, const PlantedCountMismatch& m) {
  EXPECT_EQ(what.rfind("check_collectives: all_to_all_v(", 0), 0u) << what;
  EXPECT_NE(what.find(concat("on communicator 'world': rank 0 sends 1 elements to rank ", m.last, " (in_counts[",
                             m.last, "]) but rank ", m.last, " expects 2 from rank 0 (out_counts[0])")),
            std::string::npos)
      << what;
}

}  // namespace loom::comm::test_values
