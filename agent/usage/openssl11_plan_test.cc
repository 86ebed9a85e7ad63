// The OpenSSL probe plan (probe_plan.h) on OpenSSL 1.1: Debian 11's stripped
// libssl.so.1.1/libcrypto.so.1.1 (1.1.1w), unpacked by scripts/install-deps.sh
// into /opt/tlsprof-openssl-1.1 (Debian 12 ships no 1.1). Checks the decoded
// chains and the state machine found through the method tables, then follows
// the chains through live 1.1 objects (a server and a client handshaking over
// a BIO pair) and compares them with the accessors' own answers, as
// usage_test does for OpenSSL 3. No privileges needed.
//
// The test links OpenSSL 3 (through tlsprof::usage); 1.1 is dlopen'ed with
// RTLD_LOCAL and called through dlsym. The two coexist: every symbol of both
// is versioned (OPENSSL_1_1_0 vs OPENSSL_3.0.0), so libssl.so.1.1's
// references bind to libcrypto.so.1.1 only. The objects are opaque here
// (void *): only the accessors and FollowChain look inside.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/usage/elf_functions.h"
#include "agent/usage/follow_chain.h"
#include "agent/usage/plan_test_util.h"
#include "agent/usage/probe_plan.h"

namespace tlsprof::usage {
namespace {

const RootLibraries kLibs("/opt/tlsprof-openssl-1.1", "1.1");

using Functions = std::map<std::string, FunctionCode, std::less<>>;

// Fails (never skips) without the files, saying how to get them.
bool Installed() {
  return FilesInstalled({kLibs.libssl, kLibs.libcrypto},
                        "OpenSSL 1.1 (Debian 11's libssl1.1) is unpacked there by scripts/install-deps.sh (as root)");
}

Functions Find(const std::string& path) { return PlanLibrary(path).functions; }

// Debian 11's 1.1.1w, read off its accessors with objdump -d: SSL_version
// `mov (%rdi),%eax`, SSL_get_state `mov 0x5c(%rdi),%eax`, SSL_session_reused
// `mov 0xc8(%rdi),%eax`, SSL_is_server `mov 0x38(%rdi),%eax`,
// SSL_get_current_cipher `mov 0x510(%rdi),%rax; test; je; mov 0x1f0(%rax),%rax`,
// SSL_CIPHER_get_protocol_id `mov 0x18(%rdi),%eax` (c->id & 0xffff: the
// caller keeps the low 2 bytes, as BPF does), SSL_get_privatekey
// `mov 0x490(%rdi),%rax; test; je; mov (%rax),%rax; mov 0x8(%rax),%rax`,
// EVP_PKEY_id `mov (%rdi),%eax`, EVP_MD_CTX_pkey_ctx `mov 0x20(%rdi),%rax`,
// EVP_PKEY_CTX_get0_pkey `mov 0x10(%rdi),%rax`.
const std::map<std::string, std::string> kDebian111w = {
    {"ssl.version", "+0x0 (4 bytes)"},
    {"ssl.state", "+0x5c (4 bytes)"},
    {"ssl.resumed", "+0xc8 (4 bytes)"},
    {"ssl.is_server", "+0x38 (4 bytes)"},
    {"ssl.cipher", "+0x510 -> +0x1f0 -> +0x18 (4 bytes)"},
    {"ssl.key_type", "+0x490 -> +0x0 -> +0x8 -> +0x0 (4 bytes)"},
    {"md_ctx.key_type", "+0x20 -> +0x10 -> +0x0 (4 bytes)"},
    {"pkey_ctx.key_type", "+0x10 -> +0x0 (4 bytes)"},
};

TEST(OpenSsl11Plan, DebianChainsDecode) {
  if (!Installed()) return;
  Functions ssl = Find(kLibs.libssl), crypto = Find(kLibs.libcrypto);
  // The renamed accessors are found by their 1.1 names.
  EXPECT_TRUE(crypto.count("EVP_PKEY_id"));
  EXPECT_FALSE(crypto.count("EVP_PKEY_get_id"));
  EXPECT_TRUE(crypto.count("EVP_MD_CTX_pkey_ctx"));
  ProcessPlan plan = PlanLayout({&ssl, &crypto});
  EXPECT_EQ(plan.fields, kDebian111w);

  EXPECT_EQ(Probed(PlanFile(crypto)), (std::vector<std::string>{"EVP_DigestSign", "EVP_PKEY_sign", "EVP_DigestVerify",
                                                                "EVP_PKEY_verify", "EVP_PKEY_derive"}));
}

// ossl_statem_accept/connect of 1.1.1w begin with state_machine()'s inlined
// error-state test (`cmpl $0x1,0x48(%rdi); je` to `mov $-1,%eax; ret`), then
// `mov/xor %esi; jmp` to the rest of state_machine, which is probed once.
TEST(OpenSsl11Plan, StateMachineThroughTheMethodTables) {
  if (!Installed()) return;
  PlannedLibrary lib = PlanLibrary(kLibs.libssl);
  const std::vector<FoundFunction>& found = lib.state_machine;
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "state_machine");
  EXPECT_EQ(FirstInstructionClass(found[0].code.prefix), static_cast<uint32_t>(INSN_EMULATED_PUSH));
  EXPECT_EQ(Probed(PlanFile(lib.functions, found)), (std::vector<std::string>{"state_machine", "SSL_free"}));
}

// ---- live OpenSSL 1.1 objects ------------------------------------------------

// OpenSSL 1.1 through dlsym. Its ids (obj_mac.h and ssl.h of 1.1.1, unchanged
// in 3.0): EVP_PKEY_RSA 6, EVP_PKEY_EC 408, NID_X9_62_prime256v1 415,
// EVP_PKEY_X25519 1034.
struct OpenSsl11 {
  void* crypto = nullptr;
  void* ssl = nullptr;

  template <typename F>
  F Sym(const char* name) {
    void* f = dlsym(ssl, name);  // the handle's scope: libssl.so.1.1 and libcrypto.so.1.1
    if (!f) ADD_FAILURE() << name << ": " << dlerror();
    return reinterpret_cast<F>(f);
  }

  bool Open() {
    // libcrypto first, by path: libssl.so.1.1's DT_NEEDED then finds it
    // loaded (by soname), where the loader's search path has no 1.1.
    crypto = dlopen(kLibs.libcrypto.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (crypto) ssl = dlopen(kLibs.libssl.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!ssl) ADD_FAILURE() << "dlopen: " << dlerror();
    return ssl != nullptr;
  }
  // Never dlclose'd: OpenSSL 1.1 pins itself (its atexit cleanup must find
  // its code), and the test's process ends soon after.
};

constexpr int kEvpPkeyEc = 408;
constexpr int kEvpPkeyX25519 = 1034;
constexpr int kNidP256 = 415;

using Ptr = void*;

// The 1.1 functions the live test calls; a test failure for each that
// dlsym does not find.
struct Api11 {
  explicit Api11(OpenSsl11& l) : lib(l) {}
  OpenSsl11& lib;

  Ptr (*ec_key_new)(int) = lib.Sym<Ptr (*)(int)>("EC_KEY_new_by_curve_name");
  int (*ec_key_generate)(Ptr) = lib.Sym<int (*)(Ptr)>("EC_KEY_generate_key");
  Ptr (*pkey_new)() = lib.Sym<Ptr (*)()>("EVP_PKEY_new");
  int (*pkey_assign)(Ptr, int, Ptr) = lib.Sym<int (*)(Ptr, int, Ptr)>("EVP_PKEY_assign");
  int (*pkey_id)(Ptr) = lib.Sym<int (*)(Ptr)>("EVP_PKEY_id");
  void (*pkey_free)(Ptr) = lib.Sym<void (*)(Ptr)>("EVP_PKEY_free");
  Ptr (*raw_private_key)(int, Ptr, const unsigned char*, size_t) =
      lib.Sym<Ptr (*)(int, Ptr, const unsigned char*, size_t)>("EVP_PKEY_new_raw_private_key");
  Ptr (*pkey_ctx_new)(Ptr, Ptr) = lib.Sym<Ptr (*)(Ptr, Ptr)>("EVP_PKEY_CTX_new");
  void (*pkey_ctx_free)(Ptr) = lib.Sym<void (*)(Ptr)>("EVP_PKEY_CTX_free");
  Ptr (*md_ctx_new)() = lib.Sym<Ptr (*)()>("EVP_MD_CTX_new");
  void (*md_ctx_free)(Ptr) = lib.Sym<void (*)(Ptr)>("EVP_MD_CTX_free");
  Ptr (*sha256)() = lib.Sym<Ptr (*)()>("EVP_sha256");
  int (*digest_sign_init)(Ptr, Ptr*, Ptr, Ptr, Ptr) = lib.Sym<int (*)(Ptr, Ptr*, Ptr, Ptr, Ptr)>("EVP_DigestSignInit");
  Ptr (*x509_new)() = lib.Sym<Ptr (*)()>("X509_new");
  void (*x509_free)(Ptr) = lib.Sym<void (*)(Ptr)>("X509_free");
  int (*x509_set_pubkey)(Ptr, Ptr) = lib.Sym<int (*)(Ptr, Ptr)>("X509_set_pubkey");
  Ptr (*x509_gmtime_adj)(Ptr, long) = lib.Sym<Ptr (*)(Ptr, long)>("X509_gmtime_adj");
  Ptr (*x509_not_before)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("X509_getm_notBefore");
  Ptr (*x509_not_after)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("X509_getm_notAfter");
  int (*x509_sign)(Ptr, Ptr, Ptr) = lib.Sym<int (*)(Ptr, Ptr, Ptr)>("X509_sign");
  int (*bio_pair)(Ptr*, size_t, Ptr*, size_t) = lib.Sym<int (*)(Ptr*, size_t, Ptr*, size_t)>("BIO_new_bio_pair");
  Ptr (*tls_server)() = lib.Sym<Ptr (*)()>("TLS_server_method");
  Ptr (*tls_client)() = lib.Sym<Ptr (*)()>("TLS_client_method");
  Ptr (*ctx_new)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("SSL_CTX_new");
  void (*ctx_free)(Ptr) = lib.Sym<void (*)(Ptr)>("SSL_CTX_free");
  int (*ctx_use_cert)(Ptr, Ptr) = lib.Sym<int (*)(Ptr, Ptr)>("SSL_CTX_use_certificate");
  int (*ctx_use_key)(Ptr, Ptr) = lib.Sym<int (*)(Ptr, Ptr)>("SSL_CTX_use_PrivateKey");
  Ptr (*ssl_new)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("SSL_new");
  void (*ssl_free)(Ptr) = lib.Sym<void (*)(Ptr)>("SSL_free");
  void (*set_bio)(Ptr, Ptr, Ptr) = lib.Sym<void (*)(Ptr, Ptr, Ptr)>("SSL_set_bio");
  void (*set_accept)(Ptr) = lib.Sym<void (*)(Ptr)>("SSL_set_accept_state");
  void (*set_connect)(Ptr) = lib.Sym<void (*)(Ptr)>("SSL_set_connect_state");
  int (*do_handshake)(Ptr) = lib.Sym<int (*)(Ptr)>("SSL_do_handshake");
  int (*ssl_version)(Ptr) = lib.Sym<int (*)(Ptr)>("SSL_version");
  int (*get_state)(Ptr) = lib.Sym<int (*)(Ptr)>("SSL_get_state");
  int (*is_server)(Ptr) = lib.Sym<int (*)(Ptr)>("SSL_is_server");
  int (*session_reused)(Ptr) = lib.Sym<int (*)(Ptr)>("SSL_session_reused");
  Ptr (*current_cipher)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("SSL_get_current_cipher");
  uint16_t (*protocol_id)(Ptr) = lib.Sym<uint16_t (*)(Ptr)>("SSL_CIPHER_get_protocol_id");
  Ptr (*get_privatekey)(Ptr) = lib.Sym<Ptr (*)(Ptr)>("SSL_get_privatekey");
};

// The value a planned field's chain reads from a live object (~0 where it
// cannot).
struct Follow {
  const lib_layout& layout;
  uint64_t operator()(const void* base, uint32_t field) const {
    return FollowChain(base, PlannedChain(layout, field)).value_or(~0ull);
  }
};

// An ECDSA P-256 key and a self-signed certificate for it.
void MakeEcdsaCert(const Api11& api, Ptr* key, Ptr* cert) {
  Ptr ec = api.ec_key_new(kNidP256);
  ASSERT_NE(ec, nullptr);
  ASSERT_EQ(api.ec_key_generate(ec), 1);
  *key = api.pkey_new();
  ASSERT_EQ(api.pkey_assign(*key, kEvpPkeyEc, ec), 1);  // the key owns ec
  ASSERT_EQ(api.pkey_id(*key), kEvpPkeyEc);
  *cert = api.x509_new();
  ASSERT_EQ(api.x509_set_pubkey(*cert, *key), 1);
  api.x509_gmtime_adj(api.x509_not_before(*cert), 0);
  api.x509_gmtime_adj(api.x509_not_after(*cert), 3600);
  ASSERT_GT(api.x509_sign(*cert, *key, api.sha256()), 0);
}

// A server (with `key` and `cert`) and a client over a BIO pair, before
// their handshake.
struct Connection {
  Ptr server_ctx = nullptr, client_ctx = nullptr;
  Ptr server = nullptr, client = nullptr;
};

void Connect(const Api11& api, Ptr key, Ptr cert, Connection* c) {
  c->server_ctx = api.ctx_new(api.tls_server());
  c->client_ctx = api.ctx_new(api.tls_client());
  ASSERT_EQ(api.ctx_use_cert(c->server_ctx, cert), 1);
  ASSERT_EQ(api.ctx_use_key(c->server_ctx, key), 1);
  c->server = api.ssl_new(c->server_ctx);
  c->client = api.ssl_new(c->client_ctx);
  Ptr server_bio = nullptr, client_bio = nullptr;
  ASSERT_EQ(api.bio_pair(&server_bio, 0, &client_bio, 0), 1);
  api.set_bio(c->server, server_bio, server_bio);
  api.set_bio(c->client, client_bio, client_bio);
  api.set_accept(c->server);
  api.set_connect(c->client);
}

void Handshake(const Api11& api, const Connection& c) {
  int server_done = 0, client_done = 0;
  for (int round = 0; round < 20 && (server_done != 1 || client_done != 1); ++round) {
    if (client_done != 1) client_done = api.do_handshake(c.client);
    if (server_done != 1) server_done = api.do_handshake(c.server);
  }
  ASSERT_EQ(server_done, 1);
  ASSERT_EQ(client_done, 1);
}

void Free(const Api11& api, const Connection& c) {
  api.ssl_free(c.server);
  api.ssl_free(c.client);
  api.ctx_free(c.server_ctx);
  api.ctx_free(c.client_ctx);
}

// The state machine the plan found lies where the live library has it:
// the load bias from an exported function, and the same first bytes.
void ExpectStateMachineLive(const PlannedLibrary& ssl, const Api11& api) {
  const std::vector<FoundFunction>& found = ssl.state_machine;
  ASSERT_EQ(found.size(), 1u);
  const uintptr_t bias = reinterpret_cast<uintptr_t>(api.do_handshake) - ssl.functions.at("SSL_do_handshake").vaddr;
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(bias + found[0].code.vaddr), found[0].code.prefix.data(), 16), 0);
}

// After the handshake, each side's fields read as its accessors answer.
void ExpectConnectionFields(const Api11& api, const Follow& follow, const Connection& c) {
  for (Ptr s : {c.server, c.client}) {
    EXPECT_EQ(follow(s, FIELD_SSL_VERSION), static_cast<uint64_t>(api.ssl_version(s)));
    EXPECT_EQ(api.ssl_version(s), 0x0304);
    EXPECT_EQ(follow(s, FIELD_SSL_STATE), static_cast<uint64_t>(api.get_state(s)));
    EXPECT_NE(api.get_state(s), 0);
    EXPECT_EQ(follow(s, FIELD_SSL_IS_SERVER), static_cast<uint64_t>(api.is_server(s)));
    EXPECT_EQ(follow(s, FIELD_SSL_RESUMED), static_cast<uint64_t>(api.session_reused(s)));
    // The cipher's 4-byte id; the accessor's uint16_t (and BPF) keeps its low half.
    EXPECT_EQ(follow(s, FIELD_SSL_CIPHER) & 0xffff, api.protocol_id(api.current_cipher(s)));
    EXPECT_EQ(api.protocol_id(api.current_cipher(s)), 0x1302);  // TLS_AES_256_GCM_SHA384, 1.1.1's first
  }
  EXPECT_EQ(follow(c.server, FIELD_SSL_KEY_TYPE), static_cast<uint64_t>(api.pkey_id(api.get_privatekey(c.server))));
}

// An EVP_MD_CTX set up for signing with `key` (as TLS's CertificateVerify),
// and the EVP_PKEY_CTX of an X25519 derive (as a key share).
void ExpectKeyContextFields(const Api11& api, const Follow& follow, Ptr key) {
  Ptr md = api.md_ctx_new();
  ASSERT_EQ(api.digest_sign_init(md, nullptr, api.sha256(), nullptr, key), 1);
  EXPECT_EQ(follow(md, FIELD_MDCTX_KEY_TYPE), static_cast<uint64_t>(kEvpPkeyEc));
  unsigned char raw[32] = {1};
  Ptr x = api.raw_private_key(kEvpPkeyX25519, nullptr, raw, sizeof(raw));
  ASSERT_NE(x, nullptr);
  Ptr pctx = api.pkey_ctx_new(x, nullptr);
  ASSERT_NE(pctx, nullptr);
  EXPECT_EQ(follow(pctx, FIELD_PKEYCTX_KEY_TYPE), static_cast<uint64_t>(kEvpPkeyX25519));
  EXPECT_EQ(follow(pctx, FIELD_PKEYCTX_KEY_TYPE), static_cast<uint64_t>(api.pkey_id(x)));
  api.pkey_ctx_free(pctx);
  api.pkey_free(x);
  api.md_ctx_free(md);
}

TEST(OpenSsl11Plan, ChainsFollowedThroughLiveObjects) {
  if (!Installed()) return;
  OpenSsl11 lib;
  ASSERT_TRUE(lib.Open());
  PlannedLibrary ssl_lib = PlanLibrary(kLibs.libssl);
  Functions crypto_functions = Find(kLibs.libcrypto);
  ProcessPlan plan = PlanLayout({&ssl_lib.functions, &crypto_functions});
  const Follow follow{plan.layout};
  const Api11 api(lib);
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_NO_FATAL_FAILURE(ExpectStateMachineLive(ssl_lib, api));

  Ptr key = nullptr, cert = nullptr;
  ASSERT_NO_FATAL_FAILURE(MakeEcdsaCert(api, &key, &cert));
  Connection c;
  ASSERT_NO_FATAL_FAILURE(Connect(api, key, cert, &c));
  // Before the handshake: the state the BPF side takes for "none begun".
  EXPECT_EQ(follow(c.server, FIELD_SSL_STATE), 0u);
  EXPECT_EQ(api.get_state(c.server), 0);  // TLS_ST_BEFORE
  EXPECT_EQ(follow(c.server, FIELD_SSL_IS_SERVER), 1u);
  EXPECT_EQ(follow(c.client, FIELD_SSL_IS_SERVER), 0u);
  EXPECT_EQ(follow(c.server, FIELD_SSL_KEY_TYPE), static_cast<uint64_t>(kEvpPkeyEc));
  ASSERT_NO_FATAL_FAILURE(Handshake(api, c));
  ExpectConnectionFields(api, follow, c);
  ASSERT_NO_FATAL_FAILURE(ExpectKeyContextFields(api, follow, key));

  Free(api, c);
  api.x509_free(cert);
  api.pkey_free(key);
}

}  // namespace
}  // namespace tlsprof::usage
