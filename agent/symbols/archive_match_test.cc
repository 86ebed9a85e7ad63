// Names for Debian's stripped libcrypto.so.3 from libssl-dev's libcrypto.a:
// the real files of this machine (the tests skip without libssl-dev).
//
// Ground truth is the .so's own .dynsym: the matcher is run blind (exported
// names are not used as anchors) and must give every exported function the
// name .dynsym gives it (recall) and never a wrong name at an exported
// address, nor an exported name at a foreign address (precision).
#include "agent/symbols/archive_match.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"
#include "common/proc_status.h"

namespace tlsprof::symbols {
namespace {

using namespace symtest;
using Clock = std::chrono::steady_clock;

bool Exists(const char* path) { return access(path, R_OK) == 0; }

#define REQUIRE_FILES(...)                                                              \
  for (const char* f : {__VA_ARGS__}) {                                                 \
    if (!Exists(f)) GTEST_SKIP() << f << " is missing (libssl3 and libssl-dev needed)"; \
  }

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Result<ArchiveMatch> Match(const char* so, const ArchiveIndex& index, const ArchiveMatchOptions& options = {}) {
  auto file = guard::OpenHostFile(so);
  if (!file) return file.error();
  auto elf = guard::ElfFile::Open(*file);
  if (!elf) return elf.error();
  return MatchArchive(*elf, index, options);
}

Result<std::shared_ptr<const ArchiveIndex>> LoadIndexFile(const std::string& path) {
  auto file = guard::OpenHostFile(path);
  if (!file) return file.error();
  return ArchiveIndex::Load(*file);
}

// GetArchiveIndex on a path (the cache is per file).
Result<std::shared_ptr<const ArchiveIndex>> GetArchiveIndex(const std::string& path) {
  auto file = guard::OpenHostFile(path);
  if (!file) return file.error();
  return symbols::GetArchiveIndex(*file);
}

LoadOptions DynsymOnly() {
  LoadOptions o = symtest::NoArchiveNoDebuginfod();
  o.debug.library_tables = false;
  return o;
}

TEST(ArchiveMatchTest, LibcryptoGetsInternalNames) {
  REQUIRE_FILES(kLibcrypto, kLibcryptoA);
  long hwm0 = ProcSelfStatusNumber("VmHWM:"), rss0 = ProcSelfStatusNumber("VmRSS:");
  LoadOptions options;
  options.debug.use_debuginfod = false;
  auto t0 = Clock::now();
  auto img = LoadPath(kLibcrypto, options);
  auto t1 = Clock::now();
  ASSERT_TRUE(img) << img.error().message;
  long hwm1 = ProcSelfStatusNumber("VmHWM:"), rss1 = ProcSelfStatusNumber("VmRSS:");
  const BinaryImage& i = **img;
  EXPECT_EQ(i.symbol_source, SymbolSource::kStaticArchive);

  auto dyn = LoadPath(kLibcrypto, DynsymOnly());
  ASSERT_TRUE(dyn) << dyn.error().message;
  std::printf(
      "libcrypto.so.3: %zu symbols (dynsym alone: %zu), first load %.1f ms (archive parse + match), "
      "RSS +%ld KiB, peak +%ld KiB\n",
      i.symbols.size(), (*dyn)->symbols.size(), Ms(t1 - t0), rss1 - rss0, hwm1 - hwm0);
  EXPECT_GT(i.symbols.size(), (*dyn)->symbols.size() * 2);

  // Cached archive: a second load only matches. The cache is checked by
  // what it returns, not by a time (under ASan beside other tests one load
  // took 0.3 s alone and 1.1 s in CI); the times are printed for reading.
  auto cached = GetArchiveIndex(kLibcryptoA);
  ASSERT_TRUE(cached) << cached.error().message;
  auto t2 = Clock::now();
  auto again = LoadPath(kLibcrypto, options);
  auto t3 = Clock::now();
  ASSERT_TRUE(again);
  std::printf("second load (archive index cached): %.1f ms\n", Ms(t3 - t2));
  auto cached_again = GetArchiveIndex(kLibcryptoA);
  ASSERT_TRUE(cached_again);
  EXPECT_EQ(cached->get(), cached_again->get()) << "the archive was parsed again";
  EXPECT_EQ((*again)->symbols.size(), i.symbols.size());

  for (const char* name : {"_aesni_ctr32_ghash_6x", "aesni_gcm_encrypt", "ChaCha20_ctr32",
                           "sha256_block_data_order_shaext", "ecp_nistz256_mul_mont", "x25519_fe64_mul", "rsa_sign",
                           "ecdsa_sign", "ecx_derive", "ecdh_plain_derive", "aes_gcm_cipher", "EVP_EncryptUpdate"}) {
    const Symbol* s = SymbolNamed(i, name);
    EXPECT_NE(s, nullptr) << name;
    if (s == nullptr) continue;
    auto found = i.symbols.Find(s->addr + s->size / 2);
    ASSERT_TRUE(found) << name;
    std::printf("  %-32s %#10llx %5llu bytes\n", name, static_cast<unsigned long long>(s->addr),
                static_cast<unsigned long long>(s->size));
  }
  // Exported names sit where .dynsym puts them.
  for (const char* name : {"EVP_PKEY_derive", "EVP_DigestSignFinal", "SHA256_Update"}) {
    const Symbol* d = SymbolNamed(**dyn, name);
    ASSERT_NE(d, nullptr) << name;
    const Symbol* s = SymbolNamed(i, name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->addr, d->addr) << name;
  }
}

TEST(ArchiveMatchTest, KeepFilterAppliesToArchiveNames) {
  REQUIRE_FILES(kLibcrypto, kLibcryptoA);
  LoadOptions all, some;
  all.debug.use_debuginfod = some.debug.use_debuginfod = false;
  some.keep = [](std::string_view n) { return n.starts_with("ecp_nistz256"); };
  auto a = LoadPath(kLibcrypto, all);
  auto s = LoadPath(kLibcrypto, some);
  ASSERT_TRUE(a && s);
  EXPECT_EQ((*s)->symbol_source, SymbolSource::kStaticArchive);
  EXPECT_EQ((*s)->symbols_seen, (*a)->symbols_seen);
  EXPECT_GT((*s)->symbols.size(), 10u);
  for (const Symbol& sym : (*s)->symbols.all()) ASSERT_TRUE(sym.name.starts_with("ecp_nistz256")) << sym.name;
}

// The matcher alone, without exported names as anchors, against .dynsym.
TEST(ArchiveMatchTest, BlindPrecisionAndRecallOnExports) {
  REQUIRE_FILES(kLibcrypto, kLibcryptoA);
  auto t0 = Clock::now();
  auto index = LoadIndexFile(kLibcryptoA);
  auto t1 = Clock::now();
  ASSERT_TRUE(index) << index.error().message;
  ArchiveMatchOptions blind;
  blind.anchor_on_exports = false;
  auto match = Match(kLibcrypto, **index, blind);
  auto t2 = Clock::now();
  ASSERT_TRUE(match) << match.error().message;
  const ArchiveMatchStats& st = match->stats;
  std::printf(
      "archive: %zu members, %zu functions, %zu code sections, index %.1f MiB, parsed in %.1f ms; "
      "match %.1f ms\n",
      (*index)->member_count(), (*index)->functions().size(), (*index)->section_count(),
      (*index)->memory_bytes() / 1048576.0, Ms(t1 - t0), Ms(t2 - t1));
  std::printf("exports %llu, defined by the archive %llu, fingerprint match %llu\n", (unsigned long long)st.exports,
              (unsigned long long)st.exports_checked, (unsigned long long)st.exports_matched);
  fmt::print(
      "FDE ranges {}: unique {}, ambiguous {}, too small {}, no candidate {}, no match {}; anchored sections {} "
      "(conflicting {}) added {}; placed by layout {} added {}; named addresses {}\n",
      st.fde_ranges, st.fde_unique, st.fde_ambiguous, st.fde_too_small, st.fde_no_candidate, st.fde_no_match,
      st.anchored_sections, st.conflicting_sections, st.anchored_functions, st.layout_sections, st.layout_functions,
      st.functions);

  auto dyn = LoadPath(kLibcrypto, DynsymOnly());
  ASSERT_TRUE(dyn);
  std::map<uint64_t, std::set<std::string>> truth;  // addr -> exported names
  std::map<std::string, uint64_t> exported;         // name -> addr
  for (const Symbol& s : (*dyn)->symbols.all()) {
    truth[s.addr].insert(s.name);
    exported[s.name] = s.addr;
  }
  std::map<uint64_t, std::set<std::string>> got;
  for (const MatchedFunction& f : match->functions) got[f.addr].insert(f.name);

  // Recall: exported functions the archive defines, named at their address.
  uint64_t want = 0, found = 0;
  for (const auto& [name, addr] : exported) {
    if ((*index)->GlobalsNamed(name).empty()) continue;
    ++want;
    auto it = got.find(addr);
    if (it != got.end() && it->second.contains(name)) ++found;
  }
  // Precision: every named address that .dynsym can judge (an exported
  // address, or an exported name) must agree with it.
  uint64_t judged = 0, correct = 0;
  int shown = 0;
  for (const auto& [addr, names] : got) {
    auto t = truth.find(addr);
    bool judgeable = t != truth.end();
    bool wrong = false;
    for (const std::string& n : names) {
      auto e = exported.find(n);
      if (e == exported.end()) continue;
      judgeable = true;
      if (e->second != addr) wrong = true;
    }
    if (!judgeable) continue;
    if (t != truth.end()) {
      bool any = false;
      for (const std::string& n : names) any |= t->second.contains(n);
      if (!any) wrong = true;
    }
    ++judged;
    if (!wrong) {
      ++correct;
    } else if (shown++ < 10) {
      std::printf("  WRONG at %#llx: got %s, .dynsym has %s\n", (unsigned long long)addr, names.begin()->c_str(),
                  t != truth.end() ? t->second.begin()->c_str() : "(nothing)");
    }
  }
  const double recall = want ? double(found) / double(want) : 0;
  const double precision = judged ? double(correct) / double(judged) : 0;
  std::printf("blind: recall %.4f (%llu of %llu exports), precision %.4f (%llu of %llu judgeable addresses)\n", recall,
              (unsigned long long)found, (unsigned long long)want, precision, (unsigned long long)correct,
              (unsigned long long)judged);
  EXPECT_GE(recall, 0.90);
  EXPECT_GE(precision, 0.99);
  EXPECT_GT(judged, 3000u);

  // A name that one function body carries in the whole archive is found at
  // one address at most (poly1305_init, for one, is both a global perlasm
  // function and a static in the provider).
  std::map<std::string, std::set<uint32_t>> bodies;
  for (const ArchiveFunction& f : (*index)->functions()) bodies[f.name].insert(f.body);
  std::map<std::string, std::set<uint64_t>> where;
  for (const MatchedFunction& f : match->functions) {
    if (bodies[f.name].size() == 1) where[f.name].insert(f.addr);
  }
  for (const auto& [name, addrs] : where) EXPECT_EQ(addrs.size(), 1u) << name;

  // With exports as anchors (the production setting) at least as much.
  auto anchored = Match(kLibcrypto, **index);
  ASSERT_TRUE(anchored);
  std::printf("with export anchors: %llu named addresses (%llu anchored sections)\n",
              (unsigned long long)anchored->stats.functions, (unsigned long long)anchored->stats.anchored_sections);
  EXPECT_GE(anchored->stats.functions, st.functions);
}

TEST(ArchiveMatchTest, LibsslToo) {
  REQUIRE_FILES(kLibssl, kLibsslA);
  LoadOptions options;
  options.debug.use_debuginfod = false;
  auto img = LoadPath(kLibssl, options);
  ASSERT_TRUE(img) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kStaticArchive);
  EXPECT_NE(SymbolNamed(**img, "tls13_enc"), nullptr);
  EXPECT_NE(SymbolNamed(**img, "SSL_write"), nullptr);
}

TEST(ArchiveMatchTest, ForeignArchiveIsRejected) {
  REQUIRE_FILES(kLibcrypto, kLibsslA, kLibcryptoA);
  auto ssl = GetArchiveIndex(kLibsslA);
  ASSERT_TRUE(ssl) << ssl.error().message;
  auto m = Match(kLibcrypto, **ssl);
  ASSERT_FALSE(m);
  std::printf("%s\n", m.error().message.c_str());
  // libcrypto.a against libssl.so.3: libssl's exports are not in it.
  auto crypto = GetArchiveIndex(kLibcryptoA);
  ASSERT_TRUE(crypto);
  EXPECT_FALSE(Match(kLibssl, **crypto));

  // Through LoadBinaryImage: the wrong archive is skipped, .dynsym remains.
  LoadOptions options = DynsymOnly();
  options.debug.static_archives = {kLibsslA};
  auto img = LoadPath(kLibcrypto, options);
  ASSERT_TRUE(img);
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kDynsym);
  // ... and the right one after it is used.
  options.debug.static_archives = {kLibsslA, kLibcryptoA};
  img = LoadPath(kLibcrypto, options);
  ASSERT_TRUE(img);
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kStaticArchive);
}

// An archive of the same library from another build: a function's code
// differs, so the same-build check fails. Built here: one object, compiled
// twice with different code under the same names.
TEST(ArchiveMatchTest, OtherBuildIsRejected) {
  if (!symtest::HaveTool("cc") || !symtest::HaveTool("ar")) GTEST_SKIP() << "needs cc and ar";
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::vector<uint8_t> b(text.begin(), text.end());
    WriteFileBytes(dir.File(name), b);
  };
  const char* body = R"(
static __attribute__((noinline)) unsigned mix(unsigned x) { __asm__ volatile("" ::: "memory"); return x * K + 7; }
unsigned api_one(unsigned x) { return mix(x) ^ K; }
unsigned api_two(unsigned x) { return mix(x + 1) - K; }
unsigned api_three(unsigned x) { return mix(x) + mix(x >> 3) * K; }
)";
  write("a.c", std::string("#define K 2654435761u\n") + body);
  write("b.c", std::string("#define K 40503u\n") + body);
  auto run = [&](const std::string& cmd) {
    auto r = symtest::RunCommand("cd " + dir.path() + " && " + cmd);
    ASSERT_EQ(r.status, 0) << cmd << "\n" << r.output;
  };
  run("cc -O2 -fPIC -c a.c -o a.o && ar rcs liba.a a.o && cc -shared -o liba.so a.o -Wl,-soname,liba.so.1");
  run("cc -O2 -fPIC -c b.c -o b.o && ar rcs libb.a b.o");
  run("strip --strip-all liba.so");
  auto good = LoadIndexFile(dir.File("liba.a"));
  auto bad = LoadIndexFile(dir.File("libb.a"));
  ASSERT_TRUE(good && bad);
  auto m = Match(dir.File("liba.so").c_str(), **good);
  ASSERT_TRUE(m) << m.error().message;
  bool has_mix = false;
  for (const MatchedFunction& f : m->functions) has_mix |= f.name == "mix";
  EXPECT_TRUE(has_mix);
  auto r = Match(dir.File("liba.so").c_str(), **bad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("another build"), std::string::npos) << r.error().message;

  // The default archive next to a library is found by soname.
  LoadOptions options = DynsymOnly();
  options.debug.static_archive_sonames = {"liba.so.1"};
  auto img = LoadPath(dir.File("liba.so"), options);
  ASSERT_TRUE(img) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kStaticArchive);
  EXPECT_NE(SymbolNamed(**img, "mix"), nullptr);
}

TEST(ArchiveMatchTest, DefaultArchivePaths) {
  std::vector<std::string> sonames = {"libcrypto.so.3", "libssl.so.3"};
  EXPECT_EQ(DefaultStaticArchives("libcrypto.so.3", sonames,
                                  {"/proc/7/root/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                                   "/usr/lib/x86_64-linux-gnu", "", "relative"}),
            (std::vector<std::string>{"/proc/7/root/usr/lib/x86_64-linux-gnu/libcrypto.a",
                                      "/usr/lib/x86_64-linux-gnu/libcrypto.a"}));
  EXPECT_TRUE(DefaultStaticArchives("libz.so.1", sonames, {"/usr/lib"}).empty());
  EXPECT_TRUE(DefaultStaticArchives("", sonames, {"/usr/lib"}).empty());
}

TEST(ArchiveMatchTest, CacheSharesTheIndex) {
  REQUIRE_FILES(kLibsslA);
  auto a = GetArchiveIndex(kLibsslA);
  auto b = GetArchiveIndex(kLibsslA);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->get(), b->get());
  EXPECT_FALSE(GetArchiveIndex("/tlsprof-no-such-dir/libx.a"));
}

// Truncated, garbled and foreign files: an Error or a (smaller) index, never
// a crash. Truncation inside a member is always an Error.
TEST(ArchiveMatchTest, MalformedArchives) {
  REQUIRE_FILES(kLibsslA, kLibcrypto);
  TempDir dir;
  const std::vector<uint8_t> good = ReadFileBytes(kLibsslA);
  ASSERT_GT(good.size(), 4096u);
  auto load = [&](const std::vector<uint8_t>& bytes) {
    WriteFileBytes(dir.File("x.a"), bytes);
    return LoadIndexFile(dir.File("x.a"));
  };
  EXPECT_FALSE(load({}));
  EXPECT_FALSE(load(std::vector<uint8_t>{'!', '<', 'a', 'r', 'c', 'h', '>', '\n'}));  // no members
  std::vector<uint8_t> garbage(100000);
  std::mt19937 rng(42);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  EXPECT_FALSE(load(garbage));
  auto so = ReadFileBytes(kLibcrypto);
  so.resize(1 << 20);
  EXPECT_FALSE(load(so));  // an ELF file, not an archive

  for (size_t cut : {size_t{8}, size_t{60}, size_t{68}, size_t{1000}, good.size() / 3, good.size() / 2,
                     good.size() - 100, good.size() - 1}) {
    auto r = load(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<ptrdiff_t>(cut)));
    EXPECT_FALSE(r) << "truncated to " << cut;
    if (!r) std::printf("cut %zu: %s\n", cut, r.error().message.c_str());
  }
  // Random byte flips all over: must not crash.
  int ok = 0, err = 0;
  for (int round = 0; round < 60; ++round) {
    std::vector<uint8_t> bytes = good;
    for (int k = 0; k < 40; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    // And some in the first member headers, where it hurts most.
    for (int k = 0; k < 8; ++k) bytes[rng() % 4096] = static_cast<uint8_t>(rng());
    (load(bytes) ? ok : err)++;
  }
  std::printf("flipped bytes: %d loaded, %d errors\n", ok, err);
}

}  // namespace
}  // namespace tlsprof::symbols
