// Helpers shared by the libFuzzer targets of tests/fuzz/ (see README.md).
//
// The parsers under test take file descriptors (they read ELF files through
// libelf/libdw, as the agent reads /proc/PID/map_files): an input is handed
// to them as an anonymous memfd, which behaves like a regular file and needs
// no disk. Not thread-safe (libFuzzer calls a target from one thread).
//
// The large-input mode: a target linked with sparse_on.cc (the
// `<name>_large` targets of CMakeLists.txt; the others link sparse_off.cc)
// gets each input file SPARSE and huge, kSparseBytes long: the fuzz bytes at
// the start, a hole after them.
// Headers may then point gigabytes into the file and find it there (zeros),
// so a read or an allocation sized by what a header claims, rather than by a
// cap, shows as a malloc or RSS over libFuzzer's -malloc_limit_mb and
// -rss_limit_mb (bench/fuzz.sh sets them for these targets; replay_main.cc
// applies the same limits in the normal build).
#pragma once

#include <fcntl.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

#include "agent/guard/guarded_file.h"
#include "common/fd.h"

namespace tlsprof::fuzz {

// Whether input files are made sparse and huge: sparse_on.cc or sparse_off.cc
// defines it, so that a harness is compiled once for both of its targets.
extern const bool kSparseInputs;
// Far above every cap on what is read of a file (kMaxSectionBytes, 128
// MiB; the note, row and symbol caps), but inside kMaxFileBytes (8 GiB),
// which the guarded opener refuses at open: a larger file never reaches a
// parser (guard_test, and the hostile test's 64 GiB libcrypto.so.3).
inline constexpr uint64_t kSparseBytes = 6ull << 30;

// A memfd holding `size` bytes of `data`, offset 0; with `sparse`, then
// extended by a hole to kSparseBytes. Aborts if the kernel refuses (that is
// a broken harness, not a finding).
inline UniqueFd MemFile(const uint8_t* data, size_t size, bool sparse = kSparseInputs) {
  UniqueFd fd(memfd_create("tlsprof-fuzz", MFD_CLOEXEC));
  if (!fd.valid()) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd.get(), data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  if (sparse && size < kSparseBytes && ftruncate(fd.get(), static_cast<off_t>(kSparseBytes)) != 0) std::abort();
  return fd;
}

// The same bytes as the agent reads another process's file: opened through
// the guarded opener (guard::OpenHostFile of the memfd). Aborts if that
// fails (a broken harness).
inline guard::GuardedFile GuardedMemFile(const uint8_t* data, size_t size, bool sparse = kSparseInputs) {
  UniqueFd fd = MemFile(data, size, sparse);
  auto file = guard::OpenHostFile("/proc/self/fd/" + std::to_string(fd.get()));
  if (!file) std::abort();
  return std::move(*file);
}

inline UniqueFd MemFile(std::span<const uint8_t> bytes, bool sparse = kSparseInputs) {
  return MemFile(bytes.data(), bytes.size(), sparse);
}

// Splits "u32 LE length N, N bytes, the rest" (debuglink_fuzz's format for
// two files) into the two parts. False when N is larger than what follows.
inline bool SplitTwo(std::span<const uint8_t> input, std::span<const uint8_t>& first,
                     std::span<const uint8_t>& second) {
  if (input.size() < 4) return false;
  const uint32_t n = uint32_t(input[0]) | uint32_t(input[1]) << 8 | uint32_t(input[2]) << 16 | uint32_t(input[3]) << 24;
  if (n > input.size() - 4) return false;
  first = input.subspan(4, n);
  second = input.subspan(4 + n);
  return true;
}

// A private directory for targets whose code under test reads a directory
// (on /dev/shm when there is one, so nothing reaches a disk), removed at
// exit. Clear() empties it between inputs. Never destroyed: the atexit
// handler runs after the static destructors registered before it.
class ScratchDir {
 public:
  static const ScratchDir& Get() {
    static const ScratchDir& dir = *[] {
      std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::filesystem::temp_directory_path().string();
      std::string tmpl = base + "/tlsprof-fuzz.XXXXXX";
      if (mkdtemp(tmpl.data()) == nullptr) std::abort();
      auto* d = new ScratchDir(tmpl);
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(Get().path(), ec);
      });
      return d;
    }();
    return dir;
  }

  const std::string& path() const { return path_; }

  // Removes everything inside (not the directory itself).
  void Clear() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(path_, ec)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }

  // Writes `bytes` to path()/name (parents created). Aborts on failure.
  void Write(const std::string& name, std::span<const uint8_t> bytes) const {
    const std::filesystem::path file = std::filesystem::path(path_) / name;
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    UniqueFd fd(open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) std::abort();
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

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
