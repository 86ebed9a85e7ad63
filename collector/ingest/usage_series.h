// The collector's series of the usage telemetry (docs/fleet.md, "Usage
// telemetry"): handshakes, public-key operations with their latency
// histogram, and the label orders they are kept and persisted in
// (state.proto, UsageSeries.labels).
//
// Plain values, not thread-safe: the Ingestor guards them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <prometheus/client_metric.h>

#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::collector {

// Label names in the order of the keys. The first three are the service's
// (service, container_id, pod_uid); the container labels are exposed only
// when set, as for tlsprof_cpu_seconds_total.
inline constexpr std::array<std::string_view, 10> kHandshakeLabelNames = {
    "service", "container_id", "pod_uid",      "library", "side",
    "kind",    "version",      "cipher_suite", "group",   "cert_key_type"};
inline constexpr std::array<std::string_view, 7> kOperationLabelNames = {
    "service", "container_id", "pod_uid", "library", "operation", "algorithm", "in_handshake"};
inline constexpr std::array<std::string_view, 4> kConnectionLabelNames = {"service", "container_id", "pod_uid",
                                                                          "library"};

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

// Prometheus labels of a series: name=value pairs in name order, the
// container labels only when set.
template <size_t N, class Values>
std::vector<prometheus::ClientMetric::Label> UsageLabels(const std::array<std::string_view, N>& names,
                                                         const Values& values) {
  std::vector<prometheus::ClientMetric::Label> out;
  out.reserve(N);
  for (size_t i = 0; i < N; ++i) {
    if (values[i].empty() && (names[i] == "container_id" || names[i] == "pod_uid")) continue;
    out.push_back({std::string(names[i]), std::string(values[i])});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

// The histogram of an operation series, cumulative, `le` in seconds.
inline prometheus::ClientMetric::Histogram LatencyHistogram(const OperationTotals& t) {
  prometheus::ClientMetric::Histogram h;
  h.sample_count = t.observed;
  h.sample_sum = t.observed_cpu_seconds;
  const auto bounds = v1::LatencyBucketBoundsSeconds();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < v1::kLatencyBuckets; ++i) {
    cumulative += t.buckets[i];
    h.bucket.push_back({cumulative, i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity()});
  }
  return h;
}

}  // namespace tlsprof::collector
