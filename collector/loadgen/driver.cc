#include "collector/loadgen/driver.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <queue>
#include <sstream>
#include <thread>
#include <vector>

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>

#include "common/placement/rendezvous.h"
#include "tlsprof/v1/report.grpc.pb.h"

namespace tlsprof::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};

const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  auto i = static_cast<size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

// The codes an agent retries too (docs/fleet.md): the report may be counted
// later. INVALID_ARGUMENT and the identity errors cannot change by retrying.
bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

int64_t WallNowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

Result<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError("cannot read {} {}: check the path and its permissions", what, path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// One call in flight. Its request lives on an arena whose first block is
// part of the Call: building a 100-row report then costs no malloc per row,
// which was the loadgen's largest cost (perf, 1000 reports/s).
struct Call {
  Call() : arena(ArenaOptions(arena_block, sizeof(arena_block))) {
    request = google::protobuf::Arena::CreateMessage<v1::SubmitRequest>(&arena);
  }
  static google::protobuf::ArenaOptions ArenaOptions(char* block, size_t size) {
    google::protobuf::ArenaOptions o;
    o.initial_block = block;
    o.initial_block_size = size;
    return o;
  }
  alignas(16) char arena_block[16384];
  google::protobuf::Arena arena;
  v1::SubmitRequest* request;
  grpc::ClientContext ctx;
  v1::SubmitResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SubmitResponse>> reader;
  uint32_t agent = 0;
  uint32_t collector = 0;  // index into --collector; never changes for a report
  uint32_t attempt = 0;
  Clock::time_point started;
};

struct Retry {
  Clock::time_point due;
  std::shared_ptr<v1::SubmitRequest> request;
  uint32_t agent;
  uint32_t collector;
  uint32_t attempt;
  bool operator>(const Retry& o) const { return due > o.due; }
};

// What one completion-queue thread saw; merged after the run.
struct ThreadStats {
  std::vector<uint32_t> latency_us;
  uint64_t accepted = 0, duplicate = 0, duplicate_after_retry = 0, failed = 0, retried = 0, dropped_series = 0,
           series = 0;
  ReportTotals totals;
  std::map<std::string, uint64_t> by_bucket, by_algorithm;
  std::vector<uint64_t> by_collector;
  std::map<std::string, uint64_t> errors;
  std::map<std::string, std::string> examples;
  Clock::time_point last_answer{};
};

double Percentile(std::vector<uint32_t>& v, double q) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k] / 1000.0;
}

class Runner {
 public:
  Runner(const Fleet& fleet, const DriverOptions& options) : fleet_(fleet), o_(options) {
    low_water_ = o_.max_in_flight - o_.max_in_flight / 4;
    busy_ = std::make_unique<std::atomic<bool>[]>(fleet_.agents());
  }

  Result<bool> Connect() {
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (o_.insecure) {
      creds = grpc::InsecureChannelCredentials();
    } else {
      grpc::SslCredentialsOptions ssl;
      auto ca = ReadFile(o_.tls_ca, "--tls-ca");
      if (!ca) return ca.error();
      auto cert = ReadFile(o_.tls_cert, "--tls-cert");
      if (!cert) return cert.error();
      auto key = ReadFile(o_.tls_key, "--tls-key");
      if (!key) return key.error();
      ssl.pem_root_certs = *ca;
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
      creds = grpc::SslCredentials(ssl);
    }
    channels_.resize(o_.collectors.size());
    stubs_.resize(o_.collectors.size());
    for (size_t k = 0; k < o_.collectors.size(); ++k) {
      for (uint32_t c = 0; c < o_.connections; ++c) {
        grpc::ChannelArguments args;
        // Without a local pool, channels with equal arguments share one
        // subchannel (one TCP connection); each channel is to be its own.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        args.SetInt("tlsprof.loadgen.channel", static_cast<int>(c));
        // A collector back after a restart is reconnected to within a second.
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
        args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        if (!o_.tls_server_name.empty()) args.SetSslTargetNameOverride(o_.tls_server_name);
        auto channel = grpc::CreateCustomChannel(o_.collectors[k], creds, args);
        stubs_[k].push_back(v1::Collector::NewStub(channel));
        channels_[k].push_back(std::move(channel));
      }
    }
    auto deadline = std::chrono::system_clock::now() + o_.connect_timeout;
    for (size_t k = 0; k < o_.collectors.size(); ++k) {
      for (auto& channel : channels_[k]) {
        if (!channel->WaitForConnected(deadline)) {
          return MakeError(
              "cannot connect to the collector at {} within {} ms ({}): is it listening, and do its "
              "TLS settings match (--insecure or the --tls-* files)?",
              o_.collectors[k], o_.connect_timeout.count(), o_.insecure ? "plaintext" : "mTLS");
        }
      }
    }
    // Each agent's order of preference among the collectors.
    order_.resize(fleet_.agents());
    for (uint32_t a = 0; a < fleet_.agents(); ++a) {
      for (size_t k : placement::RendezvousOrder(fleet_.agent(a).hostname, o_.collectors)) {
        order_[a].push_back(static_cast<uint32_t>(k));
      }
    }
    for (uint32_t t = 0; t < o_.threads; ++t) cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
    stats_.resize(o_.threads);
    for (ThreadStats& st : stats_) st.by_collector.resize(o_.collectors.size());
    return true;
  }

  DriverResult Run() {
    const uint32_t n = fleet_.agents();
    const int64_t interval = fleet_.interval_ns();
    const bool paced = o_.total_windows == 0 || o_.paced;
    uint64_t planned;
    if (o_.total_windows > 0) {
      planned = static_cast<uint64_t>(n) * o_.total_windows;
    } else {
      planned = static_cast<uint64_t>(std::ceil(o_.duration_seconds * 1e9 * n / static_cast<double>(interval)));
    }
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < o_.threads; ++t) threads.emplace_back([this, t] { Complete(t); });

    const double cpu0 = CpuSeconds();
    const Clock::time_point t0 = Clock::now();
    const int64_t wall0 = WallNowNs();
    // Agent i's window s is [base_i + (s-1) I, base_i + s I). Paced, it ends
    // when it is due; unpaced, the agents' last windows end before now.
    const int64_t back = interval + (paced ? 0 : static_cast<int64_t>(o_.total_windows) * interval);
    auto offset = [&](uint64_t agent) { return static_cast<int64_t>(agent) * interval / n; };
    auto due = [&](uint64_t j) {
      if (!paced) return t0;
      return t0 + std::chrono::nanoseconds((static_cast<int64_t>(j / n)) * interval + offset(j % n));
    };

    std::vector<uint32_t> lag_us;
    uint64_t next = 0, sent = 0;
    std::unique_lock lock(mu_);
    while (true) {
      Clock::time_point now = Clock::now();
      while (!retries_.empty() && retries_.top().due <= now && in_flight_ < o_.max_in_flight) {
        Retry r = retries_.top();
        retries_.pop();
        auto call = std::make_unique<Call>();
        *call->request = *r.request;
        call->agent = r.agent;
        call->collector = r.collector;
        call->attempt = r.attempt;
        Issue(std::move(call));
      }
      if (g_stop.load()) planned = next;
      lock.unlock();
      while (next < planned && in_flight_ < o_.max_in_flight) {
        Clock::time_point when = due(next);
        if (when > now) {
          now = Clock::now();
          if (when > now) break;
        }
        uint32_t agent = static_cast<uint32_t>(next % n);
        // An agent ships its windows one at a time, oldest first: its next
        // window waits for the answer to the one before.
        if (busy_[agent].load()) {
          blocked_agent_.store(agent);
          if (busy_[agent].load()) break;
          blocked_agent_.store(-1);
        }
        uint64_t sequence = next / n + 1;
        auto call = std::make_unique<Call>();
        call->agent = agent;
        call->collector = Place(agent);
        fleet_.BuildReport(agent, sequence,
                           wall0 + offset(agent) - back + static_cast<int64_t>(sequence - 1) * interval,
                           call->request->mutable_report());
        if (paced)
          lag_us.push_back(static_cast<uint32_t>(std::min<int64_t>(
              UINT32_MAX, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - when).count())));
        busy_[agent].store(true);
        Issue(std::move(call));
        ++next;
        ++sent;
      }
      lock.lock();
      if (next >= planned) draining_.store(true);
      if (next >= planned && in_flight_ == 0 && retries_.empty()) break;
      Clock::time_point wake = Clock::now() + std::chrono::milliseconds(50);
      if (next < planned && in_flight_ < o_.max_in_flight && blocked_agent_.load() < 0) {
        wake = std::min(wake, due(next));
      }
      if (!retries_.empty()) wake = std::min(wake, retries_.top().due);
      cv_.wait_until(lock, wake);
    }
    lock.unlock();

    for (auto& cq : cqs_) cq->Shutdown();
    for (auto& t : threads) t.join();

    DriverResult r;
    r.planned = planned;
    r.sent = sent;
    r.attempts = attempts_;
    r.cpu_seconds = CpuSeconds() - cpu0;
    std::vector<uint32_t> latency;
    Clock::time_point last = Merge(r, latency, t0);
    r.elapsed_seconds = std::chrono::duration<double>(last - t0).count();
    // A timed run spans its whole duration even when the last answer came
    // early in the last interval.
    if (o_.total_windows == 0 && !g_stop.load()) r.elapsed_seconds = std::max(r.elapsed_seconds, o_.duration_seconds);
    r.latency_max_ms = latency.empty() ? 0 : *std::max_element(latency.begin(), latency.end()) / 1000.0;
    r.latency_p99_ms = Percentile(latency, 0.99);
    r.latency_p50_ms = Percentile(latency, 0.50);
    r.lag_max_ms = lag_us.empty() ? 0 : *std::max_element(lag_us.begin(), lag_us.end()) / 1000.0;
    r.lag_p99_ms = Percentile(lag_us, 0.99);
    return r;
  }

 private:
  // Adds every completion thread's counts to `r`; returns the last answer's time.
  Clock::time_point Merge(DriverResult& r, std::vector<uint32_t>& latency, Clock::time_point t0) {
    Clock::time_point last = t0;
    for (ThreadStats& s : stats_) {
      latency.insert(latency.end(), s.latency_us.begin(), s.latency_us.end());
      r.accepted += s.accepted;
      r.duplicate += s.duplicate;
      r.duplicate_after_retry += s.duplicate_after_retry;
      for (auto& [k, v] : s.by_bucket) r.accepted_tls_by_bucket[k] += v;
      for (auto& [k, v] : s.by_algorithm) r.accepted_tls_by_algorithm[k] += v;
      r.accepted_by_collector.resize(s.by_collector.size());
      for (size_t k = 0; k < s.by_collector.size(); ++k) r.accepted_by_collector[k] += s.by_collector[k];
      r.failed += s.failed;
      r.retried += s.retried;
      r.dropped_series += s.dropped_series;
      r.series += s.series;
      r.accepted_totals.busy_samples += s.totals.busy_samples;
      r.accepted_totals.tls_samples += s.totals.tls_samples;
      r.accepted_totals.rows += s.totals.rows;
      for (auto& [code, count] : s.errors) r.errors[code] += count;
      for (auto& [code, message] : s.examples) r.error_examples.emplace(code, message);
      last = std::max(last, s.last_answer);
    }
    return last;
  }

  // The first collector of the agent's order whose channel is connected (a
  // report sent nowhere yet may go anywhere); the first one when none is.
  uint32_t Place(uint32_t agent) {
    const std::vector<uint32_t>& order = order_[agent];
    if (order.size() == 1) return order[0];
    uint32_t c = agent % o_.connections;
    for (uint32_t k : order) {
      if (channels_[k][c]->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return k;
    }
    return order[0];
  }

  void Issue(std::unique_ptr<Call> call) {
    uint32_t c = call->agent % o_.connections;
    call->ctx.set_deadline(std::chrono::system_clock::now() + o_.timeout);
    call->reader =
        stubs_[call->collector][c]->PrepareAsyncSubmit(&call->ctx, *call->request, cqs_[c % o_.threads].get());
    in_flight_.fetch_add(1);
    ++attempts_;
    call->started = Clock::now();
    call->reader->StartCall();
    Call* raw = call.release();
    raw->reader->Finish(&raw->response, &raw->status, raw);
  }

  void Complete(uint32_t t) {
    ThreadStats& s = stats_[t];
    void* tag;
    bool ok;
    while (cqs_[t]->Next(&tag, &ok)) {
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      Clock::time_point now = Clock::now();
      s.last_answer = now;
      s.latency_us.push_back(static_cast<uint32_t>(std::min<int64_t>(
          UINT32_MAX, std::chrono::duration_cast<std::chrono::microseconds>(now - call->started).count())));
      bool notify = false;
      const bool answered = call->status.ok();
      const auto result = call->response.result();
      if (answered && result == v1::SubmitResponse::ACCEPTED) {
        ++s.accepted;
        s.dropped_series += call->response.dropped_series();
        s.series += Count(s, *call);
      } else if (answered && result == v1::SubmitResponse::DUPLICATE) {
        ++s.duplicate;
        // A retry's DUPLICATE: this run's earlier attempt was counted.
        if (call->attempt > 0) {
          ++s.duplicate_after_retry;
          Count(s, *call);
        }
      } else {
        std::string code = call->status.ok() ? "RESULT_UNSPECIFIED" : CodeName(call->status.error_code());
        ++s.errors[code];
        s.examples.emplace(code, call->status.error_message());
        if (!call->status.ok() && Retryable(call->status.error_code()) && call->attempt < o_.retries) {
          ++s.retried;
          // Exponential backoff from 100 ms, as an agent would (without its jitter: the
          // schedule stays reproducible).
          auto backoff = std::chrono::milliseconds(100) * (1u << std::min(call->attempt, 8u));
          std::lock_guard guard(mu_);
          retries_.push(Retry{now + backoff, std::make_shared<v1::SubmitRequest>(*call->request), call->agent,
                              call->collector, call->attempt + 1});
          notify = true;
        } else {
          ++s.failed;
        }
      }
      if (!notify) {  // the agent's report is done (a retry keeps the agent busy)
        busy_[call->agent].store(false);
        if (blocked_agent_.load() == call->agent) {
          blocked_agent_.store(-1);
          notify = true;
        }
      }
      uint64_t left = in_flight_.fetch_sub(1) - 1;
      // Wake the scheduler only when it waits for this: a wake-up per answer
      // (futex) was the completion thread's largest cost.
      if (notify || (left == 0 && draining_.load()) || left == low_water_) {
        std::lock_guard guard(mu_);
        cv_.notify_one();
      }
    }
  }

  // Adds a counted report's samples to `s`; returns its rows.
  uint64_t Count(ThreadStats& s, const Call& call) {
    const v1::AgentReport& report = call.request->report();
    ReportTotals t = Totals(report);
    s.totals.busy_samples += t.busy_samples;
    s.totals.tls_samples += t.tls_samples;
    s.totals.rows += t.rows;
    ++s.by_collector[call.collector];
    if (o_.breakdown) {
      for (const auto& service : report.services()) {
        for (const auto& row : service.tls()) {
          std::string bucket = v1::Bucket_Name(row.bucket());
          if (bucket.starts_with("BUCKET_")) bucket = bucket.substr(7);
          std::transform(bucket.begin(), bucket.end(), bucket.begin(),
                         [](unsigned char ch) { return std::tolower(ch); });
          s.by_bucket[bucket] += row.samples();
          s.by_algorithm[bucket + "/" + row.algorithm()] += row.samples();
        }
      }
    }
    return t.rows;
  }

  const Fleet& fleet_;
  const DriverOptions& o_;
  // Per collector (--collector order), per connection.
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels_;
  std::vector<std::vector<std::unique_ptr<v1::Collector::Stub>>> stubs_;
  std::vector<std::vector<uint32_t>> order_;  // per agent: collector indexes, most preferred first
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<ThreadStats> stats_;
  std::atomic<uint64_t> in_flight_{0};
  std::unique_ptr<std::atomic<bool>[]> busy_;  // per agent: a report of it is in flight or waits for a retry
  std::atomic<bool> draining_{false};          // all reports started: the scheduler waits for the last answers
  std::atomic<int64_t> blocked_agent_{-1};     // the agent whose answer the scheduler waits for
  uint64_t attempts_ = 0;                      // scheduler thread only
  uint64_t low_water_ = 0;
  std::mutex mu_;  // guards retries_ and the wake-ups on cv_
  std::condition_variable cv_;
  std::priority_queue<Retry, std::vector<Retry>, std::greater<Retry>> retries_;
};

}  // namespace

void RequestStop() { g_stop.store(true); }

Result<DriverResult> RunLoad(const Fleet& fleet, const DriverOptions& options) {
  if (options.collectors.empty()) return MakeError("--collector HOST:PORT is required");
  if (!options.insecure && (options.tls_ca.empty() || options.tls_cert.empty() || options.tls_key.empty())) {
    return MakeError("give --tls-ca, --tls-cert and --tls-key (a relay identity's certificate), or --insecure");
  }
  if (options.connections == 0 || options.threads == 0 || options.max_in_flight == 0) {
    return MakeError("--connections, --threads and --max-in-flight must be at least 1");
  }
  // Debian's Abseil keeps absl::Mutex's lock-order (deadlock) graph on: a
  // graph update on every lock of gRPC's mutexes (GraphCycles::GetId), paid
  // for nothing here (bench/README.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Runner runner(fleet, options);
  auto connected = runner.Connect();
  if (!connected) return connected.error();
  return runner.Run();
}

}  // namespace tlsprof::loadgen
