// The collector's series tables, and those of the usage telemetry
// (docs/fleet.md, "Usage telemetry"): handshakes, public-key operations with
// their latency histogram, and the label orders they are kept and persisted
// in (state.proto, UsageSeries.labels).
//
// Plain values, not thread-safe: the Ingestor guards them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/metrics/metric_table.h"
#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::collector {

// Label names in the order of the keys (and of state.proto's
// UsageSeries.labels): the metric table's. The first three are the service's
// (service, container_id, pod_uid); the container labels are exposed only
// when set, as for tlsprof_cpu_seconds_total.
inline constexpr const auto& kHandshakeLabelNames = metrics::kHandshakeLabels;
inline constexpr const auto& kOperationLabelNames = metrics::kOperationLabels;
inline constexpr const auto& kConnectionLabelNames = metrics::kConnectionLabels;
inline constexpr const auto& kHandshakeCpuLabelNames = metrics::kHandshakeCpuLabels;

// One operation series: its counters (estimated) and its histogram of the
// observed operations (count, sum and buckets agree with each other).
struct OperationTotals {
  double estimated = 0;
  double cpu_seconds = 0;           // estimated on-CPU seconds
  uint64_t observed = 0;            // the histogram's count
  double observed_cpu_seconds = 0;  // the histogram's sum
  std::array<uint64_t, v1::kLatencyBuckets> buckets{};
};

// Series of N labels found by a hash of their labels (on a collision, the
// next hash value that is free or holds the same labels), like the CPU
// series. Node-based: an entry's address is stable.
template <size_t N, class V>
class SeriesTable {
 public:
  using Labels = std::array<std::string, N>;
  using LabelViews = std::array<std::string_view, N>;
  struct Entry {
    Labels labels;
    V value{};
  };

  Entry* Find(uint64_t hash, const LabelViews& labels) {
    for (;; ++hash) {
      auto it = map_.find(hash);
      if (it == map_.end()) return nullptr;
      if (std::equal(it->second.labels.begin(), it->second.labels.end(), labels.begin())) return &it->second;
    }
  }
  Entry& FindOrInsert(uint64_t hash, const LabelViews& labels) {
    for (;; ++hash) {
      auto [it, inserted] = map_.try_emplace(hash);
      Labels& l = it->second.labels;
      if (inserted) {
        std::copy(labels.begin(), labels.end(), l.begin());
        return it->second;
      }
      if (std::equal(l.begin(), l.end(), labels.begin())) return it->second;
    }
  }
  size_t size() const { return map_.size(); }
  void clear() { map_.clear(); }
  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }

 private:
  std::unordered_map<uint64_t, Entry> map_;
};

}  // namespace tlsprof::collector
