#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <vector>

#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"

using namespace loom;

TEST(Check, FailureNamesFileLineConditionAndValues) {
  const int n = 3, m = 5;
  try {
    LOOM_CHECK(n == m, "n=", n, " m=", m);
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test_check.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("n == m"), std::string::npos) << what;
    EXPECT_NE(what.find("n=3 m=5"), std::string::npos) << what;
  }
}

TEST(Check, RequireThrowsUserFacingError) {
  EXPECT_THROW(LOOM_REQUIRE(false, "bad value ", 7), Error);
  EXPECT_NO_THROW(LOOM_REQUIRE(true, "fine"));
}

TEST(Log, LinesCarryTheRankPrefix) {
  set_log_rank(2, 8);
  testing::internal::CaptureStdout();
  log_info("hello ", 42);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "[rank 2/8] hello 42\n");
  testing::internal::CaptureStderr();
  log_warn("careful");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[rank 2/8] warning: careful\n");
  set_log_rank(0, 1);
}

CpuMask cpus(std::initializer_list<int> ids) {
  CpuMask m{};
  for (int id : ids) m[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
  return m;
}

// Processes that share their CPUs split them; processes a launcher bound to
// CPUs of their own keep them all (srun --cpus-per-task, mpirun --bind-to).
TEST(Threads, EachProcessGetsItsShareOfTheCpusItMayRunOn) {
  const CpuMask eight = cpus({0, 1, 2, 3, 4, 5, 6, 7});
  const std::vector<CpuMask> unbound(4, eight);
  for (int me = 0; me < 4; ++me) EXPECT_EQ(share_of_cpus(unbound, me), 2);
  const std::vector<CpuMask> bound = {cpus({0, 1}), cpus({2, 3}), cpus({4, 5}), cpus({6, 7})};
  for (int me = 0; me < 4; ++me) EXPECT_EQ(share_of_cpus(bound, me), 2);
  // Two per socket of four: each socket split between its two processes.
  const std::vector<CpuMask> sockets = {cpus({0, 1, 2, 3}), cpus({0, 1, 2, 3}), cpus({4, 5, 6, 7}), cpus({4, 5, 6, 7})};
  EXPECT_EQ(share_of_cpus(sockets, 3), 2);
  // CPUs past the first word; more processes than CPUs still get one thread.
  EXPECT_EQ(share_of_cpus(std::vector<CpuMask>{cpus({64, 65, 700})}, 0), 3);
  EXPECT_EQ(share_of_cpus(std::vector<CpuMask>(5, cpus({0, 1})), 4), 1);
  // One alone: all of its CPUs.
  EXPECT_EQ(share_of_cpus(std::vector<CpuMask>{eight}, 0), 8);
}

TEST(Threads, DefaultIsPositiveAndSetsOpenMp) {
  const int all = default_num_threads();
  EXPECT_GE(all, 1);
  int mine = 0;
  for (uint64_t word : this_process_cpus()) mine += std::popcount(word);
  EXPECT_EQ(all, std::max(1, mine));
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(all);
  EXPECT_EQ(num_threads(), all);
  EXPECT_THROW(set_num_threads(0), Error);
}
