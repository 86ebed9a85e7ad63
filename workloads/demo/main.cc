// tlsprof-demo: one process that runs real TLS over 127.0.0.1 with the
// system's shared OpenSSL, so every profiler bucket has something in it.
//
// Server threads accept on one ephemeral port; client threads open one
// connection at a time and pick the next scenario (full or resumed
// handshake, RSA-2048 or ECDSA-P256 certificate, TLS 1.3 AEAD or TLS 1.2
// CBC bulk) as the one furthest below its share of wall time. Keys and
// self-signed certificates are generated in memory at startup.
//
// Wire protocol inside TLS: the client sends an 8-byte big-endian length N,
// the server answers with N bytes; the client closes with close_notify.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "openssl_util.h"
#include "workload_util.h"

namespace {

using tlsprof::workload::MakeOpenSslCertificate;
using tlsprof::workload::MakeOpenSslKey;
using tlsprof::workload::NowNanos;
using tlsprof::workload::OpenSslErrors;
using tlsprof::workload::Pkey;
using tlsprof::workload::Session;
using tlsprof::workload::Ssl;
using tlsprof::workload::SslCtx;
using tlsprof::workload::X509Ptr;

// ---- error reporting -------------------------------------------------------

std::atomic<long> g_errors{0};
std::mutex g_log_mu;
constexpr long kMaxLoggedErrors = 20;

// Counts a per-connection error and logs the first few; a failed connection
// is never fatal.
void ConnError(const std::string& where, const std::string& what) {
  const long n = ++g_errors;
  const std::string detail = what + OpenSslErrors();
  if (n > kMaxLoggedErrors) return;
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::fprintf(stderr, "tlsprof-demo: %s: %s\n", where.c_str(), detail.c_str());
  if (n == kMaxLoggedErrors) std::fprintf(stderr, "tlsprof-demo: further errors are only counted\n");
}

bool SetupFail(const std::string& what) { return tlsprof::workload::ReportOpenSslFailure("tlsprof-demo", what); }

// ---- scenarios -------------------------------------------------------------

struct Scenario {
  const char* name;
  bool tls13;
  const char* suite;    // TLS 1.3 ciphersuite or TLS 1.2 cipher list
  const char* groups;   // key exchange group
  const char* sigalgs;  // selects the server certificate
  bool resume;          // reuse the last session of this scenario
  uint64_t bytes;       // server -> client application data
  double weight;
};

constexpr const char* kRsaSigalgs = "rsa_pss_rsae_sha256:rsa_pkcs1_sha256";
constexpr const char* kEcdsaSigalgs = "ecdsa_secp256r1_sha256";
constexpr uint64_t kSmall = 1024;
constexpr uint64_t kBulk = 4 << 20;

// Default mix: weights are shares of client wall time (which includes the
// server's share, since a client waits on its server).
std::vector<Scenario> DefaultScenarios() {
  return {
      {"full_rsa", true, "TLS_AES_128_GCM_SHA256", "X25519", kRsaSigalgs, false, kSmall, 3},
      {"full_ecdsa", true, "TLS_AES_256_GCM_SHA384", "P-256", kEcdsaSigalgs, false, kSmall, 2},
      {"resume_tls13", true, "TLS_AES_128_GCM_SHA256", "X25519", kRsaSigalgs, true, kSmall, 1},
      {"resume_tls12", false, "ECDHE-ECDSA-AES128-GCM-SHA256", "P-256", kEcdsaSigalgs, true, kSmall, 1},
      {"bulk_aes128gcm", true, "TLS_AES_128_GCM_SHA256", "X25519", kRsaSigalgs, true, kBulk, 1},
      {"bulk_aes256gcm", true, "TLS_AES_256_GCM_SHA384", "X25519", kEcdsaSigalgs, true, kBulk, 1},
      {"bulk_chacha20", true, "TLS_CHACHA20_POLY1305_SHA256", "X25519", kRsaSigalgs, true, kBulk, 1},
      // TLS 1.2 CBC: AES-128-CBC with HMAC-SHA1 (encrypt-then-MAC, so not
      // the stitched aesni_cbc_sha1 code).
      {"bulk_aes128cbc", false, "ECDHE-RSA-AES128-SHA", "X25519", kRsaSigalgs, true, kBulk, 1},
  };
}

struct ScenarioStats {
  std::atomic<long> connections{0}, full{0}, resumed{0}, bytes{0};
};

// ---- shared state ----------------------------------------------------------

std::atomic<bool> g_stop_clients{false};
std::atomic<bool> g_stop_servers{false};
bool g_verbose = false;

constexpr int kIoTimeoutSec = 10;
constexpr size_t kRecord = 16 * 1024;

void SetTimeouts(int fd) {
  timeval tv{kIoTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool ReadFull(SSL* ssl, unsigned char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    size_t r = 0;
    if (SSL_read_ex(ssl, buf + got, n - got, &r) != 1) return false;
    got += r;
  }
  return true;
}

// ---- server ----------------------------------------------------------------

void ServeConnection(SSL_CTX* ctx, int fd) {
  tlsprof::UniqueFd sock(fd);
  SetTimeouts(fd);
  Ssl ssl(SSL_new(ctx));
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) return ConnError("server", "SSL_new");
  if (SSL_accept(ssl.get()) != 1) return ConnError("server", "handshake failed");
  std::vector<unsigned char> data(kRecord, 0x5a);
  for (;;) {
    unsigned char req[8];
    size_t r = 0;
    if (SSL_read_ex(ssl.get(), req, sizeof req, &r) != 1) {
      const int err = SSL_get_error(ssl.get(), 0);
      if (err != SSL_ERROR_ZERO_RETURN) ConnError("server", "read failed");
      ERR_clear_error();
      break;
    }
    if (r != sizeof req && !ReadFull(ssl.get(), req + r, sizeof req - r)) return ConnError("server", "short request");
    uint64_t n = 0;
    for (unsigned char b : req) n = n << 8 | b;
    while (n > 0) {
      const size_t chunk = std::min<uint64_t>(n, kRecord);
      size_t w = 0;
      if (SSL_write_ex(ssl.get(), data.data(), chunk, &w) != 1) return ConnError("server", "write failed");
      n -= w;
    }
  }
  SSL_shutdown(ssl.get());
}

void ServerThread(SSL_CTX* ctx, int listen_fd) {
  pthread_setname_np(pthread_self(), "tlsprof-demo-sv");
  while (!g_stop_servers) {
    pollfd p{listen_fd, POLLIN, 0};
    const int pr = poll(&p, 1, 100);
    if (pr <= 0) continue;
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) continue;  // another server thread took it, or EINTR
    ServeConnection(ctx, fd);
  }
}

// ---- client ----------------------------------------------------------------

struct ClientShared {
  SSL_CTX* ctx;
  uint16_t port;
  std::vector<Scenario>* scenarios;
  std::vector<ScenarioStats>* stats;
};

// Runs one connection of `sc`. `session` is the last resumable session for
// this scenario in this thread; it is replaced by the new one.
bool RunConnection(const ClientShared& sh, const Scenario& sc, ScenarioStats& st, Session& session) {
  tlsprof::UniqueFd sock(socket(AF_INET, SOCK_STREAM, 0));
  if (sock.get() < 0) return ConnError("client", std::string("socket: ") + std::strerror(errno)), false;
  SetTimeouts(sock.get());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(sh.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return ConnError("client", std::string("connect: ") + std::strerror(errno)), false;

  Ssl ssl(SSL_new(sh.ctx));
  if (!ssl) return ConnError("client", "SSL_new"), false;
  const int ver = sc.tls13 ? TLS1_3_VERSION : TLS1_2_VERSION;
  bool ok = SSL_set_min_proto_version(ssl.get(), ver) == 1 && SSL_set_max_proto_version(ssl.get(), ver) == 1 &&
            (sc.tls13 ? SSL_set_ciphersuites(ssl.get(), sc.suite) : SSL_set_cipher_list(ssl.get(), sc.suite)) == 1 &&
            SSL_set1_groups_list(ssl.get(), sc.groups) == 1 && SSL_set1_sigalgs_list(ssl.get(), sc.sigalgs) == 1 &&
            SSL_set_fd(ssl.get(), sock.get()) == 1;
  if (!ok) return ConnError(sc.name, "configuring client SSL"), false;
  if (sc.resume && session) SSL_set_session(ssl.get(), session.get());

  if (SSL_connect(ssl.get()) != 1) return ConnError(sc.name, "client handshake failed"), false;
  const bool reused = SSL_session_reused(ssl.get()) == 1;
  if (reused)
    ++st.resumed;
  else
    ++st.full;
  if (g_verbose && st.connections < 2) {
    // What was really negotiated, so a reader can check each scenario.
    X509* peer = SSL_get0_peer_certificate(ssl.get());
    EVP_PKEY* pk = peer != nullptr ? X509_get0_pubkey(peer) : nullptr;
    const int group = SSL_get_negotiated_group(ssl.get());
    std::lock_guard<std::mutex> lock(g_log_mu);
    std::fprintf(stderr, "tlsprof-demo: %s: %s %s %s cert=%s group=%s\n", sc.name, SSL_get_version(ssl.get()),
                 SSL_get_cipher_name(ssl.get()), reused ? "resumed" : "full",
                 pk != nullptr ? EVP_PKEY_get0_type_name(pk) : "-",
                 group != 0 ? SSL_group_to_name(ssl.get(), group) : "-");
  }

  unsigned char req[8];
  for (int i = 0; i < 8; ++i) req[i] = static_cast<unsigned char>(sc.bytes >> (56 - 8 * i));
  size_t w = 0;
  if (SSL_write_ex(ssl.get(), req, sizeof req, &w) != 1) return ConnError(sc.name, "write failed"), false;
  std::vector<unsigned char> buf(kRecord);
  uint64_t left = sc.bytes;
  while (left > 0) {
    size_t r = 0;
    if (SSL_read_ex(ssl.get(), buf.data(), std::min<uint64_t>(left, buf.size()), &r) != 1)
      return ConnError(sc.name, "read failed"), false;
    left -= r;
    st.bytes += static_cast<long>(r);
  }
  // TLS 1.3 tickets arrive after the handshake; they have been read by now.
  if (sc.resume) {
    Session s(SSL_get1_session(ssl.get()));
    if (s && SSL_SESSION_is_resumable(s.get())) session = std::move(s);
  }
  SSL_shutdown(ssl.get());
  ++st.connections;
  return true;
}

void ClientThread(ClientShared sh) {
  pthread_setname_np(pthread_self(), "tlsprof-demo-cl");
  const size_t n = sh.scenarios->size();
  std::vector<long long> spent_ns(n, 0);
  std::vector<Session> sessions(n);
  while (!g_stop_clients) {
    // Deficit scheduling on wall time: run the scenario furthest below its
    // weight so the mix holds over any window of a second or so.
    size_t best = n;
    double best_v = 0;
    for (size_t i = 0; i < n; ++i) {
      const double w = (*sh.scenarios)[i].weight;
      if (w <= 0) continue;
      const double v = static_cast<double>(spent_ns[i]) / w;
      if (best == n || v < best_v) best = i, best_v = v;
    }
    const long long t0 = NowNanos(CLOCK_MONOTONIC);
    if (!RunConnection(sh, (*sh.scenarios)[best], (*sh.stats)[best], sessions[best])) {
      sessions[best].reset();
      ERR_clear_error();
      // Back off a little so a persistent failure does not spin.
      usleep(10000);
    }
    spent_ns[best] += NowNanos(CLOCK_MONOTONIC) - t0;
  }
}

// ---- setup -----------------------------------------------------------------

struct Options {
  double duration = 15;
  int threads = 1;
  std::string ready_file;
  std::string mix;
  int port = 0;
};

bool ApplyMix(const std::string& mix, std::vector<Scenario>& scs) {
  for (auto& s : scs) s.weight = 0;
  for (const auto& e : tlsprof::workload::ParseMix(mix)) {
    auto it = std::find_if(scs.begin(), scs.end(), [&](auto& s) { return e.name == s.name; });
    if (it == scs.end() || !(e.weight >= 0)) {
      std::string known;
      for (auto& s : scs) known += std::string(" ") + s.name;
      std::fprintf(stderr, "--mix: bad entry '%s' (want name=weight, weight >= 0); names:%s\n", e.item.c_str(),
                   known.c_str());
      return false;
    }
    it->weight = e.weight;
  }
  for (auto& s : scs)
    if (s.weight > 0) return true;
  std::fprintf(stderr, "--mix: at least one scenario needs a weight > 0\n");
  return false;
}

SslCtx MakeServerCtx(EVP_PKEY* rsa_key, X509* rsa_cert, EVP_PKEY* ec_key, X509* ec_cert) {
  SslCtx ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return SetupFail("SSL_CTX_new (server)"), nullptr;
  static const unsigned char kSidCtx[] = "tlsprof-demo";
  const bool ok = SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) == 1 &&
                  SSL_CTX_use_certificate(ctx.get(), rsa_cert) == 1 &&
                  SSL_CTX_use_PrivateKey(ctx.get(), rsa_key) == 1 && SSL_CTX_use_certificate(ctx.get(), ec_cert) == 1 &&
                  SSL_CTX_use_PrivateKey(ctx.get(), ec_key) == 1 && SSL_CTX_check_private_key(ctx.get()) == 1 &&
                  SSL_CTX_set_ciphersuites(
                      ctx.get(), "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256") == 1 &&
                  SSL_CTX_set_cipher_list(
                      ctx.get(), "ECDHE+AESGCM:ECDHE+CHACHA20:ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA") == 1 &&
                  SSL_CTX_set1_groups_list(ctx.get(), "X25519:P-256") == 1 &&
                  SSL_CTX_set_session_id_context(ctx.get(), kSidCtx, sizeof kSidCtx - 1) == 1;
  if (!ok) return SetupFail("configuring server SSL_CTX"), nullptr;
  // Let the client's list decide the suite, so each scenario gets its own.
  SSL_CTX_clear_options(ctx.get(), SSL_OP_CIPHER_SERVER_PREFERENCE);
  return ctx;
}

SslCtx MakeClientCtx(X509* rsa_cert, X509* ec_cert) {
  SslCtx ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return SetupFail("SSL_CTX_new (client)"), nullptr;
  // Verify the server against our own certs: real clients verify, and it
  // adds the signature-verify work a profile of a real client would show.
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  if (X509_STORE_add_cert(store, rsa_cert) != 1 || X509_STORE_add_cert(store, ec_cert) != 1)
    return SetupFail("adding trust anchors"), nullptr;
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // Sessions are kept per scenario by hand; the internal cache would mix them.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::vector<Scenario> scenarios = DefaultScenarios();
  std::string names;
  for (auto& s : scenarios) names += std::string(" ") + s.name;
  CLI::App app{"tlsprof-demo: TLS client and server over loopback on the system OpenSSL"};
  app.add_option("--duration", opt.duration, "Seconds to run; 0 = until SIGTERM/SIGINT")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", opt.threads, "Client/server thread pairs")->check(CLI::Range(1, 64));
  app.add_option("--ready-file", opt.ready_file, "Written (content: port) once the listener is up");
  app.add_option("--port", opt.port, "Listen port on 127.0.0.1 (0 = ephemeral)")->check(CLI::Range(0, 65535));
  app.add_option("--mix", opt.mix, "Scenario weights, name=weight,... (unlisted = off). Names:" + names);
  app.add_flag("--verbose", g_verbose, "Log what the first connections of each scenario negotiated");
  CLI11_PARSE(app, argc, argv);
  if (!opt.mix.empty() && !ApplyMix(opt.mix, scenarios)) return 2;

  tlsprof::workload::BlockStopSignals();
  signal(SIGPIPE, SIG_IGN);

  Pkey rsa_key = MakeOpenSslKey(true), ec_key = MakeOpenSslKey(false);
  if (!rsa_key || !ec_key) return SetupFail("key generation"), 1;
  X509Ptr rsa_cert = MakeOpenSslCertificate(rsa_key.get(), "tlsprof-demo-rsa");
  X509Ptr ec_cert = MakeOpenSslCertificate(ec_key.get(), "tlsprof-demo-ecdsa");
  if (!rsa_cert || !ec_cert) return SetupFail("self-signed certificate"), 1;
  SslCtx server_ctx = MakeServerCtx(rsa_key.get(), rsa_cert.get(), ec_key.get(), ec_cert.get());
  SslCtx client_ctx = MakeClientCtx(rsa_cert.get(), ec_cert.get());
  if (!server_ctx || !client_ctx) return 1;

  tlsprof::UniqueFd listener(socket(AF_INET, SOCK_STREAM, 0));
  int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(opt.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (listener.get() < 0 || bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener.get(), 128) != 0 || getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    std::fprintf(stderr, "tlsprof-demo: cannot listen on 127.0.0.1:%d: %s\n", opt.port, std::strerror(errno));
    return 1;
  }
  const uint16_t port = ntohs(addr.sin_port);

  std::vector<ScenarioStats> stats(scenarios.size());
  std::vector<std::thread> servers, clients;
  for (int i = 0; i < opt.threads; ++i) servers.emplace_back(ServerThread, server_ctx.get(), listener.get());
  // The listener is up (connections queue in the backlog), so announce it.
  bool failed = false;
  if (!opt.ready_file.empty() && !tlsprof::workload::WriteFileAtomically(opt.ready_file, std::to_string(port) + "\n"))
    failed = true;

  const long long t0 = NowNanos(CLOCK_MONOTONIC);
  if (!failed) {
    ClientShared sh{client_ctx.get(), port, &scenarios, &stats};
    for (int i = 0; i < opt.threads; ++i) clients.emplace_back(ClientThread, sh);
    tlsprof::workload::WaitForStopSignal(opt.duration);
  }
  // Clients finish their current connection; then the servers go.
  g_stop_clients = true;
  for (auto& t : clients) t.join();
  g_stop_servers = true;
  for (auto& t : servers) t.join();
  const double secs = (NowNanos(CLOCK_MONOTONIC) - t0) * 1e-9;

  long full = 0, resumed = 0, bytes = 0;
  std::string per;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    full += stats[i].full;
    resumed += stats[i].resumed;
    bytes += stats[i].bytes;
    if (scenarios[i].weight > 0)
      per += " " + std::string(scenarios[i].name) + "=" + std::to_string(stats[i].connections);
  }
  std::printf("tlsprof-demo: %.1fs port=%u handshakes=%ld full=%ld resumed=%ld bytes=%ld errors=%ld conns:%s\n", secs,
              port, full + resumed, full, resumed, bytes, g_errors.load(), per.c_str());
  std::fflush(stdout);
  if (failed || full + resumed == 0 || g_errors > 0) return 1;
  return 0;
}
