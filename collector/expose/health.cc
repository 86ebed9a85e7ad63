#include "collector/expose/health.h"

namespace tlsprof::collector {

HealthMetrics::HealthMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& results = prometheus::BuildCounter()
                      .Name("tlsprof_collector_reports_total")
                      .Help("Submit calls by result")
                      .Register(*registry_);
  static constexpr const char* kNames[kSubmitResults] = {"accepted", "duplicate",    "invalid",   "unauthenticated",
                                                         "denied",   "rate_limited", "too_large", "agent_limit"};
  for (int i = 0; i < kSubmitResults; ++i) results_[i] = &results.Add({{"result", kNames[i]}});
  dropped_series_ = &prometheus::BuildCounter()
                         .Name("tlsprof_collector_dropped_series_total")
                         .Help("Series dropped by the per-agent cardinality caps")
                         .Register(*registry_)
                         .Add({});
  // Submit handling time: from a few µs (duplicate) to an fsync on a slow disk.
  ingest_seconds_ = &prometheus::BuildHistogram()
                         .Name("tlsprof_collector_ingest_seconds")
                         .Help("Submit handling time, including the journal fsync")
                         .Register(*registry_)
                         .Add({}, prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                                          0.01, 0.025, 0.05, 0.1, 0.25, 1});
  agents_ = &prometheus::BuildGauge()
                 .Name("tlsprof_collector_agents")
                 .Help("Agents seen in the last 5 minutes")
                 .Register(*registry_)
                 .Add({});
  journal_bytes_ = &prometheus::BuildGauge()
                        .Name("tlsprof_collector_journal_bytes")
                        .Help("Size of the journal after the last snapshot")
                        .Register(*registry_)
                        .Add({});
}

}  // namespace tlsprof::collector
