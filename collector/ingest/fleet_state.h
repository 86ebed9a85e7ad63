// What the collector knows of its fleet: the additive counters in base units,
// each agent key's memory (sequence windows, series and service hashes, the
// latest usage gauges) and the per-minute summary ring. The Ingestor applies
// reports to it; the store persists it (state.proto); the exposition reads it.
//
// Plain data, not thread-safe: the Ingestor owns the live value and guards it
// with its lock (Ingestor::Read). Series tables are node-based and never
// erase while serving (only a restore before serving replaces them), so a
// reader may keep pointers to their labels after the lock is released.
// Agents and summary minutes are Shared (copy-on-write): a copy of the state
// (compaction's, Ingestor::Copy) shares them, and may be read without the
// lock while the live state goes on.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "collector/ingest/agent_state.h"
#include "collector/ingest/usage_series.h"

namespace tlsprof::collector {

inline constexpr int64_t kNsPerMinute = 60LL * 1000 * 1000 * 1000;

// floor(a / b) for b > 0, also for negative a (times before 1970).
constexpr int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// FNV-1a, 64 bit, over the parts with a separator no label character can
// produce: stable across runs and builds, since the hashes are persisted.
inline uint64_t Fnv1a(std::initializer_list<std::string_view> parts) {
  uint64_t h = 1469598103934665603ULL;
  for (std::string_view part : parts) {
    for (unsigned char c : part) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    h ^= 0xff;
    h *= 1099511628211ULL;
  }
  return h;
}

// The hashes of a CPU series and of a service. The container labels enter
// only when set, so that a series outside containers hashes as it did before
// they existed: the hashes are persisted (the per-agent caps), and an older
// state directory must still count its series once.
inline uint64_t SeriesHash(const std::array<std::string_view, 7>& l) {
  if (l[5].empty() && l[6].empty()) return Fnv1a({l[0], l[1], l[2], l[3], l[4]});
  return Fnv1a({l[0], l[1], l[2], l[3], l[4], l[5], l[6]});
}

inline uint64_t ServiceHash(std::string_view name, std::string_view container_id, std::string_view pod_uid) {
  if (container_id.empty() && pod_uid.empty()) return Fnv1a({name});
  return Fnv1a({name, container_id, pod_uid});
}

// The hash of a usage series: its kind, then every label (container labels
// included, empty or not: these series have no older hashes to match).
template <size_t N>
uint64_t UsageHash(std::string_view kind, const std::array<std::string_view, N>& labels) {
  return [&]<size_t... I>(std::index_sequence<I...>) { return Fnv1a({kind, labels[I]...}); }
  (std::make_index_sequence<N>());
}

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

// A value the live state shares with its copies (Ingestor::Copy): copying a
// Shared copies a pointer, and the value it points to is never written while
// a copy holds it. Readers use * and ->; the Ingestor writes through
// Mutable(), which first clones the value when another Shared holds it
// (copy-on-write). Contract: Mutable() is called, and Shareds of the live
// state are copied, only under the lock that guards the live state; copies
// may then be read and destroyed on any thread without it. A count of one
// seen under that lock cannot grow behind Mutable()'s back.
template <class T>
class Shared {
 public:
  Shared() : p_(std::make_shared<T>()) {}
  const T& operator*() const { return *p_; }
  const T* operator->() const { return p_.get(); }
  T& Mutable() {
    if (p_.use_count() != 1) {
      p_ = std::make_shared<T>(*p_);
    } else {
      // The last copy may have been released on another thread just now
      // (an acq_rel decrement): its reads of the value happen before the
      // writes that follow.
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    return *p_;
  }

 private:
  std::shared_ptr<T> p_;
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

// Orders arrays of strings; finds them by an array of string_views too (no
// copy per report).
struct ArrayLess {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                        [](std::string_view x, std::string_view y) { return x < y; });
  }
};

// Label values of a series, in the order of its metric's labels
// (common/metrics/metric_table.h).
using CpuKey = std::array<std::string, 7>;               // kCpuLabels
using BusyKey = std::array<std::string, 3>;              // kServiceLabels
using ConnectionKey = std::array<std::string, 4>;        // kConnectionLabels
using HostBucket = std::pair<std::string, std::string>;  // kHostCpuLabels

struct FleetState {
  struct Instance {
    SequenceWindow window;
    int64_t last_seen_ns = 0;
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
    std::map<ConnectionKey, double> connections;
    // The resident memory beside each of those connection series (same keys;
    // counted with them, not as series of their own).
    std::map<ConnectionKey, double> resident_bytes;
  };
  struct Minute {
    uint64_t reports = 0;
    std::unordered_set<uint64_t> agents;  // Fnv1a of their keys
    double busy_seconds = 0;
    double tls_seconds = 0;
    std::array<double, 6> bucket_seconds{};  // by v1::Bucket
    std::map<std::pair<int, std::string>, double, AlgorithmLess> algorithms;
  };

  // Data series held: the --max-series bound counts these. handshake_cpu is
  // not among them: a projection of the handshake series (one per service,
  // library, kind and key type that had CPU), it never holds more, and no
  // new one is admitted past the bound.
  size_t Series() const { return cpu.size() + busy.size() + handshakes.size() + operations.size() + connection_series; }

  std::unordered_map<std::string, Shared<Agent>> agents;  // by MakeAgentKey
  uint64_t reports = 0;
  // tlsprof_cpu_seconds_total: CPU-seconds by CpuKey, found by SeriesHash.
  SeriesTable<7, double> cpu;
  std::map<BusyKey, double, ArrayLess> busy;
  std::map<HostBucket, double> host_cpu;
  std::map<std::string, double> host_busy;
  // Hosts with their own label (at most --max-hosts), and the receive time of
  // each one's last report: a slot expires with IngestOptions::idle_expiry_ns.
  std::map<std::string, int64_t> hosts;
  // Keyed by the minute of the collector's receive time (not the window's
  // end: a skewed agent clock must not create minutes outside the ring).
  std::map<int64_t, Shared<Minute>> minutes;
  // Usage telemetry: tlsprof_handshakes_total, tlsprof_crypto_operation*.
  SeriesTable<kHandshakeLabelNames.size(), double> handshakes;
  SeriesTable<kOperationLabelNames.size(), OperationTotals> operations;
  // tlsprof_handshake_cpu_seconds_total: the handshakes' modelled TLS CPU,
  // by service, library, kind and certificate key type (a series from the
  // first row with CPU).
  SeriesTable<kHandshakeCpuLabelNames.size(), double> handshake_cpu;
  size_t connection_series = 0;  // Agent::connections over all agents
  double probe_cpu_seconds = 0;
  double probe_budget_cpu_seconds = 0;
  uint64_t probe_hits = 0;
  // What the bounds refused and the skewed reports (persisted like the rest).
  uint64_t agents_evicted = 0;
  uint64_t agents_refused = 0;
  uint64_t series_refused = 0;  // series (and busy series) dropped by --max-series
  uint64_t skewed_reports = 0;
};

}  // namespace tlsprof::collector
