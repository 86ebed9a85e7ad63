// Needs root (CAP_SYS_ADMIN for /proc/PID/map_files): registered with the
// "bpf" label, which CI runs as root. Fails loudly without it.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "agent/discovery/proc_maps.h"
#include "agent/discovery/process_registry.h"

namespace tlsprof::discovery {
namespace {

TEST(RootDiscovery, ReadsALibraryThatWasDeletedAfterItWasMapped) {
  ASSERT_EQ(geteuid(), 0u) << "this test needs root: run the 'bpf' label as root";
  // Copy the system libcrypto, map it executable, then delete it: the process
  // keeps running the deleted file, as after a package upgrade.
  auto dir = std::filesystem::temp_directory_path() / fmt::format("tlsprof-del-{}", getpid());
  std::filesystem::create_directories(dir);
  auto copy = dir / "libcrypto.so.3";
  std::filesystem::copy_file("/usr/lib/x86_64-linux-gnu/libcrypto.so.3", copy);
  int fd = open(copy.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  void* addr = mmap(nullptr, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  ASSERT_NE(addr, MAP_FAILED);
  close(fd);
  std::filesystem::remove_all(dir);

  ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const auto* snap = registry.Get(getpid());
  ASSERT_NE(snap, nullptr);
  const auto* m = snap->Find(reinterpret_cast<uint64_t>(addr));
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->mapping.deleted);
  ASSERT_TRUE(m->image) << "the deleted file must be read through /proc/PID/map_files";
  ASSERT_TRUE(m->image->tls.has_value());
  EXPECT_EQ(m->image->tls->kind, classify::LibraryKind::kOpenSSL3);
  munmap(addr, st.st_size);
}

// A child in a container over DIR, which holds a copy of libcrypto at
// /lib/libcrypto.so.3: it enters the container, maps the library executable
// and waits to be killed. Returns its pid and the mapping's address.
enum class Container { kChroot, kPivotRoot };

std::pair<pid_t, uint64_t> StartContained(const std::filesystem::path& dir, Container kind) {
  int ready[2];
  if (pipe(ready) != 0) return {-1, 0};
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    bool entered = false;
    if (kind == Container::kChroot) {
      entered = chroot(dir.c_str()) == 0 && chdir("/") == 0;
    } else {
      // runc's way: an own mount namespace, the root a bind mount of itself,
      // pivot_root, the old root detached.
      const std::string old_root = (dir / "old").string();
      entered = unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0 && chdir(dir.c_str()) == 0 &&
                syscall(SYS_pivot_root, ".", "old") == 0 && chdir("/") == 0 && umount2("/old", MNT_DETACH) == 0;
    }
    const int fd = entered ? open("/lib/libcrypto.so.3", O_RDONLY) : -1;
    struct stat st {};
    void* addr = fd >= 0 && fstat(fd, &st) == 0 ? mmap(nullptr, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0)
                                                : MAP_FAILED;
    const uint64_t at = addr == MAP_FAILED ? 0 : reinterpret_cast<uint64_t>(addr);
    if (write(ready[1], &at, sizeof at) != sizeof at) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  uint64_t at = 0;
  if (pid < 0 || read(ready[0], &at, sizeof at) != sizeof at) at = 0;
  close(ready[0]);
  return {pid, at};
}

// /proc/PID/maps prints paths relative to the reader's root: the host path for
// a plain chroot, the path inside for pivot_root. The guarded opener reaches
// the mapped file for both, through map_files and through the path resolved
// inside the process's root, and the registry names the library.
TEST(RootDiscovery, FindsTheMappedFileInAChrootAndAfterPivotRoot) {
  ASSERT_EQ(geteuid(), 0u) << "this test needs root: run the 'bpf' label as root";
  for (Container kind : {Container::kChroot, Container::kPivotRoot}) {
    const bool chrooted = kind == Container::kChroot;
    SCOPED_TRACE(chrooted ? "chroot" : "pivot_root");
    auto dir = std::filesystem::temp_directory_path() / fmt::format("tlsprof-root-{}-{}", getpid(), chrooted);
    std::filesystem::create_directories(dir / "lib");
    std::filesystem::create_directories(dir / "old");
    std::filesystem::copy_file("/usr/lib/x86_64-linux-gnu/libcrypto.so.3", dir / "lib" / "libcrypto.so.3");
    auto [pid, at] = StartContained(dir, kind);
    ASSERT_GT(pid, 0);
    struct Reap {
      pid_t pid;
      std::filesystem::path dir;
      ~Reap() {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    } reap{pid, dir};
    EXPECT_NE(at, 0u) << "the child could not enter the container and map the library";
    auto maps = ReadExecMaps(pid);
    ASSERT_TRUE(maps.ok()) << maps.error().message;
    const Mapping* m = nullptr;
    for (const Mapping& x : maps->mappings) {
      if (x.contains(at)) m = &x;
    }
    ASSERT_NE(m, nullptr);
    const std::string maps_path = chrooted ? (dir / "lib" / "libcrypto.so.3").string() : "/lib/libcrypto.so.3";
    EXPECT_EQ(m->path, maps_path);
    // Through map_files.
    auto mapped = guard::OpenMapping(MappedFileOf(pid, *m));
    ASSERT_TRUE(mapped.ok()) << mapped.error().message;
    EXPECT_EQ(mapped->id().ino, m->inode);
    // Through the path, resolved inside the process's root: the path inside
    // is the same for both kinds of container.
    auto root = guard::ProcessRoot::Open(pid);
    ASSERT_TRUE(root.ok()) << root.error().message;
    EXPECT_EQ(root->InsidePath(m->path), "/lib/libcrypto.so.3");
    auto by_path = root->OpenFile("/lib/libcrypto.so.3", mapped->id());
    ASSERT_TRUE(by_path.ok()) << by_path.error().message;
    guard::MappedFileRef gone = MappedFileOf(pid, *m);
    gone.start += 0x1000000000;  // no such range: map_files fails, the path is used
    gone.end += 0x1000000000;
    auto fallback = guard::OpenMapping(gone);
    ASSERT_TRUE(fallback.ok()) << fallback.error().message;
    EXPECT_EQ(fallback->id(), mapped->id());

    ProcessRegistry registry;
    ASSERT_TRUE(registry.Refresh(pid).ok());
    const auto* snap = registry.Get(pid);
    ASSERT_NE(snap, nullptr);
    const auto* em = snap->Find(at);
    ASSERT_NE(em, nullptr);
    ASSERT_TRUE(em->image && em->image->tls.has_value());
    EXPECT_EQ(em->image->tls->kind, classify::LibraryKind::kOpenSSL3);
  }
}

}  // namespace
}  // namespace tlsprof::discovery
