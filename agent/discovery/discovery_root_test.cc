// Needs root (CAP_SYS_ADMIN for /proc/PID/map_files): registered with the
// "bpf" label, which CI runs as root. Fails loudly without it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

}  // namespace
}  // namespace tlsprof::discovery
