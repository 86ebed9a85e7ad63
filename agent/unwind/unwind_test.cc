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
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/unwind/loaded_segments_test_util.h"
#include "agent/unwind/unwind_table.h"
#include "common/fd.h"
#include "common/sanitizer.h"

using namespace tlsprof::unwind;

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
  for (const LoadedSegment& seg : LoadedSegments()) {
    if (seg.path.find("linux-vdso") != std::string::npos) continue;
    std::shared_ptr<const UnwindTable> table = TableFor(seg.path);
    if (table) out.push_back({seg.start, seg.end, seg.bias, table.get()});
  }
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
  std::printf("%s: %.1f ms, %zu rows, %lu FDEs, %lu/%lu CFI rows unsupported (%.2f%%), rsp_deref rows %lu\n",
              path.c_str(), ms, t.rows.size(), t.fdes, t.unsupported_rows, t.cfi_rows,
              100.0 * t.unsupported_rows / std::max<uint64_t>(t.cfi_rows, 1), t.kind_rows[CFA_RSP_DEREF]);

  ASSERT_GT(t.rows.size(), 1000u);
  for (size_t i = 1; i < t.rows.size(); ++i) ASSERT_LT(t.rows[i - 1].pc, t.rows[i].pc) << i;
  EXPECT_LT(t.unsupported_rows * 50, t.cfi_rows) << "more than 2% of libcrypto's CFI rows are not modelled";
  EXPECT_GT(t.kind_rows[CFA_RSP_DEREF], 0u) << "perlasm's .cfi_cfa_expression rows are missing";
  EXPECT_GT(t.kind_rows[CFA_REG], 0u) << "perlasm's CFA = rax/r9/rsi/r11 + off rows are missing";
  // bn_mul_mont, bn_mul4x_mont, bn_sqr8x_mont: CFA = *(rsp + 8 + r9 * 8) + 8.
  EXPECT_GT(t.kind_rows[CFA_RSP_REG_DEREF], 0u) << "perlasm's bn_mul_mont CFA expression rows are missing";
  for (const unwind_row& r : t.rows) {
    if (r.cfa_kind == CFA_RSP_REG_DEREF) {
      EXPECT_EQ(r.reg, 9) << std::hex << r.pc;
      EXPECT_EQ(r.cfa_off, 8) << std::hex << r.pc;
      EXPECT_EQ(r.deref_add, 8) << std::hex << r.pc;
    }
    if (r.cfa_kind != CFA_REG) continue;
    EXPECT_LT(r.reg, 16) << std::hex << r.pc;
    EXPECT_NE(r.reg, 6) << std::hex << r.pc;  // rbp and rsp have their own kinds
    EXPECT_NE(r.reg, 7) << std::hex << r.pc;
  }
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

// Runs `run`, whose leaf `leaf` unwinds this thread's stack into g_frames
// (once), prints the frames and checks there are at least `min`, `leaf`
// first.
void CaptureStack(const std::function<void()>& run, const char* leaf, size_t min) {
  g_frames.clear();
  g_captured = false;
  run();
  const auto& f = g_frames;
  std::printf("%s", Describe(f).c_str());
  ASSERT_GE(f.size(), min) << Describe(f);
  EXPECT_EQ(Symbolize(f[0]).name, leaf) << Describe(f);
}

TEST(UnwindLiveTest, ChainWithoutFramePointers) {
  ASSERT_NO_FATAL_FAILURE(CaptureStack([] { EXPECT_GT(tlsprof_unwind_test_a(1), 0); }, "tlsprof_unwind_test_c", 4));
  const auto& f = g_frames;
  EXPECT_EQ(Symbolize(f[1]).name, "tlsprof_unwind_test_b") << Describe(f);
  EXPECT_EQ(Symbolize(f[2]).name, "tlsprof_unwind_test_a") << Describe(f);
  ExpectReachesStart(f, 3);
}

TEST(UnwindLiveTest, ThroughLibcQsort) {
  ASSERT_NO_FATAL_FAILURE(CaptureStack([] { tlsprof_unwind_test_sort(); }, "tlsprof_unwind_test_compare", 3));
  const auto& f = g_frames;
  int caller = FindFrame(f, "tlsprof_unwind_test_sort");
  ASSERT_GE(caller, 2) << "qsort's own frames must lie between\n" << Describe(f);
  // Under ASan, qsort is ASan's interceptor, which calls libc's: in libasan.so with gcc; linked into this
  // executable with clang, whose interceptor also calls the comparator itself first (a check pass), so that the
  // frame above it may be the interceptor's own qsort_r.
  for (int i = 1; i < caller; ++i) {
    const bool interceptor =
        tlsprof::kAddressSanitizer &&
        (InFile(f[i], "libasan.so") || std::string(Symbolize(f[i]).name).find("qsort") != std::string::npos);
    EXPECT_TRUE(InFile(f[i], "libc.so") || interceptor) << i << "\n" << Describe(f);
  }
  ExpectReachesStart(f, caller);
}

TEST(UnwindLiveTest, ThroughLibcryptoCallback) {
  ASSERT_NO_FATAL_FAILURE(CaptureStack([] { tlsprof_unwind_test_openssl(); }, "tlsprof_unwind_test_md_callback", 3));
  const auto& f = g_frames;
  int caller = FindFrame(f, "tlsprof_unwind_test_openssl");
  ASSERT_GE(caller, 2) << Describe(f);
  int in_crypto = 0;
  for (int i = 1; i < caller; ++i) in_crypto += InFile(f[i], "libcrypto.so");
  EXPECT_GE(in_crypto, 2) << Describe(f);
  ExpectReachesStart(f, caller);
}

// ---- Sampled unwinding: what the BPF sampler does. A CPU-time timer
// interrupts crypto code at arbitrary instructions (the perlasm assembly
// included); the handler copies registers and the top of the stack, like a
// perf_event sample, and each sample is unwound afterwards from the copy.

namespace {

constexpr size_t kStackCopy = 32 * 1024;
constexpr size_t kMaxSamples = 1500;
// What the crypto loop is doing, recorded with each sample.
enum Phase : int { kPhaseOther = 0, kPhaseSha512, kPhaseSha256, kPhaseSha1, kPhaseGcm, kPhaseChacha, kPhases };
const char* const kPhaseNames[kPhases] = {"other", "sha512", "sha256", "sha1", "aes-256-gcm", "chacha20-poly1305"};
volatile int g_phase = kPhaseOther;

struct StackSample {
  Registers regs;
  int phase = kPhaseOther;
  uint64_t lo = 0;
  size_t len = 0;
  uint8_t stack[kStackCopy];
};
StackSample* g_samples = nullptr;
std::atomic<size_t> g_nsamples{0};
uint64_t g_stack_lo = 0, g_stack_hi = 0;

// The raw bytes of the interrupted thread's stack, as the BPF walker reads
// them: below and around live frames, so ASan's redzones too (not checked).
__attribute__((no_sanitize("address"))) void CopyRawStack(uint8_t* to, uint64_t from, size_t len) {
  const volatile uint8_t* src = reinterpret_cast<const volatile uint8_t*>(from);
  for (size_t i = 0; i < len; ++i) to[i] = src[i];
}

void OnProfSignal(int, siginfo_t*, void* ctx) {
  size_t i = g_nsamples.load(std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  StackSample& s = g_samples[i];
  const greg_t* g = uc->uc_mcontext.gregs;
  s.regs = {uint64_t(g[REG_RIP]), uint64_t(g[REG_RSP]), uint64_t(g[REG_RBP])};
  // By x86-64 DWARF number, like a perf_event sample's registers.
  static constexpr int kGregOfDwarf[16] = {REG_RAX, REG_RDX, REG_RCX, REG_RBX, REG_RSI, REG_RDI, REG_RBP, REG_RSP,
                                           REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
  for (int r = 0; r < 16; ++r) s.regs.gpr[r] = uint64_t(g[kGregOfDwarf[r]]);
  s.phase = g_phase;
  s.lo = s.regs.sp - 128;  // the red zone too: perlasm keeps its saved RSP at rsp-8
  s.len = (s.lo >= g_stack_lo && s.lo < g_stack_hi) ? std::min<uint64_t>(kStackCopy, g_stack_hi - s.lo) : 0;
  CopyRawStack(s.stack, s.lo, s.len);
  g_nsamples.store(i + 1, std::memory_order_relaxed);
}

// Stack words come from the copy (the live stack has moved on since);
// anything else from live memory.
bool ReadSample(void* ctx, uint64_t addr, uint64_t* out) {
  const auto* s = static_cast<const StackSample*>(ctx);
  if (addr >= s->lo && addr + 8 <= s->lo + s->len) {
    std::memcpy(out, s->stack + (addr - s->lo), 8);
    return true;
  }
  if (addr >= g_stack_lo && addr < g_stack_hi) return false;
  return ReadSelf(nullptr, addr, out);
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

extern "C" __attribute__((noinline)) int tlsprof_unwind_test_crypto_loop(double seconds) {
  std::vector<unsigned char> buf(64 * 1024, 0x5a), out(buf.size() + 64);
  unsigned char md[EVP_MAX_MD_SIZE], key[32] = {1}, iv[12] = {2};
  unsigned int md_len = 0;
  int len = 0, rounds = 0;
  EVP_CIPHER_CTX* gcm = EVP_CIPHER_CTX_new();
  EVP_CIPHER_CTX* chacha = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(gcm, EVP_aes_256_gcm(), nullptr, key, iv);
  EVP_EncryptInit_ex(chacha, EVP_chacha20_poly1305(), nullptr, key, iv);
  for (double end = CpuSeconds() + seconds; CpuSeconds() < end; ++rounds) {
    g_phase = kPhaseSha512;
    EVP_Digest(buf.data(), buf.size(), md, &md_len, EVP_sha512(), nullptr);
    g_phase = kPhaseSha256;
    EVP_Digest(buf.data(), buf.size(), md, &md_len, EVP_sha256(), nullptr);
    g_phase = kPhaseSha1;
    EVP_Digest(buf.data(), buf.size(), md, &md_len, EVP_sha1(), nullptr);
    // AES-GCM (VAES) once a round drew 2-5 of 200 libcrypto samples and
    // ChaCha20 about 20: repeated so that every phase gets tens of them.
    g_phase = kPhaseGcm;
    for (int i = 0; i < 5; ++i) EVP_EncryptUpdate(gcm, out.data(), &len, buf.data(), int(buf.size()));
    g_phase = kPhaseChacha;
    for (int i = 0; i < 2; ++i) EVP_EncryptUpdate(chacha, out.data(), &len, buf.data(), int(buf.size()));
    g_phase = kPhaseOther;
  }
  EVP_CIPHER_CTX_free(gcm);
  EVP_CIPHER_CTX_free(chacha);
  asm volatile("" ::: "memory");
  return rounds;
}

// Runs the crypto loop for 0.8 s of CPU under a 1 ms SIGPROF timer, whose
// handler keeps each sample's registers and stack in `samples`; how many it
// kept (`rounds`: the loop's own count).
size_t SampleCryptoLoop(std::vector<StackSample>& samples, int* rounds) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    ADD_FAILURE() << "pthread_getattr_np failed";
    return 0;
  }
  void* stack_addr = nullptr;
  size_t stack_size = 0;
  pthread_attr_getstack(&attr, &stack_addr, &stack_size);
  pthread_attr_destroy(&attr);
  g_stack_lo = uint64_t(stack_addr);
  g_stack_hi = g_stack_lo + stack_size;
  g_samples = samples.data();
  g_nsamples = 0;
  struct sigaction sa = {}, old = {};
  sa.sa_sigaction = OnProfSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, &old) != 0) {
    ADD_FAILURE() << "sigaction failed";
    return 0;
  }
  itimerval timer = {{0, 1000}, {0, 1000}}, off = {};
  setitimer(ITIMER_PROF, &timer, nullptr);
  *rounds = tlsprof_unwind_test_crypto_loop(0.8);
  setitimer(ITIMER_PROF, &off, nullptr);
  sigaction(SIGPROF, &old, nullptr);
  return g_nsamples.load();
}

TEST(UnwindLiveTest, SampledStacksThroughLibcryptoAssembly) {
  std::vector<StackSample> samples(kMaxSamples);
  std::vector<MappedTable> mappings = SelfMappings();  // built before sampling starts
  int rounds = 0;
  const size_t n = SampleCryptoLoop(samples, &rounds);
  ASSERT_GT(n, 100u) << "too few SIGPROF samples (" << rounds << " rounds)";

  uint64_t crypto_bias = 0;
  std::string crypto_path = LoadedPath("libcrypto.so", &crypto_bias);
  auto crypto_table = TableFor(crypto_path);
  ASSERT_TRUE(crypto_table);
  static const char* kKinds[] = {"rsp", "rbp", "rsp_deref", "plt", "end", "none", "reg"};
  size_t in_crypto = 0, reached = 0, reached_crypto = 0, cut_crypto = 0;
  size_t by_kind[UNWIND_CFA_NR_KINDS] = {}, reached_by_kind[UNWIND_CFA_NR_KINDS] = {};
  size_t by_phase[kPhases] = {}, reached_by_phase[kPhases] = {};
  // The same walks without the sample's general registers: what CFA_REG
  // rows add (without the registers they stop such walks).
  size_t reached_crypto_no_gpr = 0, reached_by_phase_no_gpr[kPhases] = {};
  std::map<uint64_t, size_t> cut_at;  // libcrypto vaddr of the frame whose rule stopped the walk
  std::string failures;
  for (size_t i = 0; i < n; ++i) {
    StackSample& s = samples[i];
    UnwindResult r = UnwindWithReason(mappings, s.regs, ReadSample, &s, kMaxFrames);
    const auto& frames = r.frames;
    bool ok = r.stop == UnwindStop::kEnd && FindFrame(frames, "tlsprof_unwind_test_crypto_loop") >= 0 &&
              Symbolize(frames.back()).name == "_start";
    reached += ok;
    if (!InFile(s.regs.ip, "libcrypto.so")) continue;
    ++in_crypto;
    reached_crypto += ok;
    ++by_phase[s.phase];
    reached_by_phase[s.phase] += ok;
    Registers no_gpr = s.regs;
    std::fill(std::begin(no_gpr.gpr), std::end(no_gpr.gpr), ~uint64_t{0});  // implausible: CFA_REG stops
    UnwindResult r0 = UnwindWithReason(mappings, no_gpr, ReadSample, &s, kMaxFrames);
    bool ok0 = r0.stop == UnwindStop::kEnd && FindFrame(r0.frames, "tlsprof_unwind_test_crypto_loop") >= 0;
    reached_crypto_no_gpr += ok0;
    reached_by_phase_no_gpr[s.phase] += ok0;
    const unwind_row* row = FindRow(*crypto_table, s.regs.ip - crypto_bias);
    int kind = row && row->cfa_kind < UNWIND_CFA_NR_KINDS ? int(row->cfa_kind) : int(CFA_NONE);
    ++by_kind[kind];
    reached_by_kind[kind] += ok;
    // The only acceptable early stop: a libcrypto rule the format cannot
    // express, or a CFA_REG row above frame 1, never a wrong one.
    bool cut = !ok && (r.stop == UnwindStop::kNoCfi || r.stop == UnwindStop::kRegUnknown) &&
               InFile(frames.back(), "libcrypto.so");
    if (cut) {
      ++cut_crypto;
      ++cut_at[frames.back() - crypto_bias];
    } else if (!ok && failures.size() < 4000) {
      char head[160];
      std::snprintf(head, sizeof(head), "leaf vaddr %#lx (%s), stop reason %d:\n", s.regs.ip - crypto_bias,
                    kKinds[kind], int(r.stop));
      failures += head + Describe(frames);
    }
  }
  std::printf(
      "%zu samples, %zu unwound to the caller and _start; %zu with the leaf in libcrypto: %zu unwound, %zu cut "
      "at an unsupported libcrypto rule\n",
      n, reached, in_crypto, reached_crypto, cut_crypto);
  for (int k = 0; k < UNWIND_CFA_NR_KINDS; ++k) {
    if (by_kind[k]) {
      std::printf("  leaf row %-9s: %zu samples, %zu unwound\n", kKinds[k], by_kind[k], reached_by_kind[k]);
    }
  }
  for (auto [vaddr, count] : cut_at) std::printf("  cut at libcrypto vaddr %#lx: %zu samples\n", vaddr, count);
  for (int p = 0; p < kPhases; ++p) {
    if (by_phase[p]) {
      std::printf("  phase %-17s: %zu libcrypto samples, %zu unwound (%zu without CFA_REG)\n", kPhaseNames[p],
                  by_phase[p], reached_by_phase[p], reached_by_phase_no_gpr[p]);
    }
  }
  std::printf("  all libcrypto samples: %zu unwound with CFA_REG, %zu without\n", reached_crypto,
              reached_crypto_no_gpr);
  ASSERT_GT(in_crypto, n / 2) << "the loop should spend most of its time in libcrypto";
  EXPECT_EQ(reached_crypto + cut_crypto, in_crypto) << "walks that went wrong:\n" << failures;
  EXPECT_GE(reached_crypto * 100, in_crypto * 95);
  // AES-GCM and ChaCha20 samples (perlasm CFA = rax/r9 + 8) reach the caller.
  for (int p : {kPhaseGcm, kPhaseChacha}) {
    EXPECT_GT(by_phase[p], 5u) << kPhaseNames[p];
    EXPECT_GE(reached_by_phase[p] * 100, by_phase[p] * 95) << kPhaseNames[p];
  }
}

// ---- The reference algorithm on synthetic tables and memory: the cases the
// BPF side must reproduce exactly.

namespace {

struct FakeMemory {
  std::map<uint64_t, uint64_t> words;
  static bool Read(void* ctx, uint64_t addr, uint64_t* out) {
    auto& w = static_cast<FakeMemory*>(ctx)->words;
    auto it = w.find(addr);
    if (it == w.end()) return false;
    *out = it->second;
    return true;
  }
};

// Unwinds from `regs` over `maps` and `mem`: the frames it gives and why it
// stopped.
void ExpectUnwind(const std::vector<MappedTable>& maps, const Registers& regs, FakeMemory& mem,
                  const std::vector<uint64_t>& frames, UnwindStop stop, size_t max_frames = TLSPROF_UNWIND_MAX_FRAMES) {
  UnwindResult r = UnwindWithReason(maps, regs, FakeMemory::Read, &mem, max_frames);
  EXPECT_EQ(r.frames, frames);
  EXPECT_EQ(r.stop, stop);
}

unwind_row Row(uint32_t pc, uint8_t kind, int32_t off, uint8_t rbp_kind = RBP_SAME, int16_t rbp_off = 0,
               int16_t add = 0) {
  unwind_row r{};
  r.pc = pc;
  r.cfa_kind = kind;
  r.cfa_off = off;
  r.rbp_kind = rbp_kind;
  r.rbp_off = rbp_off;
  r.deref_add = add;
  return r;
}

}  // namespace

TEST(UnwindAlgorithmTest, RowKindsAndReturnAddressLookup) {
  // One file mapped at bias 0x10000: code at vaddr 0x1000..0x2000.
  UnwindTable t;
  t.rows = {Row(0x1000, CFA_RSP, 16, RBP_AT_CFA, -16),  // leaf: push rbp done
            Row(0x1100, CFA_RSP_DEREF, 24, RBP_SAME, 0, 8),
            Row(0x1200, CFA_RBP, 16, RBP_AT_CFA, -16),
            Row(0x1300, CFA_END, 0),  // starts exactly at the return address below
            Row(0x1400, CFA_PLT, 8),
            Row(0x1420, CFA_NONE, 0)};
  std::vector<MappedTable> maps = {{0x11000, 0x12000, 0x10000, &t}};
  FakeMemory mem;
  const uint64_t sp0 = 0x7000;
  // Frame 0 (CFA_RSP 16): ra at sp+8, caller's rbp at sp.
  mem.words[sp0 + 8] = 0x11180;
  mem.words[sp0] = 0x9000;
  // Frame 1 at 0x1180 (RSP_DEREF: cfa = *(sp+24) + 8), sp = 0x7010.
  mem.words[0x7010 + 24] = 0x7100;
  mem.words[0x7100] = 0x11300;  // ra (cfa - 8): exactly the start of the CFA_END row
  // Frame 2 at 0x1300: ip - 1 = 0x12ff is in the CFA_RBP row; rbp = 0x9000.
  mem.words[0x9000 + 8] = 0x11410;  // ra at cfa - 8 = rbp + 8
  mem.words[0x9000] = 0x9500;       // saved rbp at cfa - 16
  // Frame 3 at 0x1410 (ip - 1 = 0x140f: PLT row), sp = 0x9010: cfa = sp + 8
  // (+8 more only when (ip & 15) >= 11 — ip itself, here 0x11410 & 15 = 0).
  mem.words[0x9010] = 0x11301;  // ra; 0x1300 is CFA_END
  ExpectUnwind(maps, Registers{0x11010, sp0, 0x1234}, mem, {0x11010, 0x11180, 0x11300, 0x11410, 0x11301},
               UnwindStop::kEnd, 16);
}

TEST(UnwindAlgorithmTest, StopsAndFramePointers) {
  UnwindTable t;
  t.rows = {Row(0x1000, CFA_RSP, 8, RBP_LOST), Row(0x1100, CFA_RBP, 16), Row(0x1200, CFA_RSP, 0),
            Row(0x1300, CFA_NONE, 0)};
  std::vector<MappedTable> maps = {{0x1000, 0x2000, 0, &t}, {0x5000, 0x6000, 0, nullptr}};
  FakeMemory mem;
  // RBP_LOST, then a CFA_RBP row: stop, RBP is unknown.
  mem.words[0x7008] = 0x1150;
  EXPECT_EQ(UnwindWithReason(maps, {0x1000, 0x7008, 0}, FakeMemory::Read, &mem).stop, UnwindStop::kBpUnknown);
  // CFA = SP: the stack does not grow.
  mem.words[0x6ff8] = 0x1000;
  EXPECT_EQ(UnwindWithReason(maps, {0x1200, 0x7000, 0}, FakeMemory::Read, &mem).stop, UnwindStop::kNotGrowing);
  // CFA_NONE, no mapping, unreadable, max frames.
  EXPECT_EQ(UnwindWithReason(maps, {0x1300, 0x7000, 0}, FakeMemory::Read, &mem).stop, UnwindStop::kNoCfi);
  EXPECT_EQ(UnwindWithReason(maps, {0x3000, 0x7000, 0}, FakeMemory::Read, &mem).stop, UnwindStop::kNoMapping);
  EXPECT_EQ(UnwindWithReason(maps, {0x1000, 0x8000, 0}, FakeMemory::Read, &mem).stop, UnwindStop::kUnreadable);
  // Frame pointers in the table-less mapping: ra = *(bp+8), bp' = *bp, sp' = bp + 16.
  mem.words[0x8008] = 0x5100;
  mem.words[0x8000] = 0x8100;
  mem.words[0x8108] = 0;  // a zero return address ends the walk
  mem.words[0x8100] = 0;
  ExpectUnwind(maps, Registers{0x5000, 0x7ff0, 0x8000}, mem, {0x5000, 0x5100}, UnwindStop::kZeroIp);
  EXPECT_EQ(UnwindWithReason(maps, {0x5000, 0x7ff0, 0x8000}, FakeMemory::Read, &mem, 1).stop, UnwindStop::kMaxFrames);
}

unwind_row RegRow(uint32_t pc, uint16_t reg, int32_t off) {
  unwind_row r = Row(pc, CFA_REG, off);
  r.reg = reg;
  return r;
}

// CFA_REG: the sample's register, at frame 0 and at frame 1 below a leaf of
// the same mapping, if the CFA is plausible; kRegUnknown otherwise.
TEST(UnwindAlgorithmTest, CfaFromAnotherRegister) {
  UnwindTable t;
  t.rows = {Row(0x1000, CFA_RSP, 8),   // perlasm leaf (_aesni_ctr32_ghash_6x)
            RegRow(0x1100, 0, 8),      // CFA = rax + 8 (aesni_gcm_encrypt)
            Row(0x1200, CFA_RSP, 16),  // its caller (EVP_EncryptUpdate)
            RegRow(0x1300, 9, 8),      // CFA = r9 + 8
            Row(0x1400, CFA_END, 0)};  // _start
  UnwindTable other;
  other.rows = {Row(0x1000, CFA_RSP, 8)};
  std::vector<MappedTable> maps = {{0x1000, 0x2000, 0, &t}, {0x5000, 0x6000, 0x4000, &other}};
  FakeMemory mem;
  // Frame 0 in the CFA = rax + 8 row: rax = 0x7100, ra at 0x7100.
  mem.words[0x7100] = 0x1210;      // into the caller
  mem.words[0x7108 + 8] = 0x1401;  // caller: cfa = 0x7108 + 16; ra at cfa - 8
  Registers regs{0x1150, 0x7000, 0};
  regs.gpr[0] = 0x7100;
  ExpectUnwind(maps, regs, mem, {0x1150, 0x1210, 0x1401}, UnwindStop::kEnd);

  // Frame 0 is the leaf (CFA_RSP), frame 1 in the rax row of the same mapping.
  mem.words[0x6ff8] = 0x1180;  // the leaf's ra (cfa = sp + 8)
  regs = {0x1010, 0x6ff8, 0};
  regs.gpr[0] = 0x7100;
  ExpectUnwind(maps, regs, mem, {0x1010, 0x1180, 0x1210, 0x1401}, UnwindStop::kEnd);

  // Frame 0 in another mapping (e.g. libc, which may clobber rax): stop.
  mem.words[0x6ff0] = 0x1180;
  regs = {0x5010, 0x6ff0, 0};
  regs.gpr[0] = 0x7100;
  ExpectUnwind(maps, regs, mem, {0x5010, 0x1180}, UnwindStop::kRegUnknown);

  // Frame 2: the sample's registers no longer hold, whatever they are.
  mem.words[0x7200] = 0x1010;  // frame 0 (CFA_RSP 16 at 0x1210) returns into the leaf
  mem.words[0x7208] = 0x1310;  // leaf returns into the r9 row
  regs = {0x1210, 0x71f8, 0};
  regs.gpr[9] = 0x7300;
  ExpectUnwind(maps, regs, mem, {0x1210, 0x1010, 0x1310}, UnwindStop::kRegUnknown);

  // Implausible CFAs at frame 0: below SP, more than 1 MiB above, misaligned.
  for (uint64_t rax : {uint64_t{0x6000}, uint64_t{0x7000 + (2 << 20)}, uint64_t{0x7101}, ~uint64_t{0}}) {
    regs = {0x1150, 0x7000, 0};
    regs.gpr[0] = rax;
    SCOPED_TRACE(::testing::Message() << std::hex << rax);
    ExpectUnwind(maps, regs, mem, {0x1150}, UnwindStop::kRegUnknown);
  }
}

// CFA_RSP_REG_DEREF (bn_mul_mont): cfa = *(sp + off + gpr[reg] * 8) + add,
// under CFA_REG's rules for the register and the CFA.
TEST(UnwindAlgorithmTest, CfaFromSlotIndexedByRegister) {
  UnwindTable t;
  unwind_row mont = Row(0x1000, CFA_RSP_REG_DEREF, 8, RBP_SAME, 0, 8);
  mont.reg = 9;
  t.rows = {mont, Row(0x1200, CFA_RSP, 16), Row(0x1400, CFA_END, 0)};
  std::vector<MappedTable> maps = {{0x1000, 0x2000, 0, &t}};
  FakeMemory mem;
  // r9 = 4 limbs: the caller's RSP is saved at sp + 8 + 4 * 8 = 0x7028.
  mem.words[0x7028] = 0x7200;
  mem.words[0x7200] = 0x1210;      // ra at cfa - 8, cfa = 0x7208
  mem.words[0x7208 + 8] = 0x1401;  // caller: cfa = 0x7208 + 16
  Registers regs{0x1050, 0x7000, 0};
  regs.gpr[9] = 4;
  ExpectUnwind(maps, regs, mem, {0x1050, 0x1210, 0x1401}, UnwindStop::kEnd);

  // An implausible slot value (below SP, misaligned): stop, never a wrong frame.
  for (uint64_t saved : {uint64_t{0x6000}, uint64_t{0x7203}}) {
    mem.words[0x7028] = saved;
    SCOPED_TRACE(::testing::Message() << std::hex << saved);
    ExpectUnwind(maps, regs, mem, {0x1050}, UnwindStop::kRegUnknown);
  }
}

TEST(UnwindAlgorithmTest, FindRow) {
  UnwindTable t;
  t.rows = {Row(0x1000, CFA_RSP, 8), Row(0x1010, CFA_RSP, 16), Row(0x1020, CFA_NONE, 0)};
  EXPECT_EQ(FindRow(t, 0xfff), nullptr);
  EXPECT_EQ(FindRow(t, 0x1000)->cfa_off, 8);
  EXPECT_EQ(FindRow(t, 0x100f)->cfa_off, 8);
  EXPECT_EQ(FindRow(t, 0x1010)->cfa_off, 16);
  EXPECT_EQ(FindRow(t, 0x5000)->cfa_kind, CFA_NONE);
  EXPECT_EQ(FindRow(t, uint64_t{1} << 33), nullptr);
  EXPECT_EQ(FindRow(UnwindTable{}, 0x1000), nullptr);
}

// ---- Bad input: an Error or an empty table, never a crash.

namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tlsprof-unwind-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name, const std::string& bytes) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Builds the table of `path`; checks the invariants when it succeeds.
bool BuildChecked(const std::string& path, size_t* rows = nullptr) {
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  auto built = BuildUnwindTable(fd.get(), path);
  if (!built.ok()) {
    EXPECT_FALSE(built.error().message.empty());
    return false;
  }
  const auto& r = (*built)->rows;
  for (size_t i = 1; i < r.size(); ++i) EXPECT_LT(r[i - 1].pc, r[i].pc) << path;
  if (rows) *rows = r.size();
  return true;
}

}  // namespace

TEST(UnwindTableTest, MalformedInput) {
  TempDir dir;
  EXPECT_FALSE(BuildChecked(dir.File("text", "not an ELF file at all\n")));
  EXPECT_FALSE(BuildChecked(dir.File("empty", "")));
  {
    auto bad = BuildUnwindTable(-1, "fd -1");
    EXPECT_FALSE(bad.ok());
  }

  uint64_t bias = 0;
  std::string lib_path = LoadedPath("libcrypto.so", &bias);
  std::string image = ReadAll(lib_path);
  ASSERT_GT(image.size(), 1u << 20);
  for (size_t len : {size_t{4}, size_t{64}, size_t{200}, size_t{4096}, image.size() / 2, image.size() - 4096}) {
    BuildChecked(dir.File("truncated", image.substr(0, len)));  // must just not crash
  }

  // Corrupt .eh_frame (and around it) at random: the builder must reject, not crash.
  std::string eh_frame_bounds = dir.path() + "/bounds";
  std::string cmd = "readelf -SW '" + lib_path + "' | awk '$2==\".eh_frame\"{print $5, $6}' > " + eh_frame_bounds;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  unsigned long off = 0, size = 0;
  ASSERT_EQ(std::sscanf(ReadAll(eh_frame_bounds).c_str(), "%lx %lx", &off, &size), 2);
  std::mt19937 rng(1);
  for (int round = 0; round < 8; ++round) {
    std::string copy = image;
    for (int i = 0; i < 2000; ++i) copy[off + rng() % size] = char(rng());
    size_t rows = 0;
    BuildChecked(dir.File("corrupt", copy), &rows);
  }

  // An ELF file without CFI: an empty table.
  std::string nocfi = dir.path() + "/nocfi";
  cmd = "objcopy -R .eh_frame -R .eh_frame_hdr -R .debug_frame /bin/true " + nocfi;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  size_t rows = 1;
  EXPECT_TRUE(BuildChecked(nocfi, &rows));
  EXPECT_EQ(rows, 0u);
}

// ---- Go: Go 1.19 writes .debug_frame only (no .eh_frame); the table comes
// from it. Go keeps frame pointers, so the agent may use either.
TEST(UnwindTableTest, GoBinary) {
  if (std::system("command -v go >/dev/null 2>&1") != 0) GTEST_SKIP() << "go is not installed";
  TempDir dir;
  dir.File("go.mod", "module unwindgo\n\ngo 1.19\n");
  dir.File("main.go",
           "package main\n\nimport (\n\t\"crypto/sha256\"\n\t\"fmt\"\n)\n\n"
           "func main() { fmt.Println(sha256.Sum256([]byte(\"hi\"))) }\n");
  std::string cmd = "cd " + dir.path() +
                    " && GOPROXY=off GOFLAGS=-mod=mod GOCACHE=/tmp/tlsprof-go-cache go build -o hello . 2>&1"
                    " && GOPROXY=off GOFLAGS=-mod=mod GOCACHE=/tmp/tlsprof-go-cache go build -ldflags=-s\\ -w"
                    " -o hello-stripped . 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string path = dir.path() + "/hello";
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  auto built = BuildUnwindTable(fd.get(), path);
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  std::printf("go binary: %zu rows, %lu FDEs, %lu unsupported, rsp rows %lu, rbp rows %lu\n", t.rows.size(), t.fdes,
              t.unsupported_rows, t.kind_rows[CFA_RSP], t.kind_rows[CFA_RBP]);
  EXPECT_GT(t.fdes, 100u);
  EXPECT_GT(t.kind_rows[CFA_RSP], 100u);
  EXPECT_EQ(t.unsupported_rows, 0u);

  // The pclntab (pcsp) table: Go's linker writes .debug_frame from the same
  // pcsp tables, so wherever .debug_frame gives CFA = RSP + n, the pclntab
  // rows must give the same n; and a stripped build (no .debug_frame, no
  // .symtab) gives the same rows.
  auto go = BuildGoUnwindTable(fd.get(), path);
  ASSERT_TRUE(go.ok()) << go.error().message;
  const UnwindTable& g = **go;
  std::printf("go pclntab: %zu rows, %lu functions, %lu unsupported, rsp %lu rbp %lu end %lu none %lu\n", g.rows.size(),
              g.fdes, g.unsupported_rows, g.kind_rows[CFA_RSP], g.kind_rows[CFA_RBP], g.kind_rows[CFA_END],
              g.kind_rows[CFA_NONE]);
  EXPECT_GE(g.fdes, t.fdes * 9 / 10);
  EXPECT_GE(g.kind_rows[CFA_RBP], 1u);  // runtime.systemstack, runtime.morestack (adjacent: one row)
  EXPECT_GE(g.kind_rows[CFA_END], 3u);
  size_t compared = 0, differ = 0, bp_saved = 0;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const unwind_row& d = t.rows[i];
    if (d.cfa_kind != CFA_RSP) continue;
    const uint64_t end = i + 1 < t.rows.size() ? t.rows[i + 1].pc : d.pc + 1;
    for (uint64_t pc = d.pc; pc < end; pc += std::max<uint64_t>(1, (end - d.pc) / 4)) {
      const unwind_row* r = FindRow(g, pc);
      if (r == nullptr || r->cfa_kind != CFA_RSP) continue;  // the stack-switching functions
      ++compared;
      if (r->cfa_off != d.cfa_off) ++differ;
      if (r->rbp_kind == RBP_AT_CFA) {
        ++bp_saved;
        EXPECT_GT(r->cfa_off, 8);
        EXPECT_EQ(r->rbp_off, -16);
      }
    }
  }
  std::printf("go pclntab vs .debug_frame: %zu PCs compared, %zu differ, %zu with RBP saved\n", compared, differ,
              bp_saved);
  EXPECT_GT(compared, 1000u);
  EXPECT_EQ(differ, 0u);
  EXPECT_GT(bp_saved, compared / 4);

  std::string stripped = dir.path() + "/hello-stripped";
  tlsprof::UniqueFd sfd(open(stripped.c_str(), O_RDONLY | O_CLOEXEC));
  auto cfi = BuildUnwindTable(sfd.get(), stripped);
  ASSERT_TRUE(cfi.ok()) << cfi.error().message;
  EXPECT_EQ((*cfi)->rows.size(), 0u);  // no .debug_frame left
  auto sgo = BuildGoUnwindTable(sfd.get(), stripped);
  ASSERT_TRUE(sgo.ok()) << sgo.error().message;
  EXPECT_EQ((*sgo)->fdes, g.fdes);
  EXPECT_EQ((*sgo)->rows.size(), g.rows.size());

  // A C file has no pclntab.
  tlsprof::UniqueFd self(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(BuildGoUnwindTable(self.get(), "self").ok());
}

// ---- Go with cgo: the C code linked into the binary has no pcsp table; its
// rows come from the file's CFI (.eh_frame), as in a C binary.
TEST(UnwindTableTest, GoBinaryWithCgoTakesCfiForTheCCode) {
  if (std::system("command -v go >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "go or gcc is not installed";
  }
  TempDir dir;
  dir.File("go.mod", "module unwindcgo\n\ngo 1.19\n");
  dir.File("main.go",
           "package main\n\n/*\n#include <stdlib.h>\n"
           "__attribute__((noinline)) int tlsprof_cfunc(int n) {\n"
           "  int *p = malloc(sizeof(int) * (n + 1)); int s = 0;\n"
           "  for (int i = 0; i <= n; i++) { p[i] = i * i; s += p[i] ^ n; }\n"
           "  free(p); return s;\n}\n*/\nimport \"C\"\nimport \"fmt\"\n\n"
           "func main() { fmt.Println(C.tlsprof_cfunc(10)) }\n");
  std::string cmd = "cd " + dir.path() +
                    " && CGO_ENABLED=1 GOPROXY=off GOFLAGS=-mod=mod GOCACHE=/tmp/tlsprof-go-cache go build -o hello ."
                    " 2>&1 && nm hello | awk '$3 == \"tlsprof_cfunc\" {print $1}' > cfunc.addr";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream addr_file(dir.path() + "/cfunc.addr");
  std::string hex;
  ASSERT_TRUE(std::getline(addr_file, hex)) << "tlsprof_cfunc not in the symbol table";
  const uint64_t cfunc = std::stoull(hex, nullptr, 16);

  std::string path = dir.path() + "/hello";
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  auto go = BuildGoUnwindTable(fd.get(), path);
  ASSERT_TRUE(go.ok()) << go.error().message;
  auto cfi = BuildUnwindTable(fd.get(), path);
  ASSERT_TRUE(cfi.ok()) << cfi.error().message;
  EXPECT_GT((*go)->gap_cfi_rows, 0u);
  // Entry (CFA = RSP + 8) and a few instructions in: the same rule as the CFI's.
  for (uint64_t pc = cfunc; pc < cfunc + 16; ++pc) {
    const unwind_row* g = FindRow(**go, pc);
    const unwind_row* c = FindRow(**cfi, pc);
    ASSERT_TRUE(g != nullptr && c != nullptr);
    EXPECT_NE(c->cfa_kind, CFA_NONE);
    EXPECT_EQ(g->cfa_kind, c->cfa_kind) << std::hex << pc;
    EXPECT_EQ(g->cfa_off, c->cfa_off) << std::hex << pc;
  }
}
