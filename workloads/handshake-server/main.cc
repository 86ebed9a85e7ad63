// tlsprof-openssl-server and tlsprof-boringssl-server: one handshake-only TLS
// server, built twice: on Debian's OpenSSL 3 (stripped libssl.so.3) and on
// Debian's BoringSSL (android-libboringssl: stripped shared libssl.so.0 and
// libcrypto.so.0). The handshake-only mode of the Go study
// (workloads/go-tls, `server --handshake-only`): each connection is accepted,
// handshaken, one byte is read, then the server shuts the connection down
// and closes it. What the usage telemetry is checked against
// (tests/integration/test_usage_boringssl.py, bench/usage_handshake_cost.py).
//
//   tlsprof-{openssl,boringssl}-server --cert rsa|ecdsa --ready-file F [--port 0] [--tickets on|off]
//                                      [--duration S] [--stats-file F] [--groups LIST]
//   tlsprof-{openssl,boringssl}-server --connect HOST:PORT [--count N] [--groups LIST]
//
// --connect makes it the client of the same handshake-only exchange, N
// times in a row (a full handshake each, one byte sent, then the server's
// close), and prints the counts and the groups the handshakes negotiated:
// the client for a library's own groups that no other client offers
// (Android's BoringSSL 14: X25519Kyber, P256Kyber).
//
// The ground truth of a handshake's cost: the TLS library runs over memory
// BIOs, and the server moves the bytes between them and the socket itself,
// so a call of SSL_do_handshake() makes no system call, and its thread's CPU
// time (CLOCK_THREAD_CPUTIME_ID around each call) is what the library spent
// on the handshake, in user mode: what tlsprof's sampled TLS CPU of the
// handshake phase measures. --stats-file gets it as JSON at the stop:
// {"handshakes", "resumed", "failed_conns", "handshake_cpu_seconds": {"full",
// "resumed"}}.
//
// The key and a self-signed certificate (RSA-2048 or ECDSA P-256) are made at
// start. TLS 1.2 and 1.3, the library's default suites, groups X25519, P-256
// and P-384 (--groups: another list, in the library's names). One thread per connection (blocking I/O with 30 s
// timeouts): a client that holds its connection open costs a thread, nothing else waits. The ready file gets
// "127.0.0.1:PORT" once the socket listens. SIGTERM or SIGINT (or --duration) stops it: the listener closes, open
// connections are shut down, their threads joined, and one line of counts goes to stdout. Exit 0; 1 if set-up failed;
// CLI11's code for bad flags.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#ifdef OPENSSL_IS_BORINGSSL
#include "boringssl_util.h"
#else
#include "openssl_util.h"
#endif
#include "workload_util.h"

namespace {

#ifdef OPENSSL_IS_BORINGSSL
constexpr char kProgram[] = "tlsprof-boringssl-server";
constexpr char kLibrary[] = "Debian's BoringSSL";
using SslCtxPtr = bssl::UniquePtr<SSL_CTX>;
using SslPtr = bssl::UniquePtr<SSL>;
std::string TlsErrors() { return tlsprof::workload::BoringSslErrors(); }
bssl::UniquePtr<EVP_PKEY> MakeKey(const std::string& kind) { return tlsprof::workload::MakeBoringSslKey(kind); }
bssl::UniquePtr<X509> MakeCertificate(EVP_PKEY* key) {
  return tlsprof::workload::MakeBoringSslCertificate(key, kProgram);
}
#else
constexpr char kProgram[] = "tlsprof-openssl-server";
constexpr char kLibrary[] = "Debian's OpenSSL 3";
using SslCtxPtr = tlsprof::workload::SslCtx;
using SslPtr = tlsprof::workload::Ssl;
std::string TlsErrors() { return tlsprof::workload::OpenSslErrors(); }
tlsprof::workload::Pkey MakeKey(const std::string& kind) { return tlsprof::workload::MakeOpenSslKey(kind == "rsa"); }
tlsprof::workload::X509Ptr MakeCertificate(EVP_PKEY* key) {
  return tlsprof::workload::MakeOpenSslCertificate(key, kProgram);
}
#endif

constexpr int kIoTimeoutSeconds = 30;
constexpr size_t kReadChunk = 16 * 1024;

// Prints the library's error queue after `what`.
void PrintErrors(const std::string& what) {
  std::fprintf(stderr, "%s: %s failed:%s\n", kProgram, what.c_str(), TlsErrors().c_str());
}

SslCtxPtr MakeContext(const std::string& cert_kind, bool tickets, const std::string& groups) {
  auto pkey = MakeKey(cert_kind);
  if (!pkey) {
    PrintErrors(cert_kind + " key generation");
    return nullptr;
  }
  auto cert = MakeCertificate(pkey.get());
  if (!cert) {
    PrintErrors("the self-signed certificate");
    return nullptr;
  }
  SslCtxPtr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set1_curves_list(ctx.get(), groups.c_str()) != 1 || SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx.get(), pkey.get()) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
    PrintErrors("the SSL_CTX");
    return nullptr;
  }
  if (!tickets) {
    // Neither tickets (TLS 1.2 and 1.3) nor the session-ID cache: every
    // handshake is full.
    SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
    SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  }
  return ctx;
}

// What the server saw, for its exit line and --stats-file.
struct Stats {
  std::mutex mu;
  std::map<std::string, long> suites;  // "TLSv1.3/TLS_AES_128_GCM_SHA256" -> handshakes
  long handshakes = 0, resumed = 0, failures = 0;
  long long full_cpu_ns = 0, resumed_cpu_ns = 0;  // the library's handshake CPU (user mode), by kind
};

// Connections being served, so a stop can shut them down and wait for them.
struct Connections {
  std::mutex mu;
  std::condition_variable done;
  std::set<int> fds;
  bool stopping = false;

  // False when the server is stopping: the caller closes `fd` itself.
  bool Add(int fd) {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return false;
    fds.insert(fd);
    return true;
  }
  void Remove(int fd) {
    std::lock_guard<std::mutex> lock(mu);
    fds.erase(fd);
    close(fd);
    done.notify_all();
  }
  // Wakes every connection's blocking read or write, then waits (up to
  // `timeout`) for their threads to remove them.
  bool ShutdownAll(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    stopping = true;
    for (int fd : fds) shutdown(fd, SHUT_RDWR);
    return done.wait_for(lock, timeout, [&] { return fds.empty(); });
  }
};

// One connection's TLS over memory BIOs: the library never touches the
// socket, so what a call of it costs its thread is the library's alone.
class MemoryBioConnection {
 public:
  MemoryBioConnection(SSL_CTX* ctx, int fd) : fd_(fd), ssl_(SSL_new(ctx)) {
    if (!ssl_) return;
    BIO* rbio = BIO_new(BIO_s_mem());
    BIO* wbio = BIO_new(BIO_s_mem());
    if (rbio == nullptr || wbio == nullptr) {
      BIO_free(rbio);
      BIO_free(wbio);
      ssl_.reset();
      return;
    }
    // An empty read BIO is "try again" (the next bytes are still on the
    // socket), not the peer's EOF.
    BIO_set_mem_eof_return(rbio, -1);
    SSL_set_bio(ssl_.get(), rbio, wbio);  // the SSL owns both
    SSL_set_accept_state(ssl_.get());
    rbio_ = rbio;
    wbio_ = wbio;
  }
  bool ok() const { return ssl_ != nullptr; }
  SSL* ssl() const { return ssl_.get(); }

  // Runs `step` (an SSL call) until it succeeds, sending what it wrote and
  // feeding it what the socket brings; adds the thread CPU time of the calls
  // (and of nothing else) to `cpu_ns`. False on a TLS error or a closed or
  // silent socket.
  bool Drive(const std::function<int()>& step, long long& cpu_ns) {
    for (;;) {
      const long long t0 = tlsprof::workload::NowNanos(CLOCK_THREAD_CPUTIME_ID);
      const int r = step();
      cpu_ns += tlsprof::workload::NowNanos(CLOCK_THREAD_CPUTIME_ID) - t0;
      if (!Flush()) return false;
      if (r > 0) return true;
      if (SSL_get_error(ssl_.get(), r) != SSL_ERROR_WANT_READ || !Fill()) return false;
    }
  }
  // Sends whatever the library has written so far.
  bool Flush() {
    char buf[kReadChunk];
    for (;;) {
      const int n = BIO_read(wbio_, buf, sizeof buf);
      if (n <= 0) return true;
      for (int off = 0; off < n;) {
        const ssize_t w = send(fd_, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
        if (w <= 0) return false;
        off += static_cast<int>(w);
      }
    }
  }

 private:
  // One read from the socket into the library's read BIO.
  bool Fill() {
    char buf[kReadChunk];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    return n > 0 && BIO_write(rbio_, buf, static_cast<int>(n)) == n;
  }

  int fd_;
  SslPtr ssl_;
  BIO* rbio_ = nullptr;  // owned by ssl_
  BIO* wbio_ = nullptr;  // owned by ssl_
};

// One connection: handshake, read one byte, shut down, close.
void Serve(SSL_CTX* ctx, int fd, Stats& stats, Connections& conns) {
  const timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  {
    MemoryBioConnection conn(ctx, fd);
    long long handshake_ns = 0, ignored_ns = 0;
    if (conn.ok() && conn.Drive([&] { return SSL_do_handshake(conn.ssl()); }, handshake_ns)) {
      const bool resumed = SSL_session_reused(conn.ssl()) != 0;
      const std::string suite =
          std::string(SSL_get_version(conn.ssl())) + "/" + SSL_CIPHER_standard_name(SSL_get_current_cipher(conn.ssl()));
      {
        std::lock_guard<std::mutex> lock(stats.mu);
        ++stats.handshakes;
        if (resumed) ++stats.resumed;
        (resumed ? stats.resumed_cpu_ns : stats.full_cpu_ns) += handshake_ns;
        ++stats.suites[suite];
      }
      // The client's byte (or its close: either ends the connection).
      char byte = 0;
      conn.Drive([&] { return SSL_read(conn.ssl(), &byte, 1); }, ignored_ns);
      SSL_shutdown(conn.ssl());
      conn.Flush();
    } else {
      // Clients that go away mid-handshake (at a stop, too) end up here.
      ERR_clear_error();
      std::lock_guard<std::mutex> lock(stats.mu);
      ++stats.failures;
    }
  }
  conns.Remove(fd);
}

// A listening TCP socket on 127.0.0.1:port; -1 on failure (printed).
int Listen(int port, int& bound_port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::perror("socket");
    return -1;
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::fprintf(stderr, "%s: listening on 127.0.0.1:%d: %s\n", kProgram, port, std::strerror(errno));
    close(fd);
    return -1;
  }
  bound_port = ntohs(addr.sin_port);
  return fd;
}

// The negotiated group's IANA id (0 if none).
uint16_t NegotiatedGroup(const SSL* ssl) {
#ifdef OPENSSL_IS_BORINGSSL
  return SSL_get_curve_id(ssl);
#else
  return static_cast<uint16_t>(SSL_get_negotiated_group(const_cast<SSL*>(ssl)) & 0xffff);
#endif
}

// The client: `count` handshake-only connections to host:port, one after
// another; the counts by negotiated group go to stdout. 0 when all of them
// handshook.
int RunClient(const std::string& address, int count, const std::string& groups) {
  const auto colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "%s: --connect wants IPv4:PORT, not '%s'\n", kProgram, address.c_str());
    return 2;
  }
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  SslCtxPtr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set1_curves_list(ctx.get(), groups.c_str()) != 1) {
    PrintErrors("the client's SSL_CTX (--groups " + groups + ")");
    return 1;
  }
  std::map<uint16_t, int> by_group;
  int failures = 0;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const timeval timeout{kIoTimeoutSeconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    SslPtr ssl(fd >= 0 ? SSL_new(ctx.get()) : nullptr);
    char byte = 'x';
    if (ssl && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && SSL_set_fd(ssl.get(), fd) == 1 &&
        SSL_connect(ssl.get()) == 1 && SSL_write(ssl.get(), &byte, 1) == 1) {
      ++by_group[NegotiatedGroup(ssl.get())];
      while (SSL_read(ssl.get(), &byte, 1) > 0) {
      }
    } else {
      PrintErrors("handshake " + std::to_string(i));
      ++failures;
    }
    ssl.reset();
    if (fd >= 0) close(fd);
  }
  std::printf("%s: handshakes=%d failed=%d groups:", kProgram, count - failures, failures);
  for (const auto& [group, n] : by_group) std::printf(" 0x%04x=%d", group, n);
  std::printf("\n");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cert_kind, ready_file, tickets = "on", stats_file, groups = "X25519:P-256:P-384", connect;
  int port = 0, count = 1;
  double duration = 0;
  CLI::App app{std::string(kProgram) + ": a handshake-only TLS server on " + kLibrary};
  auto* connect_opt = app.add_option("--connect", connect, "Be the client: handshake with this IPv4:PORT");
  app.add_option("--count", count, "With --connect: handshakes, one after another")->check(CLI::PositiveNumber);
  app.add_option("--groups", groups, "Key exchange groups, in the library's names (default X25519:P-256:P-384)");
  app.add_option("--cert", cert_kind, "Certificate key: rsa (RSA-2048) or ecdsa (P-256)")
      ->excludes(connect_opt)
      ->check(CLI::IsMember({"rsa", "ecdsa"}));
  app.add_option("--port", port, "Listen port on 127.0.0.1 (0 = ephemeral)")->check(CLI::Range(0, 65535));
  app.add_option("--ready-file", ready_file, "Written (127.0.0.1:PORT) once listening")->excludes(connect_opt);
  app.add_option("--tickets", tickets, "Session resumption (tickets and the session cache): on or off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--duration", duration, "Seconds to run; 0 = until SIGTERM/SIGINT")->check(CLI::NonNegativeNumber);
  app.add_option("--stats-file", stats_file, "Written at the stop: counts and the library's handshake CPU (JSON)");
  CLI11_PARSE(app, argc, argv);
  // A close_notify to a peer that is gone (or to a connection a stop shut
  // down) fails with EPIPE instead of killing the program.
  signal(SIGPIPE, SIG_IGN);
  if (!connect.empty()) return RunClient(connect, count, groups);
  if (cert_kind.empty() || ready_file.empty()) {
    std::fprintf(stderr, "%s: --cert and --ready-file are required (or --connect, for the client)\n", kProgram);
    return 2;
  }

  // Before any thread starts: only the main thread's wait sees the signals.
  tlsprof::workload::BlockStopSignals();
  SslCtxPtr ctx = MakeContext(cert_kind, tickets == "on", groups);
  if (!ctx) return 1;
  int bound_port = 0;
  const int listen_fd = Listen(port, bound_port);
  if (listen_fd < 0) return 1;
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    return 1;
  }
  if (!tlsprof::workload::WriteFileAtomically(ready_file, "127.0.0.1:" + std::to_string(bound_port) + "\n")) return 1;

  Stats stats;
  Connections conns;
  const auto started = std::chrono::steady_clock::now();
  // The acceptor: one detached thread per connection (Connections tracks
  // and joins them by their fds).
  std::thread acceptor([&] {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    for (;;) {
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        std::perror("poll");
        return;
      }
      if (fds[1].revents) return;
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;  // the client went away first, or out of fds: try the next
      if (!conns.Add(fd)) {
        close(fd);
        return;
      }
      std::thread(Serve, ctx.get(), fd, std::ref(stats), std::ref(conns)).detach();
    }
  });

  tlsprof::workload::WaitForStopSignal(duration);
  if (write(wake[1], "x", 1) != 1) std::perror("write");
  acceptor.join();
  close(listen_fd);
  const bool drained = conns.ShutdownAll(std::chrono::seconds(10));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::lock_guard<std::mutex> lock(stats.mu);
  std::string suites;
  for (const auto& [name, n] : stats.suites) suites += " " + name + "=" + std::to_string(n);
  std::printf("%s: %.1fs handshakes=%ld resumed=%ld failed_conns=%ld suites:%s\n", kProgram, seconds, stats.handshakes,
              stats.resumed, stats.failures, suites.c_str());
  std::fflush(stdout);
  bool stats_written = true;
  if (!stats_file.empty()) {
    char json[512];
    std::snprintf(json, sizeof json,
                  "{\"handshakes\": %ld, \"resumed\": %ld, \"failed_conns\": %ld, "
                  "\"handshake_cpu_seconds\": {\"full\": %.9f, \"resumed\": %.9f}}\n",
                  stats.handshakes, stats.resumed, stats.failures, static_cast<double>(stats.full_cpu_ns) * 1e-9,
                  static_cast<double>(stats.resumed_cpu_ns) * 1e-9);
    stats_written = tlsprof::workload::WriteFileAtomically(stats_file, json);
  }
  if (!drained) {
    // A connection thread stuck past its shutdown: do not free the SSL_CTX
    // under it.
    std::fprintf(stderr, "%s: connections still open after 10 s\n", kProgram);
    _exit(stats_written ? 0 : 1);
  }
  return stats_written ? 0 : 1;
}
