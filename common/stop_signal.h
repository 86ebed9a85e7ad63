// StopSignal: a stop request that a signal handler makes and a loop sleeps
// on without polling, so an idle agent does not wake up to look at a flag
// (bench/README.md, "agent_cost.py" has what the wake-ups cost).
//
// Request() is async-signal-safe (an atomic store and a write to an eventfd);
// SleepUntil() blocks in poll() on that eventfd. Thread-safe.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tlsprof {

class StopSignal {
 public:
  using Clock = std::chrono::steady_clock;

  StopSignal() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~StopSignal() {
    if (fd_ >= 0) close(fd_);
  }
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  void Request() {
    requested_.store(true);
    if (fd_ >= 0) {
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = write(fd_, &one, sizeof(one));
    }
  }
  bool requested() const { return requested_.load(); }

  // Sleeps until `until` or a request; true if a stop was requested.
  bool SleepUntil(Clock::time_point until) const {
    for (;;) {
      if (requested()) return true;
      const auto now = Clock::now();
      if (now >= until) return false;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      if (fd_ < 0) {  // no eventfd: short naps, the request is seen within 50 ms
        std::this_thread::sleep_for(std::min<Clock::duration>(until - now, std::chrono::milliseconds(50)));
        continue;
      }
      pollfd p{fd_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    }
  }

 private:
  std::atomic<bool> requested_{false};
  const int fd_;
};

}  // namespace tlsprof
