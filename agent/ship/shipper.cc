#include "agent/ship/shipper.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
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

#include <fmt/ranges.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>

#include "agent/ship/collectors.h"
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
  FILE* f = std::fopen(path.c_str(), "rb");  // guarded-io: the operator's TLS files
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

// One collector and the sender's connection to it.
struct Target {
  CollectorTarget where;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Collector::Stub> stub;
  uint32_t failures = 0;         // consecutive failed attempts
  Clock::time_point retry_at{};  // not tried before (its backoff)
  bool last_deadline_exceeded = false;
  uint64_t suppressed = 0;  // failures not logged since the last message
  std::optional<Clock::time_point> last_error_log;
};

// What the sender sends next, and where.
struct Choice {
  uint64_t sequence = 0;
  size_t target = 0;
  bool pinned = false;  // already pinned to that target
};

class ShipperImpl final : public Shipper {
 public:
  ShipperImpl(const ShipperOptions& options, std::vector<CollectorTarget> targets, StateDir state, Spool spool,
              uint64_t quarantined, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(options),
        credentials_(std::move(credentials)),
        state_(std::move(state)),
        spool_(std::move(spool)),
        rng_(std::random_device{}()) {
    stats_.quarantined = quarantined;
    stats_.next_sequence = state_.next_sequence();
    for (auto& where : targets) {
      targets_.emplace_back();
      targets_.back().where = std::move(where);
      NewChannel(targets_.back());
    }
    UnpinUnknownLocked();
    EnforceBoundLocked(std::nullopt);
    sender_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "tlsprof-ship");  // top -H, /proc/PID/task/*/comm
      Run();
    });
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
      ++sealed_generation_;
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
    s.pinned_batches = spool_.pins().size();
    return s;
  }

 private:
  void NewChannel(Target& t) {
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
    if (!t.where.tls_name.empty()) {
      // Dialled by address: the certificate must still hold the name.
      args.SetSslTargetNameOverride(t.where.tls_name);
      args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, t.where.tls_name);
    }
    args.SetUserAgentPrefix("tlsprof-agent");
    t.channel = grpc::CreateCustomChannel(t.where.address, credentials_, args);
    t.stub = v1::Collector::NewStub(t.channel);
  }

  // Pins to collectors no longer configured: those batches are placed again
  // (docs/fleet.md: the one way a batch sent to one collector may reach
  // another, after the operator removed the first).
  void UnpinUnknownLocked() {
    std::vector<uint64_t> orphans;
    for (const auto& [sequence, address] : spool_.pins()) {
      if (!IndexOf(address)) orphans.push_back(sequence);
    }
    for (uint64_t sequence : orphans) {
      spdlog::warn("ship: batch sequence={} was sent to collector {}, which is no longer configured: placing it again",
                   sequence, spool_.pins().at(sequence));
      spool_.Unpin(sequence);
    }
  }

  std::optional<size_t> IndexOf(const std::string& address) const {
    for (size_t i = 0; i < targets_.size(); ++i) {
      if (targets_[i].where.address == address) return i;
    }
    return std::nullopt;
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
        PauseAfterError();
      } catch (...) {
        spdlog::error("ship: sender: unknown exception");
        PauseAfterError();
      }
    }
  }

  void PauseAfterError() {
    std::unique_lock lock(mu_);
    in_flight_.reset();
    cv_.wait_for(lock, options_.backoff_max, [&] { return stop_; });
  }

  // The batch to send now and its collector: the oldest batch that may go
  // now. A pinned batch goes to its collector once that one's backoff is
  // over; any other batch to the first collector of the order of preference
  // whose backoff is over (the placement).
  std::optional<Choice> ChooseLocked(Clock::time_point now) {
    std::optional<Choice> best;
    for (const auto& [sequence, address] : spool_.pins()) {
      std::optional<size_t> i = IndexOf(address);
      if (i && targets_[*i].retry_at <= now) {
        best = Choice{sequence, *i, true};
        break;
      }
    }
    std::optional<size_t> placement;
    for (size_t i = 0; i < targets_.size() && !placement; ++i) {
      if (targets_[i].retry_at <= now) placement = i;
    }
    std::optional<uint64_t> unpinned = spool_.OldestUnpinned();
    if (placement && unpinned && (!best || *unpinned < best->sequence)) best = Choice{*unpinned, *placement, false};
    return best;
  }

  // Waits for a batch that may go now; loads it. Nullopt when stopping.
  std::optional<std::pair<Choice, v1::AgentReport>> NextLocked(std::unique_lock<std::mutex>& lock) {
    while (!stop_) {
      if (retry_now_) {  // Flush(): every backoff is cut short, once
        for (Target& t : targets_) t.retry_at = Clock::time_point{};
        retry_now_ = false;
      }
      if (spool_.batches() == 0) {
        empty_cv_.notify_all();
        cv_.wait(lock, [&] { return stop_ || retry_now_ || spool_.batches() > 0; });
        continue;
      }
      Clock::time_point now = Clock::now();
      std::optional<Choice> choice = ChooseLocked(now);
      if (!choice) {
        // Every collector a batch may go to is in its backoff: wait for the
        // first backoff to end, a new batch (it may have a collector up) or
        // a Flush().
        Clock::time_point until = Clock::time_point::max();
        for (const Target& t : targets_) until = std::min(until, t.retry_at);
        uint64_t generation = sealed_generation_;
        cv_.wait_until(lock, until, [&] { return stop_ || retry_now_ || sealed_generation_ != generation; });
        continue;
      }
      auto report = spool_.Load(choice->sequence);
      if (!report) {
        spdlog::error("ship: {}; skipping it", report.error().message);
        continue;
      }
      in_flight_ = choice->sequence;
      return std::make_pair(*choice, std::move(*report));
    }
    return std::nullopt;
  }

  // Waits (at most connect_timeout) for a connection to `t`. False when
  // none could be made: no byte of a request left, so the batch may go to
  // another collector.
  bool Connect(Target& t) {
    if (t.failures > 0 &&
        (t.last_deadline_exceeded || t.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE)) {
      // Our backoff has been waited for (or a Flush() cut it short): a
      // fresh channel makes a real connect now, where the old one would
      // wait out gRPC's own reconnect backoff. After a deadline on a READY
      // channel (a collector that took the connection and hangs, or a
      // black-holed path) the old connection is not reused either.
      NewChannel(t);
    }
    auto deadline = Clock::now() + options_.connect_timeout;
    grpc_connectivity_state state = t.channel->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY) {
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
      auto now = Clock::now();
      if (now >= deadline) return false;
      {
        std::lock_guard lock(mu_);
        if (stop_) return false;
      }
      // In slices, so that a stop is seen while a connect hangs.
      auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
      t.channel->WaitForStateChange(state, std::chrono::system_clock::now() + slice);
      state = t.channel->GetState(/*try_to_connect=*/true);
    }
    return true;
  }

  // One attempt at the batch that may go now. False when stopping.
  bool Step() {
    std::optional<std::pair<Choice, v1::AgentReport>> next;
    {
      std::unique_lock lock(mu_);
      next = NextLocked(lock);
      if (!next) return false;
    }
    const Choice& choice = next->first;
    Target& target = targets_[choice.target];
    if (!Connect(target)) {
      std::lock_guard lock(mu_);
      in_flight_.reset();
      if (stop_) return false;
      ++stats_.send_errors;
      FailedLocked(target, choice.sequence, "cannot connect");
      return true;
    }
    if (!choice.pinned && !Pin(target, choice.sequence)) return true;
    v1::SubmitRequest request;
    *request.mutable_report() = std::move(next->second);
    // The agent's clock at this attempt, for the collector's skew measurement.
    request.set_sent_unix_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    v1::SubmitResponse response;
    grpc::Status status = Submit(target, request, &response);
    target.last_deadline_exceeded = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    std::lock_guard lock(mu_);
    in_flight_.reset();
    if (stop_ && status.error_code() == grpc::StatusCode::CANCELLED) return false;
    if (Answered(target, choice.sequence, status, response) && !choice.pinned) NotePlacementLocked(choice);
    if (spool_.batches() == 0) empty_cv_.notify_all();
    return true;
  }

  // Pins the batch to `target`, durably, before its first byte is sent: from
  // then on the outcome of an attempt may be unknown, and the batch must stay
  // with this collector. A full disk is handled as Seal() does: the oldest
  // batches are dropped until the pin fits; with none left to drop, the pin
  // is kept in memory only (lost if the agent dies before an answer), so
  // that a full disk never stops the spool from draining. False, after a
  // backoff of the collector, when the pin could not be written otherwise.
  bool Pin(Target& target, uint64_t sequence) {
    int err = 0;
    Status st = spool_.WritePin(sequence, target.where.address, &err);
    while (!st.ok() && IsNoSpace(err) && DropOldestForRoom())
      st = spool_.WritePin(sequence, target.where.address, &err);
    std::lock_guard lock(mu_);
    if (!st.ok() && !IsNoSpace(err)) {
      in_flight_.reset();
      ++stats_.send_errors;
      FailedLocked(target, sequence, fmt::format("cannot pin it to the collector: {}", st.error().message));
      return false;
    }
    if (!st.ok()) {
      spdlog::warn("ship: the spool's disk is full: batch sequence={} is pinned to collector {} in memory only",
                   sequence, target.where.address);
    }
    spool_.AddPin(sequence, target.where.address);
    return true;
  }

  // Logs and counts a change of the collector that takes new batches (one
  // answered their first attempt).
  void NotePlacementLocked(const Choice& choice) {
    const std::string& address = targets_[choice.target].where.address;
    if (stats_.collector == address) return;
    if (!stats_.collector.empty()) {
      ++stats_.failovers;
      bool preferred = choice.target == 0;
      spdlog::warn("ship: new batches go to collector {} ({}), not {}", address,
                   preferred ? "the agent's own, back" : "failing over", stats_.collector);
    } else {
      spdlog::info("ship: new batches go to collector {} ({} of {} in the agent's order)", address, choice.target + 1,
                   targets_.size());
    }
    stats_.collector = address;
  }

  // The collector answered, or the attempt failed with an unknown outcome.
  // True when the batch is done with (delivered or rejected).
  bool Answered(Target& target, uint64_t sequence, const grpc::Status& status, const v1::SubmitResponse& response) {
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
      spdlog::error("ship: collector {} rejected batch sequence={} ({}): {}; dropped it", target.where.address,
                    sequence, CodeName(status.error_code()), status.error_message());
    }
    if (delivered) {
      if (target.failures > 0) {
        spdlog::info("ship: collector {} reachable again after {} failed attempt(s)", target.where.address,
                     target.failures);
      }
      target.failures = 0;
      target.retry_at = Clock::time_point{};
      target.suppressed = 0;
      target.last_error_log.reset();
      return true;
    }
    ++stats_.send_errors;
    std::string why = status.ok() ? fmt::format("it answered result {}", static_cast<int>(response.result()))
                                  : fmt::format("{}: {}", CodeName(status.error_code()), status.error_message());
    FailedLocked(target, sequence, why);
    return false;
  }

  grpc::Status Submit(Target& target, const v1::SubmitRequest& request, v1::SubmitResponse* response) {
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
    return target.stub->Submit(&context, request, response);
  }

  // A failed attempt: the collector backs off (exponentially, with jitter,
  // in [backoff_min, backoff_max]); the log is rate-limited per collector.
  void FailedLocked(Target& target, uint64_t sequence, const std::string& why) {
    ++target.failures;
    int64_t min = std::max<int64_t>(1, options_.backoff_min.count());
    int64_t max = std::max<int64_t>(min, options_.backoff_max.count());
    int64_t base = min;
    for (uint32_t i = 1; i < target.failures && base < max; ++i) base *= 2;
    base = std::min(base, max);
    int64_t delay = std::clamp(std::uniform_int_distribution<int64_t>(base / 2, base)(rng_), min, max);
    auto now = Clock::now();
    target.retry_at = now + std::chrono::milliseconds(delay);

    if (target.last_error_log && now - *target.last_error_log < kErrorLogInterval) {
      ++target.suppressed;
      return;
    }
    bool pinned = spool_.pins().count(sequence) != 0;
    std::string more = target.suppressed > 0
                           ? fmt::format(" ({} more failed attempts since the last message)", target.suppressed)
                           : std::string();
    spdlog::warn("ship: cannot ship batch sequence={} to collector {}: {}{}; {} batch(es) wait in the spool, {}",
                 sequence, target.where.address, why, more, spool_.batches(),
                 pinned ? "retrying it there only (it may have been counted)" : "retrying");
    target.suppressed = 0;
    target.last_error_log = now;
  }

  const ShipperOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;

  std::mutex seal_mu_;  // serializes Seal(); guards state_
  StateDir state_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // wakes the sender: new batch, stop, Flush()
  std::condition_variable empty_cv_;  // wakes Flush(): the spool emptied
  Spool spool_;                       // index and pins: guarded by mu_
  ShipperStats stats_;
  std::optional<uint64_t> in_flight_;
  grpc::ClientContext* rpc_ = nullptr;  // the RPC in flight, to cancel on stop
  bool stop_ = false;
  bool retry_now_ = false;
  uint64_t sealed_generation_ = 0;  // Seal() calls, to wake a sender waiting for a backoff

  // In the order of preference. Their connections: the sender thread only;
  // failures and retry_at also under mu_ (the sender holds it to choose).
  std::vector<Target> targets_;
  std::mt19937_64 rng_;  // under mu_

  std::thread sender_;
};

std::string CommonName(const std::string& pem) {
  X509Ptr leaf = FirstCertificate(pem);
  if (!leaf) return "";
  char cn[256] = {};
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(leaf.get()), NID_commonName, cn, sizeof cn);
  return n > 0 ? std::string(cn, static_cast<size_t>(n)) : std::string();
}

}  // namespace

Result<std::unique_ptr<Shipper>> Shipper::Start(const ShipperOptions& options) {
  auto targets =
      ExpandCollectors(options.collectors, options.resolver ? options.resolver : Resolver(ResolveWithGetaddrinfo));
  if (!targets) return targets.error();
  if (options.rpc_timeout.count() <= 0) return MakeError("the RPC timeout must be positive");
  if (options.connect_timeout.count() <= 0) return MakeError("the connect timeout must be positive");
  if (options.backoff_min.count() <= 0 || options.backoff_max < options.backoff_min) {
    return MakeError("the retry backoff must satisfy 0 < min ({} ms) <= max ({} ms)", options.backoff_min.count(),
                     options.backoff_max.count());
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string identity = options.identity;
  if (options.insecure) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    // The checks of the files at start (readable, PEM, key matches, not
    // expired); then gRPC's watcher reads them now and every
    // tls_reload_seconds, so a rotated certificate is used for the
    // connections made after it.
    auto tls = LoadTls(options.tls);
    if (!tls) return tls.error();
    if (identity.empty()) identity = CommonName(tls->pem_cert_chain);
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
  if (identity.empty()) identity = state->instance_hex();
  std::vector<CollectorTarget> ordered = PreferenceOrder(identity, std::move(*targets));
  std::vector<std::string> names;
  for (const auto& t : ordered) names.push_back(t.address);
  spdlog::info(
      "ship: state {}: instance {}, next sequence {}, {} batch(es) ({} bytes, {} pinned) waiting in the spool; "
      "collectors in the order of {}: {}",
      state->dir(), state->instance_hex(), state->next_sequence(), spool->batches(), spool->bytes(),
      spool->pins().size(), identity, fmt::join(names, ", "));

  return std::unique_ptr<Shipper>(new ShipperImpl(options, std::move(ordered), std::move(*state), std::move(*spool),
                                                  loaded.quarantined, std::move(credentials)));
}

}  // namespace tlsprof::ship
