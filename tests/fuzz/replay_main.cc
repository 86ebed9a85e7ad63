// A main() for the fuzz targets in the normal (non-libFuzzer) build: runs
// every file named on the command line, or found in a directory named there,
// through LLVMFuzzerTestOneInput once. CTest runs each target over its corpus
// this way, so that every seed, and every input that once crashed a target,
// is replayed by every CI run (tests/fuzz/README.md).
//
// It takes libFuzzer's two resource flags and enforces them as libFuzzer
// does, so that an input kept for an unbounded allocation fails here too:
//   -malloc_limit_mb=N  a single malloc/calloc/realloc (operator new included)
//                       of N MiB or more aborts, naming its size. (Not in a
//                       sanitizer build, whose runtime owns malloc; there the
//                       libFuzzer binary replays the corpus instead.)
//   -rss_limit_mb=N     a peak RSS over N MiB after an input fails the run.
//   -timeout=N          an input that runs longer than N seconds fails the run.
// Other flags starting with '-' are ignored.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

size_t malloc_limit_mb = 0;  // 0: none
long long timeout_seconds = 0;

void OnTimeout(int) {
  // Async-signal-safe: write(2) only. The input's name was printed before it ran.
  static const char kMessage[] = "==ERROR: timeout: the input above ran longer than -timeout\n";
  (void)!write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  _exit(70);
}

}  // namespace

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define TLSPROF_REPLAY_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TLSPROF_REPLAY_SANITIZED 1
#endif

#ifndef TLSPROF_REPLAY_SANITIZED
// glibc's allocator under its own names; defining malloc here interposes it
// for the whole process (libelf, libdw, libstdc++'s operator new), and
// free() stays glibc's, which these allocate from.
extern "C" void* __libc_malloc(size_t size);
extern "C" void* __libc_calloc(size_t n, size_t size);
extern "C" void* __libc_realloc(void* p, size_t size);

namespace {

[[noreturn]] void ReportOverLimit(const char* fn, size_t size) {
  // No allocation on this path: fprintf to stderr is unbuffered.
  std::fprintf(stderr, "==ERROR: out-of-memory (%s(%zu)): -malloc_limit_mb=%zu\n", fn, size, malloc_limit_mb);
  std::abort();
}

// As libFuzzer's HandleMalloc: whole MiB, at the limit or over.
bool OverLimit(size_t size) { return malloc_limit_mb != 0 && (size >> 20) >= malloc_limit_mb; }

}  // namespace

extern "C" void* malloc(size_t size) noexcept {
  if (OverLimit(size)) ReportOverLimit("malloc", size);
  return __libc_malloc(size);
}

extern "C" void* calloc(size_t n, size_t size) noexcept {
  if (size != 0 && (n > SIZE_MAX / size || OverLimit(n * size))) ReportOverLimit("calloc", n * size);
  return __libc_calloc(n, size);
}

extern "C" void* realloc(void* p, size_t size) noexcept {
  if (OverLimit(size)) ReportOverLimit("realloc", size);
  return __libc_realloc(p, size);
}
#endif

namespace {

// The value of "-name=N", or -1 when `arg` is not that flag.
long long Flag(std::string_view arg, std::string_view name) {
  if (arg.size() <= name.size() + 2 || arg[0] != '-' || arg.substr(1, name.size()) != name ||
      arg[name.size() + 1] != '=') {
    return -1;
  }
  return std::atoll(std::string(arg.substr(name.size() + 2)).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  long long rss_limit_mb = 0;
  std::vector<fs::path> files;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (long long v = Flag(arg, "malloc_limit_mb"); v >= 0) {
      malloc_limit_mb = static_cast<size_t>(v);
    } else if (long long v = Flag(arg, "rss_limit_mb"); v >= 0) {
      rss_limit_mb = v;
    } else if (long long v = Flag(arg, "timeout"); v >= 0) {
      timeout_seconds = v;
    } else if (!arg.starts_with("-")) {
      inputs.emplace_back(arg);
    }
  }
  LLVMFuzzerInitialize(&argc, &argv);
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(input)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else if (fs::is_regular_file(input, ec)) {
      files.emplace_back(input);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", input.c_str());
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no inputs: pass corpus directories or files\n");
    return 2;
  }
  std::sort(files.begin(), files.end());
  if (timeout_seconds > 0) signal(SIGALRM, OnTimeout);
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "%s: cannot read\n", path.c_str());
      return 2;
    }
    // Printed first, so that a crash names its input.
    std::fprintf(stderr, "%s (%zu bytes)\n", path.c_str(), bytes.size());
    if (timeout_seconds > 0) alarm(static_cast<unsigned>(timeout_seconds));
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    alarm(0);
    struct rusage ru {};
    if (rss_limit_mb > 0 && getrusage(RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss / 1024 > rss_limit_mb) {
      std::fprintf(stderr, "==ERROR: out-of-memory (used: %ld Mb; exceeds: %lld Mb) after %s\n", ru.ru_maxrss / 1024,
                   rss_limit_mb, path.c_str());
      return 1;
    }
  }
  std::printf("%zu inputs replayed\n", files.size());
  return 0;
}
