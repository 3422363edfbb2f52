#include "comm/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>

namespace loom::comm {
namespace {

using Clock = std::chrono::steady_clock;

// parallel.timeout_s of 1e10 s and more once overflowed steady_clock's int64
// nanoseconds; the deadline saturates kMaxWaitSeconds ahead instead.
TEST(Deadline, TimeoutsPastTheClocksRangeSaturateInTheFuture) {
  const Clock::time_point now = Clock::now();
  const Clock::time_point cap = now + std::chrono::seconds(static_cast<int64_t>(kMaxWaitSeconds));
  for (double s : {1e10, 1e17, 1e300, std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(deadline_after(now, s), cap) << s << " s";
  }
}

TEST(Deadline, OrdinaryTimeoutsAreExactAndNonPositiveOnesAreNow) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(deadline_after(now, 300), now + std::chrono::seconds(300));
  EXPECT_EQ(deadline_after(now, 0.25), now + std::chrono::milliseconds(250));
  EXPECT_EQ(deadline_after(now, 0), now);
  EXPECT_EQ(deadline_after(now, -1), now);
  EXPECT_EQ(deadline_after(now, std::numeric_limits<double>::quiet_NaN()), now);
}

}  // namespace
}  // namespace loom::comm
