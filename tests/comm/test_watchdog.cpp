#include "comm/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace loom::comm {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Watchdog, ACallPastItsDeadlineRunsTheExpiryOnce) {
  std::atomic<int> expired{0};
  {
    Watchdog dog(0.05, [&] { ++expired; });
    const auto start = Clock::now();
    while (expired.load() == 0 && Clock::now() - start < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(40));  // not before its deadline
  }
  EXPECT_EQ(expired.load(), 1);
}

TEST(Watchdog, ACallThatEndsInTimeNeverExpires) {
  std::atomic<int> expired{0};
  { Watchdog dog(0.2, [&] { ++expired; }); }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(expired.load(), 0);
}

// timeout_s of a job that waits "forever" (1e300: deadline.h saturates it):
// the watchdog is disarmed at once, not after its deadline.
TEST(Watchdog, DisarmingDoesNotWaitForTheDeadline) {
  const auto start = Clock::now();
  bool expired = false;
  { Watchdog dog(1e300, [&] { expired = true; }); }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(expired);
}

}  // namespace
}  // namespace loom::comm
