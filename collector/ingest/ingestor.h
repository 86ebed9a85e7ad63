// The collector's counters and per-agent memory (docs/fleet.md, "Ingest"
// steps 3, 5 and 6): rate limit, duplicate detection, cardinality caps, the
// additive counters in base units and the per-minute summary.
//
// Thread-safe: every public method may be called from any thread; one mutex
// guards the state (Submit's critical section is a few map updates).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <prometheus/metric_family.h>
#include <nlohmann/json.hpp>

#include "collector/ingest/agent_state.h"
#include "collector/ingest/usage_series.h"
#include "common/result.h"
#include "ingest/state.pb.h"  // generated from collector/ingest/state.proto
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::collector {

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
};

// The key an agent's state lives under: its identity, plus the reported
// hostname when the identity is a relay that submits for many hosts.
std::string MakeAgentKey(std::string_view identity, std::string_view relay_hostname);

// Where a report went.
struct ApplyResult {
  bool duplicate = false;
  bool too_old = false;  // duplicate because it fell below the sequence window
  // A new agent key while --max-agents keys are held and none has been
  // silent for kAgentIdleEvictNs: nothing counted, not journaled (retried).
  bool refused = false;
  uint32_t dropped_series = 0;
};

inline constexpr char kOverflowHost[] = "(overflow)";
inline constexpr char kOverflowAlgorithm[] = "(overflow)";
// Distinct (bucket, algorithm) pairs one summary minute keeps.
inline constexpr size_t kMaxSummaryAlgorithms = 1000;
// Instances one agent key remembers (an agent whose state directory is wiped
// starts a new instance); the least recently seen is forgotten.
inline constexpr size_t kMaxInstancesPerAgent = 16;
// At --max-agents, a new agent key takes the place of the least recently seen
// one if that one has been silent this long; otherwise it is refused.
inline constexpr int64_t kAgentIdleEvictNs = 3600LL * 1000 * 1000 * 1000;
// |agent clock - collector clock| above this counts a report as skewed.
inline constexpr int64_t kSkewToleranceNs = 30LL * 1000 * 1000 * 1000;
// Agents whose skew tlsprof_collector_clock_skew_seconds takes the max of.
inline constexpr int64_t kSkewHorizonNs = 300LL * 1000 * 1000 * 1000;
// An agent's live connections (a gauge) count while its last usage report
// is younger than this many of its windows, and at least kUsageHorizonMinNs:
// an agent that stopped or was evicted drops out of tlsprof_tls_connections.
inline constexpr int64_t kUsageHorizonWindows = 3;
inline constexpr int64_t kUsageHorizonMinNs = 30LL * 1000 * 1000 * 1000;
class Ingestor {
 public:
  explicit Ingestor(IngestOptions options);

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
  // Applies a journal record at start (an error when it does not parse).
  Result<ApplyResult> Replay(const state::JournalRecord& record);

  // Runs `fn` with a snapshot of the state while holding the lock, so that
  // nothing is applied between the snapshot and what `fn` does (compaction).
  void Checkpoint(const std::function<void(state::State&)>& fn) const;
  // The same, but under the lock only the state is copied and `fn` runs; the
  // snapshot is then built from the copy into `into` (which may live on an
  // arena) with the lock released.
  void Checkpoint(state::State& into, const std::function<void()>& fn) const;
  // Replaces the state by a snapshot (at start, before serving).
  Status Restore(const state::State& snapshot);

  // tlsprof_cpu_seconds_total & co., read at scrape time, and the bounds'
  // and clock skew's tlsprof_collector_* (as of `now_ns`; default: the clock).
  std::vector<prometheus::MetricFamily> CollectData(int64_t now_ns = 0) const;
  // Agents whose last report was received within `horizon_ns` of `now_ns`.
  size_t ActiveAgents(int64_t now_ns, int64_t horizon_ns) const;
  // GET /api/v1/summary: reports whose window ended in the last `minutes`.
  nlohmann::json Summary(int minutes, int64_t now_ns) const;
  // GET /api/v1/trend: Summary's minutes one by one (only those with reports),
  // oldest first; the points add up to Summary(minutes, now_ns).
  nlohmann::json Trend(int minutes, int64_t now_ns) const;
  // GET /api/v1/agents: the agents known (also those silent for long), most
  // recently seen first, at most `limit` of them (`truncated` says if more).
  nlohmann::json Agents(size_t limit, int64_t now_ns) const;

 private:
  struct Instance {
    SequenceWindow window;
    int64_t last_seen_ns = 0;
  };
  // An agent's series or service hashes: a sorted vector (a few hundred
  // entries, found by binary search; inserted rarely), contiguous so that a
  // snapshot copies it in one go instead of walking hash-set nodes.
  class HashSet {
   public:
    bool count(uint64_t h) const { return std::binary_search(v_.begin(), v_.end(), h); }
    void insert(uint64_t h) {
      auto it = std::lower_bound(v_.begin(), v_.end(), h);
      if (it == v_.end() || *it != h) v_.insert(it, h);
    }
    template <class It>
    void insert(It first, It last) {
      v_.insert(v_.end(), first, last);
      std::sort(v_.begin(), v_.end());
      v_.erase(std::unique(v_.begin(), v_.end()), v_.end());
    }
    size_t size() const { return v_.size(); }
    std::vector<uint64_t>::const_iterator begin() const { return v_.begin(); }
    std::vector<uint64_t>::const_iterator end() const { return v_.end(); }

   private:
    std::vector<uint64_t> v_;
  };
  struct Agent {
    std::unordered_map<std::string, Instance> instances;
    HashSet series;
    HashSet services;
    int64_t last_seen_ns = 0;
    uint64_t reports = 0;  // accepted (not duplicates)
    std::string hostname;  // host.hostname of the last accepted report
    bool skew_known = false;
    int64_t skew_ns = 0;  // agent clock - collector clock at the last report
    // Usage telemetry of its latest usage report (by instance and sequence):
    // the live connections (a gauge, replaced per report), the duty cycle and
    // relative error, and when it was received.
    bool usage_known = false;
    std::string usage_instance;
    uint64_t usage_sequence = 0;
    int64_t usage_received_ns = 0;
    int64_t usage_window_ns = 0;
    double duty_cycle = 1;
    double relative_error = 0;
    std::map<std::array<std::string, 4>, double> connections;  // kConnectionLabelNames
  };
  // Orders (bucket, algorithm) pairs; finds them by string_view too.
  struct AlgorithmLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      if (a.first != b.first) return a.first < b.first;
      return std::string_view(a.second) < std::string_view(b.second);
    }
  };
  struct Minute {
    uint64_t reports = 0;
    std::unordered_set<uint64_t> agents;
    double busy_seconds = 0;
    double tls_seconds = 0;
    std::array<double, 6> bucket_seconds{};  // by v1::Bucket
    std::map<std::pair<int, std::string>, double, AlgorithmLess> algorithms;
  };
  // bucket, algorithm, phase, library, service, container_id, pod_uid (the
  // last two "" outside containers).
  using CpuKey = std::array<std::string, 7>;
  using BusyKey = std::array<std::string, 3>;  // service, container_id, pod_uid
  // Orders BusyKeys; finds them by an array of string_views too (no copy per report).
  struct BusyLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                          [](std::string_view x, std::string_view y) { return x < y; });
    }
  };
  ApplyResult ApplyLocked(const std::string& agent_key, const v1::AgentReport& report, int64_t received_ns,
                          const std::function<void()>& commit, int64_t sent_ns);
  // A new agent key at max_agents: evicts the least recently seen agent if it
  // is idle enough (true), else false (refuse).
  bool MakeRoomForAgentLocked(int64_t now_ns);
  size_t SeriesLocked() const {
    return cpu_.size() + busy_.size() + handshakes_.size() + operations_.size() + connection_series_;
  }
  // A series of `agent` (its hash; `exists`: held already, for some agent)
  // within the per-agent and global caps: false (and counted in `result`)
  // when it must be dropped. The series is then counted for the agent.
  bool AdmitSeriesLocked(Agent& agent, uint64_t hash, bool exists, ApplyResult& result);
  // The usage rows of one service: counters now, its connections into
  // `connections` (the report's gauge values, applied after every service).
  void ApplyUsageLocked(Agent& agent, const v1::Service& service,
                        std::map<std::array<std::string, 4>, double>& connections, ApplyResult& result);
  // Whether `agent`'s usage (connections, duty cycle) still counts at now_ns.
  static bool UsageCurrent(const Agent& agent, int64_t now_ns);
  std::string HostLabel(const std::string& hostname);
  void PruneMinutes(int64_t now_minute);
  void SnapshotLocked(state::State& s) const;

  const IngestOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, TokenBucket> buckets_;
  std::unordered_map<std::string, Agent> agents_;
  uint64_t reports_ = 0;
  // Node-based: an element's address is stable (CollectData reads labels
  // after the lock); nothing is erased except by Restore, before serving.
  // tlsprof_cpu_seconds_total: CPU-seconds by CpuKey. Its labels are stored
  // once; a series is found by the FNV hash of its labels (SeriesHash).
  SeriesTable<7, double> cpu_;
  std::map<BusyKey, double, BusyLess> busy_;
  std::map<std::pair<std::string, std::string>, double> host_cpu_;
  std::map<std::string, double> host_busy_;
  std::set<std::string> hosts_;  // hosts with their own label (at most max_hosts)
  // Keyed by the minute of the collector's receive time (not the window's
  // end: a skewed agent clock must not create minutes outside the ring).
  std::map<int64_t, Minute> minutes_;
  // Usage telemetry: tlsprof_handshakes_total, tlsprof_crypto_operation*.
  SeriesTable<kHandshakeLabelNames.size(), double> handshakes_;
  SeriesTable<kOperationLabelNames.size(), OperationTotals> operations_;
  size_t connection_series_ = 0;  // Agent::connections over all agents
  double probe_cpu_seconds_ = 0;
  double probe_budget_cpu_seconds_ = 0;
  uint64_t probe_hits_ = 0;
  // Bounds and skew (this process's counts; not persisted).
  uint64_t agents_evicted_ = 0;
  uint64_t agents_refused_ = 0;
  uint64_t series_refused_ = 0;  // series (and busy series) dropped by max_series
  uint64_t skewed_reports_ = 0;
  int64_t no_eviction_before_ns_ = 0;  // no agent is idle enough before this
};

}  // namespace tlsprof::collector
