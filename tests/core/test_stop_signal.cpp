#include "core/stop_signal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace loom {
namespace {

TEST(StopSignals, TheFirstSigtermIsRecordedAndTheProcessGoesOn) {
  const StopSignals stop;
  EXPECT_EQ(stop.received(), 0);
  ::kill(::getpid(), SIGTERM);
  EXPECT_EQ(stop.received(), SIGTERM);
}

TEST(StopSignals, ASecondSignalExitsAtOnceWithStatus128PlusTheSignal) {
  const pid_t child = ::fork();
  if (child == 0) {
    const StopSignals stop;
    ::kill(::getpid(), SIGINT);
    ::kill(::getpid(), SIGINT);
    ::_exit(0);  // not reached
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
}

TEST(StopSignals, ThePreviousHandlersAreRestored) {
  { const StopSignals stop; }
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

}  // namespace
}  // namespace loom
