// Deadlines from a timeout in seconds (Options::timeout_s), saturated: a
// timeout too large for steady_clock's int64 nanoseconds waits "forever"
// instead of overflowing into the past (an immediate watchdog abort) or into
// a deadline no wait can reach (a busy loop).
#pragma once

#include <algorithm>
#include <chrono>

namespace loom::comm {

// About 31.7 years: from + this stays inside int64 nanoseconds for any
// steady_clock epoch (the machine's boot) younger than 250 years.
inline constexpr double kMaxWaitSeconds = 1e9;

// from + seconds, with seconds clamped to [0, kMaxWaitSeconds] (NaN: 0).
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::steady_clock::time_point from,
                                                            double seconds) {
  const double s = seconds > 0 ? std::min(seconds, kMaxWaitSeconds) : 0.0;
  return from + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace loom::comm
