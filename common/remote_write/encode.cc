#include "common/remote_write/encode.h"

#include <snappy.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace tlsprof::remote_write {
namespace {

using ::prometheus::ClientMetric;
using ::prometheus::MetricFamily;
using ::prometheus::MetricType;

// Prometheus' float formatting of a bound ("+Inf", "0.005").
std::string Bound(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// Adds one series: the metric's labels plus `name` and `extra`, sorted.
void AddSeries(std::vector<::prometheus::TimeSeries>& out, const std::string& name,
               const std::vector<ClientMetric::Label>& labels, const ClientMetric::Label* extra, double value,
               int64_t timestamp_ms) {
  std::vector<ClientMetric::Label> all = labels;  // the metric's and the external labels
  all.push_back({"__name__", name});
  if (extra != nullptr) all.push_back(*extra);
  std::sort(all.begin(), all.end());
  ::prometheus::TimeSeries& series = out.emplace_back();
  for (const ClientMetric::Label& l : all) {
    ::prometheus::Label* label = series.add_labels();
    label->set_name(l.name);
    label->set_value(l.value);
  }
  ::prometheus::Sample* sample = series.add_samples();
  sample->set_value(value);
  sample->set_timestamp(timestamp_ms);
}

void AddMetric(std::vector<::prometheus::TimeSeries>& out, const MetricFamily& family, const ClientMetric& m,
               int64_t timestamp_ms) {
  const int64_t ts = m.timestamp_ms != 0 ? m.timestamp_ms : timestamp_ms;
  switch (family.type) {
    case MetricType::Counter:
      AddSeries(out, family.name, m.label, nullptr, m.counter.value, ts);
      return;
    case MetricType::Gauge:
      AddSeries(out, family.name, m.label, nullptr, m.gauge.value, ts);
      return;
    case MetricType::Untyped:
      AddSeries(out, family.name, m.label, nullptr, m.untyped.value, ts);
      return;
    case MetricType::Histogram:
      for (const ClientMetric::Bucket& b : m.histogram.bucket) {
        const ClientMetric::Label le{"le", Bound(b.upper_bound)};
        AddSeries(out, family.name + "_bucket", m.label, &le, static_cast<double>(b.cumulative_count), ts);
      }
      AddSeries(out, family.name + "_sum", m.label, nullptr, m.histogram.sample_sum, ts);
      AddSeries(out, family.name + "_count", m.label, nullptr, static_cast<double>(m.histogram.sample_count), ts);
      return;
    case MetricType::Summary:
      for (const ClientMetric::Quantile& q : m.summary.quantile) {
        const ClientMetric::Label quantile{"quantile", Bound(q.quantile)};
        AddSeries(out, family.name, m.label, &quantile, q.value, ts);
      }
      AddSeries(out, family.name + "_sum", m.label, nullptr, m.summary.sample_sum, ts);
      AddSeries(out, family.name + "_count", m.label, nullptr, static_cast<double>(m.summary.sample_count), ts);
      return;
  }
}

}  // namespace

std::vector<::prometheus::WriteRequest> Encode(const std::vector<MetricFamily>& families, int64_t timestamp_ms,
                                               size_t max_series, const ExternalLabels& external) {
  std::vector<::prometheus::TimeSeries> series;
  for (const MetricFamily& family : families) {
    for (ClientMetric m : family.metric) {
      m.label.insert(m.label.end(), external.begin(), external.end());
      AddMetric(series, family, m, timestamp_ms);
    }
  }
  std::vector<::prometheus::WriteRequest> requests;
  const size_t per_request = std::max<size_t>(1, max_series);
  for (size_t i = 0; i < series.size(); i += per_request) {
    ::prometheus::WriteRequest& r = requests.emplace_back();
    for (size_t j = i; j < std::min(series.size(), i + per_request); ++j) *r.add_timeseries() = std::move(series[j]);
  }
  return requests;
}

std::string CompressedBody(const ::prometheus::WriteRequest& request) {
  std::string raw;
  request.SerializeToString(&raw);
  std::string body;
  snappy::Compress(raw.data(), raw.size(), &body);
  return body;
}

bool DecodeBody(const std::string& body, ::prometheus::WriteRequest& request) {
  std::string raw;
  if (!snappy::Uncompress(body.data(), body.size(), &raw)) return false;
  return request.ParseFromString(raw);
}

}  // namespace tlsprof::remote_write
