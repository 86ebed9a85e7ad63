#include "agent/expose/metrics.h"

#include <prometheus/text_serializer.h>

#include <charconv>
#include <exception>
#include <span>
#include <utility>

#include "agent/classify/classify.h"
#include "agent/wire/services.h"
#include "common/metrics/prometheus.h"
#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::expose {
namespace {

using metrics::Register;

// tlsprof_agent_batches_total's results and the ShipHealth counter of each,
// in the order the series are made.
constexpr std::pair<std::string_view, uint64_t ShipHealth::*> kBatchResults[] = {
    {"sealed", &ShipHealth::sealed},         {"accepted", &ShipHealth::accepted},
    {"duplicate", &ShipHealth::duplicates},  {"rejected", &ShipHealth::rejected},
    {"dropped", &ShipHealth::spool_dropped}, {"unpersisted", &ShipHealth::unpersisted}};
// tlsprof_agent_memory_limited_total's "what" and its BoundsHealth counter.
constexpr std::pair<std::string_view, uint64_t BoundsHealth::*> kMemoryLimited[] = {
    {"symbols", &BoundsHealth::images_skipped}, {"unwind_table", &BoundsHealth::tables_skipped}};

prometheus::Histogram::BucketBoundaries LatencyBounds() {
  const auto bounds = v1::LatencyBucketBoundsSeconds();
  return {bounds.begin(), bounds.end()};
}

std::string_view BucketLabel(v1::Bucket b) {
  switch (b) {
    case v1::BUCKET_CIPHER:
      return classify::BucketName(classify::Bucket::kCipher);
    case v1::BUCKET_SIGNATURE:
      return classify::BucketName(classify::Bucket::kSignature);
    case v1::BUCKET_KEY_EXCHANGE:
      return classify::BucketName(classify::Bucket::kKeyExchange);
    case v1::BUCKET_HASH:
      return classify::BucketName(classify::Bucket::kHash);
    default:
      return classify::BucketName(classify::Bucket::kOther);
  }
}

std::string_view PhaseLabel(v1::Phase p) {
  switch (p) {
    case v1::PHASE_HANDSHAKE:
      return classify::PhaseName(classify::Phase::kHandshake);
    case v1::PHASE_RECORD:
      return classify::PhaseName(classify::Phase::kRecord);
    default:
      return classify::PhaseName(classify::Phase::kOther);
  }
}

void Advance(prometheus::Counter& counter, uint64_t now, uint64_t before) {
  if (now > before) counter.Increment(static_cast<double>(now - before));
}

}  // namespace

Status CheckListenAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return MakeError("--metrics-listen {}: expected HOST:PORT, e.g. 127.0.0.1:9464", address);
  }
  std::string_view host(address.data(), colon);
  if (host.front() == '[' ? host.back() != ']' : host.find(':') != std::string_view::npos) {
    return MakeError("--metrics-listen {}: an IPv6 host goes in brackets, e.g. [::1]:9464", address);
  }
  std::string_view port(address.data() + colon + 1, address.size() - colon - 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
    return MakeError("--metrics-listen {}: the port must be a number in 1..65535", address);
  }
  return OkStatus();
}

AgentMetrics::AgentMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      cpu_seconds_(Register<metrics::kCpuSeconds>(*registry_)),
      busy_seconds_(Register<metrics::kBusyCpuSeconds>(*registry_)),
      reports_(Register<metrics::kReports>(*registry_).Add({})),
      windows_(Register<metrics::kAgentWindows>(*registry_).Add({})),
      window_duration_(Register<metrics::kAgentWindowDuration>(*registry_).Add({})),
      agent_cpu_(Register<metrics::kAgentCpuSeconds>(*registry_).Add({})),
      bpf_seconds_(Register<metrics::kAgentBpfSeconds>(*registry_).Add({})),
      samples_(Register<metrics::kAgentSamples>(*registry_).Add({})),
      rss_(Register<metrics::kAgentResidentMemory>(*registry_).Add({})),
      dropped_samples_(Register<metrics::kAgentDroppedSamples>(*registry_).Add({})),
      unresolved_samples_(Register<metrics::kAgentUnresolvedSamples>(*registry_).Add({})),
      tracked_processes_(Register<metrics::kAgentTrackedProcesses>(*registry_).Add({})),
      pending_processes_(Register<metrics::kAgentPendingProcesses>(*registry_).Add({})),
      spool_batches_(Register<metrics::kAgentSpoolBatches>(*registry_).Add({})),
      spool_pinned_(Register<metrics::kAgentSpoolPinnedBatches>(*registry_).Add({})),
      failovers_(Register<metrics::kAgentCollectorFailovers>(*registry_).Add({})),
      spool_bytes_(Register<metrics::kAgentSpoolBytes>(*registry_).Add({})),
      batches_(Register<metrics::kAgentBatches>(*registry_)),
      send_errors_(Register<metrics::kAgentSendErrors>(*registry_).Add({})),
      last_success_(Register<metrics::kAgentLastSuccess>(*registry_).Add({})),
      memory_limit_(Register<metrics::kAgentMemoryLimit>(*registry_).Add({})),
      memory_limited_(Register<metrics::kAgentMemoryLimited>(*registry_)),
      unwind_unregistered_(Register<metrics::kAgentUnwindUnregistered>(*registry_).Add({})),
      handshakes_(Register<metrics::kHandshakes>(*registry_)),
      operations_(Register<metrics::kCryptoOperations>(*registry_)),
      operation_cpu_(Register<metrics::kCryptoOperationCpuSeconds>(*registry_)),
      operation_latency_(Register<metrics::kCryptoOperationLatency>(*registry_)),
      handshake_cpu_(Register<metrics::kHandshakeCpuSeconds>(*registry_)),
      connections_(Register<metrics::kTlsConnections>(*registry_)),
      resident_(Register<metrics::kTlsResidentMemory>(*registry_)),
      probe_duty_cycle_(Register<metrics::kAgentUsageProbeDutyCycle>(*registry_)),
      probe_cpu_(Register<metrics::kAgentUsageProbeCpuSeconds>(*registry_)),
      probe_hits_(Register<metrics::kAgentUsageProbeHits>(*registry_)),
      probe_budget_cpu_(Register<metrics::kAgentUsageProbeBudgetCpuSeconds>(*registry_)),
      probe_toggles_(Register<metrics::kAgentUsageProbeToggles>(*registry_)),
      probe_budget_ratio_(Register<metrics::kAgentUsageProbeBudgetRatio>(*registry_)) {
  for (const auto& [what, field] : kMemoryLimited)
    memory_limited_.Add(metrics::Labels(metrics::kAgentMemoryLimited, {what}));
  // Every reason is present from the first scrape, at 0.
  auto& refused = Register<metrics::kAgentImagesRefused>(*registry_);
  for (size_t i = 0; i < refused_.size(); ++i) {
    refused_[i] =
        &refused.Add(metrics::Labels(metrics::kAgentImagesRefused, {guard::ReasonName(static_cast<guard::Reason>(i))}));
  }
  auto& phases = Register<metrics::kAgentPhaseCpuSeconds>(*registry_);
  for (size_t i = 0; i < phase_cpu_.size(); ++i) {
    phase_cpu_[i] = &phases.Add(metrics::Labels(metrics::kAgentPhaseCpuSeconds,
                                                {profiler::AgentPhaseName(static_cast<profiler::AgentPhase>(i))}));
  }
  // Present from the first scrape, at 0; "unpersisted" from the first SetShip.
  for (const auto& [result, field] : std::span(kBatchResults).first(5))
    batches_.Add(metrics::Labels(metrics::kAgentBatches, {result}));
}

Status AgentMetrics::Serve(const std::string& address, const LoopHealth* health) {
  if (auto st = CheckListenAddress(address); !st.ok()) return st;
  http::Options options;
  options.listen = address;
  // common/http's default workers: Prometheus, the kubelet's probes and idle
  // or slow clients at once; none of them holds up /healthz.
  options.routes.emplace_back("/metrics", [this](const http::Request&) {
    http::Response r{200, "OK", "text/plain; version=0.0.4; charset=utf-8", Text(), ""};
    r.compressible = true;
    return r;
  });
  std::string paths = "/metrics";
  if (health != nullptr) {
    // Reads two atomics: never waits for the window loop, whatever it is stuck in.
    options.routes.emplace_back("/healthz", [health](const http::Request&) {
      const HealthVerdict v = health->Check(LoopHealth::Clock::now());
      return http::Response{v.healthy ? 200 : 503, v.healthy ? "OK" : "Service Unavailable",
                            "text/plain; charset=utf-8", v.text + "\n", "Cache-Control: no-store\r\n"};
    });
    paths += " or /healthz";
  }
  options.routes.emplace_back("/", [paths](const http::Request&) {
    return http::Response{404, "Not Found", "text/plain; charset=utf-8", "no such page; try " + paths + "\n", ""};
  });
  auto server = http::Server::Start(std::move(options));
  if (!server.ok()) {
    return MakeError("--metrics-listen {}: cannot listen there ({}); is the port in use?", address,
                     server.error().message);
  }
  server_ = std::move(server).value();
  return OkStatus();
}

prometheus::Labels AgentMetrics::ServiceLabelsLocked(const metrics::Metric& metric, const v1::Service& s,
                                                     std::initializer_list<std::string_view> own) {
  // The series' key: the metric, then its label values in the table's order.
  std::vector<std::string> key = {std::string(metric.name)};
  const std::string_view* next = own.begin();
  for (std::string_view label : metric.labels) {
    if (label == "service") {
      key.push_back(s.name());
    } else if (label == "container_id") {
      key.push_back(s.container_id());
    } else if (label == "pod_uid") {
      key.push_back(s.pod_uid());
    } else {
      key.emplace_back(*next++);
    }
  }
  if (!series_.contains(key) && series_.size() >= kMaxSeries) {
    for (size_t i = 0; i < metric.labels.size(); ++i) {
      if (metric.labels[i] == "service") key[i + 1] = wire::kOverflowService;
      if (metrics::OnlyWhenSet(metric.labels[i])) key[i + 1].clear();
    }
  }
  prometheus::Labels labels = metrics::Labels(metric, std::span<const std::string>(key).subspan(1));
  series_.insert(std::move(key));
  return labels;
}

void AgentMetrics::AddReport(const v1::AgentReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  const double sec_per_sample = static_cast<double>(report.window().period_ns()) / 1e9;
  for (const v1::Service& s : report.services()) {
    busy_seconds_.Add(ServiceLabelsLocked(metrics::kBusyCpuSeconds, s, {}))
        .Increment(static_cast<double>(s.busy_samples()) * sec_per_sample);
    for (const v1::TlsCpu& row : s.tls()) {
      cpu_seconds_
          .Add(
              ServiceLabelsLocked(metrics::kCpuSeconds, s,
                                  {BucketLabel(row.bucket()), row.algorithm(), PhaseLabel(row.phase()), row.library()}))
          .Increment(static_cast<double>(row.samples()) * sec_per_sample);
    }
    for (const v1::Handshakes& h : s.handshakes()) {
      handshakes_
          .Add(ServiceLabelsLocked(metrics::kHandshakes, s,
                                   {h.library(), v1::SideLabel(h.side()), v1::HandshakeKindLabel(h.kind()), h.version(),
                                    h.cipher_suite(), h.group(), h.cert_key_type()}))
          .Increment(h.estimated());
      // Only rows with sampled CPU: most windows' rows have none at 99 Hz.
      if (h.cpu_seconds() > 0) {
        handshake_cpu_
            .Add(ServiceLabelsLocked(metrics::kHandshakeCpuSeconds, s,
                                     {h.library(), v1::HandshakeKindLabel(h.kind()), h.cert_key_type()}))
            .Increment(h.cpu_seconds());
      }
    }
    for (const v1::CryptoOperations& o : s.operations()) AddOperationLocked(s, o);
  }
  if (report.has_usage()) SetConnectionsLocked(report);
  reports_.Increment();
}

void AgentMetrics::AddOperationLocked(const v1::Service& s, const v1::CryptoOperations& o) {
  // One series of the series cap for the three families.
  const auto labels = ServiceLabelsLocked(
      metrics::kCryptoOperations, s,
      {o.library(), v1::OperationLabel(o.operation()), o.algorithm(), o.in_handshake() ? "true" : "false"});
  operations_.Add(labels).Increment(o.estimated());
  // Estimated CPU: the observed operations' CPU scaled as their count.
  if (o.observed() > 0) {
    operation_cpu_.Add(labels).Increment(o.cpu_seconds() * o.estimated() / static_cast<double>(o.observed()));
  }
  if (o.latency_buckets_size() == static_cast<int>(v1::kLatencyBuckets)) {
    std::vector<double> increments(o.latency_buckets().begin(), o.latency_buckets().end());
    operation_latency_.Add(labels, LatencyBounds()).ObserveMultiple(increments, o.cpu_seconds());
  }
}

void AgentMetrics::SetConnectionsLocked(const v1::AgentReport& report) {
  // Gauges: this report's values; series of processes gone are removed.
  // Both metrics have the connections' labels.
  static_assert(metrics::kTlsResidentMemory.labels.size() == metrics::kTlsConnections.labels.size());
  std::map<prometheus::Labels, ConnectionGauges> now;
  for (const v1::Service& s : report.services()) {
    for (const v1::Connections& c : s.connections()) {
      auto [it, fresh] = now.try_emplace(ServiceLabelsLocked(metrics::kTlsConnections, s, {c.library()}));
      if (fresh) {
        it->second = {&connections_.Add(it->first), &resident_.Add(it->first)};
        it->second.connections->Set(0);
        it->second.resident->Set(0);
      }
      it->second.connections->Increment(c.estimated());
      it->second.resident->Increment(static_cast<double>(c.resident_bytes()));
    }
  }
  for (const auto& [labels, gauges] : connection_gauges_) {
    if (now.contains(labels)) continue;
    connections_.Remove(gauges.connections);
    resident_.Remove(gauges.resident);
  }
  connection_gauges_ = std::move(now);
}

void AgentMetrics::AddWindow(const WindowHealth& h) {
  windows_.Increment();
  window_duration_.Set(h.duration_seconds);
  if (h.agent_cpu_seconds > 0) agent_cpu_.Increment(h.agent_cpu_seconds);
  for (size_t i = 0; i < phase_cpu_.size(); ++i) {
    if (h.phase_cpu_seconds[i] > 0) phase_cpu_[i]->Increment(h.phase_cpu_seconds[i]);
  }
  if (h.bpf_seconds > 0) bpf_seconds_.Increment(h.bpf_seconds);
  samples_.Increment(static_cast<double>(h.samples));
  rss_.Set(static_cast<double>(h.resident_bytes));
  dropped_samples_.Increment(static_cast<double>(h.dropped_samples));
  unresolved_samples_.Increment(static_cast<double>(h.unresolved_samples));
  tracked_processes_.Set(static_cast<double>(h.tracked_processes));
  pending_processes_.Set(static_cast<double>(h.pending_processes));
  if (h.usage) {
    probe_duty_cycle_.Add({}).Set(h.probe_duty_cycle);
    probe_cpu_.Add({}).Increment(h.probe_cpu_seconds);
    probe_hits_.Add({}).Increment(static_cast<double>(h.probe_hits));
    probe_budget_cpu_.Add({}).Increment(h.probe_budget_cpu_seconds);
    probe_toggles_.Add({}).Increment(static_cast<double>(h.probe_toggles));
    probe_budget_ratio_.Add({}).Set(h.probe_budget_share);
  }
}

void AgentMetrics::SetShip(const ShipHealth& s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [result, field] : kBatchResults) {
    Advance(batches_.Add(metrics::Labels(metrics::kAgentBatches, {result})), s.*field, last_ship_.*field);
  }
  Advance(send_errors_, s.send_errors, last_ship_.send_errors);
  spool_batches_.Set(static_cast<double>(s.spooled_batches));
  spool_pinned_.Set(static_cast<double>(s.pinned_batches));
  Advance(failovers_, s.failovers, last_ship_.failovers);
  spool_bytes_.Set(static_cast<double>(s.spooled_bytes));
  last_success_.Set(s.last_success_unix_seconds);
  last_ship_ = s;
}

void AgentMetrics::SetBounds(const BoundsHealth& b) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_limit_.Set(static_cast<double>(b.memory_limit_bytes));
  for (const auto& [what, field] : kMemoryLimited) {
    Advance(memory_limited_.Add(metrics::Labels(metrics::kAgentMemoryLimited, {what})), b.*field, last_bounds_.*field);
  }
  Advance(unwind_unregistered_, b.unwind_process_failures, last_bounds_.unwind_process_failures);
  for (size_t i = 0; i < refused_.size(); ++i) Advance(*refused_[i], b.refused[i], last_bounds_.refused[i]);
  last_bounds_ = b;
}

std::string AgentMetrics::Text() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace tlsprof::expose
