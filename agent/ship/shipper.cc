#include "agent/ship/shipper.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/random.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>

#include "agent/ship/spool.h"
#include "tlsprof/v1/report.grpc.pb.h"

namespace tlsprof::ship {
namespace {

using Clock = std::chrono::steady_clock;
// A collector that keeps failing is logged at most this often.
constexpr auto kErrorLogInterval = std::chrono::seconds(30);

double UnixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------------- TLS files

using BioPtr = std::unique_ptr<BIO, decltype([](BIO* b) { BIO_free(b); })>;
using X509Ptr = std::unique_ptr<X509, decltype([](X509* x) { X509_free(x); })>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, decltype([](EVP_PKEY* k) { EVP_PKEY_free(k); })>;

Result<std::string> ReadPemFile(const std::string& path, std::string_view what) {
  if (path.empty()) return MakeError("no TLS {} file given (or ship with --insecure)", what);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return MakeError("cannot read the TLS {} file {}: {}", what, path, std::strerror(errno));
  std::string data;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return MakeError("cannot read the TLS {} file {}", what, path);
  if (data.find("-----BEGIN ") == std::string::npos) {
    return MakeError("the TLS {} file {} is not PEM (no -----BEGIN line)", what, path);
  }
  return data;
}

X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return nullptr;
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// Parses the three files with OpenSSL so that a wrong file is named at start,
// rather than surfacing as a handshake failure on every attempt.
Result<grpc::SslCredentialsOptions> LoadTls(const TlsFiles& files) {
  auto ca = ReadPemFile(files.ca, "CA");
  if (!ca) return ca.error();
  auto cert = ReadPemFile(files.cert, "certificate");
  if (!cert) return cert.error();
  auto key = ReadPemFile(files.key, "key");
  if (!key) return key.error();

  if (!FirstCertificate(*ca)) return MakeError("the TLS CA file {} holds no PEM certificate", files.ca);
  X509Ptr leaf = FirstCertificate(*cert);
  if (!leaf) return MakeError("the TLS certificate file {} holds no PEM certificate", files.cert);
  BioPtr key_bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
  PkeyPtr pkey(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!pkey) return MakeError("the TLS key file {} holds no unencrypted PEM private key", files.key);
  if (X509_check_private_key(leaf.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return MakeError("the TLS key file {} does not belong to the certificate in {}", files.key, files.cert);
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf.get())) < 0) {
    spdlog::warn("ship: the TLS certificate {} has expired: the collector will refuse it", files.cert);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(*ca);
  options.pem_cert_chain = std::move(*cert);
  options.pem_private_key = std::move(*key);
  return options;
}

std::string_view CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN_CODE";
  }
}

// INVALID_ARGUMENT, and RESOURCE_EXHAUSTED for a message over a size limit:
// gRPC's own ("Received/Sent message larger than max (N vs. M)", its message
// size filter) or tlsprof-collector's ("... exceeds --max-message-bytes N",
// collector/server/service.cc). RESOURCE_EXHAUSTED otherwise is the rate
// limit: retried.
bool IsPermanent(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) return true;
  const std::string& message = status.error_message();
  return status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
         (message.find("larger than max") != std::string::npos ||
          message.find("exceeds --max-message-bytes") != std::string::npos);
}

uint64_t TlsSamples(const v1::AgentReport& report) {
  uint64_t total = 0;
  for (const auto& service : report.services()) total += service.tls_samples();
  return total;
}

// ---------------------------------------------------------------- Shipper

class ShipperImpl final : public Shipper {
 public:
  ShipperImpl(const ShipperOptions& options, StateDir state, Spool spool, uint64_t quarantined,
              std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(options),
        credentials_(std::move(credentials)),
        state_(std::move(state)),
        spool_(std::move(spool)),
        rng_(std::random_device{}()) {
    stats_.quarantined = quarantined;
    stats_.next_sequence = state_.next_sequence();
    EnforceBoundLocked(std::nullopt);
    NewChannel();
    sender_ = std::thread([this] { Run(); });
  }

  ~ShipperImpl() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      // A collector that hangs must not hold up shutdown for rpc_timeout.
      if (rpc_ != nullptr) rpc_->TryCancel();
    }
    cv_.notify_all();
    empty_cv_.notify_all();
    sender_.join();
  }

  Result<uint64_t> Seal(v1::AgentReport report) override {
    std::lock_guard seal_lock(seal_mu_);
    // The counter is persisted before the batch exists, so a sequence is
    // never handed out twice, whatever crashes in between.
    int err = 0;
    auto sequence = state_.Take(&err);
    while (!sequence && IsNoSpace(err) && DropOldestForRoom()) sequence = state_.Take(&err);
    if (!sequence) {
      CountUnpersisted();
      return MakeError("cannot seal a batch: {}", sequence.error().message);
    }
    report.set_agent_instance(state_.instance());
    report.set_sequence(*sequence);
    {
      std::lock_guard lock(mu_);
      stats_.next_sequence = state_.next_sequence();
      report.mutable_agent()->set_spooled_batches(spool_.batches());
      report.mutable_agent()->set_spool_dropped_batches(stats_.spool_dropped);
    }
    auto size = spool_.Write(report, &err);
    while (!size && IsNoSpace(err) && DropOldestForRoom()) size = spool_.Write(report, &err);
    if (!size) {
      CountUnpersisted();
      return MakeError("cannot seal batch sequence={}: {}", *sequence, size.error().message);
    }
    {
      std::lock_guard lock(mu_);
      spool_.Add(*sequence, *size);
      ++stats_.sealed;
      EnforceBoundLocked(*sequence);
    }
    cv_.notify_all();
    spdlog::info("sealed batch sequence={} window=[{},{}) busy_samples={} tls_samples={}", *sequence,
                 report.window().start_unix_ns(), report.window().end_unix_ns(), report.busy_samples(),
                 TlsSamples(report));
    return *sequence;
  }

  bool Flush(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    retry_now_ = true;
    cv_.notify_all();
    return empty_cv_.wait_for(lock, timeout, [&] { return spool_.batches() == 0; });
  }

  ShipperStats stats() const override {
    std::lock_guard lock(mu_);
    ShipperStats s = stats_;
    s.spooled_batches = spool_.batches();
    s.spooled_bytes = spool_.bytes();
    return s;
  }

 private:
  void NewChannel() {
    grpc::ChannelArguments args;
    // gRPC's own reconnect backoff (default up to 120 s) would otherwise delay
    // the first attempt after the collector comes back.
    auto ms = [](std::chrono::milliseconds d) {
      return static_cast<int>(std::min<int64_t>(d.count(), std::numeric_limits<int>::max()));
    };
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(options_.backoff_min));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, ms(options_.backoff_min));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(options_.backoff_max));
    // Channels share subchannels (connections and their backoff) through a
    // global pool by default; a fresh channel must not inherit a failed one.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetUserAgentPrefix("tlsprof-agent");
    channel_ = grpc::CreateCustomChannel(options_.collector, credentials_, args);
    stub_ = v1::Collector::NewStub(channel_);
  }

  // Drops the oldest batches while the spool is over its bound; never the
  // batch in flight (it may be counted by now) nor the one just sealed.
  void EnforceBoundLocked(std::optional<uint64_t> keep) {
    uint64_t dropped = 0, first = 0, last = 0;
    while (spool_.bytes() > options_.spool_max_bytes && spool_.batches() > 1) {
      std::optional<uint64_t> victim = spool_.Oldest(in_flight_);
      if (!victim || victim == keep) break;
      spool_.Remove(*victim);
      ++stats_.spool_dropped;
      if (dropped++ == 0) first = *victim;
      last = *victim;
    }
    if (dropped > 0) {
      spdlog::warn(
          "ship: spool over its bound of {} bytes: dropped {} oldest batch(es), sequences {}..{} ({} dropped "
          "since start)",
          options_.spool_max_bytes, dropped, first, last, stats_.spool_dropped);
      if (spool_.batches() == 0) empty_cv_.notify_all();
    }
  }

  // The disk is full: drops the oldest spooled batch (never the one in
  // flight). False when there is none to drop.
  bool DropOldestForRoom() {
    std::lock_guard lock(mu_);
    std::optional<uint64_t> victim = spool_.Oldest(in_flight_);
    if (!victim) return false;
    spool_.Remove(*victim);
    ++stats_.spool_dropped;
    spdlog::warn(
        "ship: the spool's disk is full: dropped the oldest batch, sequence {}, to make room ({} dropped since "
        "start)",
        *victim, stats_.spool_dropped);
    if (spool_.batches() == 0) empty_cv_.notify_all();
    return true;
  }

  void CountUnpersisted() {
    std::lock_guard lock(mu_);
    ++stats_.unpersisted;
  }

  void Run() {
    while (true) {
      try {
        if (!Step()) return;
      } catch (const std::exception& e) {
        // Never across threads: log, back off, go on.
        spdlog::error("ship: sender: {}", e.what());
        Backoff(++failures_);
      } catch (...) {
        spdlog::error("ship: sender: unknown exception");
        Backoff(++failures_);
      }
    }
  }

  // One attempt at the oldest batch. False when stopping.
  bool Step() {
    v1::SubmitRequest request;
    uint64_t sequence = 0;
    {
      std::unique_lock lock(mu_);
      if (spool_.batches() == 0) {
        empty_cv_.notify_all();
        cv_.wait(lock, [&] { return stop_ || spool_.batches() > 0; });
      }
      if (stop_) return false;
      std::optional<uint64_t> oldest = spool_.Oldest();
      if (!oldest) return true;
      auto report = spool_.Load(*oldest);
      if (!report) {
        spdlog::error("ship: {}; skipping it", report.error().message);
        if (spool_.batches() == 0) empty_cv_.notify_all();
        return true;
      }
      sequence = *oldest;
      *request.mutable_report() = std::move(*report);
      in_flight_ = sequence;
      retry_now_ = false;  // this attempt is the one a Flush() asked for
    }

    // Our backoff has been waited for (or a Flush() cut it short): gRPC's own
    // reconnect backoff must not add to it, or fail this attempt unsent.
    // A channel in TRANSIENT_FAILURE fails RPCs at once, unsent, until its
    // own reconnect backoff ends (and a reset of that backoff takes effect
    // only asynchronously). Our backoff has been waited for, or a Flush()
    // cut it short: this attempt gets a fresh channel, i.e. a real connect.
    // A call that ran into its deadline on a READY channel: the collector
    // took the connection and hangs (or the path to it is black-holed). The
    // channel would keep that connection forever, so the next attempt gets a
    // fresh one, which reaches a collector restarted or failed over since.
    if (failures_ > 0 &&
        (last_deadline_exceeded_ || channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE)) {
      NewChannel();
    }
    v1::SubmitResponse response;
    // The agent's clock at this attempt, for the collector's skew measurement.
    request.set_sent_unix_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    grpc::Status status = Submit(request, &response);

    last_deadline_exceeded_ = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    std::unique_lock lock(mu_);
    in_flight_.reset();
    if (stop_ && status.error_code() == grpc::StatusCode::CANCELLED) return false;
    bool delivered = false;
    if (status.ok() &&
        (response.result() == v1::SubmitResponse::ACCEPTED || response.result() == v1::SubmitResponse::DUPLICATE)) {
      if (response.result() == v1::SubmitResponse::ACCEPTED) {
        ++stats_.accepted;
      } else {
        ++stats_.duplicates;
        spdlog::debug("ship: batch sequence={} was counted before (DUPLICATE)", sequence);
      }
      if (response.dropped_series() > 0) {
        spdlog::debug("ship: the collector dropped {} series of batch sequence={} (cardinality caps)",
                      response.dropped_series(), sequence);
      }
      stats_.last_success_unix_seconds = UnixSecondsNow();
      spool_.Remove(sequence);
      delivered = true;
    } else if (IsPermanent(status)) {
      // Retrying cannot fix a malformed or oversized report, and it would
      // hold up every batch behind it.
      ++stats_.rejected;
      spool_.Remove(sequence);
      delivered = true;
      spdlog::error("ship: the collector rejected batch sequence={} ({}): {}; dropped it", sequence,
                    CodeName(status.error_code()), status.error_message());
    } else {
      ++stats_.send_errors;
      std::string why = status.ok()
                            ? fmt::format("the collector answered result {}", static_cast<int>(response.result()))
                            : fmt::format("{}: {}", CodeName(status.error_code()), status.error_message());
      LogFailureLocked(sequence, why);
    }
    if (spool_.batches() == 0) empty_cv_.notify_all();
    if (delivered) {
      if (failures_ > 0) {
        spdlog::info("ship: collector {} reachable again after {} failed attempt(s)", options_.collector, failures_);
      }
      failures_ = 0;
      suppressed_ = 0;
      last_error_log_.reset();
      return true;
    }
    lock.unlock();
    Backoff(++failures_);
    return true;
  }

  grpc::Status Submit(const v1::SubmitRequest& request, v1::SubmitResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
    {
      std::lock_guard lock(mu_);
      if (stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "shipper stopping");
      rpc_ = &context;
    }
    struct Clear {  // also on an exception: rpc_ must never dangle
      ShipperImpl* self;
      ~Clear() {
        std::lock_guard lock(self->mu_);
        self->rpc_ = nullptr;
      }
    } clear{this};
    return stub_->Submit(&context, request, response);
  }

  void LogFailureLocked(uint64_t sequence, const std::string& why) {
    auto now = Clock::now();
    if (last_error_log_ && now - *last_error_log_ < kErrorLogInterval) {
      ++suppressed_;
      return;
    }
    if (suppressed_ > 0) {
      spdlog::warn(
          "ship: cannot ship batch sequence={} to {}: {} ({} more failed attempts since the last message); "
          "{} batch(es) wait in the spool, retrying",
          sequence, options_.collector, why, suppressed_, spool_.batches());
    } else {
      spdlog::warn("ship: cannot ship batch sequence={} to {}: {}; {} batch(es) wait in the spool, retrying", sequence,
                   options_.collector, why, spool_.batches());
    }
    suppressed_ = 0;
    last_error_log_ = now;
  }

  // Exponential backoff with jitter in [backoff_min, backoff_max]; wakes on
  // stop and on Flush().
  void Backoff(uint32_t failures) {
    using std::chrono::milliseconds;
    int64_t min = std::max<int64_t>(1, options_.backoff_min.count());
    int64_t max = std::max<int64_t>(min, options_.backoff_max.count());
    int64_t base = min;
    for (uint32_t i = 1; i < failures && base < max; ++i) base *= 2;
    base = std::min(base, max);
    int64_t delay = std::uniform_int_distribution<int64_t>(base / 2, base)(rng_);
    delay = std::clamp(delay, min, max);
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, milliseconds(delay), [&] { return stop_ || retry_now_; });
  }

  const ShipperOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::shared_ptr<grpc::Channel> channel_;  // sender thread only (after construction)
  std::unique_ptr<v1::Collector::Stub> stub_;

  std::mutex seal_mu_;  // serializes Seal(); guards state_
  StateDir state_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // wakes the sender: new batch, stop, Flush()
  std::condition_variable empty_cv_;  // wakes Flush(): the spool emptied
  Spool spool_;                       // index: guarded by mu_
  ShipperStats stats_;
  std::optional<uint64_t> in_flight_;
  grpc::ClientContext* rpc_ = nullptr;  // the RPC in flight, to cancel on stop
  bool stop_ = false;
  bool retry_now_ = false;

  // Sender thread only.
  std::mt19937_64 rng_;
  uint32_t failures_ = 0;
  bool last_deadline_exceeded_ = false;
  uint64_t suppressed_ = 0;
  std::optional<Clock::time_point> last_error_log_;

  std::thread sender_;
};

}  // namespace

Result<std::unique_ptr<Shipper>> Shipper::Start(const ShipperOptions& options) {
  if (options.collector.empty()) return MakeError("no collector address given (HOST:PORT)");
  if (options.rpc_timeout.count() <= 0) return MakeError("the RPC timeout must be positive");
  if (options.backoff_min.count() <= 0 || options.backoff_max < options.backoff_min) {
    return MakeError("the retry backoff must satisfy 0 < min ({} ms) <= max ({} ms)", options.backoff_min.count(),
                     options.backoff_max.count());
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.insecure) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    // The checks of the files at start (readable, PEM, key matches, not
    // expired); then gRPC's watcher reads them now and every
    // tls_reload_seconds, so a rotated certificate is used for the
    // connections made after it.
    auto tls = LoadTls(options.tls);
    if (!tls) return tls.error();
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.tls.key, options.tls.cert, options.tls.ca, std::max(1u, options.tls_reload_seconds));
    grpc::experimental::TlsChannelCredentialsOptions tls_options;
    tls_options.set_certificate_provider(provider);
    tls_options.watch_root_certs();
    tls_options.watch_identity_key_cert_pairs();
    // The collector's certificate must name the host dialled, as with SslCredentials.
    tls_options.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
    credentials = grpc::experimental::TlsCredentials(tls_options);
  }

  auto state = StateDir::Open(options.state_dir);
  if (!state) return state.error();
  Spool::Loaded loaded;
  auto spool = Spool::Open(state->spool_dir(), options.max_quarantined, &loaded);
  if (!spool) return spool.error();
  // A crash may leave a batch on disk whose counter update was lost (older
  // versions wrote the batch first): never reuse a spooled sequence.
  if (std::optional<uint64_t> newest = spool->Newest()) {
    if (auto st = state->AdvanceTo(*newest + 1); !st) return st.error();
  }
  spdlog::info("ship: state {}: instance {}, next sequence {}, {} batch(es) ({} bytes) waiting in the spool",
               state->dir(), state->instance_hex(), state->next_sequence(), spool->batches(), spool->bytes());

  return std::unique_ptr<Shipper>(
      new ShipperImpl(options, std::move(*state), std::move(*spool), loaded.quarantined, std::move(credentials)));
}

}  // namespace tlsprof::ship
