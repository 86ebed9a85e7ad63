// The OpenSSL probe plan (probe_plan.h) on OpenSSL 3.5: Debian 13's stripped
// libssl.so.3/libcrypto.so.3 in the trixie root (scripts/make-trixie-root.sh).
// Its SSL * may be a QUIC object, so every libssl accessor dispatches on the
// object's type before it reads a TLS connection's field (accessors.h): the
// decoded chains carry a type guard. The live check of these chains is the
// usage integration test's, in the root (test_usage_trixie.py): 3.5 needs a
// newer glibc than this test's, so it cannot be dlopen'ed here. No privileges.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/usage/plan_test_util.h"
#include "agent/usage/probe_plan.h"

namespace tlsprof::usage {
namespace {

const RootLibraries kLibs("/opt/tlsprof-trixie", "3");

// Fails (never skips) without the files, saying how to get them.
bool Installed() {
  return FilesInstalled({kLibs.libssl, kLibs.libcrypto},
                        "the trixie root is made by scripts/make-trixie-root.sh (as root)");
}

// Debian 13's 3.5, read off its accessors with objdump -d: each libssl one
// tests the argument for NULL (a trap), dispatches on the type word at +0
// (0: a TLS connection), then reads SSL_version `mov 0x48(%rdi),%eax`,
// SSL_get_state `mov 0xac(%rdi),%eax`, SSL_session_reused `mov 0x508(%rdi),%eax`,
// SSL_is_server `mov 0x78(%rdi),%eax`, SSL_get_current_cipher
// `mov 0x900(%rdi),%rax; test; je; mov 0x2f8(%rax),%rax`, SSL_get_privatekey
// `mov 0x880(%rdi),%rax; test; je; mov (%rax),%rax; mov 0x8(%rax),%rax`;
// SSL_CIPHER_get_protocol_id `movzwl 0x18(%rdi),%eax`; libcrypto's have no
// dispatch: EVP_PKEY_get_id `mov (%rdi),%eax`, EVP_MD_CTX_get_pkey_ctx
// `mov 0x28(%rdi),%rax`, EVP_PKEY_CTX_get0_pkey `mov 0x88(%rdi),%rax`.
// A libssl chain behind 3.5's type dispatch: read only from a TLS connection.
std::string TlsOnly(const std::string& chain) { return "[+0x0 == 0] " + chain; }

const std::map<std::string, std::string> kDebian35 = {
    {"ssl.version", TlsOnly("+0x48 (4 bytes)")},
    {"ssl.state", TlsOnly("+0xac (4 bytes)")},
    {"ssl.resumed", TlsOnly("+0x508 (4 bytes)")},
    {"ssl.is_server", TlsOnly("+0x78 (4 bytes)")},
    {"ssl.cipher", TlsOnly("+0x900 -> +0x2f8 -> +0x18 (2 bytes)")},
    {"ssl.key_type", TlsOnly("+0x880 -> +0x0 -> +0x8 -> +0x0 (4 bytes)")},
    {"md_ctx.key_type", "+0x28 -> +0x88 -> +0x0 (4 bytes)"},
    {"pkey_ctx.key_type", "+0x88 -> +0x0 (4 bytes)"},
};

TEST(OpenSsl35Plan, DebianChainsDecodeWithTheTypeGuard) {
  if (!Installed()) return;
  PlannedLibrary ssl = PlanLibrary(kLibs.libssl), crypto = PlanLibrary(kLibs.libcrypto);
  ProcessPlan plan = PlanLayout({&ssl.functions, &crypto.functions});
  EXPECT_EQ(plan.fields, kDebian35);
  for (uint32_t field : {FIELD_SSL_VERSION, FIELD_SSL_STATE, FIELD_SSL_CIPHER, FIELD_SSL_KEY_TYPE}) {
    EXPECT_EQ(plan.layout.field[field].type_guard, 1) << FieldName(field);
  }
  EXPECT_EQ(plan.layout.field[FIELD_PKEYCTX_KEY_TYPE].type_guard, 0);
}

// libcrypto's probes: the public-key operations, and the KEM entry points
// TLS 1.3's ML-KEM groups run through (ssl_encapsulate/ssl_decapsulate).
TEST(OpenSsl35Plan, CryptoProbesTheKemEntryPoints) {
  if (!Installed()) return;
  PlannedLibrary crypto = PlanLibrary(kLibs.libcrypto);
  const FilePlan plan = PlanFile(crypto.functions);
  EXPECT_EQ(Probed(plan),
            (std::vector<std::string>{"EVP_DigestSign", "EVP_PKEY_sign", "EVP_DigestVerify", "EVP_PKEY_verify",
                                      "EVP_PKEY_derive", "EVP_PKEY_encapsulate", "EVP_PKEY_decapsulate"}));
  EXPECT_EQ(plan.sites[5].probe, static_cast<uint32_t>(PROBE_ENCAPSULATE));
  EXPECT_EQ(plan.sites[6].probe, static_cast<uint32_t>(PROBE_DECAPSULATE));
}

// 3.5's method tables are 3.0's: ossl_statem_accept/connect tail-call
// state_machine(s, server), probed once.
TEST(OpenSsl35Plan, StateMachineThroughTheMethodTables) {
  if (!Installed()) return;
  PlannedLibrary lib = PlanLibrary(kLibs.libssl);
  ASSERT_EQ(lib.state_machine.size(), 1u);
  EXPECT_EQ(lib.state_machine[0].name, "state_machine");
  EXPECT_EQ(Probed(PlanFile(lib.functions, lib.state_machine)),
            (std::vector<std::string>{"state_machine", "SSL_free"}));
}

}  // namespace
}  // namespace tlsprof::usage
