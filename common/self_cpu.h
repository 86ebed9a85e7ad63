// The process's own CPU time and the host's name (the Window's AgentCost and
// HostInfo). Thread-safe (getrusage/gethostname).
#pragma once

#include <sys/resource.h>
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

inline std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace tlsprof
