#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "agent/discovery/proc_maps.h"
#include "agent/discovery/process_registry.h"

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

TEST(ReadMaps, FindsOurOwnExecutableAndLibc) {
  auto maps = ReadMaps(getpid());
  ASSERT_TRUE(maps.ok()) << maps.error().message;
  auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  bool found_self = false, found_libc = false;
  for (const auto& m : *maps) {
    if (m.executable && m.path == self) found_self = true;
    if (m.executable && m.path.find("libc.so") != std::string::npos) found_libc = true;
  }
  EXPECT_TRUE(found_self);
  EXPECT_TRUE(found_libc);
  EXPECT_FALSE(ReadComm(getpid()).empty());
}

TEST(ReadMaps, GoneProcessIsAnErrorNotACrash) {
  auto maps = ReadMaps(0x7ffffff0);
  ASSERT_FALSE(maps.ok());
  EXPECT_NE(maps.error().message.find("gone"), std::string::npos);
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
  EXPECT_TRUE(registry.IsSyscallReturn(getpid(), *m, ret));
  EXPECT_FALSE(registry.IsSyscallReturn(getpid(), *m, reinterpret_cast<uint64_t>(code)));
  EXPECT_FALSE(registry.IsSyscallReturn(getpid(), *m, ret - 1));
  EXPECT_TRUE(registry.IsSyscallReturn(getpid(), *m, ret)) << "a cached answer must not change";
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

TEST(Registry, KeepsTheLastSnapshotOfAProcessThatExited) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
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

}  // namespace
}  // namespace tlsprof::discovery
