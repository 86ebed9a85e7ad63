#include "collector/ingest/ingestor.h"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <chrono>
#include <tuple>

#include "collector/ingest/validate.h"

namespace tlsprof::collector {
namespace {

constexpr int64_t kNsPerMinute = 60LL * 1000 * 1000 * 1000;
// Summary minutes kept: the 60 a query may ask for plus the current one.
constexpr int64_t kSummaryMinutes = 61;

// FNV-1a, 64 bit: stable across runs (the hashes are persisted).
uint64_t Fnv1a(std::initializer_list<std::string_view> parts) {
  uint64_t h = 1469598103934665603ULL;
  for (std::string_view part : parts) {
    for (unsigned char c : part) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    h ^= 0xff;  // separator no label character can produce
    h *= 1099511628211ULL;
  }
  return h;
}

// The hashes of a series and of a service. The container labels enter only
// when set, so that a series outside containers hashes as it did before they
// existed: the hashes are persisted (the per-agent caps), and an older state
// directory must still count its series once.
uint64_t SeriesHash(const std::array<std::string_view, 7>& l) {
  if (l[5].empty() && l[6].empty()) return Fnv1a({l[0], l[1], l[2], l[3], l[4]});
  return Fnv1a({l[0], l[1], l[2], l[3], l[4], l[5], l[6]});
}

uint64_t ServiceHash(std::string_view name, std::string_view container_id, std::string_view pod_uid) {
  if (container_id.empty() && pod_uid.empty()) return Fnv1a({name});
  return Fnv1a({name, container_id, pod_uid});
}

// The hash of a usage series: its kind, then every label (container labels
// included, empty or not: these series have no older hashes to match).
template <size_t N>
uint64_t UsageHash(std::string_view kind, const std::array<std::string_view, N>& labels) {
  uint64_t h = Fnv1a({kind});
  for (std::string_view l : labels) {
    for (unsigned char c : l) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    h ^= 0xff;
    h *= 1099511628211ULL;
  }
  return h;
}

// Rows of a service besides its busy series and TLS rows: what is dropped
// with it at a cap.
uint32_t UsageRows(const v1::Service& s) {
  return static_cast<uint32_t>(s.handshakes_size() + s.operations_size() + s.connections_size());
}

double Seconds(uint64_t samples, uint64_t period_ns) {
  return static_cast<double>(samples) * static_cast<double>(period_ns) / 1e9;
}

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

prometheus::ClientMetric CounterMetric(std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  return m;
}

}  // namespace

std::string MakeAgentKey(std::string_view identity, std::string_view relay_hostname) {
  std::string key(identity);
  if (!relay_hostname.empty()) {
    key.push_back('\0');  // a certificate CN cannot contain NUL; hostnames are validated
    key.append(relay_hostname);
  }
  return key;
}

Ingestor::Ingestor(IngestOptions options) : options_(options) {}

bool Ingestor::TakeToken(const std::string& agent_key, int64_t now_ns) {
  std::lock_guard lock(mu_);
  auto it = buckets_.find(agent_key);
  if (it == buckets_.end()) {
    // Bounded: a bucket is made before the report is validated or admitted,
    // so keys that never became agents (invalid reports, refused at
    // max_agents) are swept once there are twice max_agents buckets. A swept
    // key starts again with a full bucket, as any new key does.
    if (buckets_.size() >= 2 * static_cast<size_t>(std::max<uint32_t>(options_.max_agents, 1))) {
      std::erase_if(buckets_, [&](const auto& entry) { return !agents_.count(entry.first); });
    }
    it = buckets_.try_emplace(agent_key).first;
  }
  return it->second.Take(now_ns, options_.rate_per_agent, options_.rate_burst);
}

ApplyResult Ingestor::Apply(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                            const std::function<void()>& commit, int64_t sent_ns) {
  std::lock_guard lock(mu_);
  return ApplyLocked(agent_key, report, received_ns, commit, sent_ns);
}

Result<ApplyResult> Ingestor::Replay(const state::JournalRecord& record) {
  if (!record.submit_request().empty()) {
    v1::SubmitRequest request;
    if (!request.ParseFromString(record.submit_request()))
      return MakeError("journal record: submit_request is not a SubmitRequest");
    std::lock_guard lock(mu_);
    return ApplyLocked(record.agent_key(), request.report(), record.received_unix_ns(), {}, request.sent_unix_ns());
  }
  std::lock_guard lock(mu_);
  return ApplyLocked(record.agent_key(), record.report(), record.received_unix_ns(), {}, 0);
}

std::string Ingestor::HostLabel(const std::string& hostname) {
  if (hosts_.count(hostname)) return hostname;
  if (hosts_.size() < options_.max_hosts) {
    hosts_.insert(hostname);
    return hostname;
  }
  return kOverflowHost;
}

bool Ingestor::MakeRoomForAgentLocked(int64_t now_ns) {
  if (now_ns < no_eviction_before_ns_) return false;
  auto oldest = std::min_element(agents_.begin(), agents_.end(), [](const auto& a, const auto& b) {
    return a.second.last_seen_ns < b.second.last_seen_ns;
  });
  if (oldest == agents_.end()) return true;
  if (now_ns - oldest->second.last_seen_ns < kAgentIdleEvictNs) {
    // Last-seen times only grow: no agent can be evicted before then.
    no_eviction_before_ns_ = oldest->second.last_seen_ns + kAgentIdleEvictNs;
    return false;
  }
  spdlog::warn("forgetting agent {} (silent since {}): the collector holds --max-agents {} agents", oldest->first,
               oldest->second.last_seen_ns, options_.max_agents);
  buckets_.erase(oldest->first);
  connection_series_ -= oldest->second.connections.size();
  agents_.erase(oldest);
  ++agents_evicted_;
  return true;
}

ApplyResult Ingestor::ApplyLocked(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                                  const std::function<void()>& commit, int64_t sent_ns) {
  ApplyResult result;
  auto agent_it = agents_.find(agent_key);
  if (agent_it == agents_.end()) {
    if (agents_.size() >= options_.max_agents && !MakeRoomForAgentLocked(received_ns)) {
      ++agents_refused_;
      result.refused = true;
      return result;
    }
    agent_it = agents_.try_emplace(agent_key).first;
  }
  Agent& agent = agent_it->second;
  auto it = agent.instances.find(report.agent_instance());
  if (it != agent.instances.end()) {
    SequenceWindow::Check check = it->second.window.Test(report.sequence());
    if (check != SequenceWindow::Check::kNew) {
      result.duplicate = true;
      result.too_old = check == SequenceWindow::Check::kTooOld;
      return result;
    }
  } else {
    if (agent.instances.size() >= kMaxInstancesPerAgent) {
      auto oldest = std::min_element(agent.instances.begin(), agent.instances.end(), [](const auto& a, const auto& b) {
        return a.second.last_seen_ns < b.second.last_seen_ns;
      });
      spdlog::warn("agent {}: forgetting instance seen last at {} (more than {} instances)", agent_key,
                   oldest->second.last_seen_ns, kMaxInstancesPerAgent);
      agent.instances.erase(oldest);
    }
    it = agent.instances.emplace(report.agent_instance(), Instance{}).first;
  }
  it->second.window.Mark(report.sequence());
  it->second.last_seen_ns = received_ns;
  agent.last_seen_ns = received_ns;
  ++agent.reports;
  if (agent.hostname != report.host().hostname()) agent.hostname = report.host().hostname();
  // Clock skew: the agent's send time against ours (network delay is noise
  // far below the tolerance). Without a send time, a window that ends in our
  // future still proves the agent ahead by at least that much.
  if (sent_ns != 0 || report.window().end_unix_ns() > received_ns + kSkewToleranceNs) {
    agent.skew_known = true;
    agent.skew_ns = sent_ns != 0 ? sent_ns - received_ns : report.window().end_unix_ns() - received_ns;
    if (agent.skew_ns > kSkewToleranceNs || agent.skew_ns < -kSkewToleranceNs) ++skewed_reports_;
  }

  const uint64_t period = report.window().period_ns();
  // By our receive time: the agent's clock may be anywhere (validate.h).
  const int64_t minute_index = FloorDiv(received_ns, kNsPerMinute);
  Minute& minute = minutes_[minute_index];
  minute.reports++;
  minute.agents.insert(Fnv1a({agent_key}));
  ++reports_;

  std::map<std::array<std::string, 4>, double> connections;  // the report's (with usage)
  for (const v1::Service& service : report.services()) {
    // (name, container, pod) is the service: a container multiplies them,
    // and each counts toward max_services_per_agent.
    const uint64_t service_hash = ServiceHash(service.name(), service.container_id(), service.pod_uid());
    if (!agent.services.count(service_hash)) {
      if (agent.services.size() >= options_.max_services_per_agent) {
        // Its busy series, every TLS series and every usage row.
        result.dropped_series += 1 + service.tls_size() + UsageRows(service);
        continue;
      }
      agent.services.insert(service_hash);
    }
    const double busy = Seconds(service.busy_samples(), period);
    const std::array<std::string_view, 3> busy_key = {service.name(), service.container_id(), service.pod_uid()};
    auto busy_it = busy_.find(busy_key);
    if (busy_it == busy_.end()) {
      if (SeriesLocked() >= options_.max_series) {
        result.dropped_series += 1 + service.tls_size() + UsageRows(service);
        series_refused_ += 1 + service.tls_size() + UsageRows(service);
        continue;
      }
      busy_it = busy_.try_emplace(BusyKey{service.name(), service.container_id(), service.pod_uid()}).first;
    }
    busy_it->second += busy;
    minute.busy_seconds += busy;
    for (const v1::TlsCpu& row : service.tls()) {
      const std::string_view bucket = BucketName(row.bucket());
      const std::string_view phase = PhaseName(row.phase());
      const std::array<std::string_view, 7> labels = {
          bucket, row.algorithm(), phase, row.library(), service.name(), service.container_id(), service.pod_uid()};
      const uint64_t series_hash = SeriesHash(labels);
      auto* series = cpu_.Find(series_hash, labels);
      if (!AdmitSeriesLocked(agent, series_hash, series != nullptr, result)) continue;
      if (series == nullptr) series = &cpu_.FindOrInsert(series_hash, labels);
      const double seconds = Seconds(row.samples(), period);
      series->value += seconds;
      minute.tls_seconds += seconds;
      minute.bucket_seconds[row.bucket()] += seconds;
      auto alg =
          minute.algorithms.find(std::make_pair(static_cast<int>(row.bucket()), std::string_view(row.algorithm())));
      if (alg == minute.algorithms.end()) {
        const bool overflow = minute.algorithms.size() >= kMaxSummaryAlgorithms;
        alg = minute.algorithms
                  .try_emplace(std::make_pair(static_cast<int>(row.bucket()),
                                              overflow ? std::string(kOverflowAlgorithm) : row.algorithm()),
                               0.0)
                  .first;
      }
      alg->second += seconds;
      if (options_.host_labels) host_cpu_[{HostLabel(report.host().hostname()), std::string(bucket)}] += seconds;
    }
    if (report.has_usage()) ApplyUsageLocked(agent, service, connections, result);
  }
  if (options_.host_labels) host_busy_[HostLabel(report.host().hostname())] += Seconds(report.busy_samples(), period);
  if (report.has_usage()) {
    const v1::UsageStats& u = report.usage();
    probe_cpu_seconds_ += u.probe_cpu_seconds();
    probe_budget_cpu_seconds_ += u.budget_cpu_seconds();
    probe_hits_ += u.probe_hits();
    // The gauge is the latest report's: a late batch (a lower sequence of
    // the same instance) does not replace it. Another instance (the agent
    // restarted with a new state directory) always does.
    if (!agent.usage_known || agent.usage_instance != report.agent_instance() ||
        report.sequence() > agent.usage_sequence) {
      agent.usage_known = true;
      agent.usage_instance = report.agent_instance();
      agent.usage_sequence = report.sequence();
      agent.usage_received_ns = received_ns;
      agent.usage_window_ns = report.window().end_unix_ns() - report.window().start_unix_ns();
      agent.duty_cycle = u.duty_cycle();
      agent.relative_error = u.relative_error();
      connection_series_ -= agent.connections.size();
      agent.connections = std::move(connections);
      connection_series_ += agent.connections.size();
    }
  }

  PruneMinutes(FloorDiv(received_ns, kNsPerMinute));
  if (commit) commit();
  return result;
}

bool Ingestor::AdmitSeriesLocked(Agent& agent, uint64_t hash, bool exists, ApplyResult& result) {
  const bool known = agent.series.count(hash);
  if (!known && agent.series.size() >= options_.max_series_per_agent) {
    ++result.dropped_series;
    return false;
  }
  if (!exists && SeriesLocked() >= options_.max_series) {
    ++result.dropped_series;
    ++series_refused_;
    return false;
  }
  if (!known) agent.series.insert(hash);
  return true;
}

void Ingestor::ApplyUsageLocked(Agent& agent, const v1::Service& service,
                                std::map<std::array<std::string, 4>, double>& connections, ApplyResult& result) {
  const std::string_view name = service.name(), container = service.container_id(), pod = service.pod_uid();
  for (const v1::Handshakes& h : service.handshakes()) {
    const std::array<std::string_view, kHandshakeLabelNames.size()> labels = {name,
                                                                              container,
                                                                              pod,
                                                                              h.library(),
                                                                              v1::SideLabel(h.side()),
                                                                              v1::HandshakeKindLabel(h.kind()),
                                                                              h.version(),
                                                                              h.cipher_suite(),
                                                                              h.group(),
                                                                              h.cert_key_type()};
    const uint64_t hash = UsageHash("handshakes", labels);
    auto* entry = handshakes_.Find(hash, labels);
    if (!AdmitSeriesLocked(agent, hash, entry != nullptr, result)) continue;
    if (entry == nullptr) entry = &handshakes_.FindOrInsert(hash, labels);
    entry->value += h.estimated();
  }
  for (const v1::CryptoOperations& o : service.operations()) {
    const std::array<std::string_view, kOperationLabelNames.size()> labels = {name,
                                                                              container,
                                                                              pod,
                                                                              o.library(),
                                                                              v1::OperationLabel(o.operation()),
                                                                              o.algorithm(),
                                                                              o.in_handshake() ? "true" : "false"};
    const uint64_t hash = UsageHash("operations", labels);
    auto* entry = operations_.Find(hash, labels);
    if (!AdmitSeriesLocked(agent, hash, entry != nullptr, result)) continue;
    if (entry == nullptr) entry = &operations_.FindOrInsert(hash, labels);
    OperationTotals& t = entry->value;
    t.estimated += o.estimated();
    // Validation: estimated is 0 when observed is.
    if (o.observed() > 0) t.cpu_seconds += o.cpu_seconds() * (o.estimated() / static_cast<double>(o.observed()));
    // The histogram is of the observed operations, and only of rows that
    // carry one, so that its count, sum and buckets agree.
    if (o.latency_buckets_size() == static_cast<int>(v1::kLatencyBuckets)) {
      t.observed += o.observed();
      t.observed_cpu_seconds += o.cpu_seconds();
      for (size_t i = 0; i < v1::kLatencyBuckets; ++i) t.buckets[i] += o.latency_buckets(static_cast<int>(i));
    }
  }
  for (const v1::Connections& c : service.connections()) {
    const std::array<std::string_view, kConnectionLabelNames.size()> labels = {name, container, pod, c.library()};
    std::array<std::string, 4> key = {std::string(name), std::string(container), std::string(pod), c.library()};
    const bool exists = agent.connections.count(key) || connections.count(key);
    if (!AdmitSeriesLocked(agent, UsageHash("connections", labels), exists, result)) continue;
    connections[std::move(key)] += c.estimated();
  }
}

bool Ingestor::UsageCurrent(const Agent& agent, int64_t now_ns) {
  if (!agent.usage_known) return false;
  const int64_t horizon = std::max(kUsageHorizonMinNs, kUsageHorizonWindows * agent.usage_window_ns);
  return now_ns - agent.usage_received_ns <= horizon;
}

void Ingestor::PruneMinutes(int64_t now_minute) {
  while (!minutes_.empty() && minutes_.begin()->first < now_minute - kSummaryMinutes) minutes_.erase(minutes_.begin());
}

void Ingestor::Checkpoint(const std::function<void(state::State&)>& fn) const {
  std::lock_guard lock(mu_);
  state::State snapshot;
  SnapshotLocked(snapshot);
  fn(snapshot);
}

void Ingestor::Checkpoint(state::State& into, const std::function<void()>& fn) const {
  // Under the lock only a copy of the containers (cheap next to building the
  // snapshot message); `fn` runs before the lock is released.
  Ingestor copy(options_);
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    copy.reports_ = reports_;
    copy.cpu_ = cpu_;
    copy.busy_ = busy_;
    copy.host_cpu_ = host_cpu_;
    copy.host_busy_ = host_busy_;
    copy.agents_ = agents_;
    copy.minutes_ = minutes_;
    copy.handshakes_ = handshakes_;
    copy.operations_ = operations_;
    copy.probe_cpu_seconds_ = probe_cpu_seconds_;
    copy.probe_budget_cpu_seconds_ = probe_budget_cpu_seconds_;
    copy.probe_hits_ = probe_hits_;
    copy.skewed_reports_ = skewed_reports_;
    copy.agents_evicted_ = agents_evicted_;
    copy.agents_refused_ = agents_refused_;
    copy.series_refused_ = series_refused_;
    fn();
  }
  const auto copied = std::chrono::steady_clock::now();
  copy.SnapshotLocked(into);
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  spdlog::debug("checkpoint: {:.1f} ms to lock and copy the state, {:.1f} ms to build the snapshot after",
                ms(copied - start), ms(std::chrono::steady_clock::now() - copied));
}

void Ingestor::SnapshotLocked(state::State& s) const {
  s.set_reports(reports_);
  s.set_skewed_reports(skewed_reports_);
  s.set_agents_evicted(agents_evicted_);
  s.set_agents_refused(agents_refused_);
  s.set_series_refused(series_refused_);
  for (const auto& [hash, series] : cpu_) {
    const CpuKey& key = series.labels;
    const double seconds = series.value;
    state::CpuSeries* c = s.add_cpu();
    c->set_bucket(key[0]);
    c->set_algorithm(key[1]);
    c->set_phase(key[2]);
    c->set_library(key[3]);
    c->set_service(key[4]);
    c->set_container_id(key[5]);
    c->set_pod_uid(key[6]);
    c->set_seconds(seconds);
  }
  for (const auto& [key, seconds] : busy_) {
    state::NamedSeconds* b = s.add_busy();
    b->set_name(key[0]);
    b->set_container_id(key[1]);
    b->set_pod_uid(key[2]);
    b->set_seconds(seconds);
  }
  for (const auto& [key, seconds] : host_cpu_) {
    state::HostCpu* h = s.add_host_cpu();
    h->set_host(key.first);
    h->set_bucket(key.second);
    h->set_seconds(seconds);
  }
  for (const auto& [name, seconds] : host_busy_) {
    state::NamedSeconds* b = s.add_host_busy();
    b->set_name(name);
    b->set_seconds(seconds);
  }
  for (const auto& [hash, entry] : handshakes_) {
    state::UsageSeries* u = s.add_handshakes();
    u->mutable_labels()->Add(entry.labels.begin(), entry.labels.end());
    u->set_value(entry.value);
  }
  for (const auto& [hash, entry] : operations_) {
    state::UsageSeries* u = s.add_operations();
    u->mutable_labels()->Add(entry.labels.begin(), entry.labels.end());
    const OperationTotals& t = entry.value;
    u->set_value(t.estimated);
    u->set_cpu_seconds(t.cpu_seconds);
    u->set_observed(t.observed);
    u->set_observed_cpu_seconds(t.observed_cpu_seconds);
    u->mutable_latency_buckets()->Add(t.buckets.begin(), t.buckets.end());
  }
  s.set_probe_cpu_seconds(probe_cpu_seconds_);
  s.set_probe_budget_cpu_seconds(probe_budget_cpu_seconds_);
  s.set_probe_hits(probe_hits_);
  for (const auto& [key, agent] : agents_) {
    state::Agent* a = s.add_agents();
    a->set_key(key);
    a->set_last_seen_unix_ns(agent.last_seen_ns);
    a->set_reports(agent.reports);
    a->set_hostname(agent.hostname);
    if (agent.skew_known) a->set_clock_skew_ns(agent.skew_ns);
    if (agent.usage_known) {
      a->set_usage_instance(agent.usage_instance);
      a->set_usage_sequence(agent.usage_sequence);
      a->set_usage_received_unix_ns(agent.usage_received_ns);
      a->set_usage_window_ns(agent.usage_window_ns);
      a->set_duty_cycle(agent.duty_cycle);
      a->set_relative_error(agent.relative_error);
      for (const auto& [labels, value] : agent.connections) {
        state::UsageSeries* u = a->add_connections();
        u->mutable_labels()->Add(labels.begin(), labels.end());
        u->set_value(value);
      }
    }
    for (const auto& [id, instance] : agent.instances) {
      state::Instance* i = a->add_instances();
      i->set_instance(id);
      i->set_highest(instance.window.highest());
      for (uint64_t w : instance.window.Words()) i->add_seen(w);
      i->set_last_seen_unix_ns(instance.last_seen_ns);
    }
    a->mutable_series()->Add(agent.series.begin(), agent.series.end());
    a->mutable_services()->Add(agent.services.begin(), agent.services.end());
  }
  for (const auto& [index, minute] : minutes_) {
    state::Minute* m = s.add_minutes();
    m->set_minute(index);
    m->set_reports(minute.reports);
    for (uint64_t h : minute.agents) m->add_agents(h);
    m->set_busy_seconds(minute.busy_seconds);
    m->set_tls_seconds(minute.tls_seconds);
    for (double v : minute.bucket_seconds) m->add_bucket_seconds(v);
    for (const auto& [key, seconds] : minute.algorithms) {
      state::AlgorithmSeconds* a = m->add_algorithms();
      a->set_bucket(key.first);
      a->set_algorithm(key.second);
      a->set_seconds(seconds);
    }
  }
}

Status Ingestor::Restore(const state::State& s) {
  std::lock_guard lock(mu_);
  reports_ = s.reports();
  skewed_reports_ = s.skewed_reports();
  agents_evicted_ = s.agents_evicted();
  agents_refused_ = s.agents_refused();
  series_refused_ = s.series_refused();
  cpu_.clear();
  busy_.clear();
  host_cpu_.clear();
  host_busy_.clear();
  hosts_.clear();
  agents_.clear();
  minutes_.clear();
  handshakes_.clear();
  operations_.clear();
  connection_series_ = 0;
  probe_cpu_seconds_ = s.probe_cpu_seconds();
  probe_budget_cpu_seconds_ = s.probe_budget_cpu_seconds();
  probe_hits_ = s.probe_hits();
  // The label count of every usage series must be its kind's: a snapshot is
  // the collector's own, so a mismatch is corruption, not an older format.
  auto check_labels = [](const state::UsageSeries& u, size_t n, std::string_view what) -> Status {
    if (u.labels_size() != static_cast<int>(n)) {
      return MakeError("snapshot: a {} series has {} labels, expected {}", what, u.labels_size(), n);
    }
    return OkStatus();
  };
  for (const state::UsageSeries& u : s.handshakes()) {
    if (auto st = check_labels(u, kHandshakeLabelNames.size(), "handshake"); !st.ok()) return st;
    std::array<std::string_view, kHandshakeLabelNames.size()> labels;
    std::copy(u.labels().begin(), u.labels().end(), labels.begin());
    handshakes_.FindOrInsert(UsageHash("handshakes", labels), labels).value = u.value();
  }
  for (const state::UsageSeries& u : s.operations()) {
    if (auto st = check_labels(u, kOperationLabelNames.size(), "operation"); !st.ok()) return st;
    if (u.latency_buckets_size() != static_cast<int>(v1::kLatencyBuckets)) {
      return MakeError("snapshot: an operation series has {} latency buckets, expected {}", u.latency_buckets_size(),
                       v1::kLatencyBuckets);
    }
    std::array<std::string_view, kOperationLabelNames.size()> labels;
    std::copy(u.labels().begin(), u.labels().end(), labels.begin());
    OperationTotals& t = operations_.FindOrInsert(UsageHash("operations", labels), labels).value;
    t.estimated = u.value();
    t.cpu_seconds = u.cpu_seconds();
    t.observed = u.observed();
    t.observed_cpu_seconds = u.observed_cpu_seconds();
    std::copy(u.latency_buckets().begin(), u.latency_buckets().end(), t.buckets.begin());
  }
  // A snapshot from before the container fields restores with them "".
  for (const state::CpuSeries& c : s.cpu()) {
    const std::array<std::string_view, 7> labels = {c.bucket(),  c.algorithm(),    c.phase(),  c.library(),
                                                    c.service(), c.container_id(), c.pod_uid()};
    cpu_.FindOrInsert(SeriesHash(labels), labels).value = c.seconds();
  }
  for (const state::NamedSeconds& b : s.busy()) busy_[{b.name(), b.container_id(), b.pod_uid()}] = b.seconds();
  for (const state::HostCpu& h : s.host_cpu()) host_cpu_[{h.host(), h.bucket()}] = h.seconds();
  for (const state::NamedSeconds& b : s.host_busy()) {
    host_busy_[b.name()] = b.seconds();
    if (b.name() != kOverflowHost) hosts_.insert(b.name());
  }
  for (const state::HostCpu& h : s.host_cpu()) {
    if (h.host() != kOverflowHost) hosts_.insert(h.host());
  }
  for (const state::Agent& a : s.agents()) {
    Agent& agent = agents_[a.key()];
    agent.last_seen_ns = a.last_seen_unix_ns();
    agent.reports = a.reports();
    agent.hostname = a.hostname();
    agent.skew_known = a.has_clock_skew_ns();
    agent.skew_ns = a.clock_skew_ns();
    agent.usage_known = a.has_duty_cycle();
    agent.usage_instance = a.usage_instance();
    agent.usage_sequence = a.usage_sequence();
    agent.usage_received_ns = a.usage_received_unix_ns();
    agent.usage_window_ns = a.usage_window_ns();
    agent.duty_cycle = a.has_duty_cycle() ? a.duty_cycle() : 1.0;
    agent.relative_error = a.relative_error();
    for (const state::UsageSeries& u : a.connections()) {
      if (auto st = check_labels(u, kConnectionLabelNames.size(), "connection"); !st.ok()) return st;
      agent.connections[{u.labels(0), u.labels(1), u.labels(2), u.labels(3)}] = u.value();
    }
    connection_series_ += agent.connections.size();
    for (const state::Instance& i : a.instances()) {
      if (i.seen_size() != static_cast<int>(SequenceWindow::kWidth / 64)) {
        return MakeError("snapshot: agent instance window has {} words, expected {}", i.seen_size(),
                         SequenceWindow::kWidth / 64);
      }
      Instance& instance = agent.instances[i.instance()];
      instance.window = SequenceWindow::FromWords(i.highest(), {i.seen().begin(), i.seen().end()});
      instance.last_seen_ns = i.last_seen_unix_ns();
    }
    agent.series.insert(a.series().begin(), a.series().end());
    agent.services.insert(a.services().begin(), a.services().end());
  }
  for (const state::Minute& m : s.minutes()) {
    Minute& minute = minutes_[m.minute()];
    minute.reports = m.reports();
    minute.agents.insert(m.agents().begin(), m.agents().end());
    minute.busy_seconds = m.busy_seconds();
    minute.tls_seconds = m.tls_seconds();
    for (int i = 0; i < m.bucket_seconds_size() && i < static_cast<int>(minute.bucket_seconds.size()); ++i) {
      minute.bucket_seconds[i] = m.bucket_seconds(i);
    }
    for (const state::AlgorithmSeconds& a : m.algorithms())
      minute.algorithms[{a.bucket(), a.algorithm()}] = a.seconds();
  }
  return OkStatus();
}

std::vector<prometheus::MetricFamily> Ingestor::CollectData(int64_t now_ns) const {
  if (now_ns == 0) {
    now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count();
  }
  // Under the lock only a copy of the values (the labels are read after it:
  // series are never erased while serving and their labels never change), so
  // that a scrape does not hold up Submit while it formats.
  std::vector<std::pair<const CpuKey*, double>> cpu;
  std::vector<std::pair<BusyKey, double>> busy;
  std::vector<std::pair<std::pair<std::string, std::string>, double>> host_cpu;
  std::vector<std::pair<std::string, double>> host_busy;
  uint64_t reports = 0;
  uint64_t evicted = 0, refused = 0, series_refused = 0, skewed = 0;
  size_t agents = 0, series_total = 0;
  int64_t max_skew_ns = 0;
  std::vector<std::pair<const std::array<std::string, kHandshakeLabelNames.size()>*, double>> handshakes;
  std::vector<std::pair<const std::array<std::string, kOperationLabelNames.size()>*, OperationTotals>> operations;
  std::map<std::array<std::string, kConnectionLabelNames.size()>, double> connections;
  double probe_cpu = 0, probe_budget = 0, min_duty = 1, max_error = 0;
  uint64_t probe_hits = 0;
  size_t usage_agents = 0;
  {
    std::lock_guard lock(mu_);
    evicted = agents_evicted_;
    refused = agents_refused_;
    series_refused = series_refused_;
    skewed = skewed_reports_;
    agents = agents_.size();
    series_total = SeriesLocked();
    for (const auto& [key, agent] : agents_) {
      if (!agent.skew_known || agent.last_seen_ns < now_ns - kSkewHorizonNs) continue;
      max_skew_ns = std::max(max_skew_ns, agent.skew_ns < 0 ? -agent.skew_ns : agent.skew_ns);
    }
    cpu.reserve(cpu_.size());
    for (const auto& [hash, series] : cpu_) cpu.emplace_back(&series.labels, series.value);
    handshakes.reserve(handshakes_.size());
    for (const auto& [hash, entry] : handshakes_) handshakes.emplace_back(&entry.labels, entry.value);
    operations.reserve(operations_.size());
    for (const auto& [hash, entry] : operations_) operations.emplace_back(&entry.labels, entry.value);
    probe_cpu = probe_cpu_seconds_;
    probe_budget = probe_budget_cpu_seconds_;
    probe_hits = probe_hits_;
    for (const auto& [key, agent] : agents_) {
      if (!UsageCurrent(agent, now_ns)) continue;
      ++usage_agents;
      min_duty = std::min(min_duty, agent.duty_cycle);
      max_error = std::max(max_error, agent.relative_error);
      for (const auto& [labels, value] : agent.connections) connections[labels] += value;
    }
    busy.assign(busy_.begin(), busy_.end());
    reports = reports_;
    if (options_.host_labels) {
      host_cpu.assign(host_cpu_.begin(), host_cpu_.end());
      host_busy.assign(host_busy_.begin(), host_busy_.end());
    }
  }
  std::sort(cpu.begin(), cpu.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
  std::vector<prometheus::MetricFamily> families;
  {
    prometheus::MetricFamily f{
        "tlsprof_cpu_seconds_total", "CPU-seconds inside TLS code", prometheus::MetricType::Counter, {}};
    f.metric.reserve(cpu.size());
    for (const auto& [key, seconds] : cpu) {
      const CpuKey& k = *key;
      // container_id and pod_uid only when set (docs/fleet.md, "Metrics"):
      // they are part of the series' key, so a series never changes its label names.
      std::vector<prometheus::ClientMetric::Label> labels = {{"algorithm", k[1]}, {"bucket", k[0]}};
      if (!k[5].empty()) labels.push_back({"container_id", k[5]});
      labels.insert(labels.end(), {{"library", k[3]}, {"phase", k[2]}});
      if (!k[6].empty()) labels.push_back({"pod_uid", k[6]});
      labels.push_back({"service", k[4]});
      f.metric.push_back(CounterMetric(std::move(labels), seconds));
    }
    families.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{"tlsprof_busy_cpu_seconds_total",
                               "Busy CPU-seconds (user + kernel) of the service's processes; (non-tls) holds the rest",
                               prometheus::MetricType::Counter,
                               {}};
    for (const auto& [key, seconds] : busy) {
      std::vector<prometheus::ClientMetric::Label> labels;
      if (!key[1].empty()) labels.push_back({"container_id", key[1]});
      if (!key[2].empty()) labels.push_back({"pod_uid", key[2]});
      labels.push_back({"service", key[0]});
      f.metric.push_back(CounterMetric(std::move(labels), seconds));
    }
    families.push_back(std::move(f));
  }
  {
    // Usage telemetry (docs/fleet.md, "Usage telemetry"): counts are the
    // estimates (scaled for the probes' duty cycle); the histogram is of
    // the observed operations.
    auto by_labels = [](const auto& a, const auto& b) { return *a.first < *b.first; };
    std::sort(handshakes.begin(), handshakes.end(), by_labels);
    std::sort(operations.begin(), operations.end(), by_labels);
    prometheus::MetricFamily hs{"tlsprof_handshakes_total",
                                "Completed TLS handshakes (estimated for the usage probes' duty cycle)",
                                prometheus::MetricType::Counter,
                                {}};
    for (const auto& [labels, value] : handshakes)
      hs.metric.push_back(CounterMetric(UsageLabels(kHandshakeLabelNames, *labels), value));
    families.push_back(std::move(hs));
    prometheus::MetricFamily ops{"tlsprof_crypto_operations_total",
                                 "Public-key operations: signatures, verifications, key exchanges (estimated)",
                                 prometheus::MetricType::Counter,
                                 {}};
    prometheus::MetricFamily ops_cpu{"tlsprof_crypto_operation_cpu_seconds_total",
                                     "On-CPU seconds of the public-key operations (estimated)",
                                     prometheus::MetricType::Counter,
                                     {}};
    prometheus::MetricFamily latency{"tlsprof_crypto_operation_latency_seconds",
                                     "On-CPU latency of the observed public-key operations",
                                     prometheus::MetricType::Histogram,
                                     {}};
    for (const auto& [labels, totals] : operations) {
      auto l = UsageLabels(kOperationLabelNames, *labels);
      ops.metric.push_back(CounterMetric(l, totals.estimated));
      ops_cpu.metric.push_back(CounterMetric(l, totals.cpu_seconds));
      prometheus::ClientMetric m;
      m.label = std::move(l);
      m.histogram = LatencyHistogram(totals);
      latency.metric.push_back(std::move(m));
    }
    families.push_back(std::move(ops));
    families.push_back(std::move(ops_cpu));
    families.push_back(std::move(latency));
    prometheus::MetricFamily conns{"tlsprof_tls_connections",
                                   "Live TLS connections: the sum of each agent's latest value (agents that went "
                                   "silent drop out)",
                                   prometheus::MetricType::Gauge,
                                   {}};
    for (const auto& [labels, value] : connections) {
      prometheus::ClientMetric m;
      m.label = UsageLabels(kConnectionLabelNames, labels);
      m.gauge.value = value;
      conns.metric.push_back(std::move(m));
    }
    families.push_back(std::move(conns));
    families.push_back({"tlsprof_usage_probe_cpu_seconds_total",
                        "CPU-seconds the agents' usage probes cost (their estimate)",
                        prometheus::MetricType::Counter,
                        {CounterMetric({}, probe_cpu)}});
    families.push_back({"tlsprof_usage_probe_budget_cpu_seconds_total",
                        "CPU-seconds the agents' usage probe budgets allowed (agents without a budget add 0)",
                        prometheus::MetricType::Counter,
                        {CounterMetric({}, probe_budget)}});
    families.push_back({"tlsprof_usage_probe_hits_total",
                        "Usage probe and return-probe runs on the agents",
                        prometheus::MetricType::Counter,
                        {CounterMetric({}, static_cast<double>(probe_hits))}});
    // Only while some agent reports usage: a duty cycle of nobody is no 1.
    for (const auto& [name, help, value] :
         {std::tuple<const char*, const char*, double>{
              "tlsprof_usage_probe_min_duty_cycle",
              "Lowest duty cycle of the usage probes among the agents reporting usage now", min_duty},
          {"tlsprof_usage_max_relative_error",
           "Largest relative error (95%) of the usage estimates among the agents reporting usage now", max_error}}) {
      if (usage_agents == 0) break;
      prometheus::ClientMetric m;
      m.gauge.value = value;
      families.push_back({name, help, prometheus::MetricType::Gauge, {m}});
    }
  }
  {
    prometheus::MetricFamily f{"tlsprof_reports_total", "Profile windows counted", prometheus::MetricType::Counter, {}};
    f.metric.push_back(CounterMetric({}, static_cast<double>(reports)));
    families.push_back(std::move(f));
  }
  {
    auto gauge = [](double value) {
      prometheus::ClientMetric m;
      m.gauge.value = value;
      return m;
    };
    prometheus::MetricFamily skew{"tlsprof_collector_clock_skew_seconds",
                                  "Largest |agent clock - collector clock| of the agents seen in the last 5 minutes",
                                  prometheus::MetricType::Gauge,
                                  {gauge(static_cast<double>(max_skew_ns) / 1e9)}};
    families.push_back(std::move(skew));
    prometheus::MetricFamily skewed_family{
        "tlsprof_collector_skewed_reports_total",
        "Reports accepted from an agent whose clock was off by more than 30 s (counted all the same)",
        prometheus::MetricType::Counter,
        {CounterMetric({}, static_cast<double>(skewed))}};
    families.push_back(std::move(skewed_family));
    prometheus::MetricFamily held{"tlsprof_collector_agent_keys",
                                  "Agent keys held in memory (at most --max-agents)",
                                  prometheus::MetricType::Gauge,
                                  {gauge(static_cast<double>(agents))}};
    families.push_back(std::move(held));
    prometheus::MetricFamily limit{
        "tlsprof_collector_agent_limit_total",
        "New agent keys at --max-agents: evicted = an idle agent's state forgotten for it, refused = its report "
        "answered RESOURCE_EXHAUSTED",
        prometheus::MetricType::Counter,
        {CounterMetric({{"action", "evicted"}}, static_cast<double>(evicted)),
         CounterMetric({{"action", "refused"}}, static_cast<double>(refused))}};
    families.push_back(std::move(limit));
    prometheus::MetricFamily series_family{"tlsprof_collector_series",
                                           "Data series held (tlsprof_cpu_seconds_total, tlsprof_busy_cpu_seconds_"
                                           "total and the usage telemetry's; at most --max-series)",
                                           prometheus::MetricType::Gauge,
                                           {gauge(static_cast<double>(series_total))}};
    families.push_back(std::move(series_family));
    prometheus::MetricFamily series_limit{"tlsprof_collector_series_limit_dropped_total",
                                          "Series dropped because --max-series series are held",
                                          prometheus::MetricType::Counter,
                                          {CounterMetric({}, static_cast<double>(series_refused))}};
    families.push_back(std::move(series_limit));
  }
  if (options_.host_labels) {
    prometheus::MetricFamily cpu_family{
        "tlsprof_host_cpu_seconds_total", "CPU-seconds inside TLS code, per host", prometheus::MetricType::Counter, {}};
    for (const auto& [key, seconds] : host_cpu) {
      cpu_family.metric.push_back(CounterMetric({{"bucket", key.second}, {"host", key.first}}, seconds));
    }
    families.push_back(std::move(cpu_family));
    prometheus::MetricFamily busy_family{
        "tlsprof_host_busy_cpu_seconds_total", "Busy CPU-seconds, per host", prometheus::MetricType::Counter, {}};
    for (const auto& [host, seconds] : host_busy)
      busy_family.metric.push_back(CounterMetric({{"host", host}}, seconds));
    families.push_back(std::move(busy_family));
  }
  return families;
}

size_t Ingestor::ActiveAgents(int64_t now_ns, int64_t horizon_ns) const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, agent] : agents_) {
    if (agent.last_seen_ns >= now_ns - horizon_ns) ++n;
  }
  return n;
}

nlohmann::json Ingestor::Summary(int minutes, int64_t now_ns) const {
  // Minute granularity: a minute counts when it began within the last `minutes`.
  const int64_t first = FloorDiv(now_ns, kNsPerMinute) - minutes + 1;
  uint64_t reports = 0;
  std::unordered_set<uint64_t> agents;
  double busy = 0, tls = 0;
  std::array<double, 6> buckets{};
  std::map<std::pair<int, std::string>, double> algorithms;
  {
    std::lock_guard lock(mu_);
    for (auto it = minutes_.lower_bound(first); it != minutes_.end(); ++it) {
      const Minute& m = it->second;
      reports += m.reports;
      agents.insert(m.agents.begin(), m.agents.end());
      busy += m.busy_seconds;
      tls += m.tls_seconds;
      for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += m.bucket_seconds[i];
      for (const auto& [key, seconds] : m.algorithms) algorithms[key] += seconds;
    }
  }
  auto share = [tls](double v) { return tls > 0 ? v / tls : 0.0; };
  nlohmann::json out = {{"minutes", minutes},      {"reports", reports},
                        {"agents", agents.size()}, {"busy_cpu_seconds", busy},
                        {"tls_cpu_seconds", tls},  {"tls_share", busy > 0 ? tls / busy : 0.0}};
  out["buckets"] = nlohmann::json::array();
  for (int b = v1::BUCKET_CIPHER; b <= v1::BUCKET_OTHER; ++b) {
    out["buckets"].push_back({{"bucket", BucketName(static_cast<v1::Bucket>(b))},
                              {"cpu_seconds", buckets[b]},
                              {"share_of_tls", share(buckets[b])}});
  }
  std::vector<std::pair<std::pair<int, std::string>, double>> sorted(algorithms.begin(), algorithms.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  out["algorithms"] = nlohmann::json::array();
  for (const auto& [key, seconds] : sorted) {
    out["algorithms"].push_back({{"bucket", BucketName(static_cast<v1::Bucket>(key.first))},
                                 {"algorithm", key.second},
                                 {"cpu_seconds", seconds},
                                 {"share_of_tls", share(seconds)}});
  }
  return out;
}

nlohmann::json Ingestor::Trend(int minutes, int64_t now_ns) const {
  // The same minutes as Summary (window end at minute granularity), not
  // filled in: a minute without reports has no share, and a zero would read
  // as "no TLS".
  const int64_t first = FloorDiv(now_ns, kNsPerMinute) - minutes + 1;
  struct Point {
    int64_t minute;
    uint64_t reports;
    size_t agents;
    double busy, tls;
    std::array<double, 6> buckets;
  };
  std::vector<Point> points;
  {
    std::lock_guard lock(mu_);
    for (auto it = minutes_.lower_bound(first); it != minutes_.end(); ++it) {
      const Minute& m = it->second;
      points.push_back({it->first, m.reports, m.agents.size(), m.busy_seconds, m.tls_seconds, m.bucket_seconds});
    }
  }
  nlohmann::json out = {{"minutes", minutes}, {"now", now_ns / 1'000'000'000}, {"points", nlohmann::json::array()}};
  for (const Point& p : points) {
    nlohmann::json buckets = nlohmann::json::object();
    for (int b = v1::BUCKET_CIPHER; b <= v1::BUCKET_OTHER; ++b)
      buckets[std::string(BucketName(static_cast<v1::Bucket>(b)))] = p.buckets[b];
    out["points"].push_back({{"minute", p.minute * 60},
                             {"reports", p.reports},
                             {"agents", p.agents},
                             {"busy_cpu_seconds", p.busy},
                             {"tls_cpu_seconds", p.tls},
                             {"tls_share", p.busy > 0 ? p.tls / p.busy : 0.0},
                             {"bucket_cpu_seconds", std::move(buckets)}});
  }
  return out;
}

nlohmann::json Ingestor::Agents(size_t limit, int64_t now_ns) const {
  struct Row {
    std::string key, hostname;
    int64_t last_seen_ns;
    uint64_t reports;
    size_t instances, series, services;
    bool skew_known;
    int64_t skew_ns;
  };
  std::vector<Row> rows;
  size_t total = 0;
  {
    // Under the lock: pick the `limit` most recent (a partial sort of
    // pointers), then copy only those.
    std::lock_guard lock(mu_);
    std::vector<const std::pair<const std::string, Agent>*> all;
    all.reserve(agents_.size());
    for (const auto& entry : agents_) all.push_back(&entry);
    total = all.size();
    const size_t n = std::min(limit, all.size());
    std::partial_sort(all.begin(), all.begin() + n, all.end(), [](const auto* a, const auto* b) {
      if (a->second.last_seen_ns != b->second.last_seen_ns) return a->second.last_seen_ns > b->second.last_seen_ns;
      return a->first < b->first;
    });
    rows.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& [key, agent] = *all[i];
      rows.push_back({key, agent.hostname, agent.last_seen_ns, agent.reports, agent.instances.size(),
                      agent.series.size(), agent.services.size(), agent.skew_known, agent.skew_ns});
    }
  }
  nlohmann::json out = {{"now", now_ns / 1'000'000'000},
                        {"total", total},
                        {"truncated", rows.size() < total},
                        {"agents", nlohmann::json::array()}};
  for (const Row& r : rows) {
    // MakeAgentKey: identity, then NUL and the hostname for a relay's host.
    const size_t nul = r.key.find('\0');
    out["agents"].push_back({{"identity", r.key.substr(0, nul)},
                             {"relay_host", nul == std::string::npos ? "" : r.key.substr(nul + 1)},
                             {"hostname", r.hostname},
                             {"last_seen", static_cast<double>(r.last_seen_ns) / 1e9},
                             {"age_seconds", static_cast<double>(now_ns - r.last_seen_ns) / 1e9},
                             {"reports", r.reports},
                             {"instances", r.instances},
                             {"series", r.series},
                             {"services", r.services},
                             {"clock_skew_seconds", r.skew_known ? nlohmann::json(static_cast<double>(r.skew_ns) / 1e9)
                                                                 : nlohmann::json(nullptr)}});
  }
  return out;
}

}  // namespace tlsprof::collector
