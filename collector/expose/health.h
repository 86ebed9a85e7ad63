// The collector's own health metrics (docs/fleet.md, "Metrics"): the
// tlsprof_collector_* of Submit's handling, the journal and the agents seen;
// those of the ingest state (bounds, clock skew) are fleet_metrics.h's. Names
// and help come from the metric table. Thread-safe (prometheus-cpp metrics
// are atomic). And IngestHealth, what GET /healthz says.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tlsprof::collector {

class Ingestor;

// The collector's liveness, (healthy, one line): unhealthy only for what a
// restart mends. Ingest is stuck when its lock is not free within
// `stuck_after` (a deadlock, a holder that never returns); `journal_stopped`
// (StateStore::stopped(), empty when none) is a journal that cannot go on.
// A journal whose writes fail and are retried (`journal_failing`: a full
// disk, which a restart would not free) is healthy, and said.
std::pair<bool, std::string> IngestHealth(const Ingestor& ingestor, std::chrono::milliseconds stuck_after,
                                          const std::string& journal_stopped, const std::string& journal_failing);

// The values of tlsprof_collector_reports_total's "result" label.
enum class SubmitResult {
  kAccepted,
  kDuplicate,
  kInvalid,
  kUnauthenticated,
  kDenied,
  kRateLimited,
  kTooLarge,
  kAgentLimit,
  kOverloaded  // --max-request-memory held by requests in progress
};
inline constexpr int kSubmitResults = 9;

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
