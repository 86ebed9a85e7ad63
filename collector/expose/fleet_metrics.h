// The fleet's counters as the collector's /metrics shows them (docs/fleet.md,
// "Metrics" and "Usage telemetry metrics"): the data metrics, the usage
// telemetry and the tlsprof_collector_* that the ingest state holds (bounds,
// clock skew). Names, help, types and label names come from the metric table
// (common/metrics/metric_table.h); health.h has the rest of
// tlsprof_collector_*.
//
// Thread-safe: the state is read through Ingestor::Read, which holds the
// Ingestor's lock only while values are copied, so that a scrape does not
// hold up Submit while it formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <prometheus/metric_family.h>

#include "collector/ingest/ingestor.h"

namespace tlsprof::collector {

// Agents whose skew tlsprof_collector_clock_skew_seconds takes the max of.
inline constexpr int64_t kSkewHorizonNs = 300LL * 1000 * 1000 * 1000;
// An agent's live connections (a gauge) count while its last usage report
// is younger than this many of its windows, and at least kUsageHorizonMinNs:
// an agent that stopped or was evicted drops out of tlsprof_tls_connections.
inline constexpr int64_t kUsageHorizonWindows = 3;
inline constexpr int64_t kUsageHorizonMinNs = 30LL * 1000 * 1000 * 1000;

// The families, as of `now_ns` (0: the clock), in the order /metrics writes
// them. tlsprof_host_* only with --host-labels.
std::vector<prometheus::MetricFamily> FleetMetrics(const Ingestor& ingestor, int64_t now_ns = 0);

// Agents whose last report was received within `horizon_ns` of `now_ns`.
size_t ActiveAgents(const Ingestor& ingestor, int64_t now_ns, int64_t horizon_ns);

}  // namespace tlsprof::collector
