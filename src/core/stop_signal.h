// SIGTERM / SIGINT / SIGUSR1 as a request to stop cleanly (issue 15): while
// a StopSignals is alive, the first such signal only records itself, and the
// training loop finishes its step, saves and exits; a second one ends the
// process at once (exit status 128 + signal, as a shell reports a signal).
// A scheduler's SIGTERM (Slurm, Kubernetes), Slurm's --signal=USR1@N and
// Ctrl-C thus cost at most a step, not the work since the last checkpoint.
//
//   StopSignals stop;                 // handlers installed
//   for (...) { step(); if (stop.received()) { save(); break; } }
//                                     // previous handlers restored
//
// The handler only stores to a lock-free atomic and writes a fixed message
// (async-signal-safe calls only). One process-wide flag: signal dispositions
// are themselves process-wide, so only one StopSignals may be alive at a time.
#pragma once

namespace loom {

class StopSignals {
 public:
  // on_first: what the program does on the first signal, for the message it
  // writes (a string literal: the handler reads it).
  explicit StopSignals(const char* on_first = "finishing the current step, then saving and stopping");
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();

  // The first SIGTERM, SIGINT or SIGUSR1 received since construction, or 0.
  int received() const;

  // Marks `signal` as received, as the handler does (without the message):
  // what a test uses instead of kill(2).
  static void request(int signal);
};

// "SIGTERM", "SIGINT", "SIGUSR1", or "a stop signal" for any other.
const char* signal_name(int signal);

}  // namespace loom
