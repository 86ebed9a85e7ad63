// The BoringSSL probe plan (boringssl_plan.h) and the path-aware accessor
// decoder it uses (accessor_paths.h): on hand-made code, against
// DecodeLoadChain on Debian's OpenSSL 3, and on Debian's stripped BoringSSL
// (android-libboringssl: libssl.so.0, libcrypto.so.0), whose decoded chains
// are followed through live BoringSSL objects of this test's own (client and
// server handshaking over a BIO pair) and compared with the accessors'
// answers, as usage_test does for OpenSSL. No privileges needed.
//
// Built with BoringSSL's headers first on the include path and linked
// against libssl.so.0/libcrypto.so.0 (agent/usage/CMakeLists.txt).
#include <fcntl.h>
#include <unistd.h>

#include <openssl/base.h>
#ifndef OPENSSL_IS_BORINGSSL
#error "BoringSSL headers expected"
#endif
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/usage/accessor_paths.h"
#include "agent/usage/accessors.h"
#include "agent/usage/boringssl_plan.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/follow_chain.h"
#include "agent/usage/names.h"
#include "agent/usage/plan_test_util.h"
#include "agent/usage/probe_plan.h"
#include "workloads/common/boringssl_util.h"

namespace tlsprof::usage {
namespace {

using Functions = std::map<std::string, FunctionCode, std::less<>>;

FunctionCode Code(std::vector<uint8_t> bytes, uint64_t vaddr = 0x1000) {
  FunctionCode code;
  code.vaddr = vaddr;
  code.prefix = std::move(bytes);
  return code;
}

std::optional<LoadChain> Decode(std::vector<uint8_t> bytes, const AccessorContext& context = {}) {
  return DecodeAccessor(Code(std::move(bytes)), context);
}

// ---- DecodeAccessor on hand-made code ---------------------------------------

TEST(DecodeAccessor, PlainChainsAsDecodeLoadChain) {
  // SSL_get_privatekey (BoringSSL): mov 0x8(%rdi),%rax; test %rax,%rax; je 1f;
  // mov 0x20(%rax),%rax; test %rax,%rax; je 1f; mov (%rax),%rax; ret; 1: xor %eax,%eax; ret
  const std::vector<uint8_t> code = {0x48, 0x8b, 0x47, 0x08, 0x48, 0x85, 0xc0, 0x74, 0x0d, 0x48, 0x8b, 0x40, 0x20,
                                     0x48, 0x85, 0xc0, 0x74, 0x04, 0x48, 0x8b, 0x00, 0xc3, 0x31, 0xc0, 0xc3};
  auto chain = Decode(code);
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0x8 -> +0x20 -> +0x0 (8 bytes)");
  EXPECT_EQ(chain, DecodeLoadChain(code));
  // movzwl 0x10(%rdi),%eax; ret
  chain = Decode({0x0f, 0xb7, 0x47, 0x10, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0x10 (2 bytes)");
}

TEST(DecodeAccessor, BitFields) {
  // SSL_is_server: movzbl 0xa4(%rdi),%eax; and $0x1,%eax; ret
  auto chain = Decode({0x0f, 0xb6, 0x87, 0xa4, 0x00, 0x00, 0x00, 0x83, 0xe0, 0x01, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0xa4 (1 bytes) bit 0");
  // mov 0x618(%rdi),%eax; shr $0xb,%eax; and $0x1,%eax; ret
  chain = Decode({0x8b, 0x87, 0x18, 0x06, 0x00, 0x00, 0xc1, 0xe8, 0x0b, 0x83, 0xe0, 0x01, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0x618 (4 bytes) bit 11");
  // SSL_in_init: mov 0x30(%rdi),%rax; mov 0x110(%rax),%rcx; xor %eax,%eax;
  // test %rcx,%rcx; je 1f; testb $0x8,0x618(%rcx); sete %al; 1: ret
  chain = Decode({0x48, 0x8b, 0x47, 0x30, 0x48, 0x8b, 0x88, 0x10, 0x01, 0x00, 0x00, 0x31, 0xc0, 0x48, 0x85,
                  0xc9, 0x74, 0x0a, 0xf6, 0x81, 0x18, 0x06, 0x00, 0x00, 0x08, 0x0f, 0x94, 0xc0, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0x30 -> +0x110 -> +0x618 (1 bytes) bit 3 == 0");
  // and with a mask that does not start at bit 0: the value is not the field's.
  EXPECT_FALSE(Decode({0x0f, 0xb6, 0x87, 0xa4, 0x00, 0x00, 0x00, 0x83, 0xe0, 0x40, 0xc3}));
  // sete into a register whose upper bits are not known to be 0.
  EXPECT_FALSE(Decode({0xf6, 0x47, 0x10, 0x08, 0x0f, 0x94, 0xc0, 0xc3}));
}

// SSL_session_reused (BoringSSL): `s3->session_reused || SSL_in_early_data()`:
//   mov 0x30(%rdi),%rcx; mov $1,%eax; testb $0x40,0xd4(%rcx); jne 2f;
//   mov 0x110(%rcx),%rax; test %rax,%rax; je 1f; mov 0x618(%rax),%eax;
//   shr $0xb,%eax; and $1,%eax; 2: ret; 1: xor %eax,%eax; ret
const std::vector<uint8_t> kSessionReused = {0x48, 0x8b, 0x4f, 0x30, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xf6, 0x81, 0xd4,
                                             0x00, 0x00, 0x00, 0x40, 0x75, 0x18, 0x48, 0x8b, 0x81, 0x10, 0x01, 0x00,
                                             0x00, 0x48, 0x85, 0xc0, 0x74, 0x0d, 0x8b, 0x80, 0x18, 0x06, 0x00, 0x00,
                                             0xc1, 0xe8, 0x0b, 0x83, 0xe0, 0x01, 0xc3, 0x31, 0xc0, 0xc3};

// With the pointer `null` NULL by the facts (the handshake object of a
// completed handshake), the accessor `code` reads the one field `want`.
void ExpectDecodesGivenNull(const std::vector<uint8_t>& code, const LoadChain& null, const std::string& want) {
  AccessorContext completed;
  completed.null_pointers = {null};
  auto chain = Decode(code, completed);
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), want);
}

TEST(DecodeAccessor, FactsSettleBranches) {
  // Two bits ORed: no one field, unknown.
  EXPECT_FALSE(Decode(kSessionReused));
  // With the handshake object NULL (a completed handshake), one bit.
  ExpectDecodesGivenNull(kSessionReused, LoadChain{{0x30, 0x110}, 8}, "+0x30 -> +0xd4 (1 bytes) bit 6");
}

// BoringSSL 14's SSL_get_session() shape, as SSL_get_current_cipher() reads
// through it: the established session, else the handshake object's new
// session. With the handshake object NULL by the facts, the path that reads
// it would fault: dropped, one chain is left.
TEST(DecodeAccessor, PathsThroughANullFactAreDropped) {
  // mov 0x30(%rdi),%rcx; mov 0x1d0(%rcx),%rax; test %rax,%rax; jne 1f;
  // mov 0x118(%rcx),%rdi; mov 0x5f8(%rdi),%rax; 1: mov 0xc8(%rax),%rax; ret
  const std::vector<uint8_t> cipher = {0x48, 0x8b, 0x4f, 0x30, 0x48, 0x8b, 0x81, 0xd0, 0x01, 0x00, 0x00, 0x48, 0x85,
                                       0xc0, 0x75, 0x0e, 0x48, 0x8b, 0xb9, 0x18, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x87,
                                       0xf8, 0x05, 0x00, 0x00, 0x48, 0x8b, 0x80, 0xc8, 0x00, 0x00, 0x00, 0xc3};
  EXPECT_FALSE(Decode(cipher));  // two chains
  ExpectDecodesGivenNull(cipher, LoadChain{{0x30, 0x118}, 8}, "+0x30 -> +0x1d0 -> +0xc8 (8 bytes)");
}

TEST(DecodeAccessor, FollowsCallsThroughTheResolver) {
  // f: push %rax; call g; test %rax,%rax; je 1f; mov 0xd0(%rax),%rax; pop %rcx; ret; 1: xor %eax,%eax; pop %rcx; ret
  const FunctionCode f = Code({0x50, 0xe8, 0xfa, 0x0f, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x09, 0x48,
                               0x8b, 0x80, 0xd0, 0x00, 0x00, 0x00, 0x59, 0xc3, 0x31, 0xc0, 0x59, 0xc3},
                              0x1000);
  // g at 0x2000: mov 0x30(%rdi),%rax; mov 0x1c8(%rax),%rax; ret
  const FunctionCode g = Code({0x48, 0x8b, 0x47, 0x30, 0x48, 0x8b, 0x80, 0xc8, 0x01, 0x00, 0x00, 0xc3}, 0x2000);
  EXPECT_FALSE(DecodeAccessor(f));  // the call's code is not given
  AccessorContext context;
  context.resolve = [&](uint64_t vaddr) { return vaddr == 0x2000 ? &g : nullptr; };
  auto chain = DecodeAccessor(f, context);
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "+0x30 -> +0x1c8 -> +0xd0 (8 bytes)");
}

TEST(DecodeAccessor, RejectsWhatItDoesNotModel) {
  EXPECT_FALSE(Decode({0xc3}));                                      // returns nothing read
  EXPECT_FALSE(Decode({0x48, 0x89, 0xf8, 0xc3}));                    // returns its argument
  EXPECT_FALSE(Decode({0x8b, 0x06, 0xc3}));                          // from rsi
  EXPECT_FALSE(Decode({0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3}));  // rip-relative
  EXPECT_FALSE(Decode({0x48, 0x89, 0x07, 0x8b, 0x07, 0xc3}));        // a store
  EXPECT_FALSE(Decode({0x50, 0x8b, 0x07, 0xc3}));                    // unbalanced push
  EXPECT_FALSE(Decode({0x48, 0x83, 0xec, 0x08, 0x8b, 0x07, 0xc3}));  // sub %rsp
  // A branch on a comparison that is not with zero.
  EXPECT_FALSE(Decode({0x83, 0x7f, 0x20, 0x08, 0x75, 0x03, 0x8b, 0x07, 0xc3, 0x31, 0xc0, 0xc3}));
  // NULL returns 1: the BPF walk would read unknown, not 1.
  EXPECT_FALSE(
      Decode({0x48, 0x8b, 0x07, 0x48, 0x85, 0xc0, 0x74, 0x03, 0x8b, 0x00, 0xc3, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3}));
  // Two different reads on two paths.
  EXPECT_FALSE(Decode({0xf6, 0x07, 0x01, 0x74, 0x04, 0x8b, 0x47, 0x08, 0xc3, 0x8b, 0x47, 0x10, 0xc3}));
  // A load through a pointer the path knows to be NULL.
  EXPECT_FALSE(
      Decode({0x48, 0x8b, 0x07, 0x48, 0x85, 0xc0, 0x74, 0x05, 0x48, 0x8b, 0x40, 0x08, 0xc3, 0x48, 0x8b, 0x00, 0xc3}));
  // A loop: bounded by the step limit.
  EXPECT_FALSE(Decode({0xeb, 0xfe}));
  EXPECT_FALSE(Decode({}));
  EXPECT_FALSE(Decode({0x48}));
}

// ---- The decoder against DecodeLoadChain on Debian's OpenSSL 3 -------------

Functions FunctionsOf(const char* path, const std::vector<std::string_view>& names) {
  const OpenedElf opened = OpenElf(path);
  if (!opened.elf) return {};
  auto functions = FindFunctions(*opened.elf, names);
  EXPECT_TRUE(functions.ok()) << (functions.ok() ? "" : functions.error().message);
  return functions.ok() ? *functions : Functions();
}

TEST(DecodeAccessor, AgreesWithDecodeLoadChainOnDebianOpenSsl3) {
  const std::vector<std::string_view> wanted = WantedFunctions();
  size_t compared = 0;
  for (const char* path : {"/usr/lib/x86_64-linux-gnu/libssl.so.3", "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"}) {
    for (const auto& [name, code] : FunctionsOf(path, wanted)) {
      auto plain = DecodeLoadChain(code.prefix);
      if (!plain) continue;  // probed functions and method tables
      EXPECT_EQ(DecodeAccessor(code), plain) << name;
      ++compared;
    }
  }
  EXPECT_GE(compared, 9u);
}

// ---- Debian's BoringSSL ------------------------------------------------------

constexpr const char* kLibssl = "/usr/lib/x86_64-linux-gnu/android/libssl.so.0";
constexpr const char* kLibcrypto = "/usr/lib/x86_64-linux-gnu/android/libcrypto.so.0";

// The plan of this process's BoringSSL, as the agent makes it.
struct Plan {
  Functions ssl, crypto;
  ProcessPlan layout;
};

const Plan& DebianPlan() {
  static const Plan plan = [] {
    Plan p;
    const OpenedElf ssl_elf = OpenElf(kLibssl), crypto_elf = OpenElf(kLibcrypto);
    if (!ssl_elf.elf || !crypto_elf.elf) return p;
    auto ssl = FindFunctions(*ssl_elf.elf, BoringSslWantedFunctions());
    auto crypto = FindFunctions(*crypto_elf.elf, BoringSslWantedFunctions());
    EXPECT_TRUE(ssl.ok() && crypto.ok());
    if (ssl.ok()) p.ssl = std::move(*ssl);
    if (crypto.ok()) p.crypto = std::move(*crypto);
    p.layout = PlanBoringSslLayout({{ssl_elf.elf.get(), &p.ssl}, {crypto_elf.elf.get(), &p.crypto}});
    return p;
  }();
  return plan;
}

LoadChain Chain(uint32_t field) {
  const field_path& path = DebianPlan().layout.layout.field[field];
  LoadChain chain;
  for (uint8_t i = 0; i < path.n; ++i) chain.offsets.push_back(path.off[i]);
  chain.width = path.width;
  chain.shift = path.shift;
  chain.bits = path.bits;
  chain.invert = path.invert != 0;
  return chain;
}

std::optional<uint64_t> Follow(const void* base, const LoadChain& chain) { return FollowChain(base, chain); }

TEST(BoringSslPlan, DebianProbeSites) {
  const Plan& plan = DebianPlan();
  auto names = [](const FilePlan& f) {
    std::vector<std::string> out;
    for (const ProbeSite& s : f.sites) out.push_back(s.function);
    return out;
  };
  EXPECT_EQ(names(PlanBoringSslFile(plan.ssl)), (std::vector<std::string>{"SSL_do_handshake", "SSL_free"}));
  EXPECT_EQ(names(PlanBoringSslFile(plan.crypto)),
            (std::vector<std::string>{"EVP_PKEY_sign", "EVP_PKEY_verify", "EVP_PKEY_derive", "X25519"}));
  for (const ProbeSite& s : PlanBoringSslFile(plan.crypto).sites) {
    if (s.function == "X25519") {
      EXPECT_EQ(s.probe, static_cast<uint32_t>(PROBE_X25519));
    }
  }
  // BoringSSL's handshake is not OpenSSL's state machine: no method-table
  // search finds one in its libssl.
  const OpenedElf opened = OpenElf(kLibssl);
  ASSERT_TRUE(opened.elf);
  auto openssl_view = FindFunctions(*opened.elf, WantedFunctions());
  ASSERT_TRUE(openssl_view.ok());
  EXPECT_TRUE(FindHandshakeStateMachine(*opened.elf, *openssl_view).empty());
}

// What the plain-chain decoder (DecodeLoadChain, OpenSSL's) makes of
// BoringSSL's accessors: only the one-load ones and SSL_get_privatekey's
// NULL-checked chain; the others call, branch or read bits.
TEST(BoringSslPlan, DebianAccessorsThePlainDecoderReads) {
  const Plan& plan = DebianPlan();
  auto plain = [&](std::string_view name) {
    const Functions& f = plan.ssl.count(name) ? plan.ssl : plan.crypto;
    auto it = f.find(name);
    return it == f.end() ? std::string("absent")
                         : (DecodeLoadChain(it->second.prefix) ? ToString(*DecodeLoadChain(it->second.prefix))
                                                               : std::string("unknown"));
  };
  EXPECT_EQ(plain("SSL_CIPHER_get_protocol_id"), "+0x10 (2 bytes)");
  EXPECT_EQ(plain("SSL_get_privatekey"), "+0x8 -> +0x20 -> +0x0 (8 bytes)");
  EXPECT_EQ(plain("EVP_PKEY_id"), "+0x4 (4 bytes)");
  EXPECT_EQ(plain("EVP_PKEY_CTX_get0_pkey"), "+0x10 (8 bytes)");
  for (std::string_view name : {"SSL_version", "SSL_session_reused", "SSL_is_server", "SSL_get_current_cipher",
                                "SSL_get_curve_id", "SSL_in_init", "SSL_get_session", "SSL_in_early_data"}) {
    EXPECT_EQ(plain(name), "unknown") << name;
  }
}

TEST(BoringSslPlan, DebianFieldsDecode) {
  const ProcessPlan& plan = DebianPlan().layout;
  for (const auto& [name, chain] : plan.fields) std::printf("%-18s %s\n", name.c_str(), chain.c_str());
  for (uint32_t field : {FIELD_SSL_VERSION, FIELD_SSL_IN_INIT, FIELD_SSL_RESUMED, FIELD_SSL_IS_SERVER, FIELD_SSL_CIPHER,
                         FIELD_SSL_GROUP, FIELD_SSL_KEY_TYPE, FIELD_PKEYCTX_KEY_TYPE}) {
    EXPECT_GT(plan.layout.field[field].n, 0) << FieldName(field) << " did not decode";
    EXPECT_NE(plan.fields.at(std::string(FieldName(field))), "unknown");
  }
  // No state field (SSL_in_init says when a handshake runs), and no
  // EVP_MD_CTX key: this BoringSSL exports no accessor for it.
  EXPECT_EQ(plan.layout.field[FIELD_SSL_STATE].n, 0);
  EXPECT_EQ(plan.layout.field[FIELD_MDCTX_KEY_TYPE].n, 0);
}

// The two sides' contexts: a server with a fresh key and certificate, and
// a client that keeps its sessions.
struct Options {
  std::string cert = "ecdsa";
  uint16_t version = TLS1_3_VERSION;
  const char* curves = "X25519";
  const char* ciphers = nullptr;  // TLS 1.2 suites (TLS 1.3's are not configurable in BoringSSL)
};

// The last session the client got (BoringSSL hands TLS 1.3 tickets to the
// new-session callback, not to SSL_get1_session).
bssl::UniquePtr<SSL_SESSION> last_session;

class Contexts {
 public:
  explicit Contexts(const Options& o) {
    key_ = workload::MakeBoringSslKey(o.cert);
    EXPECT_TRUE(key_);
    cert_ = workload::MakeBoringSslCertificate(key_.get(), "boringssl_plan_test");
    EXPECT_TRUE(cert_);
    server_.reset(SSL_CTX_new(TLS_method()));
    client_.reset(SSL_CTX_new(TLS_method()));
    EXPECT_EQ(SSL_CTX_use_certificate(server_.get(), cert_.get()), 1);
    EXPECT_EQ(SSL_CTX_use_PrivateKey(server_.get(), key_.get()), 1);
    for (SSL_CTX* ctx : {server_.get(), client_.get()}) {
      EXPECT_EQ(SSL_CTX_set_min_proto_version(ctx, o.version), 1);
      EXPECT_EQ(SSL_CTX_set_max_proto_version(ctx, o.version), 1);
      EXPECT_EQ(SSL_CTX_set1_curves_list(ctx, o.curves), 1);
    }
    if (o.ciphers) {
      EXPECT_EQ(SSL_CTX_set_strict_cipher_list(client_.get(), o.ciphers), 1);
    }
    SSL_CTX_set_session_cache_mode(client_.get(), SSL_SESS_CACHE_CLIENT);
    SSL_CTX_sess_set_new_cb(client_.get(), [](SSL*, SSL_SESSION* session) {
      last_session.reset(session);  // the callback's reference
      return 1;
    });
  }
  SSL_CTX* server() const { return server_.get(); }
  SSL_CTX* client() const { return client_.get(); }

 private:
  bssl::UniquePtr<EVP_PKEY> key_;
  bssl::UniquePtr<X509> cert_;
  bssl::UniquePtr<SSL_CTX> server_, client_;
};

// A client and a server SSL of this process, handshaking over a BIO pair.
class Connection {
 public:
  // `client_curves`: the client's own groups, instead of its context's.
  explicit Connection(const Contexts& contexts, SSL_SESSION* session = nullptr, const char* client_curves = nullptr)
      : server_(SSL_new(contexts.server())), client_(SSL_new(contexts.client())) {
    SSL_set_accept_state(server_.get());
    SSL_set_connect_state(client_.get());
    if (client_curves) {
      EXPECT_EQ(SSL_set1_curves_list(client_.get(), client_curves), 1);
    }
    if (session) {
      EXPECT_EQ(SSL_set_session(client_.get(), session), 1);
    }
    BIO *client_bio = nullptr, *server_bio = nullptr;
    EXPECT_EQ(BIO_new_bio_pair(&client_bio, 0, &server_bio, 0), 1);
    SSL_set_bio(client_.get(), client_bio, client_bio);
    SSL_set_bio(server_.get(), server_bio, server_bio);
  }

  // Steps both sides until both are done; `mid` runs once, after the
  // server's first step (waiting for the client's next flight).
  bool Run(const std::function<void()>& mid = nullptr) {
    bool client_done = false, server_done = false;
    for (int round = 0; round < 16 && !(client_done && server_done); ++round) {
      if (!client_done) client_done = SSL_do_handshake(client_.get()) == 1;
      if (!server_done) {
        server_done = SSL_do_handshake(server_.get()) == 1;
        if (round == 0 && mid) mid();
      }
    }
    if (!client_done || !server_done) return false;
    // The server's byte takes the client through TLS 1.3's tickets.
    char byte = 'x';
    return SSL_write(server_.get(), &byte, 1) == 1 && SSL_read(client_.get(), &byte, 1) == 1;
  }

  SSL* server() const { return server_.get(); }
  SSL* client() const { return client_.get(); }

 private:
  bssl::UniquePtr<SSL> server_, client_;
};

// The completed handshake's fields of both sides, through the chains and
// through the accessors; returns the server's cipher and group names.
std::pair<std::string, std::string> ExpectFieldsMatchAccessors(const Connection& h) {
  for (SSL* ssl : {h.server(), h.client()}) {
    SCOPED_TRACE(SSL_is_server(ssl) ? "server" : "client");
    EXPECT_EQ(SSL_in_init(ssl), 0);
    // The premise of the fields read at completion: the handshake object,
    // what SSL_in_init() tests, is freed.
    LoadChain handshake = Chain(FIELD_SSL_IN_INIT);
    handshake.offsets.pop_back();
    handshake.width = 8;
    handshake.shift = handshake.bits = 0;
    handshake.invert = false;
    EXPECT_EQ(Follow(ssl, handshake), 0u);
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_IN_INIT)), std::nullopt);  // unknown: not 1
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_VERSION)), static_cast<uint64_t>(SSL_version(ssl)));
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_RESUMED)), static_cast<uint64_t>(SSL_session_reused(ssl)));
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_IS_SERVER)), static_cast<uint64_t>(SSL_is_server(ssl)));
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_CIPHER)),
              static_cast<uint64_t>(SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(ssl))));
    EXPECT_EQ(Follow(ssl, Chain(FIELD_SSL_GROUP)), static_cast<uint64_t>(SSL_get_curve_id(ssl)));
  }
  // The server's own key; the client holds none (NULL on the way: unknown).
  EXPECT_EQ(Follow(h.server(), Chain(FIELD_SSL_KEY_TYPE)),
            static_cast<uint64_t>(EVP_PKEY_id(SSL_get_privatekey(h.server()))));
  EXPECT_EQ(SSL_get_privatekey(h.client()), nullptr);
  EXPECT_EQ(Follow(h.client(), Chain(FIELD_SSL_KEY_TYPE)), std::nullopt);
  const uint16_t group = SSL_get_curve_id(h.server());
  return {CipherSuiteName(SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(h.server()))),
          GroupName(group ? USAGE_KX_TLS_GROUP | group : 0, 0)};
}

TEST(BoringSslPlan, FieldsOfLiveHandshakes) {
  struct Case {
    const char* name;
    Options options;
    const char* suite;
    const char* group;
  };
  const Case cases[] = {
      {"TLS 1.3 X25519 ECDSA", {"ecdsa", TLS1_3_VERSION, "X25519"}, "TLS_AES_128_GCM_SHA256", "X25519"},
      {"TLS 1.3 P-256 RSA", {"rsa", TLS1_3_VERSION, "P-256"}, "TLS_AES_128_GCM_SHA256", "P-256"},
      {"TLS 1.2 ECDHE-RSA-AES128-SHA",
       {"rsa", TLS1_2_VERSION, "X25519", "ECDHE-RSA-AES128-SHA"},
       "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
       "X25519"},
      // TLS 1.2 needs the ECDSA certificate's curve among the client's.
      {"TLS 1.2 ECDHE-ECDSA-CHACHA20 P-384",
       {"ecdsa", TLS1_2_VERSION, "P-384:P-256", "ECDHE-ECDSA-CHACHA20-POLY1305"},
       "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
       "P-384"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Contexts contexts(c.options);
    Connection h(contexts);
    // Mid-handshake, after the server's first flight: in init, by the
    // chain as by the accessor.
    ASSERT_TRUE(h.Run([&] {
      EXPECT_EQ(SSL_in_init(h.server()), 1);
      EXPECT_EQ(Follow(h.server(), Chain(FIELD_SSL_IN_INIT)), 1u);
    }));
    auto [suite, group] = ExpectFieldsMatchAccessors(h);
    EXPECT_EQ(suite, c.suite);
    EXPECT_EQ(group, c.group);
    EXPECT_EQ(SSL_session_reused(h.server()), 0);
    EXPECT_EQ(Follow(h.server(), Chain(FIELD_SSL_KEY_TYPE)),
              static_cast<uint64_t>(c.options.cert == "rsa" ? EVP_PKEY_RSA : EVP_PKEY_EC));
  }
}

TEST(BoringSslPlan, NewSslIsInInitFromTheStart) {
  // What lets the first SSL_do_handshake step begin a handshake in the BPF
  // probe (FIELD_SSL_IN_INIT == 1 at its entry).
  bssl::UniquePtr<SSL_CTX> ctx(SSL_CTX_new(TLS_method()));
  for (bool server : {true, false}) {
    bssl::UniquePtr<SSL> ssl(SSL_new(ctx.get()));
    server ? SSL_set_accept_state(ssl.get()) : SSL_set_connect_state(ssl.get());
    EXPECT_EQ(SSL_in_init(ssl.get()), 1);
    EXPECT_EQ(Follow(ssl.get(), Chain(FIELD_SSL_IN_INIT)), 1u);
    EXPECT_EQ(Follow(ssl.get(), Chain(FIELD_SSL_IS_SERVER)), static_cast<uint64_t>(server));
  }
}

// Resumed with a ticket: the fields as the accessors say. The group is
// BoringSSL's answer: a TLS 1.3 resumption (psk_dhe_ke) exchanges a key of
// its own, here on another group than the first handshake's; a TLS 1.2 one
// exchanges none, and the session keeps the group of the handshake that made
// it (which the BPF side does not report: bpf/usage.bpf.c, count_handshake).
TEST(BoringSslPlan, ResumedHandshakes) {
  for (uint16_t version : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    const bool tls12 = version == TLS1_2_VERSION;
    SCOPED_TRACE(tls12 ? "TLS 1.2" : "TLS 1.3");
    Contexts contexts({"rsa", version, "X25519:P-256", tls12 ? "ECDHE-RSA-AES128-GCM-SHA256" : nullptr});
    last_session.reset();
    Connection first(contexts);
    ASSERT_TRUE(first.Run());
    EXPECT_EQ(SSL_get_curve_id(first.server()), SSL_CURVE_X25519);
    bssl::UniquePtr<SSL_SESSION> session = std::move(last_session);
    ASSERT_TRUE(session);
    Connection again(contexts, session.get(), "P-256");
    ASSERT_TRUE(again.Run());
    EXPECT_EQ(SSL_session_reused(again.server()), 1);
    EXPECT_EQ(SSL_session_reused(again.client()), 1);
    auto [suite, group] = ExpectFieldsMatchAccessors(again);
    EXPECT_EQ(group, tls12 ? "X25519" : "P-256");
    EXPECT_EQ(suite, tls12 ? "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" : "TLS_AES_128_GCM_SHA256");
  }
}

TEST(BoringSslPlan, KeyOfAPkeyCtx) {
  for (const char* kind : {"rsa", "ecdsa"}) {
    bssl::UniquePtr<EVP_PKEY> key = workload::MakeBoringSslKey(kind);
    ASSERT_TRUE(key);
    bssl::UniquePtr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new(key.get(), nullptr));
    ASSERT_TRUE(ctx);
    EXPECT_EQ(Follow(ctx.get(), Chain(FIELD_PKEYCTX_KEY_TYPE)), static_cast<uint64_t>(EVP_PKEY_id(key.get())));
  }
}

TEST(Names, BoringSslGroupsAndKeyTypes) {
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 29, 0), "X25519");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 23, 0), "P-256");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 0x11ec, 0), "X25519MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 0x11eb, 0), "SecP256r1MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 0x11ed, 0), "SecP384r1MLKEM1024");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 0x1234, 0), "group-0x1234");
  EXPECT_EQ(GroupName(USAGE_UNKNOWN, 0), "unknown");
  // BoringSSL's own NIDs for X25519 and Ed25519.
  EXPECT_EQ(GroupName(EVP_PKEY_X25519, 32), "X25519");
  EXPECT_EQ(KeyExchangeAlgorithm(EVP_PKEY_X25519, 32), "X25519");
  EXPECT_EQ(CertKeyTypeName(EVP_PKEY_ED25519), "Ed25519");
  EXPECT_EQ(KeyExchangeAlgorithm(USAGE_KEY_X25519, 32), "X25519");
}

}  // namespace
}  // namespace tlsprof::usage
