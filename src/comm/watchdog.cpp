#include "comm/watchdog.h"

#include <utility>

#include "comm/deadline.h"

namespace loom::comm {

Watchdog::Watchdog(double timeout_s, std::function<void()> on_expiry) {
  const auto deadline = deadline_after(std::chrono::steady_clock::now(), timeout_s);
  thread_ = std::thread([this, deadline, expire = std::move(on_expiry)] {
    {
      std::unique_lock lock(mutex_);
      if (disarmed_.wait_until(lock, deadline, [this] { return done_; })) return;
    }
    expire();
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  disarmed_.notify_one();
  thread_.join();
}

}  // namespace loom::comm
