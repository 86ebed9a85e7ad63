#include "agent/daemon/encode.h"

#include <algorithm>
#include <vector>

#include "agent/daemon/services.h"

namespace tlsprof::daemon {

ServiceMap GroupServices(const aggregate::Profile& profile, uint64_t scope_busy_samples,
                         const std::function<ServiceKey(const aggregate::ProcessProfile&)>& service_of) {
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

v1::Bucket BucketToProto(classify::Bucket bucket) {
  switch (bucket) {
    case classify::Bucket::kCipher:
      return v1::BUCKET_CIPHER;
    case classify::Bucket::kSignature:
      return v1::BUCKET_SIGNATURE;
    case classify::Bucket::kKeyExchange:
      return v1::BUCKET_KEY_EXCHANGE;
    case classify::Bucket::kHash:
      return v1::BUCKET_HASH;
    case classify::Bucket::kOther:
      return v1::BUCKET_OTHER;
  }
  return v1::BUCKET_OTHER;
}

v1::Phase PhaseToProto(classify::Phase phase) {
  switch (phase) {
    case classify::Phase::kHandshake:
      return v1::PHASE_HANDSHAKE;
    case classify::Phase::kRecord:
      return v1::PHASE_RECORD;
    case classify::Phase::kOther:
      return v1::PHASE_OTHER;
  }
  return v1::PHASE_OTHER;
}

v1::AgentReport EncodeReport(const ServiceMap& services, uint64_t busy_samples, const WindowInfo& window,
                             const v1::Host& host, const v1::AgentStats& agent) {
  v1::AgentReport report;
  *report.mutable_host() = host;
  v1::Window* w = report.mutable_window();
  w->set_start_unix_ns(window.start_unix_ns);
  w->set_end_unix_ns(window.end_unix_ns);
  w->set_frequency_hz(window.frequency_hz);
  w->set_period_ns(window.period_ns);
  uint64_t services_busy = 0;
  for (const auto& [key, s] : services) {
    if (s.busy_samples == 0 && s.tls_samples == 0) continue;
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
    services_busy += out->busy_samples();
  }
  report.set_busy_samples(std::max(busy_samples, services_busy));
  *report.mutable_agent() = agent;
  return report;
}

}  // namespace tlsprof::daemon
