// Ingest (docs/fleet.md, "Ingest" steps 3, 5 and 6): the rate limit, then a
// validated report applied to the fleet's state (fleet_state.h): duplicate
// detection, the cardinality caps, the additive counters in base units and
// the per-minute summary. No I/O: persistence is store/ (snapshot.h), the
// Prometheus text and the JSON API are expose/ (fleet_metrics.h, fleet_api.h),
// and both reach the state through Read, Copy and Replace.
//
// Thread-safe: every public method may be called from any thread. One mutex
// guards the state and the rate-limit buckets; Apply's critical section is a
// few map updates, and readers hold it only to copy what they need. Copy
// holds it for the agents' index, not their contents (copy-on-write,
// fleet_state.h's Shared), so that compaction does not stall ingest.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "collector/ingest/agent_state.h"
#include "collector/ingest/fleet_state.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::collector {

inline constexpr int64_t kDefaultIdleExpiryNs = 3600LL * 1000 * 1000 * 1000;

struct IngestOptions {
  uint32_t max_series_per_agent = 2000;
  uint32_t max_services_per_agent = 64;
  double rate_per_agent = 1.0;  // reports per second
  double rate_burst = 120;
  bool host_labels = false;
  uint32_t max_hosts = 1000;
  // Hard bounds on what grows with the input (docs/fleet.md, "Bounds"):
  // agent keys (each holds its instances' sequence windows, series and
  // service hashes and a rate-limit bucket), and data series over all agents
  // (tlsprof_cpu_seconds_total + tlsprof_busy_cpu_seconds_total, and the
  // usage telemetry's handshake, operation and connection series: an
  // operation series, with its histogram, counts once).
  uint32_t max_agents = 10000;
  uint32_t max_series = 100000;
  // An agent key, or a host's --max-hosts slot, silent this long gives its
  // place up (docs/fleet.md, "Bounds"): what forged or departed names hold
  // is released after it. The default of --idle-expiry-seconds.
  int64_t idle_expiry_ns = kDefaultIdleExpiryNs;
};

// The key an agent's state lives under: its identity, plus the reported
// hostname when the identity is a relay that submits for many hosts.
std::string MakeAgentKey(std::string_view identity, std::string_view relay_hostname);

// Where a report went.
struct ApplyResult {
  bool duplicate = false;
  bool too_old = false;  // duplicate because it fell below the sequence window
  // A new agent key while --max-agents keys are held and none has been
  // silent for idle_expiry_ns: nothing counted, not journaled (retried).
  bool refused = false;
  uint32_t dropped_series = 0;
};

inline constexpr char kOverflowHost[] = "(overflow)";
inline constexpr char kOverflowAlgorithm[] = "(overflow)";
// Distinct (bucket, algorithm) pairs one summary minute keeps.
inline constexpr size_t kMaxSummaryAlgorithms = 1000;
// Summary minutes kept: the 60 a query may ask for plus the current one.
inline constexpr int64_t kSummaryMinutes = 61;
// Instances one agent key remembers (an agent whose state directory is wiped
// starts a new instance); the least recently seen is forgotten.
inline constexpr size_t kMaxInstancesPerAgent = 16;
// At --max-agents, a new agent key takes the place of the least recently seen
// one if that one has been silent for IngestOptions::idle_expiry_ns (by
// default this); otherwise it is refused.
inline constexpr int64_t kAgentIdleEvictNs = kDefaultIdleExpiryNs;
// |agent clock - collector clock| above this counts a report as skewed.
inline constexpr int64_t kSkewToleranceNs = 30LL * 1000 * 1000 * 1000;

class Ingestor {
 public:
  explicit Ingestor(IngestOptions options);

  const IngestOptions& options() const { return options_; }

  // Step 3: false when `agent_key` has no token left.
  bool TakeToken(const std::string& agent_key, int64_t now_ns);

  // Steps 5 and 6 for a validated report. When the report is new, `commit`
  // runs before the lock is released (the journal append: the journal's order
  // is then the order counters were applied in, and a replay gives the same
  // caps). Not called for duplicates.
  // `sent_ns`: the agent's clock at sending (SubmitRequest.sent_unix_ns, 0 =
  // unknown), for the clock-skew measurement.
  ApplyResult Apply(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                    const std::function<void()>& commit = {}, int64_t sent_ns = 0);

  // Returns fn(state) with the lock held, so that nothing is applied while
  // `fn` runs. `fn` copies what it needs and returns; it must not call the
  // Ingestor. Pointers into the series tables' labels stay valid after
  // (fleet_state.h).
  template <class Fn>
  auto Read(Fn&& fn) const {
    std::lock_guard lock(mu_);
    return fn(static_cast<const FleetState&>(state_));
  }
  // A copy of the state; `fn` runs under the same lock, after the copy
  // (compaction switches the journal there, so that the copy holds exactly
  // the records before the switch). Agents and summary minutes are shared
  // with the live state, not copied: the lock is held for one key and one
  // pointer per agent (plus the series tables, bounded by max_series), and
  // the copy may be read and destroyed on any thread without the lock while
  // ingest goes on (an agent written after the copy is cloned first).
  FleetState Copy(const std::function<void()>& fn = {}) const;
  // Replaces the state (a restored snapshot, at start, before serving).
  void Replace(FleetState state);
  // Whether the ingest lock can be taken within `wait`: false when ingest is
  // stuck (a deadlock, a holder that never returns), which only a restart
  // mends. The liveness check of /healthz.
  bool Responsive(std::chrono::milliseconds wait) const {
    std::unique_lock lock(mu_, std::defer_lock);
    return lock.try_lock_for(wait);
  }

 private:
  ApplyResult ApplyLocked(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                          int64_t sent_ns);
  // The agent of a new report: found, or made (evicting an idle agent at
  // max_agents); null when refused.
  FleetState::Agent* AdmitAgentLocked(const std::string& agent_key, int64_t now_ns);
  // A new agent key at max_agents: evicts the least recently seen agent if it
  // is idle enough (true), else false (refuse).
  bool MakeRoomForAgentLocked(int64_t now_ns);
  // Duplicate detection: false (and `result` says why) when the report's
  // (instance, sequence) was seen; else marks it seen.
  bool MarkNewLocked(const std::string& agent_key, FleetState::Agent& agent, const v1::AgentReport& report,
                     int64_t received_ns, ApplyResult& result);
  void MeasureSkewLocked(FleetState::Agent& agent, const v1::AgentReport& report, int64_t received_ns, int64_t sent_ns);
  // A report's gauges of its connection series, summed over its services:
  // live connections and the resident memory beside them.
  struct ConnectionGauges {
    std::map<ConnectionKey, double> connections;
    std::map<ConnectionKey, double> resident_bytes;
  };
  // A service's busy series and TLS rows (and its usage rows, into
  // `gauges`, when the report has usage).
  void ApplyServiceLocked(FleetState::Agent& agent, const v1::AgentReport& report, const v1::Service& service,
                          FleetState::Minute& minute, ConnectionGauges& gauges, ApplyResult& result);
  void ApplyTlsRowLocked(FleetState::Agent& agent, const v1::AgentReport& report, const v1::Service& service,
                         const v1::TlsCpu& row, FleetState::Minute& minute, ApplyResult& result);
  // A series of `agent` (its hash; `exists`: held already, for some agent)
  // within the per-agent and global caps: false (and counted in `result`)
  // when it must be dropped. The series is then counted for the agent.
  bool AdmitSeriesLocked(FleetState::Agent& agent, uint64_t hash, bool exists, ApplyResult& result);
  // The entry of `labels` (found by `hash`) in `table`, made if new; null
  // when AdmitSeriesLocked drops it.
  template <size_t N, class V>
  typename SeriesTable<N, V>::Entry* AdmitEntryLocked(FleetState::Agent& agent, SeriesTable<N, V>& table, uint64_t hash,
                                                      const std::array<std::string_view, N>& labels,
                                                      ApplyResult& result);
  // The usage rows of one service: counters now, its connections into
  // `gauges` (the report's gauge values, applied after every service).
  void ApplyUsageLocked(FleetState::Agent& agent, const v1::Service& service, ConnectionGauges& gauges,
                        ApplyResult& result);
  // The report's usage block: probe totals, and the agent's gauges when the
  // report is its latest.
  void ApplyUsageStatsLocked(FleetState::Agent& agent, const v1::AgentReport& report, int64_t received_ns,
                             ConnectionGauges gauges);
  // With --host-labels: the report's host keeps (or takes) a --max-hosts slot
  // and its last-seen time; hosts silent for idle_expiry_ns first give up
  // theirs, with their tlsprof_host_* series.
  void AdmitHostLocked(const std::string& hostname, int64_t now_ns);
  void ExpireHostsLocked(int64_t now_ns);
  // The host's own label if it holds a slot, else kOverflowHost.
  std::string HostLabelLocked(const std::string& hostname) const;
  void PruneMinutesLocked(int64_t now_minute);

  const IngestOptions options_;
  mutable std::timed_mutex mu_;  // timed: Responsive()
  FleetState state_;
  // Rate limiting (not persisted: a restart starts every key full).
  std::unordered_map<std::string, TokenBucket> buckets_;
  int64_t no_eviction_before_ns_ = 0;     // no agent is idle enough before this
  int64_t no_host_expiry_before_ns_ = 0;  // no host slot expires before this
};

}  // namespace tlsprof::collector
