#include "collector/store/snapshot.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "collector/ingest/validate.h"

namespace tlsprof::collector {
namespace {

void AgentToProto(const std::string& key, const FleetState::Agent& agent, state::Agent& a) {
  a.set_key(key);
  a.set_last_seen_unix_ns(agent.last_seen_ns);
  a.set_reports(agent.reports);
  a.set_hostname(agent.hostname);
  if (agent.skew_known) a.set_clock_skew_ns(agent.skew_ns);
  if (agent.usage_known) {
    a.set_usage_instance(agent.usage_instance);
    a.set_usage_sequence(agent.usage_sequence);
    a.set_usage_received_unix_ns(agent.usage_received_ns);
    a.set_usage_window_ns(agent.usage_window_ns);
    a.set_duty_cycle(agent.duty_cycle);
    a.set_relative_error(agent.relative_error);
    for (const auto& [labels, value] : agent.connections) {
      state::UsageSeries* u = a.add_connections();
      u->mutable_labels()->Add(labels.begin(), labels.end());
      u->set_value(value);
      if (auto it = agent.resident_bytes.find(labels); it != agent.resident_bytes.end())
        u->set_resident_bytes(it->second);
    }
  }
  for (const auto& [id, instance] : agent.instances) {
    state::Instance* i = a.add_instances();
    i->set_instance(id);
    i->set_highest(instance.window.highest());
    for (uint64_t w : instance.window.Words()) i->add_seen(w);
    i->set_last_seen_unix_ns(instance.last_seen_ns);
  }
  a.mutable_series()->Add(agent.series.begin(), agent.series.end());
  a.mutable_services()->Add(agent.services.begin(), agent.services.end());
}

void MinuteToProto(int64_t index, const FleetState::Minute& minute, state::Minute& m) {
  m.set_minute(index);
  m.set_reports(minute.reports);
  for (uint64_t h : minute.agents) m.add_agents(h);
  m.set_busy_seconds(minute.busy_seconds);
  m.set_tls_seconds(minute.tls_seconds);
  for (double v : minute.bucket_seconds) m.add_bucket_seconds(v);
  for (const auto& [key, seconds] : minute.algorithms) {
    state::AlgorithmSeconds* a = m.add_algorithms();
    a->set_bucket(key.first);
    a->set_algorithm(key.second);
    a->set_seconds(seconds);
  }
}

void SeriesToProto(const FleetState& s, state::State& out) {
  for (const auto& [hash, series] : s.cpu) {
    const CpuKey& key = series.labels;
    state::CpuSeries* c = out.add_cpu();
    c->set_bucket(key[0]);
    c->set_algorithm(key[1]);
    c->set_phase(key[2]);
    c->set_library(key[3]);
    c->set_service(key[4]);
    c->set_container_id(key[5]);
    c->set_pod_uid(key[6]);
    c->set_seconds(series.value);
  }
  for (const auto& [key, seconds] : s.busy) {
    state::NamedSeconds* b = out.add_busy();
    b->set_name(key[0]);
    b->set_container_id(key[1]);
    b->set_pod_uid(key[2]);
    b->set_seconds(seconds);
  }
  for (const auto& [key, seconds] : s.host_cpu) {
    state::HostCpu* h = out.add_host_cpu();
    h->set_host(key.first);
    h->set_bucket(key.second);
    h->set_seconds(seconds);
  }
  for (const auto& [name, seconds] : s.host_busy) {
    state::NamedSeconds* b = out.add_host_busy();
    b->set_name(name);
    b->set_seconds(seconds);
  }
  for (const auto& [name, seen_ns] : s.hosts) {
    state::HostSeen* h = out.add_hosts();
    h->set_host(name);
    h->set_last_seen_unix_ns(seen_ns);
  }
  for (const auto& [hash, entry] : s.handshakes) {
    state::UsageSeries* u = out.add_handshakes();
    u->mutable_labels()->Add(entry.labels.begin(), entry.labels.end());
    u->set_value(entry.value);
  }
  for (const auto& [hash, entry] : s.handshake_cpu) {
    state::UsageSeries* u = out.add_handshake_cpu();
    u->mutable_labels()->Add(entry.labels.begin(), entry.labels.end());
    u->set_value(entry.value);
  }
  for (const auto& [hash, entry] : s.operations) {
    state::UsageSeries* u = out.add_operations();
    u->mutable_labels()->Add(entry.labels.begin(), entry.labels.end());
    const OperationTotals& t = entry.value;
    u->set_value(t.estimated);
    u->set_cpu_seconds(t.cpu_seconds);
    u->set_observed(t.observed);
    u->set_observed_cpu_seconds(t.observed_cpu_seconds);
    u->mutable_latency_buckets()->Add(t.buckets.begin(), t.buckets.end());
  }
}

// The label count of every usage series must be its kind's.
Status CheckLabels(const state::UsageSeries& u, size_t n, std::string_view what) {
  if (u.labels_size() != static_cast<int>(n)) {
    return MakeError("snapshot: a {} series has {} labels, expected {}", what, u.labels_size(), n);
  }
  return OkStatus();
}

template <size_t N>
std::array<std::string_view, N> LabelViews(const state::UsageSeries& u) {
  std::array<std::string_view, N> labels;
  std::copy(u.labels().begin(), u.labels().end(), labels.begin());
  return labels;
}

Status UsageFromProto(const state::State& in, FleetState& s) {
  for (const state::UsageSeries& u : in.handshakes()) {
    if (auto st = CheckLabels(u, kHandshakeLabelNames.size(), "handshake"); !st.ok()) return st;
    const auto labels = LabelViews<kHandshakeLabelNames.size()>(u);
    s.handshakes.FindOrInsert(UsageHash("handshakes", labels), labels).value = u.value();
  }
  for (const state::UsageSeries& u : in.handshake_cpu()) {
    if (auto st = CheckLabels(u, kHandshakeCpuLabelNames.size(), "handshake CPU"); !st.ok()) return st;
    const auto labels = LabelViews<kHandshakeCpuLabelNames.size()>(u);
    s.handshake_cpu.FindOrInsert(UsageHash("handshake_cpu", labels), labels).value = u.value();
  }
  for (const state::UsageSeries& u : in.operations()) {
    if (auto st = CheckLabels(u, kOperationLabelNames.size(), "operation"); !st.ok()) return st;
    if (u.latency_buckets_size() != static_cast<int>(v1::kLatencyBuckets)) {
      return MakeError("snapshot: an operation series has {} latency buckets, expected {}", u.latency_buckets_size(),
                       v1::kLatencyBuckets);
    }
    const auto labels = LabelViews<kOperationLabelNames.size()>(u);
    OperationTotals& t = s.operations.FindOrInsert(UsageHash("operations", labels), labels).value;
    t.estimated = u.value();
    t.cpu_seconds = u.cpu_seconds();
    t.observed = u.observed();
    t.observed_cpu_seconds = u.observed_cpu_seconds();
    std::copy(u.latency_buckets().begin(), u.latency_buckets().end(), t.buckets.begin());
  }
  return OkStatus();
}

void SeriesFromProto(const state::State& in, FleetState& s) {
  // A snapshot from before the container fields restores with them "".
  for (const state::CpuSeries& c : in.cpu()) {
    const std::array<std::string_view, 7> labels = {c.bucket(),  c.algorithm(),    c.phase(),  c.library(),
                                                    c.service(), c.container_id(), c.pod_uid()};
    s.cpu.FindOrInsert(SeriesHash(labels), labels).value = c.seconds();
  }
  for (const state::NamedSeconds& b : in.busy()) s.busy[{b.name(), b.container_id(), b.pod_uid()}] = b.seconds();
  for (const state::HostCpu& h : in.host_cpu()) s.host_cpu[{h.host(), h.bucket()}] = h.seconds();
  for (const state::HostSeen& h : in.hosts()) s.hosts[h.host()] = h.last_seen_unix_ns();
  // A host with series holds a slot. Older state has no HostSeen: its hosts
  // are taken as seen at the newest report it knows of, so that they expire
  // an idle period after the upgrade, not at once.
  int64_t newest_ns = 0;
  for (const state::Agent& a : in.agents()) newest_ns = std::max(newest_ns, a.last_seen_unix_ns());
  for (const state::NamedSeconds& b : in.host_busy()) {
    s.host_busy[b.name()] = b.seconds();
    if (b.name() != kOverflowHost) s.hosts.try_emplace(b.name(), newest_ns);
  }
  for (const state::HostCpu& h : in.host_cpu()) {
    if (h.host() != kOverflowHost) s.hosts.try_emplace(h.host(), newest_ns);
  }
}

Status AgentFromProto(const state::Agent& a, FleetState::Agent& agent) {
  agent.last_seen_ns = a.last_seen_unix_ns();
  agent.reports = a.reports();
  agent.hostname = a.hostname();
  agent.skew_known = a.has_clock_skew_ns();
  agent.skew_ns = a.clock_skew_ns();
  // Connection series are usage too: an agent that has them is written back
  // with them (AgentToProto writes usage only when it is known), so a
  // compaction keeps what the snapshot held and the series count with it.
  agent.usage_known = a.has_duty_cycle() || a.connections_size() > 0;
  agent.usage_instance = a.usage_instance();
  agent.usage_sequence = a.usage_sequence();
  agent.usage_received_ns = a.usage_received_unix_ns();
  agent.usage_window_ns = a.usage_window_ns();
  agent.duty_cycle = a.has_duty_cycle() ? a.duty_cycle() : 1.0;
  agent.relative_error = a.relative_error();
  for (const state::UsageSeries& u : a.connections()) {
    if (auto st = CheckLabels(u, kConnectionLabelNames.size(), "connection"); !st.ok()) return st;
    const ConnectionKey key{u.labels(0), u.labels(1), u.labels(2), u.labels(3)};
    agent.connections[key] = u.value();
    agent.resident_bytes[key] = u.resident_bytes();  // as ingest keeps it: beside every connection series
  }
  for (const state::Instance& i : a.instances()) {
    if (i.seen_size() != static_cast<int>(SequenceWindow::kWidth / 64)) {
      return MakeError("snapshot: agent instance window has {} words, expected {}", i.seen_size(),
                       SequenceWindow::kWidth / 64);
    }
    FleetState::Instance& instance = agent.instances[i.instance()];
    instance.window = SequenceWindow::FromWords(i.highest(), {i.seen().begin(), i.seen().end()});
    instance.last_seen_ns = i.last_seen_unix_ns();
  }
  agent.series.insert(a.series().begin(), a.series().end());
  agent.services.insert(a.services().begin(), a.services().end());
  return OkStatus();
}

void MinuteFromProto(const state::Minute& m, FleetState::Minute& minute) {
  minute.reports = m.reports();
  minute.agents.insert(m.agents().begin(), m.agents().end());
  minute.busy_seconds = m.busy_seconds();
  minute.tls_seconds = m.tls_seconds();
  for (int i = 0; i < m.bucket_seconds_size() && i < static_cast<int>(minute.bucket_seconds.size()); ++i) {
    minute.bucket_seconds[i] = m.bucket_seconds(i);
  }
  for (const state::AlgorithmSeconds& a : m.algorithms()) minute.algorithms[{a.bucket(), a.algorithm()}] = a.seconds();
}

}  // namespace

void StateToProto(const FleetState& s, state::State& out) {
  out.set_reports(s.reports);
  out.set_skewed_reports(s.skewed_reports);
  out.set_agents_evicted(s.agents_evicted);
  out.set_agents_refused(s.agents_refused);
  out.set_series_refused(s.series_refused);
  SeriesToProto(s, out);
  out.set_probe_cpu_seconds(s.probe_cpu_seconds);
  out.set_probe_budget_cpu_seconds(s.probe_budget_cpu_seconds);
  out.set_probe_hits(s.probe_hits);
  for (const auto& [key, agent] : s.agents) AgentToProto(key, *agent, *out.add_agents());
  for (const auto& [index, minute] : s.minutes) MinuteToProto(index, *minute, *out.add_minutes());
}

Result<FleetState> StateFromProto(const state::State& in) {
  FleetState s;
  s.reports = in.reports();
  s.skewed_reports = in.skewed_reports();
  s.agents_evicted = in.agents_evicted();
  s.agents_refused = in.agents_refused();
  s.series_refused = in.series_refused();
  s.probe_cpu_seconds = in.probe_cpu_seconds();
  s.probe_budget_cpu_seconds = in.probe_budget_cpu_seconds();
  s.probe_hits = in.probe_hits();
  if (auto st = UsageFromProto(in, s); !st.ok()) return st.error();
  SeriesFromProto(in, s);
  for (const state::Agent& a : in.agents()) {
    // A snapshot holds each agent once: a second record would be merged into
    // the first and its series counted twice.
    if (s.agents.contains(a.key())) return MakeError("snapshot: agent {} appears twice", a.key());
    FleetState::Agent& agent = s.agents[a.key()].Mutable();
    if (auto st = AgentFromProto(a, agent); !st.ok()) return st.error();
    s.connection_series += agent.connections.size();
  }
  for (const state::Minute& m : in.minutes()) MinuteFromProto(m, s.minutes[m.minute()].Mutable());
  return s;
}

void TakeSnapshot(const Ingestor& ingestor, state::State& out) {
  ingestor.Read([&](const FleetState& s) { StateToProto(s, out); });
}

Status RestoreSnapshot(const state::State& snapshot, Ingestor& ingestor) {
  Result<FleetState> restored = StateFromProto(snapshot);
  if (!restored.ok()) return restored.error();
  ingestor.Replace(std::move(*restored));
  return OkStatus();
}

Result<ApplyResult> ReplayRecord(const state::JournalRecord& record, Ingestor& ingestor) {
  // Newer records carry the SubmitRequest as received; older ones the report.
  v1::SubmitRequest request;
  if (!record.submit_request().empty() && !request.ParseFromString(record.submit_request())) {
    return MakeError("journal record: submit_request is not a SubmitRequest");
  }
  const v1::AgentReport& report = record.submit_request().empty() ? record.report() : request.report();
  // Ingestor::Apply takes only a validated report (it indexes by its enums,
  // e.g. the per-minute bucket seconds by TlsCpu.bucket). Submit journals
  // only reports that passed ValidateReport, so one that does not is a
  // damaged or foreign record (its CRC may still hold): refused, never
  // applied, and the collector does not start on it.
  if (auto error = ValidateReport(report, record.received_unix_ns())) {
    return MakeError("journal record: invalid report: {}", *error);
  }
  return ingestor.Apply(record.agent_key(), report, record.received_unix_ns(), {}, request.sent_unix_ns());
}

}  // namespace tlsprof::collector
