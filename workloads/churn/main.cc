// tlsprof-churn: exec/exit churn for the agent's discovery. It starts
// `--rate` short-lived TLS processes per second (fork and exec of
// tlsprof-churn-child, next to it; child.c) for `--duration` seconds. Each
// child does `--work-ms` of thread CPU in SHA-256 (static OpenSSL 3), then
// exits, or first sleeps `--linger-ms` (every child whose index modulo 100 is
// below `--linger-percent`), so that some churners live long enough to be
// discovered and others exit before any agent could read their maps.
//
// The driver reaps children as they exit and writes JSON at the end: how many
// it started, the rate it achieved (the machine may not keep up), and the
// children's CPU (from wait4's rusage) and measured crypto CPU (each child
// reports its own through a pipe, 8 bytes).

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "workload_util.h"

extern char** environ;

namespace {

int64_t NowNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct Totals {
  uint64_t started = 0, exited_ok = 0, failed = 0, spawn_errors = 0;
  double child_cpu_seconds = 0;
};

void Reap(Totals& totals, bool block) {
  for (;;) {
    int status = 0;
    rusage ru{};
    const pid_t pid = wait4(-1, &status, block ? 0 : WNOHANG, &ru);
    if (pid <= 0) return;
    totals.child_cpu_seconds +=
        ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++totals.exited_ok;
    } else {
      ++totals.failed;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tlsprof-churn: starts short-lived TLS processes at a fixed rate"};
  double rate = 200, duration = 20, work_ms = 0.5, linger_ms = 0;
  int linger_percent = 0;
  std::optional<int> driver_nice;
  bool driver_fifo = false;
  std::string output, ready_file;
  app.add_option("--rate", rate, "Processes started per second")->check(CLI::PositiveNumber);
  app.add_option("--duration", duration, "Seconds of churn")->check(CLI::NonNegativeNumber);
  app.add_option("--work-ms", work_ms, "Thread CPU of AES-256-GCM per child (ms)")->check(CLI::NonNegativeNumber);
  app.add_option("--linger-ms", linger_ms, "How long lingering children sleep after their work")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--linger-percent", linger_percent, "Percent of the children that linger")->check(CLI::Range(0, 100));
  app.add_option("--driver-nice", driver_nice,
                 "Nice value of the driver only (children keep the caller's): a negative one, as root, keeps "
                 "the schedule on a loaded machine");
  app.add_flag("--driver-fifo", driver_fifo,
               "Run the driver (only; not its children) as SCHED_FIFO, as root: its few microseconds per start "
               "are then never late behind a loaded machine's other tasks");
  app.add_option("--output", output, "JSON written at exit");
  app.add_option("--ready-file", ready_file, "Written (content: pid) when the churn starts");
  CLI11_PARSE(app, argc, argv);

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    return 1;
  }
  // Reads the children's reports without ever blocking the driver.
  fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  int64_t crypto_ns = 0;
  uint64_t reports = 0;
  auto drain = [&] {
    int64_t values[64];
    for (;;) {
      const ssize_t n = read(pipefd[0], values, sizeof values);
      if (n <= 0) return;
      for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(int64_t)); ++i) crypto_ns += values[i];
      reports += static_cast<uint64_t>(n) / sizeof(int64_t);
    }
  };

  // The child binary sits next to this one.
  std::string self(4096, '\0');
  const ssize_t self_len = readlink("/proc/self/exe", self.data(), self.size());
  if (self_len <= 0) {
    std::perror("readlink /proc/self/exe");
    return 1;
  }
  self.resize(static_cast<size_t>(self_len));
  const std::string child = self.substr(0, self.rfind('/') + 1) + "tlsprof-churn-child";
  const std::string work = std::to_string(work_ms), linger = std::to_string(linger_ms);
  const std::string fd_text = "3";  // the write end, as the child gets it
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

  if (!ready_file.empty() && !tlsprof::workload::WriteFileAtomically(ready_file, std::to_string(getpid()))) return 1;
  errno = 0;
  const int caller_nice = getpriority(PRIO_PROCESS, 0);
  if (driver_nice && setpriority(PRIO_PROCESS, 0, *driver_nice) != 0) {
    std::perror("setpriority --driver-nice");
    return 1;
  }
  // SCHED_RESET_ON_FORK: the children start as ordinary SCHED_OTHER tasks.
  const sched_param fifo{1};
  if (driver_fifo && sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &fifo) != 0) {
    std::perror("sched_setscheduler --driver-fifo");
    return 1;
  }
  Totals totals;
  const int64_t start = NowNs(CLOCK_MONOTONIC);
  const int64_t end = start + static_cast<int64_t>(duration * 1e9);
  const double period_ns = 1e9 / rate;
  std::vector<char*> args;
  for (uint64_t k = 0;; ++k) {
    const int64_t due = start + static_cast<int64_t>(static_cast<double>(k) * period_ns);
    if (due >= end) break;
    if (NowNs(CLOCK_MONOTONIC) < due) {
      const timespec ts{static_cast<time_t>(due / 1000000000LL), static_cast<long>(due % 1000000000LL)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
      }
    }
    const bool lingers = static_cast<int>(k % 100) < linger_percent;
    const std::string& child_linger = lingers ? linger : std::string("0");
    args = {const_cast<char*>(child.c_str()), const_cast<char*>(work.c_str()), const_cast<char*>(child_linger.c_str()),
            const_cast<char*>(fd_text.c_str()), nullptr};
    // fork, not posix_spawn: posix_spawn's vfork holds the driver until the
    // child's exec is done, and on a loaded machine that wait, not the
    // driver's own work, kept it below the rate.
    const pid_t pid = fork();
    if (pid == 0) {
      // Back to the caller's priority (raising the nice value needs no
      // privilege): the churners compete like any process.
      if (driver_nice) setpriority(PRIO_PROCESS, 0, caller_nice);
      if (null_fd >= 0) dup2(null_fd, 0);
      // The report pipe's write end is the child's fd 3, kept across exec.
      if (pipefd[1] == 3) {
        fcntl(3, F_SETFD, 0);
      } else {
        dup2(pipefd[1], 3);
      }
      execve(child.c_str(), args.data(), environ);
      _exit(127);
    }
    if (pid > 0) {
      ++totals.started;
    } else {
      ++totals.spawn_errors;
    }
    Reap(totals, false);
    drain();
  }
  const double elapsed = (NowNs(CLOCK_MONOTONIC) - start) / 1e9;
  close(pipefd[1]);
  Reap(totals, true);
  fcntl(pipefd[0], F_SETFL, 0);
  drain();

  nlohmann::json out = {
      {"started", totals.started},
      {"exited_ok", totals.exited_ok},
      {"failed", totals.failed},
      {"spawn_errors", totals.spawn_errors},
      {"elapsed_seconds", elapsed},
      {"rate_per_second", totals.started / elapsed},
      {"child_cpu_seconds", totals.child_cpu_seconds},
      {"child_crypto_cpu_seconds", crypto_ns / 1e9},
      {"child_reports", reports},
  };
  std::printf("tlsprof-churn: %s\n", out.dump().c_str());
  if (!output.empty() && !tlsprof::workload::WriteFileAtomically(output, out.dump(2))) return 1;
  return totals.failed == 0 && totals.spawn_errors == 0 ? 0 : 1;
}
