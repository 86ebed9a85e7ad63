// One window of the profiler as a tlsprof.v1.AgentReport (proto/tlsprof/v1/
// report.proto): processes grouped into services (services.h), TLS samples
// per (bucket, algorithm, phase, library). Sequence and instance are left to
// the shipper (ship::Shipper::Seal). Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "agent/aggregate/attribution.h"
#include "agent/profiler/window.h"
#include "agent/usage/handshake_cost.h"
#include "agent/usage/usage_probes.h"
#include "agent/wire/services.h"
#include "proto/tlsprof/v1/usage_wire.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::wire {

// A service's usage telemetry in one window (usage::UsageSnapshot's rows of
// its processes, merged by their labels: names from agent/usage/names.h,
// the library's family).
struct ServiceUsage {
  // side, kind, version, cipher_suite, group, cert_key_type, library
  using HandshakeKey =
      std::tuple<v1::Side, v1::HandshakeKind, std::string, std::string, std::string, std::string, std::string>;
  struct Count {
    uint64_t observed = 0;
    double estimated = 0;
    double cpu_seconds = 0;  // the handshakes' modelled TLS CPU (UsageCosts::handshake_cpu)
  };
  // operation, algorithm, library, in_handshake
  using OperationKey = std::tuple<v1::Operation, std::string, std::string, bool>;
  struct Operation {
    uint64_t observed = 0;
    double estimated = 0;
    uint64_t cpu_ns = 0;
    std::array<uint64_t, v1::kLatencyBuckets> buckets{};  // v1's fixed bounds
  };
  std::map<HandshakeKey, Count> handshakes;
  std::map<OperationKey, Operation> operations;
  // Live connections by library, and the resident memory of the processes
  // that hold them (each process once per library).
  struct Connections {
    double estimated = 0;
    uint64_t resident_bytes = 0;
  };
  std::map<std::string, Connections> connections;

  bool empty() const { return handshakes.empty() && operations.empty() && connections.empty(); }
};

struct ServiceTotals {
  uint64_t busy_samples = 0;
  uint64_t tls_samples = 0;
  uint32_t processes = 0;
  std::map<aggregate::LibraryAlgorithmKey, uint64_t> tls;
  ServiceUsage usage;
};

using ServiceMap = std::map<ServiceKey, ServiceTotals>;

// The services of a window. `service_of` keys a process (its unit or comm,
// its container and pod); processes with no TLS time and no TLS library go
// to "(non-tls)" without asking it. `scope_busy_samples`: the host's busy
// samples; what no process entry holds (the kernel's pid map was full) is
// added to "(non-tls)", so that the services add up to the host. Past
// kMaxServices keys (containers multiply them), the keys with the least busy
// CPU are summed into "(overflow)", which has no container.
ServiceMap GroupServices(const aggregate::Attribution& profile, uint64_t scope_busy_samples,
                         const std::function<ServiceKey(const aggregate::ProcessAttribution&)>& service_of);

// The usage probes' histogram (usage::OperationStats::slots, USAGE_HIST_SLOTS
// exp2 slots with sub-buckets) in v1's fixed buckets: every slot lies inside
// one of them (usage::SlotBounds).
std::array<uint64_t, v1::kLatencyBuckets> LatencyBuckets(const std::vector<uint64_t>& slots);

// What a window knows of its usage rows' processes besides the probes'
// counts: per row of UsageSnapshot::handshakes, in order, the modelled TLS
// CPU of its handshakes (usage::SplitHandshakeCpu; empty: none known), and a
// process's resident memory at the window's end (empty: 0).
struct UsageCosts {
  std::vector<usage::HandshakeCost> handshake_cpu;
  std::function<uint64_t(uint32_t tgid)> resident_bytes;
};

// Adds the window's usage rows to `services`. `service_of` keys a process
// (nullopt: leave it out: the agent itself, processes outside --pid);
// `library_of` names a probe cookie's library family ("openssl-3", "go").
// A service the samples did not give is added, unless kMaxServices are
// there: then its rows go to "(overflow)". Rows of the calibration
// operation are left out. Past v1's per-report row caps (usage_wire.h) new
// rows are dropped: returns how many. `costs` adds each handshake row's CPU
// to its row, and each process's resident memory to its connection rows.
size_t AddUsage(ServiceMap& services, const usage::UsageSnapshot& usage,
                const std::function<std::optional<ServiceKey>(uint32_t tgid)>& service_of,
                const std::function<std::string(uint16_t lib)>& library_of, const UsageCosts& costs = {});

// The report's usage block from the window's budget and totals.
v1::UsageStats UsageStatsOf(const usage::UsageSnapshot& usage);

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
// edge; the report keeps the collector's invariant (tls <= busy). `usage`:
// the report's usage block (`run --usage`), with the services' usage rows.
v1::AgentReport EncodeReport(const ServiceMap& services, uint64_t busy_samples, const WindowInfo& window,
                             const v1::Host& host, const v1::AgentStats& agent,
                             const std::optional<v1::UsageStats>& usage = std::nullopt);

// How the agent labels its services (--no-container-labels turns the
// container and pod off).
struct EncodeOptions {
  bool container_labels = true;
};

// The spool when the window is sealed (ship::ShipperStats); zero without a
// collector.
struct SpoolState {
  uint64_t batches = 0;
  uint64_t dropped = 0;
};

// One window as the fleet's report: services from the window's processes
// (GroupServices), their usage rows (AddUsage, with the processes the
// window describes), the host, the agent's cost and the spool. Usage rows
// past the per-report caps are left out, and logged.
v1::AgentReport EncodeWindow(const profiler::Window& window, const EncodeOptions& options, const SpoolState& spool);

}  // namespace tlsprof::wire
