#include "tenant.h"

#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/fd.h"
#include "workload_util.h"

namespace tlsprof::hostile {
namespace {

constexpr uint64_t kPage = 4096;
// Where the swapped library and the fillers go: far below the kernel's own
// choices (near the top of the address space), so the profiler reads the
// library's line first and the fillers' lines after it.
constexpr uintptr_t kVictimBase = 0x100000000000;
constexpr uintptr_t kFillerBase = 0x200000000000;

volatile sig_atomic_t g_stop = 0;

void OnStop(int) { g_stop = 1; }

[[noreturn]] void Fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

uint64_t AlignDown(uint64_t v) { return v & ~(kPage - 1); }
uint64_t AlignUp(uint64_t v) { return AlignDown(v + kPage - 1); }

void InstallStopHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Burns CPU in this program's own code for `duty` of every 20 ms, for
// `seconds` (<= 0: until a stop signal) or until `done` says so.
template <typename Done>
void Burn(double seconds, double duty, Done done) {
  const double end = seconds > 0 ? Now() + seconds : 1e300;
  volatile uint64_t sink = 0;
  while (!g_stop && Now() < end && !done()) {
    const double slice_end = Now() + 0.020 * duty;
    while (Now() < slice_end) {
      for (int i = 0; i < 1000; ++i) sink = sink * 6364136223846793005ull + 1442695040888963407ull;
    }
    if (duty < 1) {
      const auto ns = static_cast<long>(0.020 * (1 - duty) * 1e9);
      timespec ts{0, ns};
      nanosleep(&ts, nullptr);
    }
  }
}

void Burn(double seconds, double duty) {
  Burn(seconds, duty, [] { return false; });
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) Fail("cannot open " + path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("cannot read " + path);
    if (n == 0) return out;
    out.insert(out.end(), buf, buf + n);
  }
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, mode_t mode = 0644) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd.valid()) Fail("cannot create " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("cannot write " + path);
    done += static_cast<size_t>(n);
  }
}

// The PT_LOAD headers of an ELF64 image held in memory.
std::vector<Elf64_Phdr> LoadSegments(const std::vector<uint8_t>& head, const std::string& path) {
  Elf64_Ehdr e;
  if (head.size() < sizeof e || std::memcmp(head.data(), ELFMAG, SELFMAG) != 0) {
    throw std::runtime_error(path + " is not an ELF file");
  }
  std::memcpy(&e, head.data(), sizeof e);
  if (e.e_phentsize != sizeof(Elf64_Phdr) || e.e_phnum > 64 || e.e_phoff > head.size() ||
      (head.size() - e.e_phoff) / sizeof(Elf64_Phdr) < e.e_phnum) {
    throw std::runtime_error(path + ": program headers out of range");
  }
  std::vector<Elf64_Phdr> out;
  for (unsigned i = 0; i < e.e_phnum; ++i) {
    Elf64_Phdr p;
    std::memcpy(&p, head.data() + e.e_phoff + i * sizeof p, sizeof p);
    if (p.p_type == PT_LOAD && p.p_memsz > 0) out.push_back(p);
  }
  if (out.empty()) throw std::runtime_error(path + " has no PT_LOAD segment");
  return out;
}

std::vector<Elf64_Phdr> LoadSegments(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) Fail("cannot open " + path);
  std::vector<uint8_t> head(kPage);
  const ssize_t n = pread(fd.get(), head.data(), head.size(), 0);
  if (n < 0) Fail("cannot read " + path);
  head.resize(static_cast<size_t>(n));
  return LoadSegments(head, path);
}

struct Mapped {
  uintptr_t start = 0;
  size_t length = 0;
};

// Maps `path`'s PT_LOAD segments relative to one base, each with its own
// protection, as the dynamic loader lays a library out (no relocation, no
// .bss): the span is reserved first, at `at` if non-zero.
Mapped MapSegments(const std::string& path, const std::vector<Elf64_Phdr>& loads, uintptr_t at = 0) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const Elf64_Phdr& p : loads) {
    lo = std::min<uint64_t>(lo, AlignDown(p.p_vaddr));
    hi = std::max<uint64_t>(hi, AlignUp(p.p_vaddr + p.p_memsz));
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) Fail("cannot open " + path);
  void* base = mmap(reinterpret_cast<void*>(at), hi - lo, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | (at != 0 ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (base == MAP_FAILED) Fail("cannot reserve room for " + path);
  for (const Elf64_Phdr& p : loads) {
    const uint64_t start = AlignDown(p.p_vaddr), end = AlignUp(p.p_vaddr + p.p_filesz);
    if (end <= start) continue;
    const int prot = ((p.p_flags & PF_R) ? PROT_READ : 0) | ((p.p_flags & PF_W) ? PROT_WRITE : 0) |
                     ((p.p_flags & PF_X) ? PROT_EXEC : 0);
    void* where = static_cast<uint8_t*>(base) + (start - lo);
    if (mmap(where, end - start, prot, MAP_PRIVATE | MAP_FIXED, fd.get(), static_cast<off_t>(AlignDown(p.p_offset))) ==
        MAP_FAILED) {
      Fail("cannot map a segment of " + path);
    }
  }
  return {reinterpret_cast<uintptr_t>(base), hi - lo};
}

Mapped MapSegments(const std::string& path) { return MapSegments(path, LoadSegments(path)); }

// File offset of the first executable segment's first page.
uint64_t ExecOffset(const std::vector<Elf64_Phdr>& loads, const std::string& path) {
  for (const Elf64_Phdr& p : loads) {
    if (p.p_flags & PF_X) return AlignDown(p.p_offset);
  }
  throw std::runtime_error(path + " has no executable segment");
}

void MapCommon(const Common& common) {
  for (const std::string& path : common.map) MapSegments(path);
}

void Status(const std::string& path, const std::string& json) {
  if (!path.empty()) workload::WriteFileAtomically(path, json + "\n");
}

void Ready(const Common& common) {
  if (!common.ready.empty() && !workload::WriteFileAtomically(common.ready, std::to_string(getpid()) + "\n")) {
    throw std::runtime_error("cannot write the ready file " + common.ready);
  }
}

bool TimeUp(double end) { return g_stop || (end > 0 && Now() >= end); }

// Kills and reaps the children still running.
void KillAll(std::vector<pid_t>& children) {
  for (pid_t pid : children) kill(pid, SIGKILL);
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
  children.clear();
}

// One round of RunFifoSwap in its own child process: exit 0 if the
// profiler's open was seen and the library swapped, 3 if not within `wait`.
[[noreturn]] void FifoRound(const std::string& copy, Mapped victim, int watch_fd, double wait, double hold) {
  std::atomic<bool> swapped{false};
  std::thread watcher([&] {
    alignas(inotify_event) char buf[4096];
    for (;;) {
      const ssize_t n = read(watch_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      // The profiler opened the copy: it is loading what the snapshot lists.
      unlink(copy.c_str());
      mkfifo(copy.c_str(), 0644);
      munmap(reinterpret_cast<void*>(victim.start), victim.length);
      swapped = true;
      return;
    }
  });
  watcher.detach();
  Burn(wait, 0.5, [&] { return swapped.load(); });
  if (!swapped) _exit(3);
  Burn(hold, 0.5);
  _exit(0);
}

}  // namespace

int RunTenant(const Common& common) {
  InstallStopHandler();
  MapCommon(common);
  Ready(common);
  Burn(common.seconds, common.duty);
  return 0;
}

int RunFifoSwap(const Common& common, const std::string& library, const std::string& dir, int fillers, double hold) {
  InstallStopHandler();
  MapCommon(common);
  const std::vector<uint8_t> content = ReadAll(library);
  const std::vector<Elf64_Phdr> loads = LoadSegments(content, library);
  // The fillers: one copy, mapped page by page above where the victims go.
  const std::string filler = dir + "/filler.so";
  WriteFile(filler, content);
  {
    UniqueFd fd(::open(filler.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Fail("cannot open " + filler);
    const uint64_t off = ExecOffset(loads, filler);
    for (int i = 0; i < fillers; ++i) {
      void* at = reinterpret_cast<void*>(kFillerBase + static_cast<uintptr_t>(i) * 2 * kPage);
      if (mmap(at, kPage, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd.get(),
               static_cast<off_t>(off)) == MAP_FAILED) {
        Fail("cannot map filler " + std::to_string(i));
      }
    }
  }
  Ready(common);
  const double end = common.seconds > 0 ? Now() + common.seconds : 0;
  int rounds = 0, swaps = 0;
  std::vector<pid_t> children;
  while (!TimeUp(end)) {
    ++rounds;
    const std::string round_dir = dir + "/r" + std::to_string(rounds);
    mkdir(round_dir.c_str(), 0755);
    const std::string copy = round_dir + "/libhostile-victim.so";
    WriteFile(copy, content);
    const Mapped victim = MapSegments(copy, loads, kVictimBase + static_cast<uintptr_t>(rounds) * 0x10000000);
    UniqueFd watch(inotify_init1(IN_CLOEXEC));
    if (!watch.valid() || inotify_add_watch(watch.get(), copy.c_str(), IN_OPEN) < 0) Fail("inotify on " + copy);
    const pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) FifoRound(copy, victim, watch.get(), 4.0, hold);
    children.push_back(pid);
    munmap(reinterpret_cast<void*>(victim.start), victim.length);
    watch.reset();
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR && !g_stop) {
    }
    if (g_stop) break;
    children.clear();
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++swaps;
    std::ostringstream s;
    s << "{\"rounds\": " << rounds << ", \"swapped\": " << swaps << "}";
    Status(common.status, s.str());
  }
  KillAll(children);
  return 0;
}

int RunTruncateLoop(const Common& common, const std::string& library, const std::string& path, int spawn_ms) {
  InstallStopHandler();
  MapCommon(common);
  const std::vector<uint8_t> content = ReadAll(library);
  const std::vector<Elf64_Phdr> loads = LoadSegments(content, library);
  WriteFile(path, content);
  std::vector<pid_t> children;
  // The rewriter: truncate to nothing, write it all back, pause 5-15 ms.
  const pid_t rewriter = fork();
  if (rewriter < 0) Fail("fork");
  if (rewriter == 0) {
    std::minstd_rand rng(static_cast<unsigned>(getpid()));
    uint64_t rewrites = 0;
    while (!g_stop) {
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd.valid() || ftruncate(fd.get(), 0) != 0) _exit(1);
      for (size_t done = 0; done < content.size();) {
        const ssize_t n = pwrite(fd.get(), content.data() + done, content.size() - done, static_cast<off_t>(done));
        if (n <= 0) _exit(1);
        done += static_cast<size_t>(n);
      }
      ++rewrites;
      if (rewrites % 64 == 0) {
        Status(common.status.empty() ? "" : common.status + ".rewriter",
               "{\"rewrites\": " + std::to_string(rewrites) + "}");
      }
      timespec ts{0, static_cast<long>(5'000'000 + rng() % 10'000'000)};
      nanosleep(&ts, nullptr);
    }
    _exit(0);
  }
  children.push_back(rewriter);
  Ready(common);
  const double end = common.seconds > 0 ? Now() + common.seconds : 0;
  int mappers = 0;
  while (!TimeUp(end)) {
    std::erase_if(children, [](pid_t pid) { return waitpid(pid, nullptr, WNOHANG) == pid; });
    const pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) {
      // The headers come from memory: the file may be empty right now, and a
      // mapping past its end is allowed until someone touches it.
      MapSegments(path, loads);
      Burn(1.5, 0.5);
      _exit(0);
    }
    children.push_back(pid);
    ++mappers;
    Status(common.status, "{\"mappers\": " + std::to_string(mappers) + "}");
    const double next = Now() + spawn_ms / 1000.0;
    while (!TimeUp(end) && Now() < next) {
      timespec ts{0, 20'000'000};
      nanosleep(&ts, nullptr);
    }
  }
  KillAll(children);  // the rewriter and the mappers still burning
  return 0;
}

int RunManyMaps(const Common& common, const std::string& file, int count) {
  InstallStopHandler();
  MapCommon(common);
  const std::vector<Elf64_Phdr> loads = LoadSegments(file);
  const uint64_t off = ExecOffset(loads, file);
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) Fail("cannot open " + file);
  // A free range twice the size (a page mapped, a page left out), found by
  // reserving and releasing it: nothing else maps in between.
  const size_t span = static_cast<size_t>(count) * 2 * kPage;
  void* region = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) Fail("cannot find room for the mappings");
  munmap(region, span);
  for (int i = 0; i < count; ++i) {
    void* at = static_cast<uint8_t*>(region) + static_cast<size_t>(i) * 2 * kPage;
    if (mmap(at, kPage, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd.get(), static_cast<off_t>(off)) ==
        MAP_FAILED) {
      Fail("cannot make mapping " + std::to_string(i));
    }
  }
  Status(common.status, "{\"mappings\": " + std::to_string(count) + "}");
  Ready(common);
  Burn(common.seconds, common.duty);
  return 0;
}

}  // namespace tlsprof::hostile
