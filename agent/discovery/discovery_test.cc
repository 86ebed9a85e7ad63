#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "agent/discovery/proc_maps.h"
#include "agent/discovery/process_registry.h"
#include "agent/guard/deadline.h"
#include "agent/guard/guarded_file.h"
#include "agent/guard/limits.h"

namespace tlsprof::discovery {
namespace {

TEST(ParseMaps, ReadsEveryField) {
  auto maps = ParseMaps(
      "55d0c2a00000-55d0c2a21000 r--p 00000000 fd:01 1311 /usr/bin/nginx\n"
      "7f1c2a000000-7f1c2a200000 r-xp 00002000 fd:01 99  /usr/lib/x86_64-linux-gnu/libcrypto.so.3\n"
      "7f1c2b000000-7f1c2b001000 r-xp 00001000 08:02 42 /tmp/lib with space.so (deleted)\n"
      "7ffd4b5e0000-7ffd4b601000 rw-p 00000000 00:00 0                          [stack]\n"
      "7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0 \n");
  ASSERT_TRUE(maps.ok()) << maps.error().message;
  ASSERT_EQ(maps->size(), 5u);
  const Mapping& crypto = (*maps)[1];
  EXPECT_EQ(crypto.start, 0x7f1c2a000000u);
  EXPECT_EQ(crypto.end, 0x7f1c2a200000u);
  EXPECT_EQ(crypto.offset, 0x2000u);
  EXPECT_EQ(crypto.dev_major, 0xfdu);
  EXPECT_EQ(crypto.dev_minor, 1u);
  EXPECT_EQ(crypto.inode, 99u);
  EXPECT_TRUE(crypto.executable);
  EXPECT_FALSE(crypto.deleted);
  EXPECT_EQ(crypto.path, "/usr/lib/x86_64-linux-gnu/libcrypto.so.3");
  EXPECT_TRUE(crypto.is_file());
  EXPECT_FALSE((*maps)[0].executable);
  EXPECT_TRUE((*maps)[2].deleted);
  EXPECT_EQ((*maps)[2].path, "/tmp/lib with space.so");
  EXPECT_EQ((*maps)[3].path, "[stack]");
  EXPECT_FALSE((*maps)[3].is_file());
  EXPECT_TRUE((*maps)[4].path.empty());
}

TEST(ParseMaps, RejectsMalformedLinesWithTheLineNumber) {
  for (const char* bad : {"zzzz-1000 r-xp 0 fd:01 1 /x\n", "1000 r-xp 0 fd:01 1 /x\n", "2000-1000 r-xp 0 fd:01 1 /x\n",
                          "1000-2000 r-xp 0 fd01 1 /x\n", "1000-2000 r-xp 0 fd:01 x1 /x\n", "1000-2000 r\n"}) {
    auto maps = ParseMaps(std::string("1000-2000 r-xp 00000000 fd:01 1 /ok\n") + bad);
    ASSERT_FALSE(maps.ok()) << bad;
    EXPECT_NE(maps.error().message.find("line 2"), std::string::npos) << maps.error().message;
  }
  auto empty = ParseMaps("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(ReadExecMaps, FindsOurOwnExecutableAndLibc) {
  auto maps = ReadExecMaps(getpid());
  ASSERT_TRUE(maps.ok()) << maps.error().message;
  EXPECT_FALSE(maps->cut);
  auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  bool found_self = false, found_libc = false;
  for (const auto& m : maps->mappings) {
    EXPECT_TRUE(m.executable && m.is_file()) << m.path;
    if (m.executable && m.path == self) found_self = true;
    if (m.executable && m.path.find("libc.so") != std::string::npos) found_libc = true;
  }
  EXPECT_TRUE(found_self);
  EXPECT_TRUE(found_libc);
  EXPECT_FALSE(ReadComm(getpid()).empty());
}

TEST(ReadExecMaps, GoneProcessIsAnErrorNotACrash) {
  auto maps = ReadExecMaps(0x7ffffff0);
  ASSERT_FALSE(maps.ok());
  EXPECT_NE(maps.error().message.find("gone"), std::string::npos);
}

// A process with more executable mappings than the agent keeps (a tenant
// mapping one file thousands of times) is cut at the cap, counted, and what
// was kept is still usable.
TEST(ReadExecMaps, ManyMappingsAreCutAtTheCap) {
  const size_t n = guard::kMaxExecMappings + 500;
  const long page = sysconf(_SC_PAGESIZE);
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // One reserved range, then every other page of it mapped from the file:
  // neighbours are not merged into one mapping.
  char* base = static_cast<char*>(mmap(nullptr, 2 * n * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  for (size_t i = 0; i < n; ++i) {
    void* at = mmap(base + 2 * i * page, page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0);
    ASSERT_NE(at, MAP_FAILED);
  }
  close(fd);
  const uint64_t before = guard::RefusalCounts()[static_cast<size_t>(guard::Reason::kMaps)];
  auto maps = ReadExecMaps(getpid());
  munmap(base, 2 * n * page);
  ASSERT_TRUE(maps.ok()) << maps.error().message;
  EXPECT_TRUE(maps->cut);
  EXPECT_EQ(maps->mappings.size(), guard::kMaxExecMappings);
  EXPECT_EQ(guard::RefusalCounts()[static_cast<size_t>(guard::Reason::kMaps)], before + 1);
}

TEST(Registry, FindsTheSystemLibcryptoInAProcessThatMapsIt) {
  // dlopen the system OpenSSL so this very process maps it.
  void* handle = dlopen("libcrypto.so.3", RTLD_NOW);
  ASSERT_NE(handle, nullptr) << dlerror();
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const ProcessSnapshot* snap = registry.Get(getpid());
  ASSERT_NE(snap, nullptr);
  EXPECT_TRUE(snap->has_tls());
  bool found = false;
  for (const auto& m : snap->mappings) {
    if (m.mapping.path.find("libcrypto.so.3") == std::string::npos) continue;
    ASSERT_TRUE(m.image);
    ASSERT_TRUE(m.image->tls.has_value());
    EXPECT_EQ(m.image->tls->kind, classify::LibraryKind::kOpenSSL3);
    EXPECT_TRUE(m.image->tls->whole_file_is_tls);
    EXPECT_FALSE(m.image->image->build_id.empty());
    // Address lookup through the process snapshot lands in the mapping.
    void* sym = dlsym(handle, "EVP_EncryptUpdate");
    ASSERT_NE(sym, nullptr);
    const auto* found_mapping = snap->Find(reinterpret_cast<uint64_t>(sym));
    ASSERT_NE(found_mapping, nullptr);
    EXPECT_EQ(found_mapping->image, m.image);
    found = true;
  }
  EXPECT_TRUE(found);
  // Our own test binary carries no TLS library.
  auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const auto& m : snap->mappings) {
    if (m.mapping.path == self) {
      EXPECT_FALSE(m.image && m.image->tls.has_value());
    }
  }
}

// libc's write() wrapper issues the system call itself: the address after
// its `syscall` instruction (found in this process's own code) is a syscall
// return, the wrapper's first instruction and the byte before are not.
TEST(Registry, FindsTheSyscallReturnInLibcsWrite) {
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const ProcessSnapshot* snap = registry.Get(getpid());
  ASSERT_NE(snap, nullptr);
  void* handle = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << dlerror();
  const auto* code = static_cast<const unsigned char*>(dlsym(handle, "write"));
  ASSERT_NE(code, nullptr);
  size_t after = 0;
  for (size_t i = 0; i + 1 < 64; ++i) {
    if (code[i] == 0x0f && code[i + 1] == 0x05) {
      after = i + 2;
      break;
    }
  }
  ASSERT_NE(after, 0u) << "no syscall instruction in the first 64 bytes of write()";
  const auto* m = snap->Find(reinterpret_cast<uint64_t>(code));
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->image && m->image->image);
  const auto ret = reinterpret_cast<uint64_t>(code + after);
  EXPECT_TRUE(registry.IsSyscallReturn(*m, ret));
  EXPECT_FALSE(registry.IsSyscallReturn(*m, reinterpret_cast<uint64_t>(code)));
  EXPECT_FALSE(registry.IsSyscallReturn(*m, ret - 1));
  EXPECT_TRUE(registry.IsSyscallReturn(*m, ret)) << "a cached answer must not change";
  dlclose(handle);
}

TEST(Registry, FindsDebiansSharedBoringSSL) {
  // android-libboringssl: a stripped BoringSSL shared build whose libcrypto
  // also exports OpenSSL-looking names such as OPENSSL_init_crypto.
  constexpr const char* kPath = "/usr/lib/x86_64-linux-gnu/android/libcrypto.so.0";
  void* handle = dlopen(kPath, RTLD_NOW);
  ASSERT_NE(handle, nullptr) << dlerror();
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const ProcessSnapshot* snap = registry.Get(getpid());
  ASSERT_NE(snap, nullptr);
  void* sym = dlsym(handle, "EVP_AEAD_CTX_seal");
  ASSERT_NE(sym, nullptr);
  const auto* m = snap->Find(reinterpret_cast<uint64_t>(sym));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->mapping.path, kPath);
  ASSERT_TRUE(m->image && m->image->tls.has_value());
  EXPECT_EQ(m->image->tls->kind, classify::LibraryKind::kBoringSSL);
  EXPECT_TRUE(m->image->tls->whole_file_is_tls);
}

// A child that waits until it is killed; the caller kills and reaps it.
pid_t PausedChild() {
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  return child;
}

TEST(Registry, KeepsTheLastSnapshotOfAProcessThatExited) {
  const pid_t child = PausedChild();
  ASSERT_GE(child, 0);
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(child).ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(registry.Refresh(child).ok());
  const ProcessSnapshot* snap = registry.Get(child);
  ASSERT_NE(snap, nullptr);
  EXPECT_TRUE(snap->exited);
  EXPECT_FALSE(snap->mappings.empty());
}

// From its exit until its parent reaps it, a process reads as its old start
// time with no executable and empty maps. A window's close that reads it
// then must keep the snapshot its samples are attributed with: it is
// neither another process nor another program.
TEST(Registry, KeepsTheSnapshotOfAProcessExitingUnreaped) {
  const pid_t child = PausedChild();
  ASSERT_GE(child, 0);
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(child).ok());
  const size_t mapped = registry.Get(child)->mappings.size();
  ASSERT_GT(mapped, 0u);
  kill(child, SIGKILL);
  // A zombie: waitid with WNOWAIT sees the exit and leaves it unreaped.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  auto identity = ReadProcessIdentity(child);
  ASSERT_TRUE(identity.ok()) << identity.error().message;
  EXPECT_FALSE(identity->has_exe());
  EXPECT_FALSE(registry.Replaced(child));
  EXPECT_EQ(registry.stats().processes_replaced, 0u);
  EXPECT_FALSE(registry.Refresh(child).ok());
  const ProcessSnapshot* snap = registry.Get(child);
  ASSERT_NE(snap, nullptr);
  EXPECT_TRUE(snap->exited);
  EXPECT_EQ(snap->mappings.size(), mapped);
  waitpid(child, nullptr, 0);
}

TEST(ProcessIdentity, OnlyAnotherStartTimeOrAnotherReadableExeIsAnotherProcess) {
  const ProcessIdentity running{100, 2049, 77};
  EXPECT_FALSE(running.ReplacedBy(running));
  EXPECT_TRUE(running.ReplacedBy({101, 2049, 77}));  // the pid was reused
  EXPECT_TRUE(running.ReplacedBy({100, 2049, 78}));  // exec
  EXPECT_TRUE(running.ReplacedBy({100, 2050, 77}));
  EXPECT_FALSE(running.ReplacedBy({100, 0, 0}));  // exiting: no exe to read
  EXPECT_TRUE(running.ReplacedBy({101, 0, 0}));
  const ProcessIdentity kernel_thread{5, 0, 0};
  EXPECT_FALSE(kernel_thread.ReplacedBy(kernel_thread));
}

TEST(ParseStatStartTime, CountsFieldsAfterTheLastParenthesis) {
  // A command name with spaces and ") (" in it, as a process may choose.
  const std::string stat =
      "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 987654321 1000000 200 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  auto start = ParseStatStartTime(stat);
  ASSERT_TRUE(start.ok()) << start.error().message;
  EXPECT_EQ(*start, 987654321u);
  EXPECT_FALSE(ParseStatStartTime("4242 (no closing paren S 1 2").ok());
  EXPECT_FALSE(ParseStatStartTime("4242 (short) S 1 2 3").ok());
}

TEST(ReadProcessIdentity, NamesThisProcessAndItsExecutable) {
  auto id = ReadProcessIdentity(getpid());
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_GT(id->start_time, 0u);
  struct stat st {};
  ASSERT_EQ(stat("/proc/self/exe", &st), 0);
  EXPECT_EQ(id->exe_dev, st.st_dev);
  EXPECT_EQ(id->exe_inode, st.st_ino);
  auto again = ReadProcessIdentity(getpid());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *id);
}

// A process that calls execve keeps its pid (and start time) but runs
// another program: the registry tells, so the caller reads it again.
TEST(Registry, TellsAProcessThatExecedAnotherProgram) {
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(go[1]);
    char c;
    if (read(go[0], &c, 1) == 1) execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    _exit(1);
  }
  close(go[0]);
  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(child).ok());
  EXPECT_FALSE(registry.Replaced(child));
  const auto before = registry.Get(child)->identity;
  ASSERT_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  // Wait (bounded) until the exec happened: /proc/PID/exe names sleep.
  std::error_code ec;
  const auto sleep_bin = std::filesystem::canonical("/bin/sleep");
  for (int i = 0; i < 1000 && std::filesystem::read_symlink(fmt::format("/proc/{}/exe", child), ec) != sleep_bin; ++i)
    usleep(5000);
  ASSERT_EQ(std::filesystem::read_symlink(fmt::format("/proc/{}/exe", child), ec), sleep_bin);
  EXPECT_TRUE(registry.Replaced(child));
  EXPECT_EQ(registry.stats().processes_replaced, 1u);
  ASSERT_TRUE(registry.Refresh(child).ok());
  EXPECT_FALSE(registry.Replaced(child));
  const ProcessSnapshot* snap = registry.Get(child);
  EXPECT_EQ(snap->identity.start_time, before.start_time);
  EXPECT_NE(snap->identity.exe_inode, before.exe_inode);
  EXPECT_EQ(snap->comm, "sleep");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Gone: nothing to compare with, so not "replaced".
  EXPECT_FALSE(registry.Replaced(child));
}

// A Go ground truth (workloads/go-groundtruth) started for a test and
// stopped, by its pid, when the test ends.
class GoGroundTruth {
 public:
  explicit GoGroundTruth(const std::string& binary)
      : path_(std::string(TLSPROF_BINARY_DIR) + "/bin/" + binary),
        ready_(std::filesystem::temp_directory_path() / fmt::format("tlsprof-discovery-{}-{}", getpid(), binary)) {
    std::filesystem::remove(ready_);
    pid_ = fork();
    if (pid_ == 0) {
      // SHA-256 alone: no key generation, ready at once; 0 = until SIGTERM.
      execl(path_.c_str(), path_.c_str(), "--mix", "sha256=1", "--warmup", "0", "--duration", "0", "--output",
            "/dev/null", "--ready-file", ready_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~GoGroundTruth() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(ready_);
  }
  const std::string& path() const { return path_; }
  pid_t pid() const { return pid_; }
  // Waits (bounded) for the ready file; false if the process exited first.
  bool WaitReady() {
    for (int i = 0; i < 2000; ++i) {
      if (std::filesystem::exists(ready_)) return true;
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      usleep(5000);
    }
    return false;
  }

 private:
  std::string path_;
  std::filesystem::path ready_;
  pid_t pid_ = -1;
};

// A Go binary's crypto/* is its TLS library whether or not crypto/tls is
// linked (docs/attribution.md): the ground truth with crypto/tls, the same
// linked -s -w (names from .gopclntab only) and tlsprof-go-crypto, which
// links crypto/* without crypto/tls, are each found as Go.
TEST(Registry, FindsGoCryptoWithAndWithoutCryptoTls) {
  for (const char* binary : {"tlsprof-go-groundtruth", "tlsprof-go-groundtruth-stripped", "tlsprof-go-crypto"}) {
    SCOPED_TRACE(binary);
    GoGroundTruth gt(binary);
    ASSERT_TRUE(std::filesystem::exists(gt.path()))
        << gt.path() << " is not built (cmake --build build --target " << binary << ")";
    ASSERT_TRUE(gt.WaitReady()) << gt.path() << " exited or was not ready in 10 s";
    ProcessRegistry registry;
    ASSERT_TRUE(registry.Refresh(gt.pid()).ok());
    const ProcessSnapshot* snap = registry.Get(gt.pid());
    ASSERT_NE(snap, nullptr);
    EXPECT_TRUE(snap->has_tls());
    const auto exe = std::filesystem::canonical(gt.path()).string();
    bool found = false;
    for (const auto& m : snap->mappings) {
      if (m.mapping.path != exe) continue;
      ASSERT_TRUE(m.image && m.image->tls.has_value());
      EXPECT_EQ(m.image->tls->kind, classify::LibraryKind::kGo);
      EXPECT_FALSE(m.image->tls->whole_file_is_tls);
      bool tls_linked = false;
      bool sha256 = false;
      for (const auto& sym : m.image->image->symbols.all()) {
        tls_linked = tls_linked || sym.name.starts_with("crypto/tls.");
        sha256 = sha256 || sym.name.starts_with("crypto/sha256.");
      }
      EXPECT_TRUE(sha256);
      EXPECT_EQ(tls_linked, std::string_view(binary) != "tlsprof-go-crypto");
      found = true;
    }
    EXPECT_TRUE(found) << "no mapping of " << exe;
  }
}

// Maps `path` executable into this process; returns the address (or null).
void* MapExecutable(const std::string& path, size_t& length) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  length = static_cast<size_t>(lseek(fd, 0, SEEK_END));
  void* addr = mmap(nullptr, length, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  close(fd);
  return addr == MAP_FAILED ? nullptr : addr;
}

const ProcessSnapshot::ExecMapping* MappingOf(const ProcessSnapshot& snap, void* addr) {
  return snap.Find(reinterpret_cast<uint64_t>(addr));
}

void CopyInPlace(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);  // same inode, new content
  out << in.rdbuf();
}

// An upgrade that rewrites a library in place (cp over it) keeps its
// dev:inode: a process that maps it afterwards must get the new file's
// symbols, not the image cached for the inode.
TEST(Registry, LoadsAFileRewrittenInPlaceAgain) {
  const std::string libcrypto = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";
  ASSERT_TRUE(std::filesystem::exists(libcrypto));
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tlsprof-inplace-{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "image.so").string();
  CopyInPlace(libcrypto, path);
  struct stat first {};
  ASSERT_EQ(stat(path.c_str(), &first), 0);

  ProcessRegistry registry;
  size_t length = 0;
  void* addr = MapExecutable(path, length);
  ASSERT_NE(addr, nullptr);
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const auto* m = MappingOf(*registry.Get(getpid()), addr);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->image && m->image->image);
  const std::shared_ptr<const ImageInfo> old_image = m->image;
  EXPECT_TRUE(old_image->tls.has_value());
  const std::string old_build_id = old_image->image->build_id;
  munmap(addr, length);

  // Rewritten in place with another ELF file (no TLS library in it).
  CopyInPlace("/proc/self/exe", path);
  struct stat second {};
  ASSERT_EQ(stat(path.c_str(), &second), 0);
  ASSERT_EQ(second.st_ino, first.st_ino) << "the rewrite must keep the inode";
  addr = MapExecutable(path, length);
  ASSERT_NE(addr, nullptr);
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  m = MappingOf(*registry.Get(getpid()), addr);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->image && m->image->image);
  EXPECT_NE(m->image, old_image);
  EXPECT_NE(m->image->image->build_id, old_build_id);
  EXPECT_FALSE(m->image->tls.has_value());
  EXPECT_EQ(registry.stats().images_changed, 1u);
  // The old content's image stays valid for whoever still holds it.
  EXPECT_EQ(old_image->image->build_id, old_build_id);

  // Mapped again unchanged: the cached image, no new load.
  const uint64_t loads = registry.stats().images_loaded;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  EXPECT_EQ(registry.stats().images_loaded, loads);
  EXPECT_EQ(registry.stats().images_changed, 1u);
  munmap(addr, length);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tlsprof::discovery

namespace tlsprof::discovery {
namespace {

// A debuginfod server that takes the connection and never answers: a load
// that asks it (a stripped library without a local debug file) blocks until
// the query's own timeout, as a tenant's FUSE file would block a read.
class SilentServer {
 public:
  SilentServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentServer() { close(fd_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A load that blocks does not hold the caller: Refresh returns within the
// wait, the mapping has no image for now, and once the load ends the
// process is named for a second Refresh, which finds it loaded. The process
// is `sleep` with libz preloaded: four stripped files (sleep, libz, libc,
// ld.so), each of whose loads asks the silent server.
TEST(Registry, ALoadThatBlocksIsLeftToTheWorker) {
  const char* lib = "/usr/lib/x86_64-linux-gnu/libz.so.1";
  ASSERT_EQ(access(lib, R_OK), 0) << lib << " (zlib1g) is needed";
  SilentServer server;
  ASSERT_EQ(setenv("DEBUGINFOD_URLS", server.url().c_str(), 1), 0);
  // A cache of its own: debuginfod remembers a miss (cache_miss_s), and a
  // load that finds one ends at once instead of waiting for the server.
  char cache_dir[] = "/tmp/tlsprof-discovery-test-debuginfod.XXXXXX";
  ASSERT_NE(mkdtemp(cache_dir), nullptr);
  ASSERT_EQ(setenv("DEBUGINFOD_CACHE_PATH", cache_dir, 1), 0);
  symbols::DebugSearch debug;
  debug.debug_roots.clear();
  debug.use_debuginfod = true;
  debug.debuginfod_timeout = std::chrono::milliseconds(1000);
  ProcessRegistry registry("/proc", debug);
  guard::DeadlineWorker worker("test-loader");
  registry.SetDeadlineWorker(&worker, std::chrono::milliseconds(300));

  // Wait for sleep to have mapped libz.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("LD_PRELOAD", lib, 1);
    execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  auto maps_libz = [child] {
    // Before its exec the child is a copy of this test, which maps libz too.
    std::error_code ec;
    if (std::filesystem::read_symlink("/proc/" + std::to_string(child) + "/exe", ec).filename() != "sleep")
      return false;
    auto maps = ReadExecMaps(child, "/proc");
    return maps.ok() && std::any_of(maps->mappings.begin(), maps->mappings.end(),
                                    [](const Mapping& m) { return m.path.find("libz.so") != std::string::npos; });
  };
  for (int i = 0; i < 500 && !maps_libz(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(maps_libz());
  auto image_at = [&]() -> const ImageInfo* {
    const auto* snap = registry.Get(child);
    if (snap == nullptr) return nullptr;
    for (const auto& m : snap->mappings) {
      if (m.mapping.path.find("libz.so") != std::string::npos) return m.image.get();
    }
    return nullptr;
  };
  // The caller's deadline bounds how long Refresh waits for the loads.
  const auto t0 = std::chrono::steady_clock::now();
  registry.SetDeadline(t0 + std::chrono::seconds(1));
  ASSERT_TRUE(registry.Refresh(child).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "Refresh waited for the loads";
  EXPECT_EQ(image_at(), nullptr);
  // As loads end, the process is named again, until libz's is done.
  const ImageInfo* image = nullptr;
  for (int i = 0; i < 600 && (image == nullptr || image->image == nullptr); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::vector<pid_t> loaded = registry.TakeLoaded();
    if (loaded.empty()) continue;
    ASSERT_EQ(loaded, std::vector<pid_t>{child});
    registry.SetDeadline(std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
    ASSERT_TRUE(registry.Refresh(child).ok());
    image = image_at();
  }
  // Once every file is known, a Refresh reads them on its own thread: they
  // are on a block device (no tenant's daemon answers their reads), and
  // the same versions, so no load is handed to the worker.
  ASSERT_TRUE(guard::OpenHostFile(lib)->on_block_device())
      << lib << " is not on a block device's filesystem: this test needs it to be";
  ASSERT_TRUE(worker.WaitIdle(std::chrono::seconds(30)));
  const auto jobs = [&worker] { return worker.stats().done + worker.stats().late + worker.stats().refused; };
  const uint64_t jobs_before = jobs();
  registry.SetDeadline(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  ASSERT_TRUE(registry.Refresh(child).ok());
  EXPECT_EQ(jobs(), jobs_before);
  EXPECT_EQ(image_at(), image);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_NE(image, nullptr);
  ASSERT_NE(image->image, nullptr);
  EXPECT_EQ(image->image->symbol_source, symbols::SymbolSource::kDynsym);
  EXPECT_GE(worker.stats().late, 1u);
  // Nothing is left running when the test ends.
  EXPECT_TRUE(worker.WaitIdle(std::chrono::seconds(30)));
  unsetenv("DEBUGINFOD_URLS");
  std::filesystem::remove_all(cache_dir);
}

}  // namespace
}  // namespace tlsprof::discovery
