// Tests for the unwind tables and the reference unwinder.
//
// The end-to-end tests unwind this very process's live stack: the functions
// below are compiled without frame pointers (see CMakeLists.txt), like
// Debian's C libraries, so only the CFI tables can get past them.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/common/fd.h"
#include "agent/unwind/unwind_table.h"

using tlsprof::unwind::BuildUnwindTable;
using tlsprof::unwind::FindRow;
using tlsprof::unwind::MappedTable;
using tlsprof::unwind::Registers;
using tlsprof::unwind::Unwind;
using tlsprof::unwind::UnwindTable;

// Captures the registers at this point of the calling function. The ip is
// that of the next instruction, whose CFI row describes the captured rsp.
#define CAPTURE_REGISTERS(regs) \
  asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"((regs).ip), "=r"((regs).sp), "=r"((regs).bp))

namespace {

constexpr size_t kMaxFrames = 128;

std::shared_ptr<const UnwindTable> TableFor(const std::string& path) {
  static std::map<std::string, std::shared_ptr<const UnwindTable>> cache;
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  std::shared_ptr<const UnwindTable> table;
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.valid()) {
    auto built = BuildUnwindTable(fd.get(), path);
    if (built.ok()) table = *built;
  }
  cache.emplace(path, table);
  return table;
}

// Executable mappings of this process, each with the table of its file.
std::vector<MappedTable> SelfMappings() {
  std::vector<MappedTable> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* out = static_cast<std::vector<MappedTable>*>(arg);
        std::string path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
        if (path.find("linux-vdso") != std::string::npos) return 0;
        std::shared_ptr<const UnwindTable> table = TableFor(path);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X) || !table) continue;
          out->push_back(
              {info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz, info->dlpi_addr, table.get()});
        }
        return 0;
      },
      &out);
  return out;
}

// Reads our own memory without faulting on a bad address.
bool ReadSelf(void*, uint64_t addr, uint64_t* out) {
  iovec local{out, sizeof(*out)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(*out)};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == sizeof(*out);
}

struct Symbol {
  std::string name;  // empty if dladdr knows none
  std::string file;
};
Symbol Symbolize(uint64_t addr) {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(addr), &info)) return {};
  return {info.dli_sname ? info.dli_sname : "", info.dli_fname ? info.dli_fname : ""};
}

std::string Describe(const std::vector<uint64_t>& frames) {
  std::string s;
  for (uint64_t ip : frames) {
    Symbol sym = Symbolize(ip);
    char line[512];
    std::snprintf(line, sizeof(line), "  %#lx %s (%s)\n", ip, sym.name.c_str(), sym.file.c_str());
    s += line;
  }
  return s;
}

// Index of the first frame (from `from`) whose symbol is `name`; -1 if none.
int FindFrame(const std::vector<uint64_t>& frames, const std::string& name, size_t from = 0) {
  for (size_t i = from; i < frames.size(); ++i) {
    if (Symbolize(frames[i]).name == name) return int(i);
  }
  return -1;
}
bool InFile(uint64_t ip, const char* file_part) { return Symbolize(ip).file.find(file_part) != std::string::npos; }

// The whole stack must be walked: main is found, and the walk ends in
// _start, whose CFI marks the return address undefined (CFA_END).
void ExpectReachesStart(const std::vector<uint64_t>& frames, size_t from) {
  int main_at = FindFrame(frames, "main", from);
  EXPECT_GE(main_at, 0) << Describe(frames);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(Symbolize(frames.back()).name, "_start") << Describe(frames);
  bool libc_after_main = false;
  for (size_t i = main_at < 0 ? 0 : main_at; i < frames.size(); ++i) libc_after_main |= InFile(frames[i], "libc.so");
  EXPECT_TRUE(libc_after_main) << Describe(frames);
}

std::string LoadedPath(const char* soname_part, uint64_t* bias) {
  struct Arg {
    const char* part;
    std::string path;
    uint64_t bias;
  } arg{soname_part, "", 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) {
        auto* a = static_cast<Arg*>(p);
        if (info->dlpi_name && std::strstr(info->dlpi_name, a->part)) {
          a->path = info->dlpi_name;
          a->bias = info->dlpi_addr;
          return 1;
        }
        return 0;
      },
      &arg);
  *bias = arg.bias;
  return arg.path;
}

}  // namespace

// ---- Functions that are unwound live. extern "C" and exported (the test is
// linked with -rdynamic) so dladdr can name them.

extern "C" {
std::vector<uint64_t> g_frames;

__attribute__((noinline)) int tlsprof_unwind_test_c(int x) {
  volatile char scratch[96];  // a real frame: CFA = RSP + something > 8
  scratch[x & 63] = char(x);
  Registers regs;
  CAPTURE_REGISTERS(regs);
  g_frames = Unwind(SelfMappings(), regs, ReadSelf, nullptr, kMaxFrames);
  return scratch[x & 63] + 1;
}
__attribute__((noinline)) int tlsprof_unwind_test_b(int x) {
  int r = tlsprof_unwind_test_c(x + 1);
  asm volatile("" ::: "memory");
  return r * 3;
}
__attribute__((noinline)) int tlsprof_unwind_test_a(int x) {
  int r = tlsprof_unwind_test_b(x + 1);
  asm volatile("" ::: "memory");
  return r + 7;
}

std::atomic<bool> g_captured{false};

__attribute__((noinline)) int tlsprof_unwind_test_compare(const void* a, const void* b) {
  if (!g_captured.exchange(true)) {
    Registers regs;
    CAPTURE_REGISTERS(regs);
    g_frames = Unwind(SelfMappings(), regs, ReadSelf, nullptr, kMaxFrames);
  }
  int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  return (x > y) - (x < y);
}
__attribute__((noinline)) int tlsprof_unwind_test_sort() {
  int v[32];
  for (int i = 0; i < 32; ++i) v[i] = (i * 7919) % 61;
  qsort(v, 32, sizeof(int), tlsprof_unwind_test_compare);
  asm volatile("" ::: "memory");
  return v[0];
}

__attribute__((noinline)) void tlsprof_unwind_test_md_callback(const EVP_MD*, const char*, const char*, void*) {
  if (!g_captured.exchange(true)) {
    Registers regs;
    CAPTURE_REGISTERS(regs);
    g_frames = Unwind(SelfMappings(), regs, ReadSelf, nullptr, kMaxFrames);
  }
}
__attribute__((noinline)) int tlsprof_unwind_test_openssl() {
  EVP_MD_do_all(tlsprof_unwind_test_md_callback, nullptr);
  asm volatile("" ::: "memory");
  return 1;
}
}

// ---- Tables of real files.

TEST(UnwindTableTest, LibcryptoTable) {
  uint64_t bias = 0;
  std::string path = LoadedPath("libcrypto.so", &bias);
  ASSERT_FALSE(path.empty()) << "the test links libcrypto";
  auto t0 = std::chrono::steady_clock::now();
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  auto built = BuildUnwindTable(fd.get(), path);
  ASSERT_TRUE(built.ok()) << built.error().message;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const UnwindTable& t = **built;
  std::printf("%s: %.1f ms, %zu rows, %lu FDEs, %lu/%lu libdw rows unsupported (%.2f%%), rsp_deref rows %lu\n",
              path.c_str(), ms, t.rows.size(), t.fdes, t.unsupported_rows, t.cfi_rows,
              100.0 * t.unsupported_rows / std::max<uint64_t>(t.cfi_rows, 1), t.kind_rows[CFA_RSP_DEREF]);

  ASSERT_GT(t.rows.size(), 1000u);
  for (size_t i = 1; i < t.rows.size(); ++i) ASSERT_LT(t.rows[i - 1].pc, t.rows[i].pc) << i;
  EXPECT_LT(t.unsupported_rows * 50, t.cfi_rows) << "more than 2% of libcrypto's CFI rows are not modelled";
  EXPECT_GT(t.kind_rows[CFA_RSP_DEREF], 0u) << "perlasm's .cfi_cfa_expression rows are missing";
  EXPECT_EQ(t.rows.back().cfa_kind, CFA_NONE) << "code past the last FDE must not inherit its rule";

  for (const char* fn : {"EVP_EncryptUpdate", "EVP_DigestUpdate", "SSL_library_init"}) {
    void* addr = dlsym(RTLD_DEFAULT, fn);
    if (!addr || !InFile(uint64_t(addr), "libcrypto")) continue;
    const unwind_row* row = FindRow(t, uint64_t(addr) - bias);
    ASSERT_NE(row, nullptr) << fn;
    EXPECT_EQ(row->cfa_kind, CFA_RSP) << fn;
    EXPECT_EQ(row->cfa_off, 8) << fn;
    EXPECT_EQ(row->rbp_kind, RBP_SAME) << fn;
  }
}

TEST(UnwindTableTest, LibcTableHasStartEnd) {
  uint64_t bias = 0;
  std::string path = LoadedPath("libc.so", &bias);
  ASSERT_FALSE(path.empty());
  auto table = TableFor(path);
  ASSERT_TRUE(table);
  std::printf("%s: %zu rows, %lu unsupported of %lu, rbp-based rows %lu, end rows %lu\n", path.c_str(),
              table->rows.size(), table->unsupported_rows, table->cfi_rows, table->kind_rows[CFA_RBP],
              table->kind_rows[CFA_END]);
  EXPECT_GT(table->rows.size(), 1000u);
  EXPECT_GT(table->kind_rows[CFA_END], 0u) << "clone/start code marks the outermost frame";
  // A function that sets up RBP as frame pointer saves the caller's RBP at CFA-16.
  bool saved_rbp = std::any_of(table->rows.begin(), table->rows.end(), [](const unwind_row& r) {
    return r.cfa_kind == CFA_RBP && r.rbp_kind == RBP_AT_CFA && r.rbp_off == -16 && r.cfa_off == 16;
  });
  EXPECT_TRUE(saved_rbp);
}

// ---- End to end on this process's live stack.

TEST(UnwindLiveTest, ChainWithoutFramePointers) {
  g_frames.clear();
  EXPECT_GT(tlsprof_unwind_test_a(1), 0);
  const auto& f = g_frames;
  std::printf("%s", Describe(f).c_str());
  ASSERT_GE(f.size(), 4u) << Describe(f);
  EXPECT_EQ(Symbolize(f[0]).name, "tlsprof_unwind_test_c") << Describe(f);
  EXPECT_EQ(Symbolize(f[1]).name, "tlsprof_unwind_test_b") << Describe(f);
  EXPECT_EQ(Symbolize(f[2]).name, "tlsprof_unwind_test_a") << Describe(f);
  ExpectReachesStart(f, 3);
}

TEST(UnwindLiveTest, ThroughLibcQsort) {
  g_frames.clear();
  g_captured = false;
  tlsprof_unwind_test_sort();
  const auto& f = g_frames;
  std::printf("%s", Describe(f).c_str());
  ASSERT_GE(f.size(), 3u) << Describe(f);
  EXPECT_EQ(Symbolize(f[0]).name, "tlsprof_unwind_test_compare") << Describe(f);
  int caller = FindFrame(f, "tlsprof_unwind_test_sort");
  ASSERT_GE(caller, 2) << "qsort's own frames must lie between\n" << Describe(f);
  for (int i = 1; i < caller; ++i) EXPECT_TRUE(InFile(f[i], "libc.so")) << i << "\n" << Describe(f);
  ExpectReachesStart(f, caller);
}

TEST(UnwindLiveTest, ThroughLibcryptoCallback) {
  g_frames.clear();
  g_captured = false;
  tlsprof_unwind_test_openssl();
  const auto& f = g_frames;
  std::printf("%s", Describe(f).c_str());
  ASSERT_GE(f.size(), 3u) << Describe(f);
  EXPECT_EQ(Symbolize(f[0]).name, "tlsprof_unwind_test_md_callback") << Describe(f);
  int caller = FindFrame(f, "tlsprof_unwind_test_openssl");
  ASSERT_GE(caller, 2) << Describe(f);
  int in_crypto = 0;
  for (int i = 1; i < caller; ++i) in_crypto += InFile(f[i], "libcrypto.so");
  EXPECT_GE(in_crypto, 2) << Describe(f);
  ExpectReachesStart(f, caller);
}
