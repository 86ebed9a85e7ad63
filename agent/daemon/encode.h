// One window of the profiler as a tlsprof.v1.AgentReport (proto/tlsprof/v1/
// report.proto): processes grouped into services (services.h), TLS samples
// per (bucket, algorithm, phase, library). Sequence and instance are left to
// the shipper (ship::Shipper::Seal). Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "agent/aggregate/profile.h"
#include "agent/daemon/services.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::daemon {

struct ServiceTotals {
  uint64_t busy_samples = 0;
  uint64_t tls_samples = 0;
  uint32_t processes = 0;
  std::map<aggregate::LibraryAlgorithmKey, uint64_t> tls;
};

using ServiceMap = std::map<ServiceKey, ServiceTotals>;

// The services of a window. `service_of` keys a process (its unit or comm,
// its container and pod); processes with no TLS time and no TLS library go
// to "(non-tls)" without asking it. `scope_busy_samples`: the host's busy
// samples; what no process entry holds (the kernel's pid map was full) is
// added to "(non-tls)", so that the services add up to the host. Past
// kMaxServices keys (containers multiply them), the keys with the least busy
// CPU are summed into "(overflow)", which has no container.
ServiceMap GroupServices(const aggregate::Profile& profile, uint64_t scope_busy_samples,
                         const std::function<ServiceKey(const aggregate::ProcessProfile&)>& service_of);

struct WindowInfo {
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  uint32_t frequency_hz = 0;
  uint64_t period_ns = 0;
};

v1::Bucket BucketToProto(classify::Bucket bucket);
v1::Phase PhaseToProto(classify::Phase phase);

// The report of one window. Per service, busy_samples is at least
// tls_samples: the kernel maps are read one after another, so a process's
// TLS samples may run a few samples ahead of its busy samples at a window's
// edge; the report keeps the collector's invariant (tls <= busy).
v1::AgentReport EncodeReport(const ServiceMap& services, uint64_t busy_samples, const WindowInfo& window,
                             const v1::Host& host, const v1::AgentStats& agent);

}  // namespace tlsprof::daemon
