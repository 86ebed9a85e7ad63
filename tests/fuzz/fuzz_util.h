// Helpers shared by the libFuzzer targets of tests/fuzz/ (see README.md).
//
// The parsers under test take file descriptors (they read ELF files through
// libelf/libdw, as the agent reads /proc/PID/map_files): an input is handed
// to them as an anonymous memfd, which behaves like a regular file and needs
// no disk. Not thread-safe (libFuzzer calls a target from one thread).
#pragma once

#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent/guard/guarded_file.h"
#include "common/fd.h"

namespace tlsprof::fuzz {

// A memfd holding `size` bytes of `data`, offset 0. Aborts if the kernel
// refuses (that is a broken harness, not a finding).
inline UniqueFd MemFile(const uint8_t* data, size_t size) {
  UniqueFd fd(memfd_create("tlsprof-fuzz", MFD_CLOEXEC));
  if (!fd.valid()) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd.get(), data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return fd;
}

// The same bytes as the agent reads another process's file: opened through
// the guarded opener (guard::OpenHostFile of the memfd). Aborts if that
// fails (a broken harness).
inline guard::GuardedFile GuardedMemFile(const uint8_t* data, size_t size) {
  UniqueFd fd = MemFile(data, size);
  auto file = guard::OpenHostFile("/proc/self/fd/" + std::to_string(fd.get()));
  if (!file) std::abort();
  return std::move(*file);
}

// Logs at every level into a sink that drops the lines: the messages about
// malformed input are still formatted (a bad format argument is a finding
// too), but the fuzzer's output stays readable and fast.
inline void QuietLogs() {
  auto logger = std::make_shared<spdlog::logger>("fuzz", std::make_shared<spdlog::sinks::null_sink_mt>());
  logger->set_level(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

// Reads a little-endian u32 from the front of the input and consumes it;
// 0 when fewer than 4 bytes are left.
inline uint32_t TakeU32(const uint8_t*& data, size_t& size) {
  if (size < 4) return 0;
  uint32_t v = uint32_t(data[0]) | uint32_t(data[1]) << 8 | uint32_t(data[2]) << 16 | uint32_t(data[3]) << 24;
  data += 4;
  size -= 4;
  return v;
}

}  // namespace tlsprof::fuzz
