// The collector's own health metrics (docs/fleet.md, "Metrics"): the
// tlsprof_collector_* of Submit's handling, the journal and the agents seen;
// those of the ingest state (bounds, clock skew) are fleet_metrics.h's. Names
// and help come from the metric table. Thread-safe (prometheus-cpp metrics
// are atomic).
#pragma once

#include <memory>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tlsprof::collector {

// The values of tlsprof_collector_reports_total's "result" label.
enum class SubmitResult {
  kAccepted,
  kDuplicate,
  kInvalid,
  kUnauthenticated,
  kDenied,
  kRateLimited,
  kTooLarge,
  kAgentLimit
};
inline constexpr int kSubmitResults = 8;

class HealthMetrics {
 public:
  HealthMetrics();

  void Count(SubmitResult result) { results_[static_cast<int>(result)]->Increment(); }
  void AddDroppedSeries(double n) { dropped_series_->Increment(n); }
  void ObserveIngestSeconds(double seconds) { ingest_seconds_->Observe(seconds); }
  void SetAgents(double n) { agents_->Set(n); }
  void SetJournalBytes(double n) { journal_bytes_->Set(n); }
  double count(SubmitResult result) const { return results_[static_cast<int>(result)]->Value(); }

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* results_[kSubmitResults];
  prometheus::Counter* dropped_series_;
  prometheus::Histogram* ingest_seconds_;
  prometheus::Gauge* agents_;
  prometheus::Gauge* journal_bytes_;
};

}  // namespace tlsprof::collector
