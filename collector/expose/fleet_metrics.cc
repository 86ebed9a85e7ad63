#include "collector/expose/fleet_metrics.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "common/metrics/prometheus.h"

namespace tlsprof::collector {
namespace {

namespace m = metrics;
using HandshakeKey = std::array<std::string, kHandshakeLabelNames.size()>;
using OperationKey = std::array<std::string, kOperationLabelNames.size()>;
using HandshakeCpuKey = std::array<std::string, kHandshakeCpuLabelNames.size()>;

// What a scrape copies under the Ingestor's lock. Series labels are pointers
// into the state: its series are never erased while serving, and their labels
// never change (fleet_state.h).
struct Values {
  std::vector<std::pair<const CpuKey*, double>> cpu;
  std::vector<std::pair<BusyKey, double>> busy;
  std::vector<std::pair<HostBucket, double>> host_cpu;
  std::vector<std::pair<std::string, double>> host_busy;
  std::vector<std::pair<const HandshakeKey*, double>> handshakes;
  std::vector<std::pair<const OperationKey*, OperationTotals>> operations;
  std::map<ConnectionKey, double> connections;     // summed over the agents whose usage is current
  std::map<ConnectionKey, double> resident_bytes;  // likewise
  std::vector<std::pair<const HandshakeCpuKey*, double>> handshake_cpu;
  uint64_t reports = 0;
  uint64_t evicted = 0, refused = 0, series_refused = 0, skewed = 0;
  size_t agents = 0, series = 0;
  int64_t max_skew_ns = 0;
  double probe_cpu = 0, probe_budget = 0, min_duty = 1, max_error = 0;
  uint64_t probe_hits = 0;
  size_t usage_agents = 0;  // agents whose usage is current
};

// Whether `agent`'s usage (connections, duty cycle) still counts at now_ns.
bool UsageCurrent(const FleetState::Agent& agent, int64_t now_ns) {
  if (!agent.usage_known) return false;
  const int64_t horizon = std::max(kUsageHorizonMinNs, kUsageHorizonWindows * agent.usage_window_ns);
  return now_ns - agent.usage_received_ns <= horizon;
}

void CopyAgents(const FleetState& s, int64_t now_ns, Values& v) {
  for (const auto& [key, shared] : s.agents) {
    const FleetState::Agent& agent = *shared;
    if (agent.skew_known && agent.last_seen_ns >= now_ns - kSkewHorizonNs) {
      v.max_skew_ns = std::max(v.max_skew_ns, agent.skew_ns < 0 ? -agent.skew_ns : agent.skew_ns);
    }
    if (!UsageCurrent(agent, now_ns)) continue;
    ++v.usage_agents;
    v.min_duty = std::min(v.min_duty, agent.duty_cycle);
    v.max_error = std::max(v.max_error, agent.relative_error);
    for (const auto& [labels, value] : agent.connections) v.connections[labels] += value;
    for (const auto& [labels, value] : agent.resident_bytes) v.resident_bytes[labels] += value;
  }
}

Values CopyValues(const FleetState& s, int64_t now_ns, bool host_labels) {
  Values v;
  v.evicted = s.agents_evicted;
  v.refused = s.agents_refused;
  v.series_refused = s.series_refused;
  v.skewed = s.skewed_reports;
  v.agents = s.agents.size();
  v.series = s.Series();
  CopyAgents(s, now_ns, v);
  v.cpu.reserve(s.cpu.size());
  for (const auto& [hash, series] : s.cpu) v.cpu.emplace_back(&series.labels, series.value);
  v.handshakes.reserve(s.handshakes.size());
  for (const auto& [hash, entry] : s.handshakes) v.handshakes.emplace_back(&entry.labels, entry.value);
  v.handshake_cpu.reserve(s.handshake_cpu.size());
  for (const auto& [hash, entry] : s.handshake_cpu) v.handshake_cpu.emplace_back(&entry.labels, entry.value);
  v.operations.reserve(s.operations.size());
  for (const auto& [hash, entry] : s.operations) v.operations.emplace_back(&entry.labels, entry.value);
  v.probe_cpu = s.probe_cpu_seconds;
  v.probe_budget = s.probe_budget_cpu_seconds;
  v.probe_hits = s.probe_hits;
  v.busy.assign(s.busy.begin(), s.busy.end());
  v.reports = s.reports;
  if (host_labels) {
    v.host_cpu.assign(s.host_cpu.begin(), s.host_cpu.end());
    v.host_busy.assign(s.host_busy.begin(), s.host_busy.end());
  }
  return v;
}

prometheus::ClientMetric Counter(std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric c;
  c.label = std::move(labels);
  c.counter.value = value;
  return c;
}

prometheus::ClientMetric Gauge(std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric g;
  g.label = std::move(labels);
  g.gauge.value = value;
  return g;
}

// A family of one series without labels.
prometheus::MetricFamily Single(const m::Metric& metric, double value) {
  prometheus::MetricFamily f = m::Family(metric);
  f.metric.push_back(metric.type == m::Type::kGauge ? Gauge({}, value) : Counter({}, value));
  return f;
}

// The histogram of an operation series, cumulative, `le` in seconds.
prometheus::ClientMetric::Histogram LatencyHistogram(const OperationTotals& t) {
  prometheus::ClientMetric::Histogram h;
  h.sample_count = t.observed;
  h.sample_sum = t.observed_cpu_seconds;
  const auto bounds = v1::LatencyBucketBoundsSeconds();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < v1::kLatencyBuckets; ++i) {
    cumulative += t.buckets[i];
    h.bucket.push_back({cumulative, i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity()});
  }
  return h;
}

// Series of labels kept by pointer, in label order (the maps they come from
// are hashed).
template <class Pairs>
void SortByLabels(Pairs& pairs) {
  std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
}

void AppendData(Values& v, std::vector<prometheus::MetricFamily>& out) {
  SortByLabels(v.cpu);
  prometheus::MetricFamily cpu = m::Family(m::kCpuSeconds);
  cpu.metric.reserve(v.cpu.size());
  for (const auto& [key, seconds] : v.cpu)
    cpu.metric.push_back(Counter(m::ClientLabels(m::kCpuSeconds, *key), seconds));
  out.push_back(std::move(cpu));
  prometheus::MetricFamily busy = m::Family(m::kBusyCpuSeconds);
  for (const auto& [key, seconds] : v.busy)
    busy.metric.push_back(Counter(m::ClientLabels(m::kBusyCpuSeconds, key), seconds));
  out.push_back(std::move(busy));
}

// Usage telemetry (docs/fleet.md, "Usage telemetry"): counts are the
// estimates (scaled for the probes' duty cycle); the histogram is of the
// observed operations.
void AppendUsage(Values& v, std::vector<prometheus::MetricFamily>& out) {
  SortByLabels(v.handshakes);
  SortByLabels(v.operations);
  prometheus::MetricFamily handshakes = m::Family(m::kHandshakes);
  for (const auto& [labels, value] : v.handshakes) {
    handshakes.metric.push_back(Counter(m::ClientLabels(m::kHandshakes, *labels), value));
  }
  out.push_back(std::move(handshakes));
  SortByLabels(v.handshake_cpu);
  prometheus::MetricFamily handshake_cpu = m::Family(m::kHandshakeCpuSeconds);
  for (const auto& [labels, value] : v.handshake_cpu) {
    handshake_cpu.metric.push_back(Counter(m::ClientLabels(m::kHandshakeCpuSeconds, *labels), value));
  }
  out.push_back(std::move(handshake_cpu));
  prometheus::MetricFamily ops = m::Family(m::kCryptoOperations);
  prometheus::MetricFamily ops_cpu = m::Family(m::kCryptoOperationCpuSeconds);
  prometheus::MetricFamily latency = m::Family(m::kCryptoOperationLatency);
  for (const auto& [labels, totals] : v.operations) {
    auto l = m::ClientLabels(m::kCryptoOperations, *labels);
    ops.metric.push_back(Counter(l, totals.estimated));
    ops_cpu.metric.push_back(Counter(l, totals.cpu_seconds));
    prometheus::ClientMetric h;
    h.label = std::move(l);
    h.histogram = LatencyHistogram(totals);
    latency.metric.push_back(std::move(h));
  }
  out.push_back(std::move(ops));
  out.push_back(std::move(ops_cpu));
  out.push_back(std::move(latency));
  prometheus::MetricFamily connections = m::Family(m::kTlsConnections);
  for (const auto& [labels, value] : v.connections) {
    connections.metric.push_back(Gauge(m::ClientLabels(m::kTlsConnections, labels), value));
  }
  out.push_back(std::move(connections));
  prometheus::MetricFamily resident = m::Family(m::kTlsResidentMemory);
  for (const auto& [labels, value] : v.resident_bytes) {
    resident.metric.push_back(Gauge(m::ClientLabels(m::kTlsResidentMemory, labels), value));
  }
  out.push_back(std::move(resident));
  out.push_back(Single(m::kUsageProbeCpuSeconds, v.probe_cpu));
  out.push_back(Single(m::kUsageProbeBudgetCpuSeconds, v.probe_budget));
  out.push_back(Single(m::kUsageProbeHits, static_cast<double>(v.probe_hits)));
  // Only while some agent reports usage: a duty cycle of nobody is no 1.
  if (v.usage_agents > 0) {
    out.push_back(Single(m::kUsageProbeMinDutyCycle, v.min_duty));
    out.push_back(Single(m::kUsageMaxRelativeError, v.max_error));
  }
}

// The bounds' and the clock skew's tlsprof_collector_*.
void AppendBounds(const Values& v, std::vector<prometheus::MetricFamily>& out) {
  out.push_back(Single(m::kCollectorClockSkew, static_cast<double>(v.max_skew_ns) / 1e9));
  out.push_back(Single(m::kCollectorSkewedReports, static_cast<double>(v.skewed)));
  out.push_back(Single(m::kCollectorAgentKeys, static_cast<double>(v.agents)));
  prometheus::MetricFamily limit = m::Family(m::kCollectorAgentLimit);
  limit.metric = {Counter(m::ClientLabels(m::kCollectorAgentLimit, {"evicted"}), static_cast<double>(v.evicted)),
                  Counter(m::ClientLabels(m::kCollectorAgentLimit, {"refused"}), static_cast<double>(v.refused))};
  out.push_back(std::move(limit));
  out.push_back(Single(m::kCollectorSeries, static_cast<double>(v.series)));
  out.push_back(Single(m::kCollectorSeriesLimitDropped, static_cast<double>(v.series_refused)));
}

void AppendHosts(const Values& v, std::vector<prometheus::MetricFamily>& out) {
  prometheus::MetricFamily cpu = m::Family(m::kHostCpuSeconds);
  for (const auto& [key, seconds] : v.host_cpu) {
    cpu.metric.push_back(Counter(m::ClientLabels(m::kHostCpuSeconds, {key.first, key.second}), seconds));
  }
  out.push_back(std::move(cpu));
  prometheus::MetricFamily busy = m::Family(m::kHostBusyCpuSeconds);
  for (const auto& [host, seconds] : v.host_busy) {
    busy.metric.push_back(Counter(m::ClientLabels(m::kHostBusyCpuSeconds, {host}), seconds));
  }
  out.push_back(std::move(busy));
}

}  // namespace

std::vector<prometheus::MetricFamily> FleetMetrics(const Ingestor& ingestor, int64_t now_ns) {
  if (now_ns == 0) {
    now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count();
  }
  const bool host_labels = ingestor.options().host_labels;
  Values v = ingestor.Read([&](const FleetState& s) { return CopyValues(s, now_ns, host_labels); });
  std::vector<prometheus::MetricFamily> families;
  AppendData(v, families);
  AppendUsage(v, families);
  families.push_back(Single(m::kReports, static_cast<double>(v.reports)));
  AppendBounds(v, families);
  if (host_labels) AppendHosts(v, families);
  return families;
}

size_t ActiveAgents(const Ingestor& ingestor, int64_t now_ns, int64_t horizon_ns) {
  return ingestor.Read([&](const FleetState& s) {
    return static_cast<size_t>(std::count_if(s.agents.begin(), s.agents.end(), [&](const auto& entry) {
      return entry.second->last_seen_ns >= now_ns - horizon_ns;
    }));
  });
}

}  // namespace tlsprof::collector
