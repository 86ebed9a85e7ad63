#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <map>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/usage/accessors.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/follow_chain.h"
#include "agent/usage/handshake_cost.h"
#include "agent/usage/names.h"
#include "agent/usage/plan_test_util.h"
#include "agent/usage/probe_plan.h"
#include "agent/usage/usage_probes.h"

namespace tlsprof::usage {
namespace {

std::optional<LoadChain> Decode(std::vector<uint8_t> code) { return DecodeLoadChain(code); }

TEST(DecodeLoadChain, OneLoad) {
  // SSL_version: mov (%rdi),%eax; xor %edi,%edi; ret
  auto chain = Decode({0x8b, 0x07, 0x31, 0xff, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(chain->offsets, std::vector<int32_t>{0});
  EXPECT_EQ(chain->width, 4);
  // SSL_session_reused: mov 0x4d0(%rdi),%eax; ret (with endbr64)
  chain = Decode({0xf3, 0x0f, 0x1e, 0xfa, 0x8b, 0x87, 0xd0, 0x04, 0x00, 0x00, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(chain->offsets, std::vector<int32_t>{0x4d0});
  // SSL_CIPHER_get_protocol_id: movzwl 0x18(%rdi),%eax; ret
  chain = Decode({0x0f, 0xb7, 0x47, 0x18, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(chain->offsets, std::vector<int32_t>{0x18});
  EXPECT_EQ(chain->width, 2);
}

TEST(DecodeLoadChain, NullCheckedChain) {
  // SSL_get_privatekey: mov 0x898(%rdi),%rax; test %rax,%rax; je +6;
  // mov (%rax),%rax; mov 0x8(%rax),%rax; xor %edi,%edi; ret
  auto chain = Decode({0x48, 0x8b, 0x87, 0x98, 0x08, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74,
                       0x07, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x40, 0x08, 0x31, 0xff, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(chain->offsets, (std::vector<int32_t>{0x898, 0, 8}));
  EXPECT_EQ(chain->width, 8);
  EXPECT_EQ(ToString(*chain), "+0x898 -> +0x0 -> +0x8 (8 bytes)");
}

TEST(DecodeLoadChain, RejectsWhatIsNotAPlainChain) {
  EXPECT_FALSE(Decode({0xc3}));                                      // no load
  EXPECT_FALSE(Decode({0x8b, 0x06, 0xc3}));                          // from rsi, not rdi
  EXPECT_FALSE(Decode({0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3}));  // rip-relative
  EXPECT_FALSE(Decode({0x8b, 0x04, 0x24, 0xc3}));                    // SIB
  EXPECT_FALSE(Decode({0x8b, 0x17, 0xc3}));                          // ends in edx, not eax
  EXPECT_FALSE(Decode({0x48, 0x8b, 0x07, 0xe8, 0, 0, 0, 0, 0xc3}));  // a call
  // A load through a 4-byte value.
  EXPECT_FALSE(Decode({0x8b, 0x07, 0x48, 0x8b, 0x00, 0xc3}));
  // je to something that does more than return.
  EXPECT_FALSE(
      Decode({0x48, 0x8b, 0x07, 0x48, 0x85, 0xc0, 0x74, 0x05, 0x48, 0x8b, 0x40, 0x08, 0xc3, 0x48, 0x8b, 0x00, 0xc3}));
  EXPECT_FALSE(Decode({}));
  EXPECT_FALSE(Decode({0x48}));  // truncated
  // More loads than the BPF side follows.
  EXPECT_FALSE(
      Decode({0x48, 0x8b, 0x07, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x00, 0xc3}));
}

// OpenSSL 3.5 (Debian 13's libssl.so.3, objdump -d): the type dispatch
// before the field, the NULL argument's path a trap (mov 0x0,%eax; ud2).
TEST(DecodeLoadChain, OpenSsl35TypeGuard) {
  // SSL_version: endbr64; test %rdi,%rdi; je trap; mov (%rdi),%eax;
  // test %eax,%eax; je conn; test $0x80,%al; jne quic; xor..; ret;
  // conn: mov 0x48(%rdi),%eax; xor..; ret; trap: mov 0x0,%eax; ud2
  auto chain = Decode({0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x74, 0x27, 0x8b, 0x07, 0x85, 0xc0, 0x74, 0x11,
                       0xa8, 0x80, 0x75, 0x2d, 0x31, 0xc0, 0x31, 0xd2, 0x31, 0xc9, 0x31, 0xff, 0xc3, 0x0f, 0x1f,
                       0x40, 0x00, 0x8b, 0x47, 0x48, 0x31, 0xd2, 0x31, 0xc9, 0x31, 0xff, 0xc3, 0x66, 0x0f, 0x1f,
                       0x44, 0x00, 0x00, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x0b});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "[+0x0 == 0] +0x48 (4 bytes)");
  // SSL_get_privatekey: the QUIC path calls; the connection's is
  // mov 0x880(%rdi),%rax; test; je; mov (%rax),%rax; mov 0x8(%rax),%rax.
  chain = Decode({0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x74, 0x67, 0x8b, 0x07, 0x85, 0xc0, 0x74, 0x31, 0xa8, 0x80,
                  0x74, 0x5d, 0x48, 0x83, 0xec, 0x08, 0xe8, 0x44, 0x87, 0x03, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x3f, 0x48,
                  0x8b, 0x80, 0x80, 0x08, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x33, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x40,
                  0x08, 0x48, 0x83, 0xc4, 0x08, 0x31, 0xff, 0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x48, 0x8b, 0x87, 0x80,
                  0x08, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x24, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x40, 0x08, 0x31, 0xff,
                  0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, 0x31, 0xc0, 0x48, 0x83, 0xc4, 0x08,
                  0x31, 0xff, 0xc3, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00, 0x31, 0xc0, 0x31, 0xff, 0xc3});
  ASSERT_TRUE(chain);
  EXPECT_EQ(ToString(*chain), "[+0x0 == 0] +0x880 -> +0x0 -> +0x8 (8 bytes)");
  // The guard composes first, never second.
  EXPECT_TRUE(Compose(*chain, LoadChain{{0}, 4}));
  EXPECT_FALSE(Compose(LoadChain{{0x880}, 8}, *chain));
  // A dispatch that jumps backwards, or a type word tested but not for 0.
  EXPECT_FALSE(Decode({0x8b, 0x07, 0x85, 0xc0, 0x74, 0xf0, 0x8b, 0x47, 0x48, 0xc3}));
  EXPECT_FALSE(Decode({0x8b, 0x07, 0xa8, 0x80, 0x74, 0x01, 0xc3, 0x8b, 0x47, 0x48, 0xc3}));
  // Followed through memory: a TLS connection's type word is 0, a QUIC object's not.
  struct {
    uint32_t type;
    uint32_t pad[17];
    uint32_t version;
  } object{};
  static_assert(offsetof(decltype(object), version) == 0x48);
  object.version = 0x0304;
  LoadChain version{{0x48}, 4};
  version.type_guard = true;
  EXPECT_EQ(FollowChain(&object, version), 0x0304u);
  object.type = 0x80;
  EXPECT_EQ(FollowChain(&object, version), std::nullopt);
}

TEST(Compose, ChainsThroughPointers) {
  LoadChain a{{0x918}, 8}, b{{0x18}, 2}, c{{0}, 4};
  auto ab = Compose(a, b);
  ASSERT_TRUE(ab);
  EXPECT_EQ(ab->offsets, (std::vector<int32_t>{0x918, 0x18}));
  EXPECT_EQ(ab->width, 2);
  EXPECT_FALSE(Compose(c, b));  // c ends in an int
  EXPECT_FALSE(Compose(LoadChain{{1, 2, 3}, 8}, LoadChain{{4, 5}, 4}));
}

// Follows a chain through this process's own memory, as the BPF side does
// through the profiled process's.
uint64_t Follow(const void* base, const LoadChain& chain) { return FollowChain(base, chain).value_or(~0ull); }

std::map<std::string, FunctionCode, std::less<>> Functions(const char* path) { return PlanLibrary(path).functions; }

// Debian's libssl.so.3 and libcrypto.so.3 (stripped: only their exported
// API has symbols), the files this test links against.
constexpr const char* kLibssl = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
constexpr const char* kLibcrypto = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";

TEST(ProbePlan, DebianOpenSsl3EveryFieldDecodesAndIsRight) {
  auto ssl_functions = Functions(kLibssl);
  auto crypto_functions = Functions(kLibcrypto);
  FilePlan ssl_plan = PlanFile(ssl_functions), crypto_plan = PlanFile(crypto_functions);
  ASSERT_EQ(ssl_plan.sites.size(), 2u);  // and SSL_free, a connection's end
  EXPECT_EQ(ssl_plan.sites[0].function, "SSL_do_handshake");
  EXPECT_EQ(ssl_plan.sites[1].function, "SSL_free");
  EXPECT_EQ(ssl_plan.sites[1].probe, static_cast<uint32_t>(PROBE_CLOSE));
  EXPECT_EQ(crypto_plan.sites.size(), 7u);  // sign x2, verify x2, derive, encapsulate, decapsulate
  ProcessPlan plan = PlanLayout({&ssl_functions, &crypto_functions});
  // OpenSSL's fields (ssl.group and ssl.in_init are BoringSSL's).
  for (uint32_t field = 0; field <= FIELD_PKEYCTX_KEY_TYPE; ++field) {
    EXPECT_GT(plan.layout.field[field].n, 0) << FieldName(field) << " did not decode";
  }
  EXPECT_EQ(plan.layout.field[FIELD_SSL_GROUP].n, 0);
  EXPECT_EQ(plan.layout.field[FIELD_SSL_IN_INIT].n, 0);

  // The chains, followed through live objects, give what the accessors say.
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  ASSERT_NE(ctx, nullptr);
  SSL* ssl = SSL_new(ctx);
  ASSERT_NE(ssl, nullptr);
  ASSERT_EQ(SSL_use_PrivateKey(ssl, key), 1);
  SSL_set_accept_state(ssl);
  EXPECT_EQ(Follow(ssl, PlannedChain(plan.layout, FIELD_SSL_VERSION)), static_cast<uint64_t>(SSL_version(ssl)));
  EXPECT_EQ(Follow(ssl, PlannedChain(plan.layout, FIELD_SSL_STATE)), static_cast<uint64_t>(TLS_ST_BEFORE));
  EXPECT_EQ(TLS_ST_BEFORE, 0);  // what bpf/usage.bpf.c takes for "no handshake begun"
  EXPECT_EQ(Follow(ssl, PlannedChain(plan.layout, FIELD_SSL_IS_SERVER)), 1u);
  EXPECT_EQ(Follow(ssl, PlannedChain(plan.layout, FIELD_SSL_RESUMED)), 0u);
  EXPECT_EQ(Follow(ssl, PlannedChain(plan.layout, FIELD_SSL_KEY_TYPE)), static_cast<uint64_t>(EVP_PKEY_EC));

  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ASSERT_EQ(EVP_DigestSignInit(md, nullptr, EVP_sha256(), nullptr, key), 1);
  EXPECT_EQ(Follow(md, PlannedChain(plan.layout, FIELD_MDCTX_KEY_TYPE)), static_cast<uint64_t>(EVP_PKEY_EC));
  EVP_PKEY* x = EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519");
  ASSERT_NE(x, nullptr);
  EVP_PKEY_CTX* pctx = EVP_PKEY_CTX_new(x, nullptr);
  EXPECT_EQ(Follow(pctx, PlannedChain(plan.layout, FIELD_PKEYCTX_KEY_TYPE)), static_cast<uint64_t>(EVP_PKEY_X25519));

  EVP_PKEY_CTX_free(pctx);
  EVP_PKEY_free(x);
  EVP_MD_CTX_free(md);
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  EVP_PKEY_free(key);
}

// The handshake state machine of Debian's stripped libssl.so.3, found through
// its method tables: OpenSSL 3.0's ossl_statem_accept/connect both tail-call
// state_machine, which is probed once. Its address is checked against the
// live library: SSL_set_accept_state() stores ossl_statem_accept in the SSL,
// and that function's jump lands on the same state_machine.
TEST(FindHandshakeStateMachine, DebianOpenSsl3) {
  PlannedLibrary lib = PlanLibrary(kLibssl);
  const auto* functions = &lib.functions;
  const std::vector<FoundFunction>& found = lib.state_machine;
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "state_machine");
  // Its first instruction's class (how the uprobe runs it) follows Debian's
  // build: a push in earlier 3.0 packages, another instruction in
  // 3.0.22-1~deb12u2.
  // The class is what the bytes say (probe_plan.cc); the bytes are checked
  // against the live library below.
  EXPECT_NE(FirstInstructionClass(found[0].code.prefix), static_cast<uint32_t>(INSN_GO));
  FilePlan plan = PlanFile(*functions, found);
  ASSERT_EQ(plan.sites.size(), 2u);  // replaces SSL_do_handshake; and SSL_free
  EXPECT_EQ(plan.sites[0].function, "state_machine");
  EXPECT_EQ(plan.sites[0].probe, static_cast<uint32_t>(PROBE_HANDSHAKE));

  // In this process: the library's load bias from an exported function,
  // then state_machine's address must be where ossl_statem_accept jumps.
  const uintptr_t do_handshake = reinterpret_cast<uintptr_t>(&SSL_do_handshake);
  const uintptr_t bias = do_handshake - functions->at("SSL_do_handshake").vaddr;
  const uintptr_t state_machine = bias + found[0].code.vaddr;
  // The first bytes there are the ones the plan read from the file.
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(state_machine), found[0].code.prefix.data(), 16), 0);
}

TEST(FindHandshakeStateMachine, NothingWithoutMethodTables) {
  std::map<std::string, FunctionCode, std::less<>> none;
  const OpenedElf opened = OpenElf(kLibcrypto);
  ASSERT_TRUE(opened.elf);
  EXPECT_TRUE(FindHandshakeStateMachine(*opened.elf, none).empty());
}

TEST(FindFunctions, RejectsWhatIsNotElf) {
  char path[] = "/tmp/tlsprof-usage-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "not an elf file", 15), 15);
  close(fd);
  auto file = guard::OpenHostFile(path);
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(guard::ElfFile::Open(*file).ok());
  unlink(path);
}

TEST(Names, VocabularyOfTheReport) {
  EXPECT_EQ(VersionName(0x0304), "TLSv1.3");
  EXPECT_EQ(VersionName(0xffff), "unknown");
  EXPECT_EQ(CipherSuiteName(0x1303), "TLS_CHACHA20_POLY1305_SHA256");
  EXPECT_EQ(CipherSuiteName(0xc013), "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA");
  EXPECT_EQ(CipherSuiteName(0x1234), "0x1234");
  EXPECT_EQ(GroupName(1034, 32), "X25519");
  EXPECT_EQ(GroupName(408, 32), "P-256");
  EXPECT_EQ(GroupName(0, 0), "none");
  EXPECT_EQ(SignatureAlgorithm(6, 256), "RSA-2048");
  EXPECT_EQ(SignatureAlgorithm(408, 71), "ECDSA-P256");
  EXPECT_EQ(SignatureAlgorithm(408, 103), "ECDSA-P384");
  EXPECT_EQ(KeyExchangeAlgorithm(408, 32), "ECDHE-P256");
  EXPECT_EQ(KeyExchangeAlgorithm(1034, 32), "X25519");
  EXPECT_EQ(CertKeyTypeName(1087), "Ed25519");
  // KEMs by their ciphertext's length.
  EXPECT_EQ(GroupName(USAGE_KEY_KEM, 1120), "X25519MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KEY_KEM, 1153), "SecP256r1MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KEY_KEM, 1088), "MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KEY_KEM, 1000), "kem-1000");
  EXPECT_EQ(KeyExchangeAlgorithm(USAGE_KEY_KEM, 1088), "ML-KEM-768");
  EXPECT_EQ(KeyExchangeAlgorithm(USAGE_KEY_KEM, 1665), "SecP384r1MLKEM1024");
  EXPECT_EQ(GroupName(USAGE_KX_TLS_GROUP | 0x11ec, 0), "X25519MLKEM768");
  EXPECT_EQ(GroupName(USAGE_KEY_KYBER, 1120), "X25519Kyber768Draft00");
  EXPECT_EQ(KeyExchangeAlgorithm(USAGE_KEY_KYBER, 1088), "Kyber768");
}

TEST(Histogram, SlotsAndQuantiles) {
  // Slot bounds tile the line: each slot starts where the previous ended.
  for (uint32_t slot = 1; slot < USAGE_HIST_SLOTS; ++slot) {
    EXPECT_EQ(SlotBounds(slot).first, SlotBounds(slot - 1).second) << slot;
  }
  // 1,000 ns falls in [960, 1024): the midpoint is within 6%.
  std::vector<uint64_t> slots(USAGE_HIST_SLOTS, 0);
  uint32_t slot = 0;
  while (SlotBounds(slot).second <= 1000) ++slot;
  slots[slot] = 10;
  EXPECT_NEAR(HistogramQuantile(slots, 0.5), 1000, 60);
  EXPECT_EQ(HistogramQuantile(std::vector<uint64_t>(USAGE_HIST_SLOTS, 0), 0.5), 0);
}

}  // namespace
}  // namespace tlsprof::usage

namespace tlsprof::usage {
namespace {

HandshakeCount Row(uint32_t tgid, bool server, bool resumed, uint32_t cert, uint32_t sig_len, uint32_t kx,
                   uint32_t kx_len, uint64_t n) {
  HandshakeCount h{};
  h.key.tgid = tgid;
  h.key.is_server = server;
  h.key.resumed = resumed;
  h.key.cert_type = cert;
  h.key.sig_len = sig_len;
  h.key.kx_type = kx;
  h.key.kx_len = kx_len;
  h.count = n;
  h.estimated = static_cast<double>(n);
  return h;
}

OperationStats Op(uint32_t tgid, uint8_t op, uint32_t type, uint32_t len, uint64_t n, double seconds) {
  OperationStats o{};
  o.key.tgid = tgid;
  o.key.op = op;
  o.key.key_type = type;
  o.key.len = len;
  o.key.in_handshake = 1;
  o.count = n;
  o.estimated = static_cast<double>(n);
  o.cpu_ns = static_cast<uint64_t>(seconds * 1e9);
  return o;
}

// 100 full RSA handshakes (1 ms sign each), 100 full ECDSA (0.1 ms) and 200
// resumed ones, all with a 50 us X25519 derive: 0.3 s sampled. Own costs
// 0.105 + 0.015 + 0.01 s; the remaining 0.17 s shared by 400 handshakes.
TEST(SplitHandshakeCpu, OwnOperationsPlusAnEqualShare) {
  UsageSnapshot w;
  w.handshakes = {Row(7, true, false, 6, 256, 1034, 32, 100), Row(7, true, false, 408, 71, 1034, 32, 100),
                  Row(7, true, true, 408, 0, 1034, 32, 200)};
  w.operations = {Op(7, USAGE_OP_SIGN, 6, 256, 100, 0.1), Op(7, USAGE_OP_SIGN, 408, 71, 100, 0.01),
                  Op(7, USAGE_OP_DERIVE, 1034, 32, 400, 0.02)};
  auto cost = SplitHandshakeCpu(w, [](uint32_t tgid) { return tgid == 7 ? 0.3 : 0.0; });
  ASSERT_EQ(cost.size(), 3u);
  const double share = (0.3 - 0.1 - 0.01 - 0.02) / 400;
  EXPECT_NEAR(cost[0].cpu_seconds / 100, 1e-3 + 50e-6 + share, 1e-9);
  EXPECT_NEAR(cost[1].cpu_seconds / 100, 100e-6 + 50e-6 + share, 1e-9);
  EXPECT_NEAR(cost[2].cpu_seconds / 200, 50e-6 + share, 1e-9);
  EXPECT_NEAR(cost[0].cpu_seconds + cost[1].cpu_seconds + cost[2].cpu_seconds, 0.3, 1e-9);
}

// A hybrid whose halves ran as two operations (Go: ML-KEM-768 and X25519)
// costs both.
TEST(SplitHandshakeCpu, HybridHalvesAddUp) {
  UsageSnapshot w;
  w.handshakes = {Row(3, true, false, 408, 71, USAGE_KEY_KEM, 1088 + 32, 100),
                  Row(3, true, false, 408, 71, 1034, 32, 100)};
  w.operations = {Op(3, USAGE_OP_SIGN, 408, 71, 200, 0.02), Op(3, USAGE_OP_DERIVE, 1034, 32, 200, 0.02),
                  Op(3, USAGE_OP_DERIVE, USAGE_KEY_KEM, 1088, 100, 0.03)};
  auto cost = SplitHandshakeCpu(w, [](uint32_t) { return 0.1; });
  const double share = (0.1 - 0.02 - 0.02 - 0.03) / 200;
  EXPECT_NEAR(cost[0].cpu_seconds / 100, 100e-6 + 100e-6 + 300e-6 + share, 1e-9);
  EXPECT_NEAR(cost[1].cpu_seconds / 100, 100e-6 + 100e-6 + share, 1e-9);
}

// Operations that add up to more than was sampled are scaled down to it;
// a process with one kind of handshake gets exactly its CPU per handshake.
TEST(SplitHandshakeCpu, NeverMoreThanSampled) {
  UsageSnapshot w;
  w.handshakes = {Row(1, true, false, 6, 256, 0, 0, 10), Row(2, false, false, 408, 71, 1034, 32, 4)};
  w.operations = {Op(1, USAGE_OP_SIGN, 6, 256, 10, 0.02), Op(2, USAGE_OP_VERIFY, 408, 71, 8, 0.001)};
  auto cost = SplitHandshakeCpu(w, [](uint32_t tgid) { return tgid == 1 ? 0.01 : 0.004; });
  EXPECT_NEAR(cost[0].cpu_seconds, 0.01, 1e-12);
  EXPECT_NEAR(cost[1].cpu_seconds, 0.004, 1e-12);
}

}  // namespace
}  // namespace tlsprof::usage
