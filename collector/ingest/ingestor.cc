#include "collector/ingest/ingestor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "collector/ingest/validate.h"

namespace tlsprof::collector {
namespace {

// Rows of a service besides its busy series and TLS rows: what is dropped
// with it at a cap.
uint32_t UsageRows(const v1::Service& s) {
  return static_cast<uint32_t>(s.handshakes_size() + s.operations_size() + s.connections_size());
}

double Seconds(uint64_t samples, uint64_t period_ns) {
  return static_cast<double>(samples) * static_cast<double>(period_ns) / 1e9;
}

int64_t LastSeen(const FleetState::Instance& instance) { return instance.last_seen_ns; }
int64_t LastSeen(const Shared<FleetState::Agent>& agent) { return agent->last_seen_ns; }

// The least recently seen entry of a map of instances or agents.
template <class Map>
auto LeastRecentlySeen(Map& map) {
  return std::min_element(map.begin(), map.end(),
                          [](const auto& a, const auto& b) { return LastSeen(a.second) < LastSeen(b.second); });
}

// A usage row's label values, in the order of its metric's labels.
std::array<std::string_view, kHandshakeLabelNames.size()> HandshakeLabels(const v1::Service& s,
                                                                          const v1::Handshakes& h) {
  return {s.name(),         s.container_id(),        s.pod_uid(),
          h.library(),      v1::SideLabel(h.side()), v1::HandshakeKindLabel(h.kind()),
          h.version(),      h.cipher_suite(),        h.group(),
          h.cert_key_type()};
}

std::array<std::string_view, kHandshakeCpuLabelNames.size()> HandshakeCpuLabels(const v1::Service& s,
                                                                                const v1::Handshakes& h) {
  return {s.name(), s.container_id(), s.pod_uid(), h.library(), v1::HandshakeKindLabel(h.kind()), h.cert_key_type()};
}

std::array<std::string_view, kOperationLabelNames.size()> OperationLabels(const v1::Service& s,
                                                                          const v1::CryptoOperations& o) {
  return {s.name(),
          s.container_id(),
          s.pod_uid(),
          o.library(),
          v1::OperationLabel(o.operation()),
          o.algorithm(),
          o.in_handshake() ? "true" : "false"};
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
      std::erase_if(buckets_, [&](const auto& entry) { return !state_.agents.count(entry.first); });
    }
    it = buckets_.try_emplace(agent_key).first;
  }
  return it->second.Take(now_ns, options_.rate_per_agent, options_.rate_burst);
}

ApplyResult Ingestor::Apply(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                            const std::function<void()>& commit, int64_t sent_ns) {
  std::lock_guard lock(mu_);
  ApplyResult result = ApplyLocked(agent_key, report, received_ns, sent_ns);
  if (!result.duplicate && !result.refused && commit) commit();
  return result;
}

FleetState Ingestor::Copy(const std::function<void()>& fn) const {
  std::lock_guard lock(mu_);
  FleetState copy = state_;
  if (fn) fn();
  return copy;
}

void Ingestor::Replace(FleetState state) {
  std::lock_guard lock(mu_);
  state_ = std::move(state);
  no_eviction_before_ns_ = 0;
  no_host_expiry_before_ns_ = 0;
}

void Ingestor::AdmitHostLocked(const std::string& hostname, int64_t now_ns) {
  ExpireHostsLocked(now_ns);
  auto it = state_.hosts.find(hostname);
  if (it != state_.hosts.end()) {
    it->second = std::max(it->second, now_ns);
  } else if (state_.hosts.size() < options_.max_hosts) {
    state_.hosts.emplace(hostname, now_ns);
    no_host_expiry_before_ns_ = std::min(no_host_expiry_before_ns_, now_ns + options_.idle_expiry_ns);
  }
}

void Ingestor::ExpireHostsLocked(int64_t now_ns) {
  if (now_ns < no_host_expiry_before_ns_) return;
  // The series of an expired host go with its slot: the hosts that hold a
  // slot are exactly those with tlsprof_host_* series (a restored snapshot
  // derives one from the other), and a host that comes back starts its
  // counters again from zero, which rate() reads as a reset.
  int64_t oldest_kept = INT64_MAX;
  size_t expired = 0;
  for (auto it = state_.hosts.begin(); it != state_.hosts.end();) {
    if (now_ns - it->second < options_.idle_expiry_ns) {
      oldest_kept = std::min(oldest_kept, it->second);
      ++it;
      continue;
    }
    state_.host_busy.erase(it->first);
    auto cpu = state_.host_cpu.lower_bound({it->first, std::string()});
    while (cpu != state_.host_cpu.end() && cpu->first.first == it->first) cpu = state_.host_cpu.erase(cpu);
    it = state_.hosts.erase(it);
    ++expired;
  }
  if (expired) spdlog::info("host labels: {} hosts silent for --idle-expiry-seconds released their slots", expired);
  no_host_expiry_before_ns_ = oldest_kept == INT64_MAX ? INT64_MAX : oldest_kept + options_.idle_expiry_ns;
}

std::string Ingestor::HostLabelLocked(const std::string& hostname) const {
  return state_.hosts.count(hostname) ? hostname : std::string(kOverflowHost);
}

FleetState::Agent* Ingestor::AdmitAgentLocked(const std::string& agent_key, int64_t now_ns) {
  auto it = state_.agents.find(agent_key);
  if (it != state_.agents.end()) return &it->second.Mutable();
  if (state_.agents.size() >= options_.max_agents && !MakeRoomForAgentLocked(now_ns)) {
    ++state_.agents_refused;
    return nullptr;
  }
  return &state_.agents.try_emplace(agent_key).first->second.Mutable();
}

bool Ingestor::MakeRoomForAgentLocked(int64_t now_ns) {
  if (now_ns < no_eviction_before_ns_) return false;
  auto oldest = LeastRecentlySeen(state_.agents);
  if (oldest == state_.agents.end()) return true;
  if (now_ns - oldest->second->last_seen_ns < options_.idle_expiry_ns) {
    // Last-seen times only grow: no agent can be evicted before then.
    no_eviction_before_ns_ = oldest->second->last_seen_ns + options_.idle_expiry_ns;
    return false;
  }
  spdlog::warn("forgetting agent {} (silent since {}): the collector holds --max-agents {} agents", oldest->first,
               oldest->second->last_seen_ns, options_.max_agents);
  buckets_.erase(oldest->first);
  state_.connection_series -= oldest->second->connections.size();
  state_.agents.erase(oldest);
  ++state_.agents_evicted;
  return true;
}

bool Ingestor::MarkNewLocked(const std::string& agent_key, FleetState::Agent& agent, const v1::AgentReport& report,
                             int64_t received_ns, ApplyResult& result) {
  auto it = agent.instances.find(report.agent_instance());
  if (it != agent.instances.end()) {
    SequenceWindow::Check check = it->second.window.Test(report.sequence());
    if (check != SequenceWindow::Check::kNew) {
      result.duplicate = true;
      result.too_old = check == SequenceWindow::Check::kTooOld;
      return false;
    }
  } else {
    if (agent.instances.size() >= kMaxInstancesPerAgent) {
      auto oldest = LeastRecentlySeen(agent.instances);
      spdlog::warn("agent {}: forgetting instance seen last at {} (more than {} instances)", agent_key,
                   oldest->second.last_seen_ns, kMaxInstancesPerAgent);
      agent.instances.erase(oldest);
    }
    it = agent.instances.emplace(report.agent_instance(), FleetState::Instance{}).first;
  }
  it->second.window.Mark(report.sequence());
  it->second.last_seen_ns = received_ns;
  return true;
}

void Ingestor::MeasureSkewLocked(FleetState::Agent& agent, const v1::AgentReport& report, int64_t received_ns,
                                 int64_t sent_ns) {
  // The agent's send time against ours (network delay is noise far below the
  // tolerance). Without a send time, a window that ends in our future still
  // proves the agent ahead by at least that much.
  if (sent_ns == 0 && report.window().end_unix_ns() <= received_ns + kSkewToleranceNs) return;
  agent.skew_known = true;
  agent.skew_ns = sent_ns != 0 ? sent_ns - received_ns : report.window().end_unix_ns() - received_ns;
  if (agent.skew_ns > kSkewToleranceNs || agent.skew_ns < -kSkewToleranceNs) ++state_.skewed_reports;
}

ApplyResult Ingestor::ApplyLocked(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                                  int64_t sent_ns) {
  ApplyResult result;
  FleetState::Agent* agent = AdmitAgentLocked(agent_key, received_ns);
  if (agent == nullptr) {
    result.refused = true;
    return result;
  }
  if (!MarkNewLocked(agent_key, *agent, report, received_ns, result)) return result;
  agent->last_seen_ns = received_ns;
  ++agent->reports;
  if (agent->hostname != report.host().hostname()) agent->hostname = report.host().hostname();
  MeasureSkewLocked(*agent, report, received_ns, sent_ns);

  // By our receive time: the agent's clock may be anywhere (validate.h).
  const int64_t minute_index = FloorDiv(received_ns, kNsPerMinute);
  FleetState::Minute& minute = state_.minutes[minute_index].Mutable();
  minute.reports++;
  minute.agents.insert(Fnv1a({agent_key}));
  ++state_.reports;

  if (options_.host_labels) AdmitHostLocked(report.host().hostname(), received_ns);
  ConnectionGauges gauges;  // the report's (with usage)
  for (const v1::Service& service : report.services()) {
    ApplyServiceLocked(*agent, report, service, minute, gauges, result);
  }
  if (options_.host_labels) {
    state_.host_busy[HostLabelLocked(report.host().hostname())] +=
        Seconds(report.busy_samples(), report.window().period_ns());
  }
  if (report.has_usage()) ApplyUsageStatsLocked(*agent, report, received_ns, std::move(gauges));
  PruneMinutesLocked(minute_index);
  return result;
}

void Ingestor::ApplyServiceLocked(FleetState::Agent& agent, const v1::AgentReport& report, const v1::Service& service,
                                  FleetState::Minute& minute, ConnectionGauges& gauges, ApplyResult& result) {
  // What is dropped with the service at a cap: its busy series, every TLS
  // series and every usage row.
  const uint32_t rows = 1 + service.tls_size() + UsageRows(service);
  // (name, container, pod) is the service: a container multiplies them, and
  // each counts toward max_services_per_agent.
  const uint64_t service_hash = ServiceHash(service.name(), service.container_id(), service.pod_uid());
  if (!agent.services.count(service_hash)) {
    if (agent.services.size() >= options_.max_services_per_agent) {
      result.dropped_series += rows;
      return;
    }
    agent.services.insert(service_hash);
  }
  const std::array<std::string_view, 3> busy_key = {service.name(), service.container_id(), service.pod_uid()};
  auto busy = state_.busy.find(busy_key);
  if (busy == state_.busy.end()) {
    if (state_.Series() >= options_.max_series) {
      result.dropped_series += rows;
      state_.series_refused += rows;
      return;
    }
    busy = state_.busy.try_emplace(BusyKey{service.name(), service.container_id(), service.pod_uid()}).first;
  }
  const double busy_seconds = Seconds(service.busy_samples(), report.window().period_ns());
  busy->second += busy_seconds;
  minute.busy_seconds += busy_seconds;
  for (const v1::TlsCpu& row : service.tls()) ApplyTlsRowLocked(agent, report, service, row, minute, result);
  if (report.has_usage()) ApplyUsageLocked(agent, service, gauges, result);
}

void Ingestor::ApplyTlsRowLocked(FleetState::Agent& agent, const v1::AgentReport& report, const v1::Service& service,
                                 const v1::TlsCpu& row, FleetState::Minute& minute, ApplyResult& result) {
  const std::string_view bucket = BucketName(row.bucket());
  const std::array<std::string_view, 7> labels = {bucket,           row.algorithm(), PhaseName(row.phase()),
                                                  row.library(),    service.name(),  service.container_id(),
                                                  service.pod_uid()};
  auto* series = AdmitEntryLocked(agent, state_.cpu, SeriesHash(labels), labels, result);
  if (series == nullptr) return;
  const double seconds = Seconds(row.samples(), report.window().period_ns());
  series->value += seconds;
  minute.tls_seconds += seconds;
  minute.bucket_seconds[row.bucket()] += seconds;
  const auto key = std::make_pair(static_cast<int>(row.bucket()), std::string_view(row.algorithm()));
  auto alg = minute.algorithms.find(key);
  if (alg == minute.algorithms.end()) {
    const bool overflow = minute.algorithms.size() >= kMaxSummaryAlgorithms;
    alg = minute.algorithms.try_emplace({key.first, overflow ? std::string(kOverflowAlgorithm) : row.algorithm()}, 0.0)
              .first;
  }
  alg->second += seconds;
  if (options_.host_labels) {
    state_.host_cpu[{HostLabelLocked(report.host().hostname()), std::string(bucket)}] += seconds;
  }
}

bool Ingestor::AdmitSeriesLocked(FleetState::Agent& agent, uint64_t hash, bool exists, ApplyResult& result) {
  const bool known = agent.series.count(hash);
  if (!known && agent.series.size() >= options_.max_series_per_agent) {
    ++result.dropped_series;
    return false;
  }
  if (!exists && state_.Series() >= options_.max_series) {
    ++result.dropped_series;
    ++state_.series_refused;
    return false;
  }
  if (!known) agent.series.insert(hash);
  return true;
}

template <size_t N, class V>
typename SeriesTable<N, V>::Entry* Ingestor::AdmitEntryLocked(FleetState::Agent& agent, SeriesTable<N, V>& table,
                                                              uint64_t hash,
                                                              const std::array<std::string_view, N>& labels,
                                                              ApplyResult& result) {
  auto* entry = table.Find(hash, labels);
  if (!AdmitSeriesLocked(agent, hash, entry != nullptr, result)) return nullptr;
  return entry != nullptr ? entry : &table.FindOrInsert(hash, labels);
}

void Ingestor::ApplyUsageLocked(FleetState::Agent& agent, const v1::Service& service, ConnectionGauges& gauges,
                                ApplyResult& result) {
  for (const v1::Handshakes& h : service.handshakes()) {
    const auto labels = HandshakeLabels(service, h);
    auto* entry = AdmitEntryLocked(agent, state_.handshakes, UsageHash("handshakes", labels), labels, result);
    if (entry != nullptr) entry->value += h.estimated();
    if (h.cpu_seconds() > 0) {
      const auto cpu_labels = HandshakeCpuLabels(service, h);
      auto* cpu =
          AdmitEntryLocked(agent, state_.handshake_cpu, UsageHash("handshake_cpu", cpu_labels), cpu_labels, result);
      if (cpu != nullptr) cpu->value += h.cpu_seconds();
    }
  }
  for (const v1::CryptoOperations& o : service.operations()) {
    const auto labels = OperationLabels(service, o);
    auto* entry = AdmitEntryLocked(agent, state_.operations, UsageHash("operations", labels), labels, result);
    if (entry == nullptr) continue;
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
    const std::array<std::string_view, kConnectionLabelNames.size()> labels = {service.name(), service.container_id(),
                                                                               service.pod_uid(), c.library()};
    ConnectionKey key = {service.name(), service.container_id(), service.pod_uid(), c.library()};
    const bool exists = agent.connections.count(key) || gauges.connections.count(key);
    if (!AdmitSeriesLocked(agent, UsageHash("connections", labels), exists, result)) continue;
    gauges.resident_bytes[key] += static_cast<double>(c.resident_bytes());
    gauges.connections[std::move(key)] += c.estimated();
  }
}

void Ingestor::ApplyUsageStatsLocked(FleetState::Agent& agent, const v1::AgentReport& report, int64_t received_ns,
                                     ConnectionGauges gauges) {
  const v1::UsageStats& u = report.usage();
  state_.probe_cpu_seconds += u.probe_cpu_seconds();
  state_.probe_budget_cpu_seconds += u.budget_cpu_seconds();
  state_.probe_hits += u.probe_hits();
  // The gauge is the latest report's: a late batch (a lower sequence of the
  // same instance) does not replace it. Another instance (the agent
  // restarted with a new state directory) always does.
  if (agent.usage_known && agent.usage_instance == report.agent_instance() &&
      report.sequence() <= agent.usage_sequence) {
    return;
  }
  agent.usage_known = true;
  agent.usage_instance = report.agent_instance();
  agent.usage_sequence = report.sequence();
  agent.usage_received_ns = received_ns;
  agent.usage_window_ns = report.window().end_unix_ns() - report.window().start_unix_ns();
  agent.duty_cycle = u.duty_cycle();
  agent.relative_error = u.relative_error();
  state_.connection_series -= agent.connections.size();
  agent.connections = std::move(gauges.connections);
  agent.resident_bytes = std::move(gauges.resident_bytes);
  state_.connection_series += agent.connections.size();
}

void Ingestor::PruneMinutesLocked(int64_t now_minute) {
  auto& minutes = state_.minutes;
  while (!minutes.empty() && minutes.begin()->first < now_minute - kSummaryMinutes) minutes.erase(minutes.begin());
}

}  // namespace tlsprof::collector
