// Needs root and a real kernel (label "bpf"). Probes that cannot attach are a
// failure here, never a skip: CI runs this as root on the target kernel.
//
// The handshakes run in this process, through Debian's libssl.so.3 (the file
// the probes are attached to), a client and a server SSL joined by a BIO
// pair, so every count is known exactly.
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "agent/usage/names.h"
#include "agent/usage/usage_probes.h"

namespace tlsprof::usage {
namespace {

constexpr const char* kLibssl = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
constexpr const char* kLibcrypto = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";

FileRef Ref(const char* path) {
  auto file = guard::OpenHostFile(path);
  EXPECT_TRUE(file.ok()) << path;
  if (!file) return FileRef{};
  const guard::FileId id = file->id();
  return FileRef{std::make_shared<const guard::GuardedFile>(std::move(*file)), path, id.dev, id.ino, "openssl-3"};
}

// A self-signed certificate for `key`.
X509* SelfSigned(EVP_PKEY* key) {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("tlsprof-test"), -1, -1,
                             0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  return cert;
}

struct Server {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  SSL_CTX* ctx = nullptr;
  explicit Server(EVP_PKEY* k) : key(k), cert(SelfSigned(k)), ctx(SSL_CTX_new(TLS_server_method())) {
    SSL_CTX_use_certificate(ctx, cert);
    SSL_CTX_use_PrivateKey(ctx, key);
  }
  ~Server() {
    SSL_CTX_free(ctx);
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

struct ClientConfig {
  int version = TLS1_3_VERSION;
  const char* suites = nullptr;   // TLS 1.3
  const char* ciphers = nullptr;  // TLS 1.2
  const char* groups = nullptr;
};

// One handshake over a BIO pair; returns the client's session (for
// resumption) or nullptr. Fails the test if it does not complete.
// `implicit`: the server never calls SSL_do_handshake or SSL_accept; its
// SSL_read drives the handshake (as `openssl s_server -www` does).
SSL_SESSION* Handshake(Server& server, const ClientConfig& config, SSL_SESSION* resume = nullptr,
                       bool implicit = false) {
  SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(cctx, config.version);
  SSL_CTX_set_max_proto_version(cctx, config.version);
  if (config.suites) SSL_CTX_set_ciphersuites(cctx, config.suites);
  if (config.ciphers) SSL_CTX_set_cipher_list(cctx, config.ciphers);
  if (config.groups) SSL_CTX_set1_groups_list(cctx, config.groups);
  SSL* client = SSL_new(cctx);
  SSL* srv = SSL_new(server.ctx);
  if (resume) SSL_set_session(client, resume);
  BIO *client_io = nullptr, *server_io = nullptr;
  BIO_new_bio_pair(&client_io, 0, &server_io, 0);
  SSL_set_bio(client, client_io, client_io);
  SSL_set_bio(srv, server_io, server_io);
  SSL_set_connect_state(client);
  SSL_set_accept_state(srv);
  int rc = 0, rs = 0;
  for (int i = 0; i < 20 && (rc != 1 || rs != 1); ++i) {
    if (rc != 1) rc = SSL_do_handshake(client);
    if (rs != 1 && implicit) {
      char byte;
      SSL_read(srv, &byte, 1);
      if (SSL_is_init_finished(srv)) rs = 1;
    } else if (rs != 1) {
      rs = SSL_do_handshake(srv);
    }
  }
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(rs, 1);
  // TLS 1.3 tickets come after the handshake: let the client read them.
  char byte;
  SSL_write(srv, "x", 1);
  SSL_read(client, &byte, 1);
  SSL_SESSION* session = SSL_get1_session(client);
  // Closed cleanly: SSL_free() of a connection not shut down marks its
  // session not resumable.
  SSL_set_shutdown(client, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  SSL_set_shutdown(srv, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  SSL_free(client);
  SSL_free(srv);
  SSL_CTX_free(cctx);
  return session;
}

struct Row {
  std::string side, kind, version, suite, group, cert;
  bool operator<(const Row& o) const {
    return std::tie(side, kind, version, suite, group, cert) <
           std::tie(o.side, o.kind, o.version, o.suite, o.group, o.cert);
  }
};

std::map<Row, uint64_t> Rows(const UsageProbes& probes, pid_t tgid) {
  std::map<Row, uint64_t> rows;
  for (const HandshakeCount& h : probes.ReadHandshakes()) {
    if (h.key.tgid != static_cast<uint32_t>(tgid)) continue;
    Row row{h.key.is_server == 1   ? "server"
            : h.key.is_server == 0 ? "client"
                                   : "unknown",
            h.key.resumed == 1   ? "resumed"
            : h.key.resumed == 0 ? "full"
                                 : "unknown",
            VersionName(h.key.version),
            CipherSuiteName(h.key.cipher),
            GroupName(h.key.kx_type, h.key.kx_len),
            CertKeyTypeName(h.key.cert_type)};
    rows[row] += h.count;
  }
  return rows;
}

TEST(UsageProbes, CountsHandshakesByParametersExactly) {
  // Before the probes: making the certificates signs and verifies too.
  Server ecdsa(EVP_EC_gen("P-256"));
  Server rsa(EVP_RSA_gen(2048));
  auto probes = UsageProbes::Start();
  ASSERT_TRUE(probes.ok()) << probes.error().message;
  Status attached = (*probes)->AttachProcess({Ref(kLibssl), Ref(kLibcrypto)});
  ASSERT_TRUE(attached.ok()) << attached.error().message;
  ASSERT_EQ((*probes)->files().size(), 2u);
  for (int i = 0; i < 5; ++i) {
    SSL_SESSION_free(Handshake(ecdsa, {TLS1_3_VERSION, "TLS_AES_128_GCM_SHA256", nullptr, "X25519"}));
  }
  // Two more whose server side only ever calls SSL_read.
  for (int i = 0; i < 2; ++i) {
    SSL_SESSION_free(
        Handshake(ecdsa, {TLS1_3_VERSION, "TLS_AES_128_GCM_SHA256", nullptr, "X25519"}, nullptr, /*implicit=*/true));
  }
  for (int i = 0; i < 3; ++i) {
    SSL_SESSION_free(Handshake(ecdsa, {TLS1_3_VERSION, "TLS_CHACHA20_POLY1305_SHA256", nullptr, "P-256"}));
  }
  for (int i = 0; i < 4; ++i) {
    SSL_SESSION_free(Handshake(rsa, {TLS1_2_VERSION, nullptr, "ECDHE-RSA-AES128-SHA", "X25519"}));
  }
  // Two resumptions of one TLS 1.3 session (psk_dhe_ke: X25519 again).
  SSL_SESSION* session = Handshake(ecdsa, {TLS1_3_VERSION, "TLS_AES_256_GCM_SHA384", nullptr, "X25519"});
  ASSERT_NE(session, nullptr);
  for (int i = 0; i < 2; ++i) {
    SSL_SESSION_free(Handshake(ecdsa, {TLS1_3_VERSION, "TLS_AES_256_GCM_SHA384", nullptr, "X25519"}, session));
  }
  SSL_SESSION_free(session);

  std::map<Row, uint64_t> want = {
      {{"server", "full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "ECDSA"}, 7},
      {{"client", "full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "ECDSA"}, 7},
      {{"server", "full", "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", "P-256", "ECDSA"}, 3},
      {{"client", "full", "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", "P-256", "ECDSA"}, 3},
      {{"server", "full", "TLSv1.2", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "X25519", "RSA"}, 4},
      {{"client", "full", "TLSv1.2", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "X25519", "RSA"}, 4},
      {{"server", "full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "ECDSA"}, 1},
      {{"client", "full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "ECDSA"}, 1},
      // A resumed client verifies no certificate: "none".
      {{"server", "resumed", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "ECDSA"}, 2},
      {{"client", "resumed", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "none"}, 2},
  };
  std::map<Row, uint64_t> got = Rows(**probes, getpid());
  for (const auto& [row, count] : got) {
    if (!want.count(row)) {
      ADD_FAILURE() << "unexpected row " << row.side << " " << row.kind << " " << row.version << " " << row.suite << " "
                    << row.group << " " << row.cert << ": " << count;
    }
  }
  for (const auto& [row, count] : want) {
    EXPECT_EQ(got[row], count) << row.side << " " << row.kind << " " << row.version << " " << row.suite << " "
                               << row.group << " " << row.cert;
  }
  UsageTotals totals = (*probes)->ReadTotals();
  EXPECT_EQ(totals.handshakes, 2u * (7 + 3 + 4 + 1 + 2));
  EXPECT_EQ(totals.dropped_keys, 0u);
  EXPECT_EQ(totals.read_errors, 0u);

  // Operations: the servers' signatures (one per full handshake), the
  // clients' verifications, and the key exchanges, with their latency.
  std::map<std::string, uint64_t> ops;
  for (const OperationStats& op : (*probes)->ReadOperations()) {
    // This process's own calibration calls (UsageProbes::Start) are not operations.
    if (op.key.tgid != static_cast<uint32_t>(getpid()) || op.key.op == USAGE_OP_CALIBRATE) continue;
    std::string name = op.key.op == USAGE_OP_DERIVE ? KeyExchangeAlgorithm(op.key.key_type, op.key.len)
                                                    : SignatureAlgorithm(op.key.key_type, op.key.len);
    name = (op.key.op == USAGE_OP_SIGN ? "sign " : op.key.op == USAGE_OP_VERIFY ? "verify " : "derive ") + name;
    ops[name] += op.count;
    EXPECT_EQ(op.key.in_handshake, 1) << name;
    EXPECT_GT(op.cpu_ns, 0u) << name;
    EXPECT_LE(op.cpu_ns, op.wall_ns) << name;
    EXPECT_GT(HistogramQuantile(op.slots, 0.5), 1000) << name << ": a public-key operation takes over 1 us";
  }
  EXPECT_EQ(ops["sign ECDSA-P256"], 7u + 3 + 1);
  EXPECT_EQ(ops["verify ECDSA-P256"], 7u + 3 + 1);
  EXPECT_EQ(ops["sign RSA-2048"], 4u);
  EXPECT_EQ(ops["verify RSA-2048"], 4u);
  // Each side derives once per handshake that has (EC)DHE.
  EXPECT_EQ(ops["derive X25519"], 2u * (7 + 4 + 1 + 2));
  EXPECT_EQ(ops["derive ECDHE-P256"], 2u * 3);
}

TEST(UsageProbes, TimesASigningLoopOnCpu) {
  auto probes = UsageProbes::Start();
  ASSERT_TRUE(probes.ok()) << probes.error().message;
  ASSERT_TRUE((*probes)->AttachProcess({Ref(kLibcrypto)}).ok());
  // The calibration measured the probes' own time per call: a single-stepped
  // first instruction costs the kernel one more trap than an emulated push.
  const auto& own = (*probes)->probe_overhead_ns();
  EXPECT_GT(own[INSN_EMULATED_PUSH], 0);
  EXPECT_GT(own[INSN_SINGLE_STEPPED], own[INSN_EMULATED_PUSH]);
  EVP_PKEY* key = EVP_RSA_gen(2048);
  ASSERT_NE(key, nullptr);
  unsigned char digest[32] = {1, 2, 3};
  constexpr int kSigns = 40;
  for (int i = 0; i < kSigns; ++i) {
    EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(key, nullptr);
    ASSERT_EQ(EVP_PKEY_sign_init(ctx), 1);
    EVP_PKEY_CTX_set_signature_md(ctx, EVP_sha256());
    unsigned char sig[512];
    size_t len = sizeof(sig);
    ASSERT_EQ(EVP_PKEY_sign(ctx, sig, &len, digest, sizeof(digest)), 1);
    EVP_PKEY_CTX_free(ctx);
  }
  EVP_PKEY_free(key);
  uint64_t count = 0;
  double p50 = 0;
  for (const OperationStats& op : (*probes)->ReadOperations()) {
    if (op.key.tgid != static_cast<uint32_t>(getpid()) || op.key.op != USAGE_OP_SIGN) continue;
    EXPECT_EQ(SignatureAlgorithm(op.key.key_type, op.key.len), "RSA-2048");
    EXPECT_EQ(op.key.in_handshake, 0);
    count += op.count;
    p50 = HistogramQuantile(op.slots, 0.5);
  }
  EXPECT_EQ(count, static_cast<uint64_t>(kSigns));
  // An RSA-2048 sign is 0.3-3 ms on any x86-64 of the last decade.
  EXPECT_GT(p50, 100e3);
  EXPECT_LT(p50, 20e6);
}

// Probes attached while a thread signs in a tight loop: a call whose entry
// probe fired must not miss its return probe (return probes are attached
// first), or the thread would look inside one operation for good and every
// later sign would count as nested, untimed.
TEST(UsageProbes, AttachesUnderLoadWithoutLosingReturns) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> signs{0};
  std::thread signer([&] {
    unsigned char digest[32] = {7};
    while (!stop.load()) {
      EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(key, nullptr);
      EVP_PKEY_sign_init(ctx);
      unsigned char sig[80];
      size_t len = sizeof(sig);
      if (EVP_PKEY_sign(ctx, sig, &len, digest, sizeof(digest)) == 1) signs++;
      EVP_PKEY_CTX_free(ctx);
    }
  });
  // Joined on every way out, a failed assertion included.
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, signer};
  while (signs.load() < 100) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto probes = UsageProbes::Start();
  ASSERT_TRUE(probes.ok()) << probes.error().message;
  const uint64_t before_attach = signs.load();
  ASSERT_TRUE((*probes)->AttachProcess({Ref(kLibcrypto)}).ok());
  const uint64_t at_attach = signs.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  signer.join();
  const uint64_t total = signs.load();
  EVP_PKEY_free(key);
  // This process's signs only: the probes are on the file for every
  // process, and others on the host may sign too.
  uint64_t ops = 0;
  for (const OperationStats& op : (*probes)->ReadOperations()) {
    if (op.key.tgid == static_cast<uint32_t>(getpid()) && op.key.op == USAGE_OP_SIGN) ops += op.count;
  }
  EXPECT_EQ((*probes)->ReadTotals().nested, 0u);
  // Every sign after the attachment is timed (give or take the one in
  // flight), and none from before it began.
  EXPECT_GE(ops + 1, total - at_attach);
  EXPECT_LE(ops, total - before_attach);
  EXPECT_GT(total - at_attach, 100u);
}

// A probed file rewritten in place (same inode, new bytes: `cp` over it)
// loses its probes at the next check: the kernel would keep them at the old
// offsets in the new code. Renaming a new file over it is a new inode and
// needs nothing.
TEST(UsageProbes, FileRewrittenInPlaceLosesItsProbes) {
  char dir[] = "/tmp/tlsprof-usage-inplace-XXXXXX";
  ASSERT_TRUE(mkdtemp(dir));
  const std::string copy = std::string(dir) + "/libssl.so.3";
  std::filesystem::copy_file(kLibssl, copy);
  auto probes = UsageProbes::Start();
  ASSERT_TRUE(probes.ok()) << probes.error().message;
  const size_t before = (*probes)->link_count();
  // libcrypto alongside gives the layout; its own probes are elsewhere.
  ASSERT_TRUE((*probes)->AttachProcess({Ref(copy.c_str()), Ref(kLibcrypto)}).ok());
  const size_t attached = (*probes)->link_count();
  EXPECT_GT(attached, before);
  EXPECT_EQ((*probes)->CheckFiles(), 0u);  // unchanged
  // Rewritten in place: another file's bytes into the same inode.
  struct stat st {};
  ASSERT_EQ(stat(copy.c_str(), &st), 0);
  {
    std::ifstream from(kLibcrypto, std::ios::binary);
    std::ofstream to(copy, std::ios::binary | std::ios::trunc);  // the same inode, truncated
    to << from.rdbuf();
    ASSERT_TRUE(to.good());
  }
  struct stat after {};
  ASSERT_EQ(stat(copy.c_str(), &after), 0);
  ASSERT_EQ(after.st_ino, st.st_ino);
  EXPECT_EQ((*probes)->CheckFiles(), 1u);
  EXPECT_LT((*probes)->link_count(), attached);
  for (const AttachedFile& f : (*probes)->files()) {
    if (f.path == copy) {
      EXPECT_TRUE(f.functions.empty());
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tlsprof::usage
