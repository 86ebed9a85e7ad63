#include "agent/wire/encode.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "agent/usage/names.h"
#include "agent/wire/services.h"

#include <spdlog/spdlog.h>

namespace tlsprof::wire {

ServiceMap GroupServices(const aggregate::Attribution& profile, uint64_t scope_busy_samples,
                         const std::function<ServiceKey(const aggregate::ProcessAttribution&)>& service_of) {
  const ServiceKey non_tls{std::string(kNonTlsService), "", ""};
  ServiceMap services;
  uint64_t accounted = 0;
  for (const auto& [pid, p] : profile.processes) {
    const bool tls = p.crypto.tls > 0 || !p.libraries.empty();
    ServiceTotals& s = services[tls ? service_of(p) : non_tls];
    s.busy_samples += p.samples;
    s.tls_samples += p.crypto.tls;
    s.processes += 1;
    for (const auto& [key, n] : p.crypto.library_algorithms) s.tls[key] += n;
    accounted += p.samples;
  }
  if (scope_busy_samples > accounted) services[non_tls].busy_samples += scope_busy_samples - accounted;

  if (services.size() > kMaxServices) {
    std::vector<std::pair<uint64_t, ServiceKey>> by_busy;
    for (const auto& [key, s] : services) {
      if (key != non_tls) by_busy.emplace_back(s.busy_samples, key);
    }
    std::sort(by_busy.begin(), by_busy.end(), std::greater<>());
    // Keep (non-tls), (overflow) and the busiest others.
    const size_t keep = kMaxServices - 2;
    ServiceTotals overflow;
    for (size_t i = keep; i < by_busy.size(); ++i) {
      auto node = services.extract(by_busy[i].second);
      ServiceTotals& s = node.mapped();
      overflow.busy_samples += s.busy_samples;
      overflow.tls_samples += s.tls_samples;
      overflow.processes += s.processes;
      for (const auto& [key, n] : s.tls) overflow.tls[key] += n;
    }
    ServiceTotals& o = services[ServiceKey{std::string(kOverflowService), "", ""}];
    o.busy_samples += overflow.busy_samples;
    o.tls_samples += overflow.tls_samples;
    o.processes += overflow.processes;
    for (const auto& [key, n] : overflow.tls) o.tls[key] += n;
  }
  return services;
}

std::array<uint64_t, v1::kLatencyBuckets> LatencyBuckets(const std::vector<uint64_t>& slots) {
  std::array<uint64_t, v1::kLatencyBuckets> out{};
  for (uint32_t i = 0; i < slots.size(); ++i) {
    if (slots[i] == 0) continue;
    out[v1::LatencyBucketOf(usage::SlotBounds(i).second)] += slots[i];
  }
  return out;
}

namespace {

v1::Side SideOf(uint8_t is_server) {
  return is_server == 1 ? v1::SIDE_SERVER : is_server == 0 ? v1::SIDE_CLIENT : v1::SIDE_UNKNOWN;
}

v1::HandshakeKind KindOf(uint8_t resumed) {
  return resumed == 1   ? v1::HANDSHAKE_KIND_RESUMED
         : resumed == 0 ? v1::HANDSHAKE_KIND_FULL
                        : v1::HANDSHAKE_KIND_UNKNOWN;
}

std::optional<v1::Operation> OperationOf(uint8_t op) {
  switch (op) {
    case USAGE_OP_SIGN:
      return v1::OPERATION_SIGN;
    case USAGE_OP_VERIFY:
      return v1::OPERATION_VERIFY;
    case USAGE_OP_DERIVE:
      return v1::OPERATION_KEY_EXCHANGE;
  }
  return std::nullopt;  // USAGE_OP_CALIBRATE: the agent's own probe timing
}

}  // namespace

size_t AddUsage(ServiceMap& services, const usage::UsageSnapshot& usage,
                const std::function<std::optional<ServiceKey>(uint32_t tgid)>& service_of,
                const std::function<std::string(uint16_t lib)>& library_of, const UsageCosts& costs) {
  // A process's usage goes to its service as the samples keyed it; one the
  // window's samples did not give (no sample at 99 Hz) is added, within
  // kMaxServices.
  std::map<uint32_t, ServiceTotals*> by_tgid;
  auto service = [&](uint32_t tgid) -> ServiceTotals* {
    auto [it, fresh] = by_tgid.try_emplace(tgid, nullptr);
    if (!fresh) return it->second;
    std::optional<ServiceKey> key = service_of(tgid);
    if (!key) return nullptr;
    key->name = SanitizeLabel(key->name);
    if (!services.contains(*key) && services.size() >= kMaxServices) key = ServiceKey{std::string(kOverflowService)};
    return it->second = &services[*key];
  };
  size_t handshake_rows = 0, operation_rows = 0, connection_rows = 0, dropped = 0;
  for (const auto& [key, s] : services) {
    handshake_rows += s.usage.handshakes.size();
    operation_rows += s.usage.operations.size();
    connection_rows += s.usage.connections.size();
  }
  // The row of `key` in `rows`, or nullptr past `cap` rows over all services.
  auto row = [&dropped](auto& rows, auto&& key, size_t& count, size_t cap) -> decltype(&rows.begin()->second) {
    auto it = rows.find(key);
    if (it != rows.end()) return &it->second;
    if (count >= cap) {
      ++dropped;
      return nullptr;
    }
    ++count;
    return &rows[std::forward<decltype(key)>(key)];
  };
  for (size_t i = 0; i < usage.handshakes.size(); ++i) {
    const usage::HandshakeCount& h = usage.handshakes[i];
    ServiceTotals* s = service(h.key.tgid);
    if (s == nullptr) continue;
    ServiceUsage::HandshakeKey key{SideOf(h.key.is_server),
                                   KindOf(h.key.resumed),
                                   SanitizeLabel(usage::VersionName(h.key.version)),
                                   SanitizeLabel(usage::CipherSuiteName(h.key.cipher)),
                                   SanitizeLabel(usage::GroupName(h.key.kx_type, h.key.kx_len)),
                                   SanitizeLabel(usage::CertKeyTypeName(h.key.cert_type)),
                                   SanitizeLabel(library_of(h.key.lib))};
    if (auto* c = row(s->usage.handshakes, std::move(key), handshake_rows, v1::kMaxHandshakeRows)) {
      c->observed += h.count;
      c->estimated += h.estimated;
      if (i < costs.handshake_cpu.size()) c->cpu_seconds += costs.handshake_cpu[i].cpu_seconds;
    }
  }
  for (const usage::OperationStats& op : usage.operations) {
    const std::optional<v1::Operation> operation = OperationOf(op.key.op);
    if (!operation) continue;
    ServiceTotals* s = service(op.key.tgid);
    if (s == nullptr) continue;
    const std::string algorithm = op.key.op == USAGE_OP_DERIVE
                                      ? usage::KeyExchangeAlgorithm(op.key.key_type, op.key.len)
                                      : usage::SignatureAlgorithm(op.key.key_type, op.key.len);
    ServiceUsage::OperationKey key{*operation, SanitizeLabel(algorithm), SanitizeLabel(library_of(op.key.lib)),
                                   op.key.in_handshake != 0};
    if (auto* o = row(s->usage.operations, std::move(key), operation_rows, v1::kMaxOperationRows)) {
      o->observed += op.count;
      o->estimated += op.estimated;
      o->cpu_ns += op.cpu_ns;
      const auto buckets = LatencyBuckets(op.slots);
      for (size_t i = 0; i < buckets.size(); ++i) o->buckets[i] += buckets[i];
    }
  }
  for (const usage::ConnectionCount& c : usage.connections) {
    ServiceTotals* s = service(c.tgid);
    if (s == nullptr) continue;
    if (auto* n =
            row(s->usage.connections, SanitizeLabel(library_of(c.lib)), connection_rows, v1::kMaxConnectionRows)) {
      n->estimated += c.estimated;
      if (costs.resident_bytes) n->resident_bytes += costs.resident_bytes(c.tgid);
    }
  }
  return dropped;
}

v1::UsageStats UsageStatsOf(const usage::UsageSnapshot& usage) {
  // Within what the collector accepts (a bad value would get the whole
  // report rejected): a duty cycle in [0, 1], the rest finite and >= 0.
  auto non_negative = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  v1::UsageStats out;
  out.set_duty_cycle(std::isfinite(usage.budget.duty_cycle) ? std::clamp(usage.budget.duty_cycle, 0.0, 1.0) : 1.0);
  out.set_relative_error(non_negative(usage.budget.relative_error));
  out.set_probe_cpu_seconds(non_negative(usage.budget.probe_cpu_seconds));
  out.set_probe_hits(usage.totals.hits);
  out.set_budget_cpu_seconds(non_negative(usage.budget.budget_cpu_seconds));
  return out;
}

// The wire's enums are the agent's, shifted past UNSPECIFIED (0).
static_assert(v1::BUCKET_CIPHER == 1 + static_cast<int>(classify::Bucket::kCipher) &&
              v1::BUCKET_SIGNATURE == 1 + static_cast<int>(classify::Bucket::kSignature) &&
              v1::BUCKET_KEY_EXCHANGE == 1 + static_cast<int>(classify::Bucket::kKeyExchange) &&
              v1::BUCKET_HASH == 1 + static_cast<int>(classify::Bucket::kHash) &&
              v1::BUCKET_OTHER == 1 + static_cast<int>(classify::Bucket::kOther));
static_assert(v1::PHASE_HANDSHAKE == 1 + static_cast<int>(classify::Phase::kHandshake) &&
              v1::PHASE_RECORD == 1 + static_cast<int>(classify::Phase::kRecord) &&
              v1::PHASE_OTHER == 1 + static_cast<int>(classify::Phase::kOther));

v1::Bucket BucketToProto(classify::Bucket bucket) { return static_cast<v1::Bucket>(1 + static_cast<int>(bucket)); }

v1::Phase PhaseToProto(classify::Phase phase) { return static_cast<v1::Phase>(1 + static_cast<int>(phase)); }

namespace {

// What the collector accepts of an estimate (docs/fleet.md, "Usage
// telemetry"): finite, at least the observed count, 0 when nothing was
// observed. A value outside would get the whole report rejected, its CPU
// rows included, so it falls back to the observed count.
double Estimate(uint64_t observed, double estimated) {
  if (observed == 0) return 0;
  const double floor = static_cast<double>(observed);
  return std::isfinite(estimated) && estimated >= floor ? estimated : floor;
}

void EncodeUsage(const ServiceUsage& usage, v1::Service& out) {
  for (const auto& [key, count] : usage.handshakes) {
    const auto& [side, kind, version, suite, group, cert, library] = key;
    v1::Handshakes* h = out.add_handshakes();
    h->set_side(side);
    h->set_kind(kind);
    h->set_version(version);
    h->set_cipher_suite(suite);
    h->set_group(group);
    h->set_cert_key_type(cert);
    h->set_library(library);
    h->set_observed(count.observed);
    h->set_estimated(Estimate(count.observed, count.estimated));
    h->set_cpu_seconds(std::isfinite(count.cpu_seconds) && count.cpu_seconds > 0 ? count.cpu_seconds : 0);
  }
  for (const auto& [key, op] : usage.operations) {
    const auto& [operation, algorithm, library, in_handshake] = key;
    v1::CryptoOperations* o = out.add_operations();
    o->set_operation(operation);
    o->set_algorithm(algorithm);
    o->set_library(library);
    o->set_in_handshake(in_handshake);
    o->set_observed(op.observed);
    o->set_estimated(Estimate(op.observed, op.estimated));
    o->set_cpu_seconds(static_cast<double>(op.cpu_ns) / 1e9);
    // The histogram adds up to `observed` (the collector checks): the BPF
    // map's count and slots are updated together.
    o->mutable_latency_buckets()->Add(op.buckets.begin(), op.buckets.end());
  }
  for (const auto& [library, connections] : usage.connections) {
    v1::Connections* c = out.add_connections();
    c->set_library(library);
    c->set_estimated(std::isfinite(connections.estimated) && connections.estimated > 0 ? connections.estimated : 0);
    c->set_resident_bytes(connections.resident_bytes);
  }
}

}  // namespace

v1::AgentReport EncodeReport(const ServiceMap& services, uint64_t busy_samples, const WindowInfo& window,
                             const v1::Host& host, const v1::AgentStats& agent,
                             const std::optional<v1::UsageStats>& usage) {
  v1::AgentReport report;
  *report.mutable_host() = host;
  v1::Window* w = report.mutable_window();
  w->set_start_unix_ns(window.start_unix_ns);
  w->set_end_unix_ns(window.end_unix_ns);
  w->set_frequency_hz(window.frequency_hz);
  w->set_period_ns(window.period_ns);
  uint64_t services_busy = 0;
  for (const auto& [key, s] : services) {
    if (s.busy_samples == 0 && s.tls_samples == 0 && (!usage || s.usage.empty())) continue;
    v1::Service* out = report.add_services();
    out->set_name(SanitizeLabel(key.name));
    out->set_container_id(key.container_id);
    out->set_pod_uid(key.pod_uid);
    uint64_t tls = 0;
    for (const auto& [key, n] : s.tls) {
      if (n == 0) continue;
      v1::TlsCpu* row = out->add_tls();
      row->set_bucket(BucketToProto(key.algorithm.bucket));
      row->set_algorithm(SanitizeLabel(key.algorithm.algorithm));
      row->set_phase(PhaseToProto(key.algorithm.phase));
      row->set_library(SanitizeLabel(classify::LibraryKindName(key.library)));
      row->set_samples(n);
      tls += n;
    }
    out->set_tls_samples(tls);
    out->set_busy_samples(std::max(s.busy_samples, tls));
    out->set_processes(s.processes);
    if (usage) EncodeUsage(s.usage, *out);
    services_busy += out->busy_samples();
  }
  report.set_busy_samples(std::max(busy_samples, services_busy));
  *report.mutable_agent() = agent;
  if (usage) *report.mutable_usage() = *usage;
  return report;
}

namespace {

// A process with usage rows, as a service: from its snapshot, else from
// /proc at the close; "(exited)" when it was gone by then (a short-lived
// client); nullopt for the agent itself and processes outside --pid.
std::optional<ServiceKey> UsageServiceOf(const profiler::Window& window, uint32_t tgid, bool container_labels) {
  if (!window.in_scope(tgid)) return std::nullopt;
  const profiler::ProcessInfo& info = window.process(tgid);
  if (!info.snapshotted && info.comm.empty()) return ServiceKey{std::string(kExitedService)};
  return ServiceKeyOf(info.cgroup, info.comm, info.container, container_labels);
}

}  // namespace

v1::AgentReport EncodeWindow(const profiler::Window& window, const EncodeOptions& options, const SpoolState& spool) {
  const aggregate::Attribution& profile = window.attribution;
  ServiceMap services =
      GroupServices(profile, profile.scope_samples, [&window, &options](const aggregate::ProcessAttribution& p) {
        const profiler::ProcessInfo& info = window.process(static_cast<uint32_t>(p.pid));
        return ServiceKeyOf(info.snapshotted ? std::string_view(info.cgroup) : std::string_view(), p.comm,
                            info.snapshotted ? info.container : discovery::ContainerIdentity{},
                            options.container_labels);
      });
  std::optional<v1::UsageStats> usage_stats;
  if (window.usage) {
    std::map<uint16_t, std::string> library;
    for (const usage::AttachedFile& f : window.usage->files) library[f.lib] = f.library;
    auto service_of = [&](uint32_t tgid) { return UsageServiceOf(window, tgid, options.container_labels); };
    auto library_of = [&library](uint16_t lib) {
      auto it = library.find(lib);
      return it == library.end() || it->second.empty() ? std::string("unknown") : it->second;
    };
    // The handshake phase's sampled TLS CPU of each process, split over its
    // handshakes as the JSON report does (docs/usage.md, "Cost per
    // handshake"), and the processes' resident memory beside their
    // connections.
    UsageCosts costs;
    costs.handshake_cpu = usage::SplitHandshakeCpu(window.usage->counts, [&window](uint32_t tgid) {
      auto it = window.attribution.processes.find(static_cast<pid_t>(tgid));
      if (it == window.attribution.processes.end()) return 0.0;
      return static_cast<double>(it->second.crypto.phases[static_cast<size_t>(classify::Phase::kHandshake)]) *
             window.seconds_per_sample();
    });
    costs.resident_bytes = [&window](uint32_t tgid) { return window.process(tgid).resident_bytes; };
    if (const size_t dropped = AddUsage(services, window.usage->counts, service_of, library_of, costs); dropped > 0) {
      spdlog::warn("usage: {} rows past the per-report caps left out of this window", dropped);
    }
    usage_stats = UsageStatsOf(window.usage->counts);
  }
  v1::Host host;
  host.set_hostname(window.host.hostname);
  host.set_machine_id(window.host.machine_id);
  host.set_agent_version(TLSPROF_VERSION);
  host.set_cpus(static_cast<uint32_t>(window.host.cpus));
  v1::AgentStats agent;
  agent.set_cpu_seconds(window.cost.window_cpu_seconds);
  agent.set_max_rss_bytes(window.cost.resident_bytes);
  agent.set_dropped_samples(window.totals.dropped_ip + window.totals.dropped_pid + window.totals.dropped_stack);
  agent.set_unresolved_samples(profile.unresolved_samples);
  agent.set_spooled_batches(spool.batches);
  agent.set_spool_dropped_batches(spool.dropped);
  WindowInfo info{.start_unix_ns = window.start_unix_ns,
                  .end_unix_ns = window.end_unix_ns,
                  .frequency_hz = window.host.frequency_hz,
                  .period_ns = window.host.period_ns};
  return EncodeReport(services, profile.scope_samples, info, host, agent, usage_stats);
}

}  // namespace tlsprof::wire
