// The simulated fleet of tlsprof-loadgen: N agents, each with a fixed shape
// (CPUs, services, the TLS rows each service reports) drawn from --seed, and
// one AgentReport per window whose sample counts are drawn from (seed, agent,
// sequence) alone. So a report is the same whatever the order, timing or
// process that builds it, and two runs with one seed send the same counts
// (docs/fleet.md, "Load simulator").
//
// Reports pass every check the collector makes (docs/fleet.md, "Ingest"):
// 16-byte instance, sequence ≥ 1, contiguous windows of one interval,
// period_ns == 1e9/frequency_hz, busy samples ≤ cpus × length × frequency,
// tls_samples == the sum of its rows ≤ busy_samples, every row ≥ 1 sample,
// enums specified and label values from the canonical names.
//
// Thread-safe: a Fleet is immutable after Make(); BuildReport() may be called
// from any number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::loadgen {

struct FleetOptions {
  uint64_t seed = 1;
  uint32_t agents = 100;
  uint32_t series = 100;   // TlsCpu rows per report, exactly
  uint32_t services = 20;  // service names in the fleet's pool
  double interval_seconds = 10;
  uint32_t frequency_hz = 99;
  std::string hostname_prefix = "loadgen-";  // agent i is <prefix><i>
};

// What a row of a service reports: one (bucket, algorithm, phase) of the
// service's library, and its fixed share of the service's TLS samples.
struct RowShape {
  uint16_t combo;  // index into the combination table (fleet.cc)
  double weight;
};

struct ServiceShape {
  uint32_t name;     // index into the service pool
  uint32_t library;  // index into the library table
  uint32_t processes;
  double busy_weight;   // share of the host's busy samples
  double tls_fraction;  // of its busy samples
  std::vector<RowShape> rows;
};

struct AgentShape {
  std::string hostname;
  std::string instance;  // 16 bytes
  std::string machine_id;
  uint32_t cpus;
  double busy_fraction;   // of cpus × interval
  double non_tls_weight;  // share of busy samples outside any TLS service
  std::vector<ServiceShape> services;
};

class Fleet {
 public:
  static Result<Fleet> Make(const FleetOptions& options);

  const FleetOptions& options() const { return options_; }
  uint32_t agents() const { return static_cast<uint32_t>(agents_.size()); }
  const AgentShape& agent(uint32_t i) const { return agents_[i]; }
  int64_t interval_ns() const { return interval_ns_; }
  uint64_t period_ns() const { return period_ns_; }
  // The service pool's names, in pool order.
  const std::vector<std::string>& service_names() const { return service_names_; }

  // Fills `report` (cleared first) with agent `agent`'s window number
  // `sequence` (≥ 1): [start_unix_ns, start_unix_ns + interval).
  void BuildReport(uint32_t agent, uint64_t sequence, int64_t start_unix_ns, v1::AgentReport* report) const;

 private:
  FleetOptions options_;
  int64_t interval_ns_ = 0;
  uint64_t period_ns_ = 0;
  std::vector<std::string> service_names_;
  std::vector<AgentShape> agents_;
};

// Counts a report carries, for cross-checks against a collector's counters.
struct ReportTotals {
  uint64_t busy_samples = 0;
  uint64_t tls_samples = 0;
  uint64_t rows = 0;
};
ReportTotals Totals(const v1::AgentReport& report);

}  // namespace tlsprof::loadgen
