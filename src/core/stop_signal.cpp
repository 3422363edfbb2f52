#include "core/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "core/error.h"

namespace loom {

namespace {

// The one place state must be global: a signal handler reaches nothing else.
std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
std::atomic<const char*> g_on_first{""};
struct sigaction g_old_term {}, g_old_int {}, g_old_usr1 {};

void write_stderr(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  (void)!::write(STDERR_FILENO, text, n);
}

void on_stop_signal(int signal) {
  int expected = 0;
  if (g_received.compare_exchange_strong(expected, signal)) {
    write_stderr(signal == SIGINT ? "\nloom: SIGINT: " : signal == SIGUSR1 ? "\nloom: SIGUSR1: " : "\nloom: SIGTERM: ");
    write_stderr(g_on_first.load());
    write_stderr(" (send it again to stop at once)\n");
    return;
  }
  write_stderr("\nloom: second stop signal: exiting at once\n");
  ::_exit(128 + signal);
}

static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");
static_assert(std::atomic<const char*>::is_always_lock_free, "the handler reads the message lock-free");

}  // namespace

StopSignals::StopSignals(const char* on_first) {
  LOOM_CHECK(!g_installed.exchange(true), "two StopSignals alive at once");
  g_received = 0;
  g_on_first = on_first;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI progress, file I/O) go on
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  g_installed = false;
}

int StopSignals::received() const { return g_received.load(); }

void StopSignals::request(int signal) {
  int expected = 0;
  g_received.compare_exchange_strong(expected, signal);
}

const char* signal_name(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGUSR1) return "SIGUSR1";
  return "a stop signal";
}

}  // namespace loom
