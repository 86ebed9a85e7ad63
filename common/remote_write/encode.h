// Prometheus metric families as remote-write 1.0 requests
// (proto/prometheus/remote_write.proto): one series per metric, a
// histogram's _bucket{le}, _sum and _count and a summary's quantiles, _sum
// and _count, as Prometheus itself would scrape them; labels sorted, with
// __name__. Counters are cumulative totals, so a request sent twice (a retry,
// a replay) writes the same samples again and the receiver keeps one: a
// write is idempotent. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <prometheus/metric_family.h>

#include "prometheus/remote_write.pb.h"

namespace tlsprof::remote_write {

// A label every series carries (Prometheus' external labels): it tells
// apart the writers of one receiver, such as the collectors of a tier.
using ExternalLabels = std::vector<::prometheus::ClientMetric::Label>;

// Every series of `families` plus `external` labels, with one sample each at
// `timestamp_ms`, cut into requests of at most `max_series` series.
std::vector<::prometheus::WriteRequest> Encode(const std::vector<::prometheus::MetricFamily>& families,
                                               int64_t timestamp_ms, size_t max_series,
                                               const ExternalLabels& external = {});

// The body of an HTTP POST: the request serialized, snappy block-compressed.
std::string CompressedBody(const ::prometheus::WriteRequest& request);

// The inverse, for tests and receivers: false if the body is not snappy or
// not a WriteRequest.
bool DecodeBody(const std::string& body, ::prometheus::WriteRequest& request);

}  // namespace tlsprof::remote_write
