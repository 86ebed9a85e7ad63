// The metric table (metric_table.h) in prometheus-cpp's terms: a family
// registered from a table entry, its labels and an empty MetricFamily, so
// that the name, the help, the type and the label names of what an
// exposition writes come from the table.
//
// Pure functions; Register is as thread-safe as prometheus::Registry (it
// takes the registry's lock).
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "common/metrics/metric_table.h"

namespace tlsprof::metrics {

// Registers `M` in `registry`: a Family of Counter, Gauge or Histogram as the
// table's type says (a member of another type does not compile).
template <const Metric& M>
auto& Register(prometheus::Registry& registry) {
  if constexpr (M.type == Type::kCounter) {
    return prometheus::BuildCounter().Name(std::string(M.name)).Help(std::string(M.help)).Register(registry);
  } else if constexpr (M.type == Type::kGauge) {
    return prometheus::BuildGauge().Name(std::string(M.name)).Help(std::string(M.help)).Register(registry);
  } else {
    static_assert(M.type == Type::kHistogram);
    return prometheus::BuildHistogram().Name(std::string(M.name)).Help(std::string(M.help)).Register(registry);
  }
}

// The labels of one series of `metric` for prometheus-cpp's Family::Add
// (SeriesLabels: values in the order of metric.labels).
template <class Values>
prometheus::Labels Labels(const Metric& metric, const Values& values) {
  prometheus::Labels out;
  for (const auto& [name, value] : SeriesLabels(metric, values)) out.emplace(name, value);
  return out;
}
inline prometheus::Labels Labels(const Metric& metric, std::initializer_list<std::string_view> values) {
  return Labels(metric, std::span<const std::string_view>(values.begin(), values.size()));
}

// The same for a MetricFamily built by hand: sorted by name, as
// prometheus-cpp writes a Family's labels.
template <class Values>
std::vector<prometheus::ClientMetric::Label> ClientLabels(const Metric& metric, const Values& values) {
  std::vector<prometheus::ClientMetric::Label> out;
  for (const auto& [name, value] : SeriesLabels(metric, values)) out.push_back({std::string(name), std::string(value)});
  return out;
}
inline std::vector<prometheus::ClientMetric::Label> ClientLabels(const Metric& metric,
                                                                 std::initializer_list<std::string_view> values) {
  return ClientLabels(metric, std::span<const std::string_view>(values.begin(), values.size()));
}

// An empty family of `metric`: its name, help and type.
inline prometheus::MetricFamily Family(const Metric& metric) {
  prometheus::MetricFamily f;
  f.name = std::string(metric.name);
  f.help = std::string(metric.help);
  switch (metric.type) {
    case Type::kCounter:
      f.type = prometheus::MetricType::Counter;
      break;
    case Type::kGauge:
      f.type = prometheus::MetricType::Gauge;
      break;
    case Type::kHistogram:
      f.type = prometheus::MetricType::Histogram;
      break;
  }
  return f;
}

}  // namespace tlsprof::metrics
