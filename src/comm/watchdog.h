// A deadline for a blocking call that has none of its own (NCCL's
// communicator set-up, its first point-to-point connect, its teardown): a
// thread waits until the Watchdog is destroyed or the deadline passes, and
// then runs `on_expiry` (which, for NCCL, reports and aborts the job: the
// blocked call cannot be interrupted from outside).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace loom::comm {

class Watchdog {
 public:
  // timeout_s as Options::timeout_s (deadline.h saturates it).
  Watchdog(double timeout_s, std::function<void()> on_expiry);
  ~Watchdog();  // disarms; on_expiry never starts after this returns
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable disarmed_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace loom::comm
