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

// Slurm's --signal=USR1@N (PyTorch Lightning's requeue signal) stops as
// cleanly as SIGTERM: its default action would end the process unsaved.
TEST(StopSignals, Sigusr1IsAStopSignalToo) {
  const StopSignals stop;
  ::kill(::getpid(), SIGUSR1);
  EXPECT_EQ(stop.received(), SIGUSR1);
  EXPECT_STREQ(signal_name(SIGUSR1), "SIGUSR1");
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
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) {
    sigaction(signal, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_DFL) << signal;
  }
}

}  // namespace
}  // namespace loom
