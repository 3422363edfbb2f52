#include <gtest/gtest.h>

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

TEST(Threads, DefaultIsPositiveAndDividesAmongRanks) {
  const int all = default_num_threads();
  EXPECT_GE(all, 1);
  EXPECT_EQ(default_num_threads(1000000), 1);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(all);
  EXPECT_EQ(num_threads(), all);
  EXPECT_THROW(set_num_threads(0), Error);
}
