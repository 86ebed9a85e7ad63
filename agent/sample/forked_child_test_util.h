// A forked child process for the BPF tests: it signals readiness through a
// pipe, then runs `body` (which never returns: it spins) until the object is
// destroyed, when it is killed and reaped by pid. fork() keeps every address,
// so the parent can name the child's code with its own symbols. Not
// thread-safe; one test thread owns it.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "common/fd.h"

namespace tlsprof::sample {

class ForkedChild {
 public:
  // `body` runs in the child and must not return (it is _exit'ed if it does).
  template <typename Body>
  explicit ForkedChild(Body body) {
    int fds[2];
    if (pipe(fds) != 0) return;
    UniqueFd read_end(fds[0]);
    UniqueFd write_end(fds[1]);
    pid_ = fork();
    if (pid_ == 0) {
      char ready = 'r';
      if (write(write_end.get(), &ready, 1) != 1) _exit(1);
      body();
      _exit(0);
    }
    write_end.reset();
    char ready = 0;
    if (pid_ > 0 && read(read_end.get(), &ready, 1) != 1) ready = 0;
    ready_ = ready == 'r';
  }
  ~ForkedChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }

  // The CPU time the child has used so far (its process CPU clock), in
  // seconds; negative if it cannot be read.
  double cpu_seconds() const {
    clockid_t clock;
    timespec ts{};
    if (pid_ <= 0 || clock_getcpuclockid(pid_, &clock) != 0 || clock_gettime(clock, &ts) != 0) return -1;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }

  // Returns once the child has run `seconds` more of CPU, or after `timeout`
  // (false). Tests that count a child's samples wait on its CPU time, not on
  // a wall-clock time: beside other tests a spinning child gets less than a
  // CPU, and its samples per wall second depend on its neighbours.
  bool RunFor(double seconds, std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    const double start = cpu_seconds();
    if (start < 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (cpu_seconds() - start < seconds) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace tlsprof::sample
