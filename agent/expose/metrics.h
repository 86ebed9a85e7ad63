// The agent's own /metrics (prometheus-cpp's registry and text format over
// common/http's server): the same data metrics as the collector's, for this
// host (docs/fleet.md, "Metrics"), and the agent's health as tlsprof_agent_*;
// beside it, GET /healthz answers from the window loop's LoopHealth
// (health.h).
// Thread-safe: prometheus-cpp's metrics are; the server serves from its own
// threads.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "agent/expose/health.h"
#include "agent/guard/limits.h"
#include "agent/profiler/phase_clock.h"
#include "agent/ship/shipper.h"
#include "common/http/server.h"
#include "common/metrics/metric_table.h"
#include "common/result.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::expose {

// The agent's health over one window.
struct WindowHealth {
  double duration_seconds = 0;
  double agent_cpu_seconds = 0;  // the agent process's CPU in the window
  // The agent's CPU per phase over the window's cycle (profiler::AgentCost::phases).
  profiler::AgentPhaseSeconds phase_cpu_seconds{};
  double bpf_seconds = 0;  // the sampling program's run time in the window
  uint64_t samples = 0;    // samples it took, idle ones included
  uint64_t resident_bytes = 0;
  uint64_t dropped_samples = 0;
  uint64_t unresolved_samples = 0;
  uint64_t tracked_processes = 0;
  uint64_t pending_processes = 0;  // found, not read yet (Profiler::pending)
  // Usage probes (run --usage): their duty cycle over the window, their
  // estimated CPU cost and hits in it.
  bool usage = false;
  double probe_duty_cycle = 1;
  double probe_cpu_seconds = 0;
  uint64_t probe_hits = 0;
  double probe_budget_cpu_seconds = 0;  // what the budget allowed in the window (0: no budget)
  uint64_t probe_toggles = 0;           // attaches and detaches of the duty cycle
  double probe_budget_share = 0;        // --usage-budget as a share of the host's CPUs (0: none)
};

// The shipper's counters, mirrored as they are.
using ShipHealth = ship::ShipperStats;

// The agent's bounds (docs/fleet.md, "Memory"): cumulative counts, mirrored.
struct BoundsHealth {
  uint64_t memory_limit_bytes = 0;       // 0: no limit
  uint64_t images_skipped = 0;           // symbol loads refused by the memory budget
  uint64_t tables_skipped = 0;           // unwind tables not built, likewise
  uint64_t unwind_process_failures = 0;  // processes the unwind_procs map had no room for
  // What the guard's caps refused or cut, by guard::Reason (guard/limits.h).
  std::array<uint64_t, guard::kReasonCount> refused{};
};

// "HOST:PORT" with a numeric port in 1..65535 and a non-empty host (an IPv6
// host in brackets). An error says what is wrong.
Status CheckListenAddress(const std::string& address);

class AgentMetrics {
 public:
  static constexpr size_t kMaxSeries = 4000;

  AgentMetrics();
  // Serves the registry at http://ADDRESS/metrics (gzip when the scrape
  // takes it) and, given a `health` that outlives this object, GET /healthz:
  // 200 with its text while healthy, 503 once stalled. Other paths are 404,
  // other methods 405. Fails when the address does not parse or cannot be
  // bound (port in use).
  Status Serve(const std::string& address, const LoopHealth* health = nullptr);

  void AddReport(const v1::AgentReport& report);
  void AddWindow(const WindowHealth& health);
  void SetShip(const ShipHealth& ship);
  void SetBounds(const BoundsHealth& bounds);

  // The text exposition, as a scrape would get it (for tests).
  std::string Text() const;

 private:
  // The labels of a series of one of `s`'s data metrics, from `own`: its
  // values of the metric's other labels, in the table's order. Past
  // kMaxSeries series, a new one goes to service "(overflow)" without a
  // container.
  prometheus::Labels ServiceLabelsLocked(const metrics::Metric& metric, const v1::Service& s,
                                         std::initializer_list<std::string_view> own);
  void AddOperationLocked(const v1::Service& s, const v1::CryptoOperations& o);
  // tlsprof_tls_connections and tlsprof_tls_resident_memory_bytes become
  // `report`'s.
  void SetConnectionsLocked(const v1::AgentReport& report);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& cpu_seconds_;
  prometheus::Family<prometheus::Counter>& busy_seconds_;
  prometheus::Counter& reports_;
  prometheus::Counter& windows_;
  prometheus::Gauge& window_duration_;
  prometheus::Counter& agent_cpu_;
  std::array<prometheus::Counter*, profiler::kAgentPhaseCount> phase_cpu_{};
  prometheus::Counter& bpf_seconds_;
  prometheus::Counter& samples_;
  prometheus::Gauge& rss_;
  prometheus::Counter& dropped_samples_;
  prometheus::Counter& unresolved_samples_;
  prometheus::Gauge& tracked_processes_;
  prometheus::Gauge& pending_processes_;
  prometheus::Gauge& spool_batches_;
  prometheus::Gauge& spool_pinned_;
  prometheus::Counter& failovers_;
  prometheus::Gauge& spool_bytes_;
  prometheus::Family<prometheus::Counter>& batches_;
  prometheus::Counter& send_errors_;
  prometheus::Gauge& last_success_;
  prometheus::Gauge& memory_limit_;
  prometheus::Family<prometheus::Counter>& memory_limited_;
  std::array<prometheus::Counter*, guard::kReasonCount> refused_{};
  prometheus::Counter& unwind_unregistered_;
  // Usage telemetry (docs/fleet.md, "Usage telemetry").
  prometheus::Family<prometheus::Counter>& handshakes_;
  prometheus::Family<prometheus::Counter>& operations_;
  prometheus::Family<prometheus::Counter>& operation_cpu_;
  prometheus::Family<prometheus::Histogram>& operation_latency_;
  prometheus::Family<prometheus::Counter>& handshake_cpu_;
  prometheus::Family<prometheus::Gauge>& connections_;
  prometheus::Family<prometheus::Gauge>& resident_;
  prometheus::Family<prometheus::Gauge>& probe_duty_cycle_;
  prometheus::Family<prometheus::Counter>& probe_cpu_;
  prometheus::Family<prometheus::Counter>& probe_hits_;
  prometheus::Family<prometheus::Counter>& probe_budget_cpu_;
  prometheus::Family<prometheus::Counter>& probe_toggles_;
  prometheus::Family<prometheus::Gauge>& probe_budget_ratio_;
  // The connection and resident memory gauges of the last report (by the
  // connections' labels): a series the next report lacks is removed (its
  // processes are gone).
  struct ConnectionGauges {
    prometheus::Gauge* connections = nullptr;
    prometheus::Gauge* resident = nullptr;
  };
  std::map<std::map<std::string, std::string>, ConnectionGauges> connection_gauges_;
  BoundsHealth last_bounds_;
  std::mutex mu_;
  ShipHealth last_ship_;  // counters are advanced by the difference
  // Series of the data metrics so far: past kMaxSeries, new series of a
  // service go to service "(overflow)", so /metrics stays bounded over months
  // of services coming and going.
  std::set<std::vector<std::string>> series_;
  // Last: destroyed first, so no request in flight outlives what it reads.
  std::unique_ptr<http::Server> server_;
};

}  // namespace tlsprof::expose
