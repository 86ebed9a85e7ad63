// The process's own memory as /proc/self/status reports it, for the memory
// checks of the symbols tests and of tlsprof-symbols-loadcheck. Header-only;
// thread-safe.
#pragma once

#include <cstring>
#include <fstream>
#include <string>

namespace tlsprof::symbols {

// A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"); -1 if absent.
inline long ProcStatusKb(const char* field) {
  std::ifstream in("/proc/self/status");  // guarded-io: the agent's own
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

}  // namespace tlsprof::symbols
