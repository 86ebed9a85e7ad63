// The process's and the calling thread's own CPU time, and the host's name
// (the Window's AgentCost and HostInfo). Thread-safe (getrusage,
// clock_gettime, gethostname).
#pragma once

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <string>

namespace tlsprof {

// User + system CPU seconds of this process so far.
inline double SelfCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// User + system CPU seconds of the calling thread so far. A system call: the
// vDSO does not serve thread CPU clocks.
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

inline std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace tlsprof
