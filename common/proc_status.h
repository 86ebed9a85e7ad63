// Numeric fields of the process's own /proc/self/status: its memory for the
// symbols tests and tlsprof-symbols-loadcheck, its seccomp mode for the
// sampler's error messages. Header-only; thread-safe.
#pragma once

#include <cstring>
#include <fstream>
#include <string>

namespace tlsprof {

// The number after a field of /proc/self/status ("VmRSS:" and "VmHWM:" in
// KiB, "Seccomp:" 0/1/2); -1 if absent.
inline long ProcSelfStatusNumber(const char* field) {
  std::ifstream in("/proc/self/status");  // guarded-io: the agent's own
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

}  // namespace tlsprof
