// Names for Debian's stripped BoringSSL (android-libboringssl's
// libcrypto.so.0) from its method structs: the real file of this machine
// (scripts/install-deps.sh installs it; without it the tests fail).
//
// Cross-check: the same structs read by hand, with binutils instead of this
// module's decoder. objdump disassembles each getter (its `lea rax` before
// `ret`, and the init it passes to CRYPTO_once@plt) and each init (its `lea
// rax, fn` / `mov [slot], rax` pairs); readelf lists the relocations of a
// static struct and the .eh_frame FDEs that give each function's extent.
#include "agent/symbols/boringssl_tables.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

constexpr const char* kLibcrypto = "/usr/lib/x86_64-linux-gnu/android/libcrypto.so.0";
constexpr const char* kLibssl = "/usr/lib/x86_64-linux-gnu/android/libssl.so.0";
constexpr const char* kOpenSsl3 = symtest::kLibcrypto;

#define REQUIRE_FILES(...) SYMTEST_REQUIRE_FILES("run scripts/install-deps.sh (android-libboringssl-dev)", __VA_ARGS__)

Result<BoringSslTables> Read(const std::string& path) { return symtest::ReadPath(path, ReadBoringSslTables); }

using symtest::MustRun;

uint64_t Hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

// The binutils view of the library.
class Binutils {
 public:
  Binutils() {
    // Exported functions.
    std::istringstream nm(MustRun(std::string("nm -D --defined-only ") + kLibcrypto));
    for (std::string line; std::getline(nm, line);) {
      std::istringstream f(line);
      std::string addr, type, name;
      if (f >> addr >> type >> name) exports_[name] = Hex(addr);
    }
    // Relocations: R_X86_64_RELATIVE slot -> target.
    std::istringstream rel(MustRun(std::string("readelf -rW ") + kLibcrypto));
    const std::regex relative(R"(^([0-9a-f]{16})\s+[0-9a-f]+\s+R_X86_64_RELATIVE\s+([0-9a-f]+))");
    for (std::string line; std::getline(rel, line);) {
      std::smatch m;
      if (std::regex_search(line, m, relative)) relative_[Hex(m[1])] = Hex(m[2]);
    }
    // FDEs: start -> length.
    std::istringstream fr(MustRun(std::string("readelf --debug-dump=frames ") + kLibcrypto));
    const std::regex fde(R"(FDE cie=[0-9a-f]+ pc=([0-9a-f]+)\.\.([0-9a-f]+))");
    for (std::string line; std::getline(fr, line);) {
      std::smatch m;
      if (std::regex_search(line, m, fde)) fdes_[Hex(m[1])] = Hex(m[2]) - Hex(m[1]);
    }
  }

  uint64_t Export(const std::string& name) const {
    auto it = exports_.find(name);
    return it == exports_.end() ? 0 : it->second;
  }
  std::optional<uint64_t> Relative(uint64_t slot) const {
    auto it = relative_.find(slot);
    if (it == relative_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<uint64_t> FdeLength(uint64_t start) const {
    auto it = fdes_.find(start);
    if (it == fdes_.end()) return std::nullopt;
    return it->second;
  }

  // objdump's lines from `addr` to its first ret.
  static std::vector<std::string> Disassemble(uint64_t addr) {
    char range[96];
    std::snprintf(range, sizeof range, "--start-address=0x%llx --stop-address=0x%llx",
                  static_cast<unsigned long long>(addr), static_cast<unsigned long long>(addr + 1024));
    std::istringstream out(MustRun(std::string("objdump -d -M intel --no-show-raw-insn ") + range + " " + kLibcrypto));
    std::vector<std::string> lines;
    bool started = false;
    for (std::string line; std::getline(out, line);) {
      if (line.find(":\t") == std::string::npos) continue;
      started = true;
      lines.push_back(line);
      if (line.find("\tret") != std::string::npos) break;
    }
    EXPECT_TRUE(started);
    return lines;
  }

  // A getter by hand: the struct (`lea rax,[rip+..] # S` before ret) and the
  // once-init (`lea rsi,[rip+..] # I` before `call ... <CRYPTO_once@plt>`).
  struct Getter {
    uint64_t strukt = 0;
    uint64_t init = 0;
  };
  static Getter ReadGetter(uint64_t addr) {
    const std::regex lea(R"(lea\s+(r[a-z0-9]+),\[rip\+0x[0-9a-f]+\]\s+# ([0-9a-f]+))");
    Getter g;
    uint64_t rsi = 0;
    for (const std::string& line : Disassemble(addr)) {
      std::smatch m;
      if (std::regex_search(line, m, lea)) {
        if (m[1] == "rax") g.strukt = Hex(m[2]);
        if (m[1] == "rsi") rsi = Hex(m[2]);
      }
      if (line.find("<CRYPTO_once@plt>") != std::string::npos) g.init = rsi;
    }
    return g;
  }

  // An init by hand: slot -> function, from `lea rax,[rip+..] # F` followed
  // by `mov QWORD PTR [rip+..],rax # SLOT`.
  static std::map<uint64_t, uint64_t> ReadInit(uint64_t addr) {
    const std::regex lea(R"(lea\s+rax,\[rip\+0x[0-9a-f]+\]\s+# ([0-9a-f]+))");
    const std::regex store(R"(mov\s+QWORD PTR \[rip\+0x[0-9a-f]+\],rax\s+# ([0-9a-f]+))");
    std::map<uint64_t, uint64_t> out;
    uint64_t rax = 0;
    for (const std::string& line : Disassemble(addr)) {
      std::smatch m;
      if (std::regex_search(line, m, lea)) {
        rax = Hex(m[1]);
      } else if (std::regex_search(line, m, store) && rax != 0) {
        out[Hex(m[1])] = rax;
      } else if (line.find("rax") != std::string::npos) {
        rax = 0;  // anything else that touches rax: not a function pointer we can vouch for
      }
    }
    return out;
  }

 private:
  std::map<std::string, uint64_t> exports_;
  std::map<uint64_t, uint64_t> relative_;
  std::map<uint64_t, uint64_t> fdes_;
};

std::map<uint64_t, const TableFunction*> ByAddr(const BoringSslTables& t) {
  std::map<uint64_t, const TableFunction*> out;
  for (const TableFunction& f : t.functions) out[f.addr] = &f;
  return out;
}

// The once-init of P-256's EC_METHOD, read by hand from the curve table's
// init `init`: the first once-init after the entry's
// `mov DWORD PTR [..],0x19f` (NID 415; in this build the method's getter is
// inlined after it). 0: none.
uint64_t P256MethodInit(uint64_t init) {
  const std::regex once_init(R"(lea\s+rsi,\[rip\+0x[0-9a-f]+\]\s+# ([0-9a-f]+))");
  bool after_p256 = false;
  for (const std::string& line : Binutils::Disassemble(init)) {
    if (line.find("DWORD PTR") != std::string::npos && line.find(",0x19f") != std::string::npos) after_p256 = true;
    std::smatch m;
    if (after_p256 && std::regex_search(line, m, once_init)) return Hex(m[1]);
  }
  return 0;
}

TEST(BoringSslTablesTest, NamesDebianBoringSslFromItsGetters) {
  REQUIRE_FILES(kLibcrypto);
  ASSERT_TRUE(symtest::HaveTool("objdump") && symtest::HaveTool("readelf") && symtest::HaveTool("nm"))
      << "binutils is missing";
  auto tables = Read(kLibcrypto);
  ASSERT_TRUE(tables) << tables.error().message;
  const BoringSslTablesStats& st = tables->stats;
  std::printf("libcrypto.so.0: %llu getters, %llu curves, %llu slots, %llu functions named, %llu without an FDE\n",
              (unsigned long long)st.getters, (unsigned long long)st.curves, (unsigned long long)st.slots,
              (unsigned long long)st.functions, (unsigned long long)st.no_extent);
  // Android 13's BoringSSL: ~60 EVP_aead_/EVP_aes_/EVP_sha.. getters, 4 built-in curves.
  EXPECT_GE(st.getters, 45u);
  EXPECT_EQ(st.curves, 4u);
  EXPECT_GE(st.functions, 100u);
  EXPECT_EQ(st.no_extent, 0u);
  const auto by_addr = ByAddr(*tables);
  Binutils bu;

  // Every named function starts an FDE of the length it was given.
  for (const TableFunction& f : tables->functions) {
    EXPECT_EQ(bu.FdeLength(f.addr), f.size) << f.name;
  }

  auto expect_name = [&](uint64_t fn, const std::string& want, const std::string& what) {
    auto it = by_addr.find(fn);
    if (it == by_addr.end()) {
      ADD_FAILURE() << what << ": nothing named at " << std::hex << fn << ", want " << want;
      return;
    }
    EXPECT_EQ(it->second->name, want) << what << " at " << std::hex << fn;
  };

  // A static struct (.data.rel.ro, R_X86_64_RELATIVE): EVP_AEAD's seal_scatter
  // (offset 40) and open_gather (48).
  {
    const Binutils::Getter g = Binutils::ReadGetter(bu.Export("EVP_aead_chacha20_poly1305"));
    ASSERT_NE(g.strukt, 0u);
    EXPECT_EQ(g.init, 0u);
    auto seal = bu.Relative(g.strukt + 40);
    auto open = bu.Relative(g.strukt + 48);
    ASSERT_TRUE(seal && open);
    expect_name(*seal, "boringssl:aead:ChaCha20-Poly1305:seal_scatter", "EVP_aead_chacha20_poly1305 seal");
    expect_name(*open, "boringssl:aead:ChaCha20-Poly1305:open_gather", "EVP_aead_chacha20_poly1305 open");
  }
  // Structs filled by a once-init (.bss): the init's stores give the fields.
  struct Once {
    const char* getter;
    uint64_t offset;
    const char* name;
  };
  const Once kOnce[] = {
      {"EVP_aead_aes_128_gcm", 40, "boringssl:aead:AES-GCM:seal_scatter"},
      {"EVP_aes_128_cbc", 40, "boringssl:cipher:AES-CBC:cipher"},
      {"EVP_aes_128_ctr", 40, "boringssl:cipher:AES-CTR:cipher"},
      {"EVP_sha256", 24, "boringssl:md:SHA-256:update"},
      {"EVP_sha1", 24, "boringssl:md:SHA-1:update"},
      {"EVP_sha512", 32, "boringssl:md:SHA-512:final"},
  };
  for (const Once& o : kOnce) {
    const Binutils::Getter g = Binutils::ReadGetter(bu.Export(o.getter));
    ASSERT_NE(g.strukt, 0u) << o.getter;
    ASSERT_NE(g.init, 0u) << o.getter;
    const auto stores = Binutils::ReadInit(g.init);
    auto it = stores.find(g.strukt + o.offset);
    ASSERT_NE(it, stores.end()) << o.getter << " init stores nothing at +" << o.offset;
    expect_name(it->second, o.name, o.getter);
  }
  // The key size is dropped: AES-128-CBC and AES-256-CBC share their cipher function.
  {
    const auto g128 = Binutils::ReadGetter(bu.Export("EVP_aes_128_cbc"));
    const auto g256 = Binutils::ReadGetter(bu.Export("EVP_aes_256_cbc"));
    EXPECT_EQ(Binutils::ReadInit(g128.init).at(g128.strukt + 40), Binutils::ReadInit(g256.init).at(g256.strukt + 40));
  }

  // EC: EC_GROUP_new_by_curve_name's first once-init fills the built-in
  // curve table; P-256 (NID 415) has a method of its own (fiat-crypto; this
  // build is OPENSSL_SMALL, so no nistz256), P-384/P-521/P-224 share the
  // generic Montgomery one. By hand: the entry whose `mov DWORD PTR [..],0x19f`
  // is followed by the once-init of its method.
  {
    const Binutils::Getter curves = Binutils::ReadGetter(bu.Export("EC_GROUP_new_by_curve_name"));
    ASSERT_NE(curves.init, 0u);
    const uint64_t p256_init = P256MethodInit(curves.init);
    ASSERT_NE(p256_init, 0u) << "no once-init after the P-256 entry in the curve table's init";
    const auto method = Binutils::ReadInit(p256_init);
    ASSERT_GE(method.size(), 10u);
    const uint64_t base = method.begin()->first;
    // EC_METHOD: mul at 56, mul_base at 64 (BoringSSL 2021-2023).
    expect_name(method.at(base + 56), "boringssl:ec:P-256:mul", "P-256 mul");
    expect_name(method.at(base + 64), "boringssl:ec:P-256:mul_base", "P-256 mul_base");
    expect_name(method.at(base + 0), "boringssl:ec:P-224|P-256|P-384|P-521:group_init", "group_init");
  }
  // Functions shared by algorithms list them all.
  bool shared_init = false;
  for (const TableFunction& f : tables->functions) {
    shared_init |= f.name == "boringssl:aead:ChaCha20-Poly1305|XChaCha20-Poly1305:init";
  }
  EXPECT_TRUE(shared_init);
}

// A library laid out the way BoringSSL lays its methods out, built here from
// testdata/boringssl_methods.c: the names depend on the structs alone, not
// on Debian's build. Built at two optimisation levels (the getters and inits
// compile differently: -Os keeps the getters' frames).
class SyntheticBoringSslTest : public ::testing::TestWithParam<const char*> {};

// What the reader names each function of testdata/boringssl_methods.c.
const std::map<std::string, std::string> kBoringSslMethodNames = {
    // A static struct, through its relocations.
    {"chacha_init", "boringssl:aead:ChaCha20-Poly1305:init"},
    {"chacha_cleanup", "boringssl:aead:ChaCha20-Poly1305:cleanup"},
    {"chacha_seal_scatter", "boringssl:aead:ChaCha20-Poly1305:seal_scatter"},
    {"chacha_open_gather", "boringssl:aead:ChaCha20-Poly1305:open_gather"},
    // Structs filled by once-inits; two getters (key sizes) of one struct.
    {"sha256_init", "boringssl:md:SHA-256:init"},
    {"sha256_update", "boringssl:md:SHA-256:update"},
    {"sha256_final", "boringssl:md:SHA-256:final"},
    {"aes_init_key", "boringssl:cipher:AES-CBC:init"},
    {"aes_cbc_cipher", "boringssl:cipher:AES-CBC:cipher"},
    // The curve table: a method per curve, a function both share.
    {"p256_mul", "boringssl:ec:P-256:mul"},
    {"p256_mul_base", "boringssl:ec:P-256:mul_base"},
    {"mont_mul", "boringssl:ec:P-384:mul"},
    {"mont_mul_base", "boringssl:ec:P-384:mul_base"},
    {"mont_group_init", "boringssl:ec:P-256|P-384:group_init"},
};

TEST_P(SyntheticBoringSslTest, NamesEveryMethodFunction) {
  symtest::BuiltTables<BoringSslTables> built;
  ASSERT_NO_FATAL_FAILURE(symtest::ReadBuiltLibrary("libbssl", "libbssl.so.0", GetParam(), "boringssl_methods.c",
                                                    "-lpthread", ReadBoringSslTables, &built));
  EXPECT_EQ(built.by_real_name, kBoringSslMethodNames);
  EXPECT_EQ(built.tables.stats.curves, 2u);
}

INSTANTIATE_TEST_SUITE_P(OptLevels, SyntheticBoringSslTest, ::testing::Values("-O2", "-Os"));

TEST(BoringSslTablesTest, OtherLibrariesGiveNothing) {
  REQUIRE_FILES(kLibssl, kOpenSsl3);
  for (const char* lib : {kLibssl, kOpenSsl3}) {
    auto tables = Read(lib);
    ASSERT_TRUE(tables) << tables.error().message;
    EXPECT_TRUE(tables->functions.empty()) << lib;
    EXPECT_EQ(tables->stats.getters, 0u) << lib;
  }
}

// Through LoadBinaryImage, with no debug file: .dynsym plus the method
// tables (source "method-tables"), an export's own name kept where both
// name an address.
TEST(BoringSslTablesTest, LoadBinaryImageAddsThemAfterDynsym) {
  REQUIRE_FILES(kLibcrypto);
  const LoadOptions options = symtest::NoArchiveNoDebuginfod();
  auto img = symtest::LoadFrom(kLibcrypto, options, SymbolSource::kMethodTables);
  ASSERT_NE(img, nullptr);
  const BinaryImage& i = *img;
  symtest::ExpectFoundInside(i, "boringssl:aead:ChaCha20-Poly1305:seal_scatter");
  // Exports keep their names: none of the table's functions is at an export.
  for (const Symbol& s : i.symbols.all()) {
    if (s.name.rfind("boringssl:", 0) != 0) continue;
    auto at = i.symbols.Find(s.addr);
    ASSERT_TRUE(at);
    EXPECT_EQ(i.symbols.at(*at).name.rfind("boringssl:", 0), 0u) << s.name << " lost to an export";
  }
  EXPECT_GE(i.symbols.size(), symtest::DynsymOnlySize(kLibcrypto, options) + 100);
}

// Truncated and corrupted copies: an Error or a (partial) result, never a
// crash or a read outside the file (ASan in the sanitizer pass). The
// corruption is aimed at what the decoder reads (the getters' code, the
// structs and the relocations) as well as spread over the whole file.
TEST(BoringSslTablesTest, MalformedCopiesGiveErrorsNotCrashes) {
  REQUIRE_FILES(kLibcrypto);
  // File offsets of the decoded regions: .text (getters, inits) at 0x863c0
  // for 1 MiB, .data.rel.ro at 0x18c230, .rela.dyn at 0x24838 (readelf -S).
  symtest::ExpectMalformedCopiesHandled(kLibcrypto, "libcrypto.so.0",
                                        {{0, 0}, {0x863c0, 0x18c000}, {0x18c230, 0x19af48}, {0x24838, 0x3c400}}, 4,
                                        4000, Read, [](const Result<BoringSslTables>& t, unsigned seed) {
                                          if (!t) return;
                                          for (const TableFunction& f : t->functions)
                                            ASSERT_EQ(f.name.rfind("boringssl:", 0), 0u) << "seed " << seed;
                                        });
}

}  // namespace
}  // namespace tlsprof::symbols
