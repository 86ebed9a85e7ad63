// tlsprof-groundtruth: a process whose crypto CPU split is known.
//
// One worker thread runs short slices (default 20 ms of thread CPU) of one
// primitive at a time, picking next the category furthest below its target
// share, and measures each slice with CLOCK_THREAD_CPUTIME_ID. Keys, peers
// and buffers are made before the measured window; a warm-up runs the same
// mix unmeasured. At exit (duration or SIGTERM) it writes JSON with the CPU
// it measured per category, so a profile of the same window can be compared
// share by share.

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "openssl_util.h"
#include "workload_util.h"

namespace {

using tlsprof::workload::NowNanos;

constexpr size_t kBufferBytes = 16 * 1024;
constexpr int kPeerKeys = 64;

using tlsprof::workload::Cipher;
using tlsprof::workload::CipherCtx;
using tlsprof::workload::Md;
using tlsprof::workload::MdCtx;
using tlsprof::workload::Pkey;
using tlsprof::workload::PkeyCtx;

// Prints OpenSSL's error queue after `what` and returns false, so setup code
// can write `if (!x) return Fail("...")`.
bool Fail(const std::string& what) { return tlsprof::workload::ReportOpenSslFailure("tlsprof-groundtruth", what); }

// One measured category. `op` runs one operation and returns false on error.
struct Category {
  std::string name;
  std::string bucket;
  std::string algorithm;
  double weight = 0;
  size_t bytes_per_op = 0;  // 0 for public-key operations
  std::function<bool()> op;
  int batch = 1;  // ops between clock reads, sized in Calibrate()
  // Measured window only.
  long long cpu_ns = 0;
  long long ops = 0;
  // Warm-up (kept apart so warm-up scheduling does not skew the window).
  long long warm_cpu_ns = 0;
};

Pkey Keygen(const char* type, const char* group = nullptr, unsigned rsa_bits = 0) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0) return nullptr;
  if (group != nullptr && EVP_PKEY_CTX_set_group_name(ctx.get(), group) <= 0) return nullptr;
  if (rsa_bits != 0 && EVP_PKEY_CTX_set_rsa_keygen_bits(ctx.get(), static_cast<int>(rsa_bits)) <= 0) return nullptr;
  EVP_PKEY* key = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &key) <= 0) return nullptr;
  return Pkey(key);
}

// State behind the category closures; everything is allocated in Setup().
struct Primitives {
  std::vector<unsigned char> in = std::vector<unsigned char>(kBufferBytes);
  std::vector<unsigned char> out = std::vector<unsigned char>(kBufferBytes + 64);
  unsigned char key[32] = {};
  unsigned char iv[16] = {};
  unsigned long long counter = 0;
  Cipher aes_gcm, chacha, aes_cbc;
  CipherCtx gcm_ctx, chacha_ctx, cbc_ctx;
  Md sha256, sha1;
  MdCtx md_ctx;
  Pkey rsa_key, ecdsa_key;
  PkeyCtx rsa_sign_ctx, ecdsa_sign_ctx;
  unsigned char digest[32] = {};
  unsigned char sig[512] = {};
  Pkey x25519_key, p256_key;
  PkeyCtx x25519_ctx, p256_ctx;
  std::vector<Pkey> x25519_peers, p256_peers;
  unsigned char secret[64] = {};
  size_t peer_index = 0;

  // AEAD seal of one 16 KiB record with a fresh nonce, as a TLS record does.
  bool Seal(EVP_CIPHER_CTX* ctx) {
    ++counter;
    std::memcpy(iv + 4, &counter, sizeof counter);
    int len = 0;
    if (EVP_EncryptInit_ex2(ctx, nullptr, nullptr, iv, nullptr) <= 0) return false;
    if (EVP_EncryptUpdate(ctx, nullptr, &len, iv, 13) <= 0) return false;  // AAD
    if (EVP_EncryptUpdate(ctx, out.data(), &len, in.data(), static_cast<int>(in.size())) <= 0) return false;
    if (EVP_EncryptFinal_ex(ctx, out.data() + len, &len) <= 0) return false;
    unsigned char tag[16];
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) > 0;
  }

  bool CbcEncrypt() {
    // The context keeps chaining across calls, like a CBC record stream.
    int len = 0;
    return EVP_EncryptUpdate(cbc_ctx.get(), out.data(), &len, in.data(), static_cast<int>(in.size())) > 0;
  }

  bool Digest(const EVP_MD* md) {
    unsigned int len = 0;
    return EVP_DigestInit_ex2(md_ctx.get(), md, nullptr) > 0 &&
           EVP_DigestUpdate(md_ctx.get(), in.data(), in.size()) > 0 &&
           EVP_DigestFinal_ex(md_ctx.get(), out.data(), &len) > 0;
  }

  bool Sign(EVP_PKEY_CTX* ctx) {
    size_t siglen = sizeof sig;
    digest[0]++;
    return EVP_PKEY_sign(ctx, sig, &siglen, digest, sizeof digest) > 0;
  }

  bool Derive(EVP_PKEY_CTX* ctx, const std::vector<Pkey>& peers) {
    peer_index = (peer_index + 1) % peers.size();
    size_t len = sizeof secret;
    return EVP_PKEY_derive_set_peer(ctx, peers[peer_index].get()) > 0 && EVP_PKEY_derive(ctx, secret, &len) > 0;
  }
};

bool SetupCipher(Cipher& cipher, CipherCtx& ctx, const char* name, const unsigned char* key, const unsigned char* iv) {
  cipher.reset(EVP_CIPHER_fetch(nullptr, name, nullptr));
  ctx.reset(EVP_CIPHER_CTX_new());
  if (!cipher || !ctx) return Fail(std::string("fetching ") + name);
  if (EVP_EncryptInit_ex2(ctx.get(), cipher.get(), key, iv, nullptr) <= 0)
    return Fail(std::string("initialising ") + name);
  return true;
}

bool SetupSign(Pkey& key, PkeyCtx& ctx, bool rsa) {
  key = rsa ? Keygen("RSA", nullptr, 2048) : Keygen("EC", "P-256");
  if (!key) return Fail(rsa ? "RSA-2048 keygen" : "P-256 keygen");
  ctx.reset(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!ctx || EVP_PKEY_sign_init(ctx.get()) <= 0) return Fail("sign init");
  if (rsa && EVP_PKEY_CTX_set_rsa_padding(ctx.get(), RSA_PKCS1_PSS_PADDING) <= 0)
    return Fail("RSA PSS padding");  // TLS 1.3 signs with rsa_pss_rsae_*
  if (EVP_PKEY_CTX_set_signature_md(ctx.get(), EVP_sha256()) <= 0) return Fail("signature md");
  return true;
}

bool SetupDerive(Pkey& key, PkeyCtx& ctx, std::vector<Pkey>& peers, bool x25519) {
  auto gen = [&] { return x25519 ? Keygen("X25519") : Keygen("EC", "P-256"); };
  key = gen();
  if (!key) return Fail("key-exchange keygen");
  for (int i = 0; i < kPeerKeys; ++i) {
    // Only the public half is needed by the deriving side.
    Pkey peer = gen();
    if (!peer) return Fail("peer keygen");
    peers.push_back(std::move(peer));
  }
  ctx.reset(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0) return Fail("derive init");
  return true;
}

struct Options {
  double duration = 20;
  double warmup = 1;
  double slice_ms = 20;
  std::string mix;
  bool with_p256 = false;
  std::string output;
  std::string ready_file;
};

// Parses "name=weight,..." into the categories' weights; names not listed
// get weight 0 (disabled).
bool ApplyMix(const std::string& mix, std::vector<Category>& cats) {
  for (auto& c : cats) c.weight = 0;
  for (const auto& e : tlsprof::workload::ParseMix(mix)) {
    auto it = std::find_if(cats.begin(), cats.end(), [&](auto& c) { return c.name == e.name; });
    if (it == cats.end()) {
      std::string known;
      for (auto& c : cats) known += " " + c.name;
      std::fprintf(stderr, "--mix: unknown category '%s'; known:%s\n", e.name.c_str(), known.c_str());
      return false;
    }
    if (!(e.weight >= 0)) {
      std::fprintf(stderr, "--mix: weight for '%s' must be a number >= 0\n", e.name.c_str());
      return false;
    }
    it->weight = e.weight;
  }
  return true;
}

// Sizes each category's batch so that one batch takes about 200 us: short
// enough that a slice ends close to slice_ms, long enough that the clock
// reads between batches stay far below 1% of the measured time.
bool Calibrate(std::vector<Category>& cats) {
  for (auto& c : cats) {
    if (c.weight <= 0) continue;
    for (int i = 0; i < 3; ++i)
      if (!c.op()) return Fail("warm-up of " + c.name);
    const long long t0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
    int n = 0;
    while (NowNanos(CLOCK_THREAD_CPUTIME_ID) - t0 < 5'000'000) {
      if (!c.op()) return Fail(c.name);
      ++n;
    }
    const double per_op = 5e6 / n;
    c.batch = std::max(1, static_cast<int>(200'000 / per_op));
  }
  return true;
}

struct Window {
  long long start_realtime_ns = 0, end_realtime_ns = 0;
  long long start_mono_ns = 0, end_mono_ns = 0;
  long long thread_cpu_ns = 0;
  long long process_cpu_ns = 0;
};

std::atomic<bool> g_stop{false};
std::atomic<bool> g_measuring{false};
std::atomic<bool> g_failed{false};

// The worker: warm-up, then the measured window until g_stop.
void Worker(std::vector<Category>& cats, const Options& opt, Window& win, std::atomic<int>& tid_out,
            std::atomic<bool>& warm_done) {
  pthread_setname_np(pthread_self(), "tlsprof-gt-wrk");
  tid_out = static_cast<int>(syscall(SYS_gettid));
  const long long slice_ns = static_cast<long long>(opt.slice_ms * 1e6);

  auto run_slice = [&](Category& c) -> long long {
    const long long t0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
    long long t1 = t0;
    long long ops = 0;
    while (t1 - t0 < slice_ns) {
      for (int i = 0; i < c.batch; ++i) {
        if (!c.op()) {
          Fail(c.name);
          g_failed = true;
          g_stop = true;
          break;
        }
      }
      ops += c.batch;
      t1 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
      if (g_stop) break;
    }
    if (g_measuring) c.ops += ops;
    return t1 - t0;
  };
  // Deficit scheduling: run next the category with the least CPU per unit
  // of weight, so shares converge on the weights whatever an op costs.
  auto pick = [&](bool measuring) -> Category& {
    Category* best = nullptr;
    double best_v = 0;
    for (auto& c : cats) {
      if (c.weight <= 0) continue;
      const double v = static_cast<double>(measuring ? c.cpu_ns : c.warm_cpu_ns) / c.weight;
      if (best == nullptr || v < best_v) best = &c, best_v = v;
    }
    return *best;
  };

  const long long warm_end = NowNanos(CLOCK_MONOTONIC) + static_cast<long long>(opt.warmup * 1e9);
  while (!g_stop && NowNanos(CLOCK_MONOTONIC) < warm_end) {
    Category& c = pick(false);
    c.warm_cpu_ns += run_slice(c);
  }

  win.start_mono_ns = NowNanos(CLOCK_MONOTONIC);
  win.start_realtime_ns = NowNanos(CLOCK_REALTIME);
  const long long cpu0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
  const long long pcpu0 = NowNanos(CLOCK_PROCESS_CPUTIME_ID);
  g_measuring = true;
  warm_done = true;
  while (!g_stop) {
    Category& c = pick(true);
    c.cpu_ns += run_slice(c);
  }
  win.thread_cpu_ns = NowNanos(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  win.process_cpu_ns = NowNanos(CLOCK_PROCESS_CPUTIME_ID) - pcpu0;
  win.end_mono_ns = NowNanos(CLOCK_MONOTONIC);
  win.end_realtime_ns = NowNanos(CLOCK_REALTIME);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"tlsprof-groundtruth: known mix of libcrypto primitives for accuracy tests"};
  app.add_option("--duration", opt.duration, "Measured window in seconds (after warm-up); 0 = until SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", opt.warmup, "Seconds of unmeasured mix before the window")->check(CLI::NonNegativeNumber);
  app.add_option("--slice-ms", opt.slice_ms, "Thread CPU per slice of one category")->check(CLI::PositiveNumber);
  app.add_option("--mix", opt.mix,
                 "Target CPU shares, name=weight,... (unlisted = off). Names: aes_gcm, "
                 "chacha20_poly1305, aes_cbc, sha256, sha1, rsa, x25519, ecdsa_p256, ecdhe_p256");
  app.add_flag("--with-p256", opt.with_p256, "Add ecdsa_p256 and ecdhe_p256 to the default mix");
  app.add_option("--output", opt.output, "JSON written at exit");
  app.add_option("--ready-file", opt.ready_file, "Written (content: pid) when the measured window starts");
  CLI11_PARSE(app, argc, argv);

  tlsprof::workload::BlockStopSignals();

  Primitives p;
  std::vector<Category> cats = {
      {"aes_gcm", "cipher", "AES-GCM", 1, kBufferBytes, [&] { return p.Seal(p.gcm_ctx.get()); }},
      {"chacha20_poly1305", "cipher", "ChaCha20-Poly1305", 1, kBufferBytes, [&] { return p.Seal(p.chacha_ctx.get()); }},
      {"aes_cbc", "cipher", "AES-CBC", 1, kBufferBytes, [&] { return p.CbcEncrypt(); }},
      {"sha256", "hash", "SHA-256", 1, kBufferBytes, [&] { return p.Digest(p.sha256.get()); }},
      {"sha1", "hash", "SHA-1", 1, kBufferBytes, [&] { return p.Digest(p.sha1.get()); }},
      {"rsa", "signature", "RSA", 1, 0, [&] { return p.Sign(p.rsa_sign_ctx.get()); }},
      {"x25519", "key_exchange", "X25519", 1, 0, [&] { return p.Derive(p.x25519_ctx.get(), p.x25519_peers); }},
      {"ecdsa_p256", "signature", "ECDSA-P256", opt.with_p256 ? 1.0 : 0.0, 0,
       [&] { return p.Sign(p.ecdsa_sign_ctx.get()); }},
      {"ecdhe_p256", "key_exchange", "ECDHE-P256", opt.with_p256 ? 1.0 : 0.0, 0,
       [&] { return p.Derive(p.p256_ctx.get(), p.p256_peers); }},
  };
  if (!opt.mix.empty() && !ApplyMix(opt.mix, cats)) return 2;
  double total_w = 0;
  for (auto& c : cats) total_w += c.weight;
  if (total_w <= 0) {
    std::fprintf(stderr, "--mix: at least one category needs a weight > 0\n");
    return 2;
  }

  // Setup outside any window: keys, peers, contexts, buffers.
  if (RAND_bytes(p.in.data(), static_cast<int>(p.in.size())) <= 0 || RAND_bytes(p.key, 32) <= 0)
    return Fail("RAND_bytes"), 1;
  auto enabled = [&](const char* n) {
    return std::any_of(cats.begin(), cats.end(), [&](auto& c) { return c.name == n && c.weight > 0; });
  };
  bool ok = SetupCipher(p.aes_gcm, p.gcm_ctx, "AES-128-GCM", p.key, p.iv) &&
            SetupCipher(p.chacha, p.chacha_ctx, "ChaCha20-Poly1305", p.key, p.iv) &&
            SetupCipher(p.aes_cbc, p.cbc_ctx, "AES-128-CBC", p.key, p.iv);
  if (ok) {
    EVP_CIPHER_CTX_set_padding(p.cbc_ctx.get(), 0);
    p.sha256.reset(EVP_MD_fetch(nullptr, "SHA2-256", nullptr));
    p.sha1.reset(EVP_MD_fetch(nullptr, "SHA1", nullptr));
    p.md_ctx.reset(EVP_MD_CTX_new());
    ok = (p.sha256 && p.sha1 && p.md_ctx) || Fail("fetching digests");
  }
  if (ok && enabled("rsa")) ok = SetupSign(p.rsa_key, p.rsa_sign_ctx, true);
  if (ok && enabled("ecdsa_p256")) ok = SetupSign(p.ecdsa_key, p.ecdsa_sign_ctx, false);
  if (ok && enabled("x25519")) ok = SetupDerive(p.x25519_key, p.x25519_ctx, p.x25519_peers, true);
  if (ok && enabled("ecdhe_p256")) ok = SetupDerive(p.p256_key, p.p256_ctx, p.p256_peers, false);
  if (ok) ok = Calibrate(cats);
  if (!ok) return 1;

  Window win;
  std::atomic<int> tid{0};
  std::atomic<bool> warm_done{false};
  std::thread worker(Worker, std::ref(cats), std::cref(opt), std::ref(win), std::ref(tid), std::ref(warm_done));

  // Wait out the warm-up (or a stop signal), then announce the window.
  int sig = 0;
  while (!warm_done && !g_stop) {
    sig = tlsprof::workload::WaitForStopSignal(0.01);
    if (sig != 0) g_stop = true;
  }
  if (!g_stop && !opt.ready_file.empty() &&
      !tlsprof::workload::WriteFileAtomically(opt.ready_file, std::to_string(getpid()) + "\n")) {
    g_stop = true;
    g_failed = true;
  }
  if (!g_stop) {
    if (opt.duration > 0) {
      const double left = opt.duration - (NowNanos(CLOCK_MONOTONIC) - win.start_mono_ns) * 1e-9;
      if (left > 0) tlsprof::workload::WaitForStopSignal(left);
    } else {
      tlsprof::workload::WaitForStopSignal(0);
    }
  }
  g_stop = true;
  worker.join();

  long long sum_ns = 0;
  nlohmann::json out;
  out["pid"] = getpid();
  out["tid"] = tid.load();
  out["wall_seconds"] = (win.end_mono_ns - win.start_mono_ns) * 1e-9;
  out["thread_cpu_seconds"] = win.thread_cpu_ns * 1e-9;
  out["process_cpu_seconds"] = win.process_cpu_ns * 1e-9;
  out["window"] = {{"start_unix_ns", win.start_realtime_ns},
                   {"end_unix_ns", win.end_realtime_ns},
                   {"start_monotonic_ns", win.start_mono_ns},
                   {"end_monotonic_ns", win.end_mono_ns}};
  out["slice_ms"] = opt.slice_ms;
  out["buffer_bytes"] = kBufferBytes;
  out["categories"] = nlohmann::json::array();
  for (auto& c : cats) {
    if (c.weight <= 0) continue;
    sum_ns += c.cpu_ns;
    out["categories"].push_back({{"name", c.name},
                                 {"bucket", c.bucket},
                                 {"algorithm", c.algorithm},
                                 {"target_share", c.weight / total_w},
                                 {"cpu_seconds", c.cpu_ns * 1e-9},
                                 {"ops", c.ops},
                                 {"bytes", c.ops * static_cast<long long>(c.bytes_per_op)}});
  }
  out["measured_cpu_seconds"] = sum_ns * 1e-9;
  // Thread CPU the slices did not cover: scheduling, clock reads, JSON.
  out["unmeasured_cpu_seconds"] = (win.thread_cpu_ns - sum_ns) * 1e-9;
  out["ok"] = !g_failed.load();

  const std::string text = out.dump(2) + "\n";
  if (!opt.output.empty()) {
    if (!tlsprof::workload::WriteFileAtomically(opt.output, text)) return 1;
  } else {
    std::fputs(text.c_str(), stdout);
  }
  std::fprintf(stderr, "tlsprof-groundtruth: window %.2fs, thread cpu %.3fs, measured %.3fs%s\n",
               (win.end_mono_ns - win.start_mono_ns) * 1e-9, win.thread_cpu_ns * 1e-9, sum_ns * 1e-9,
               g_failed ? " (FAILED, see above)" : "");
  return g_failed ? 1 : 0;
}
