// A forked child process for the BPF tests: it signals readiness through a
// pipe, then runs `body` (which never returns: it spins) until the object is
// destroyed, when it is killed and reaped by pid. fork() keeps every address,
// so the parent can name the child's code with its own symbols.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "agent/common/fd.h"

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

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace tlsprof::sample
