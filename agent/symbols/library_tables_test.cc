// Names for Debian's stripped libcrypto.so.3 from its provider tables: the
// real files of this machine (libssl3 and libssl-dev from
// scripts/install-deps.sh; without them the tests fail).
//
// Ground truth is libssl-dev's libcrypto.a, which names the same build's
// functions at the same addresses (archive_match.h): a function the tables
// name must be the provider function OpenSSL's source puts in that table.
#include "agent/symbols/library_tables.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "agent/symbols/archive_match.h"
#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

using namespace symtest;

#define REQUIRE_FILES(...) SYMTEST_REQUIRE_FILES("run scripts/install-deps.sh (libssl3, libssl-dev)", __VA_ARGS__)

Result<LibraryTables> Read(const std::string& path) { return symtest::ReadPath(path, ReadLibraryTables); }

// The truth: the names libssl-dev's libcrypto.a (the same build) gives the
// addresses of libcrypto.so.3, and their sizes.
struct ArchiveTruth {
  std::map<uint64_t, std::set<std::string>> names;
  std::map<uint64_t, uint64_t> sizes;
};

void ReadArchiveTruth(ArchiveTruth* out) {
  auto archive = guard::OpenHostFile(kLibcryptoA);
  ASSERT_TRUE(archive) << archive.error().message;
  auto index = GetArchiveIndex(*archive);
  ASSERT_TRUE(index) << index.error().message;
  auto file = guard::OpenHostFile(kLibcrypto);
  ASSERT_TRUE(file) << file.error().message;
  auto elf = guard::ElfFile::Open(*file);
  ASSERT_TRUE(elf) << elf.error().message;
  auto match = MatchArchive(*elf, **index);
  ASSERT_TRUE(match) << match.error().message;
  for (const MatchedFunction& f : match->functions) {
    out->names[f.addr].insert(f.name);
    out->sizes[f.addr] = f.size;
  }
}

std::map<std::string, uint64_t> ByName(const LibraryTables& t) {
  std::map<std::string, uint64_t> out;
  for (const TableFunction& f : t.functions) out.emplace(f.name, f.addr);
  return out;
}

// What the provider tables of OpenSSL 3.0 put behind the names TLS needs
// (providers/implementations/*): the synthetic name and the function's real
// name in libcrypto.a.
const std::pair<const char*, const char*> kProviderFunctions[] = {
    {"provider:signature:ECDSA:sign", "ecdsa_sign"},
    {"provider:signature:ECDSA:digest_sign_init", "ecdsa_digest_sign_init"},
    {"provider:signature:RSA:sign", "rsa_sign"},
    {"provider:signature:RSA:newctx", "rsa_newctx"},
    {"provider:keyexch:ECDH:derive", "ecdh_derive"},
    {"provider:keyexch:ECDH:newctx", "ecdh_newctx"},
    {"provider:keymgmt:EC:gen", "ec_gen"},
    {"provider:keymgmt:X25519:gen", "x25519_gen"},
    {"provider:cipher:AES-GCM|ARIA-GCM:update", "ossl_gcm_stream_update"},
    {"provider:cipher:ChaCha20-Poly1305:newctx", "chacha20_poly1305_newctx"},
    {"provider:cipher:ChaCha20-Poly1305:update", "chacha20_poly1305_update"},
    {"provider:cipher:ChaCha20-Poly1305:cipher", "chacha20_poly1305_cipher"},
    {"provider:kdf:TLS13-KDF:derive", "kdf_tls1_3_derive"},
    {"provider:kdf:HKDF:derive", "kdf_hkdf_derive"},
    {"provider:mac:HMAC:update", "hmac_update"},
};

// Debian's libcrypto.so.3 named from its tables, and the truth for it.
class DebianLibcryptoTables : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_FILES(kLibcrypto, kLibcryptoA);
    auto read = Read(kLibcrypto);
    ASSERT_TRUE(read) << read.error().message;
    tables_ = std::move(*read);
    ASSERT_NO_FATAL_FAILURE(ReadArchiveTruth(&archive_));
  }

  LibraryTables tables_;
  ArchiveTruth archive_;
};

TEST_F(DebianLibcryptoTables, NameTheProviderFunctions) {
  const LibraryTablesStats& st = tables_.stats;
  std::printf(
      "libcrypto.so.3: %llu algorithms in %llu tables, %llu dispatch slots, %llu functions named, %llu "
      "without an FDE\n",
      (unsigned long long)st.algorithms, (unsigned long long)st.tables, (unsigned long long)st.dispatch_slots,
      (unsigned long long)st.functions, (unsigned long long)st.no_extent);
  // OpenSSL 3.0's default and base providers: ~500 algorithms in ~20 tables.
  EXPECT_GE(st.algorithms, 400u);
  EXPECT_GE(st.tables, 15u);
  EXPECT_GE(st.functions, 1000u);
  EXPECT_EQ(st.functions, tables_.functions.size());

  std::map<uint64_t, std::set<std::string>>& truth = archive_.names;
  const std::map<uint64_t, uint64_t>& truth_size = archive_.sizes;

  // Every named address is the start of a function of that size (nothing is
  // read from a table that is not one), wherever the archive names it.
  size_t known = 0, wrong_extent = 0;
  for (const TableFunction& f : tables_.functions) {
    auto it = truth_size.find(f.addr);
    if (it == truth_size.end()) continue;
    ++known;
    if (it->second != f.size) ++wrong_extent;
  }
  std::printf("%zu of %zu named functions also named by libcrypto.a; %zu with another extent\n", known,
              tables_.functions.size(), wrong_extent);
  EXPECT_GE(known, tables_.functions.size() * 95 / 100);
  EXPECT_EQ(wrong_extent, 0u);

  const auto by_name = ByName(tables_);
  for (const auto& [synthetic, real] : kProviderFunctions) {
    auto it = by_name.find(synthetic);
    if (it == by_name.end()) {
      ADD_FAILURE() << synthetic << " is not among the names";
      continue;
    }
    const std::set<std::string>& names = truth[it->second];
    EXPECT_TRUE(names.count(real)) << synthetic << " at " << std::hex << it->second << " is "
                                   << (names.empty() ? std::string("unnamed") : *names.begin()) << ", not " << real;
  }

  // Functions shared by algorithms list them all (X25519 and X448 share
  // ecx_derive), or "*" for many (every block cipher mode the generic update).
  auto named_as = [&](const std::string& synthetic, const std::string& real) {
    for (const TableFunction& f : tables_.functions) {
      if (f.name == synthetic && truth[f.addr].count(real)) return true;
    }
    return false;
  };
  EXPECT_TRUE(named_as("provider:keyexch:X25519|X448:derive", "ecx_derive"));
  EXPECT_TRUE(named_as("provider:cipher:*:update", "ossl_cipher_generic_block_update"));
}

// Below the providers (library_tables.h, "openssl:" names): the EC methods
// of the built-in curves, the cipher hw structs and X25519's primitive, the
// same ground truth.
const std::pair<const char*, const char*> kCodeFunctions[] = {
    // P-256's own method (ecp_nistz256.c on x86-64).
    {"openssl:ec:P-256:mul", "ecp_nistz256_points_mul"},
    {"openssl:ec:P-256:field_inverse_mod_ord", "ecp_nistz256_inv_mod_ord"},
    {"openssl:ec:P-256:point_get_affine_coordinates", "ecp_nistz256_get_affine"},
    {"openssl:ec:P-224:mul", "ossl_ec_GFp_nistp224_points_mul"},
    {"openssl:ec:P-521:mul", "ossl_ec_GFp_nistp521_points_mul"},
    // AES-CBC's AES-NI hw (AES-CBC-CTS shares its newctx and so its hw).
    {"openssl:cipher-hw:AES-CBC|AES-CBC-CTS:cipher", "cipher_hw_aesni_cbc"},
    {"openssl:cipher-hw:AES-CBC-HMAC-SHA1:cipher", "aesni_cbc_hmac_sha1_cipher"},
    {"openssl:cipher-hw:AES-GCM:cipherupdate", "generic_aes_gcm_cipher_update"},
    {"openssl:cipher-hw:AES-GCM:setkey", "aesni_gcm_initkey"},
    {"openssl:cipher-hw:ChaCha20-Poly1305:aead_cipher", "chacha20_poly1305_aead_cipher"},
    {"openssl:ecx:X25519:derive", "ossl_x25519"},
};

TEST_F(DebianLibcryptoTables, NameTheCodeBelowTheProviders) {
  const LibraryTablesStats& st = tables_.stats;
  std::printf("libcrypto.so.3: %llu curves, %llu EC methods, %llu cipher hw structs, %llu functions named below\n",
              (unsigned long long)st.curves, (unsigned long long)st.ec_methods, (unsigned long long)st.hw_structs,
              (unsigned long long)st.code_functions);
  // OpenSSL 3.0's curve_list: 82 curves (ec_curve.c), whose methods are
  // nistp224, nistz256, nistp521, and the generic GFp (Montgomery) and GF2m.
  EXPECT_EQ(st.curves, 82u);
  EXPECT_EQ(st.ec_methods, 5u);
  EXPECT_GE(st.hw_structs, 40u);

  std::map<uint64_t, std::set<std::string>>& truth = archive_.names;

  // Several functions may share a name (aes_gcm_initkey and
  // aesni_gcm_initkey are both AES-GCM's setkey): one of them is `real`.
  for (const auto& [synthetic, real] : kCodeFunctions) {
    bool found = false;
    std::string other = "not among the names";
    for (const TableFunction& f : tables_.functions) {
      if (f.name != synthetic) continue;
      if (truth[f.addr].count(real)) {
        found = true;
        break;
      }
      other = truth[f.addr].empty() ? "unnamed" : *truth[f.addr].begin();
    }
    EXPECT_TRUE(found) << synthetic << " is " << other << ", not " << real;
  }

  // Every name that says one curve, one TLS cipher or X25519 is that code in
  // the archive; shared code never names one curve.
  auto any_contains = [](const std::set<std::string>& names, std::string_view part) {
    return std::any_of(names.begin(), names.end(),
                       [part](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  size_t p256 = 0, cbc = 0, checked = 0;
  for (const TableFunction& f : tables_.functions) {
    if (f.name.rfind("openssl:", 0) != 0) continue;
    const std::set<std::string>& names = truth[f.addr];
    if (names.empty()) continue;
    ++checked;
    if (f.name.rfind("openssl:ec:P-256:", 0) == 0) {
      ++p256;
      EXPECT_TRUE(any_contains(names, "nistz256")) << f.name << " is " << *names.begin();
    }
    if (any_contains(names, "ec_GFp_mont_") || any_contains(names, "ec_GFp_simple_")) {
      const bool several = f.name.find('|') != std::string::npos || f.name.find(":*:") != std::string::npos;
      EXPECT_TRUE(several) << f.name << " (" << *names.begin() << ") is shared code but names one curve";
    }
    if (f.name.rfind("openssl:cipher-hw:AES-CBC|AES-CBC-CTS:", 0) == 0) {
      ++cbc;
      EXPECT_TRUE(any_contains(names, "cbc")) << f.name << " is " << *names.begin();
    }
    if (f.name.rfind("openssl:ecx:X25519:", 0) == 0) {
      EXPECT_TRUE(any_contains(names, "x25519")) << f.name << " is " << *names.begin();
    }
  }
  std::printf("%zu of %zu named below the providers also named by libcrypto.a\n", checked,
              static_cast<size_t>(st.code_functions));
  EXPECT_GE(checked, st.code_functions * 95 / 100);
  EXPECT_GE(p256, 5u);
  EXPECT_GE(cbc, 1u);
}

// A provider laid out the way OpenSSL 3 lays one out, built here from
// testdata/provider_tables.c: the names depend on the tables alone, not on
// Debian's build.
// Linked both ways: .rodata in a segment of its own, and in the code's
// (-z noseparate-code, older binutils' default).
class SyntheticProviderTest : public ::testing::TestWithParam<const char*> {};

// What the reader names each function of testdata/provider_tables.c.
const std::map<std::string, std::string> kProviderTableNames = {
    // Shared by two digests: both listed.
    {"sha_newctx", "provider:digest:SHA1|SHA2-256:newctx"},
    {"sha1_update", "provider:digest:SHA1:update"},
    {"sha256_update", "provider:digest:SHA2-256:update"},
    {"sha256_final", "provider:digest:SHA2-256:final"},
    // Ciphers (OSSL_ALGORITHM_CAPABLE, 40 bytes apart): the key size dropped.
    {"aes128gcm_newctx", "provider:cipher:AES-GCM:newctx"},
    {"aes256gcm_newctx", "provider:cipher:AES-GCM:newctx"},
    {"aria128gcm_newctx", "provider:cipher:ARIA-GCM:newctx"},
    // Two slots of one table, and two algorithms.
    {"gcm_update", "provider:cipher:AES-GCM|ARIA-GCM:update+cipher"},
    {"ecdsa_newctx", "provider:signature:ECDSA:newctx"},
    {"ecdsa_sign", "provider:signature:ECDSA:sign"},
    {"rsa_sign", "provider:signature:RSA:sign"},
    // Properties with output=: an encoder, whose ids this module does not name.
    {"rsa_encoder", "provider:encoder:RSA:fn1"},
};

TEST_P(SyntheticProviderTest, NamesEveryTableFunction) {
  symtest::BuiltTables<LibraryTables> built;
  ASSERT_NO_FATAL_FAILURE(symtest::ReadBuiltLibrary("libprov", "libprov.so.1", std::string("-O2 ") + GetParam(),
                                                    "provider_tables.c", "", ReadLibraryTables, &built));
  EXPECT_EQ(built.by_real_name, kProviderTableNames);
  EXPECT_EQ(built.tables.stats.tables, 4u);
  EXPECT_EQ(built.tables.stats.algorithms, 8u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SyntheticProviderTest,
                         ::testing::Values("-Wl,-z,separate-code", "-Wl,-z,noseparate-code"));

TEST(LibraryTablesTest, LibsslHasNoProviderTables) {
  REQUIRE_FILES(kLibssl);
  auto tables = Read(kLibssl);
  ASSERT_TRUE(tables) << tables.error().message;
  EXPECT_TRUE(tables->functions.empty());
  EXPECT_EQ(tables->stats.algorithms, 0u);
}

// Through LoadBinaryImage, with no archive and no debug file: .dynsym plus
// the tables, an export's own name kept where both name an address.
TEST(LibraryTablesTest, LoadBinaryImageAddsThemAfterDynsym) {
  REQUIRE_FILES(kLibcrypto);
  const LoadOptions options = symtest::NoArchiveNoDebuginfod();
  auto img = symtest::LoadFrom(kLibcrypto, options, SymbolSource::kLibraryTables);
  ASSERT_NE(img, nullptr);
  const BinaryImage& i = *img;
  symtest::ExpectFoundInside(i, "provider:signature:ECDSA:sign");
  // SHA256_Update is both exported and in the SHA2-256 dispatch table.
  const Symbol* update = symtest::SymbolNamed(i, "SHA256_Update");
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(i.symbols.at(*i.symbols.Find(update->addr)).name, "SHA256_Update");
  EXPECT_EQ(symtest::SymbolNamed(i, "provider:digest:SHA2-256:update"), nullptr);
  EXPECT_GT(i.symbols.size(), symtest::DynsymOnlySize(kLibcrypto, options) + 1000);
}

// Truncated and corrupted copies: an Error or a (partial) result, never a
// crash or a read outside the file (ASan in the sanitizer pass).
TEST(LibraryTablesTest, MalformedCopiesGiveErrorsNotCrashes) {
  REQUIRE_FILES(kLibcrypto);
  // Bytes flipped all over the file, the headers and tables included.
  symtest::ExpectMalformedCopiesHandled(
      kLibcrypto, "libcrypto.so.3", {{0, 0}}, 8, 2000, Read, [](const Result<LibraryTables>& t, unsigned seed) {
        if (!t) return;
        for (const TableFunction& f : t->functions) {
          ASSERT_TRUE(f.name.rfind("provider:", 0) == 0 || f.name.rfind("openssl:", 0) == 0)
              << f.name << " seed " << seed;
          ASSERT_GT(f.size, 0u) << f.name << " seed " << seed;
        }
      });
}

}  // namespace
}  // namespace tlsprof::symbols
