// Helpers shared by the C++ workloads. Not thread-safe unless stated.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace tlsprof::workload {

// Writes `content` to `path` atomically (temp file + rename) so a test that
// polls for the file never reads it half-written. Returns false and prints
// the reason on failure.
inline bool WriteFileAtomically(const std::string& path, const std::string& content) {
  // Only a regular file (or a new one) is replaced by rename: renaming over
  // /dev/null or a FIFO would replace the node itself, so those are written
  // in place.
  struct stat st {};
  const bool special = stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  const std::string tmp = special ? path : path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
    return false;
  }
  const bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  if (std::fclose(f) != 0 || !ok) {
    std::fprintf(stderr, "cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
    return false;
  }
  if (!special && std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "cannot rename %s to %s: %s\n", tmp.c_str(), path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

// Blocks SIGTERM and SIGINT in the calling thread. Call it in main() before
// starting threads, so every thread inherits the mask and only
// WaitForStopSignal() ever sees the signals.
inline void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// Waits until SIGTERM/SIGINT arrives or `seconds` have passed
// (seconds <= 0 waits for a signal only). Returns the signal number, or 0 on
// timeout.
inline int WaitForStopSignal(double seconds) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const long long add_ns = static_cast<long long>(seconds * 1e9);
  long long end_ns = deadline.tv_sec * 1000000000LL + deadline.tv_nsec + add_ns;
  for (;;) {
    int sig = 0;
    if (seconds <= 0) {
      if (sigwait(&set, &sig) == 0) return sig;
      continue;
    }
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long long left = end_ns - (now.tv_sec * 1000000000LL + now.tv_nsec);
    if (left <= 0) return 0;
    timespec ts{static_cast<time_t>(left / 1000000000LL), static_cast<long>(left % 1000000000LL)};
    sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (sig < 0 && errno == EAGAIN) return 0;
    // EINTR: another signal interrupted the wait; go around.
  }
}

inline double NowSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline long long NowNanos(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// One entry of a --mix option ("name=weight,name,...").
struct MixEntry {
  std::string item;  // the entry as written
  std::string name;
  double weight;  // 1 when no '=weight' is given; -1 when it is not a number
};

// Splits a --mix value at commas into entries, skipping empty ones. Weights
// are not range-checked: callers reject !(weight >= 0).
inline std::vector<MixEntry> ParseMix(const std::string& mix) {
  std::vector<MixEntry> entries;
  std::stringstream ss(mix);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    double w = 1;
    if (eq != std::string::npos) {
      try {
        w = std::stod(item.substr(eq + 1));
      } catch (const std::exception&) {
        w = -1;
      }
    }
    entries.push_back({item, item.substr(0, eq), w});
  }
  return entries;
}

}  // namespace tlsprof::workload
