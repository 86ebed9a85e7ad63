#include "collector/expose/health.h"

#include "common/metrics/prometheus.h"

#include <fmt/format.h>

#include "collector/ingest/ingestor.h"

namespace tlsprof::collector {
namespace {

// tlsprof_collector_reports_total's "result", by SubmitResult.
constexpr std::string_view kSubmitResultNames[kSubmitResults] = {"accepted",        "duplicate",   "invalid",
                                                                 "unauthenticated", "denied",      "rate_limited",
                                                                 "too_large",       "agent_limit", "overloaded"};

}  // namespace

HealthMetrics::HealthMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using metrics::Register;
  auto& results = Register<metrics::kCollectorReports>(*registry_);
  for (int i = 0; i < kSubmitResults; ++i) {
    results_[i] = &results.Add(metrics::Labels(metrics::kCollectorReports, {kSubmitResultNames[i]}));
  }
  dropped_series_ = &Register<metrics::kCollectorDroppedSeries>(*registry_).Add({});
  // Submit handling time: from a few µs (duplicate) to an fsync on a slow disk.
  ingest_seconds_ = &Register<metrics::kCollectorIngestSeconds>(*registry_)
                         .Add({}, prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                                          0.01, 0.025, 0.05, 0.1, 0.25, 1});
  agents_ = &Register<metrics::kCollectorAgents>(*registry_).Add({});
  journal_bytes_ = &Register<metrics::kCollectorJournalBytes>(*registry_).Add({});
}

std::pair<bool, std::string> IngestHealth(const Ingestor& ingestor, std::chrono::milliseconds stuck_after,
                                          const std::string& journal_stopped, const std::string& journal_failing) {
  if (!ingestor.Responsive(stuck_after)) {
    return {false, fmt::format("ingest is stuck: its lock was not free within {} ms", stuck_after.count())};
  }
  if (!journal_stopped.empty()) return {false, "journal stopped: " + journal_stopped};
  if (!journal_failing.empty()) return {true, "ingesting; journal writes failing, retried: " + journal_failing};
  return {true, "ingesting"};
}

}  // namespace tlsprof::collector
