// The collector's ingest path for one Submit (collector/server/service.cc,
// docs/fleet.md "Ingest"): the request bytes parsed as a SubmitRequest,
// ValidateReport, then Ingestor::Apply under the agent key the service would
// use; then everything that reads the counters back: /metrics (text
// exposition), /api/v1/summary, /trend and /agents (JSON as the HTTP layer
// dumps it), and a snapshot restored into a fresh Ingestor (the state
// directory), which must expose the same metrics.
//
// The report is applied three times: as sent, again (a duplicate), and with
// the next sequence number from a relay (another agent key), so that the
// duplicate and the cardinality-cap paths run on every input.
#include <prometheus/text_serializer.h>
#include <cstdio>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collector/expose/fleet_api.h"
#include "collector/expose/fleet_metrics.h"
#include "collector/ingest/ingestor.h"
#include "collector/ingest/test_report.h"
#include "collector/ingest/validate.h"
#include "collector/store/snapshot.h"
#include "common/metrics/metric_table.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tlsprof::collector::IngestOptions;
using tlsprof::collector::Ingestor;

constexpr int64_t kNowNs = tlsprof::collector::testing::kTestNowNs;

IngestOptions Options() {
  IngestOptions o;
  // Small caps, so that small inputs reach them.
  o.max_series_per_agent = 8;
  o.max_services_per_agent = 4;
  o.max_hosts = 2;
  o.host_labels = true;
  return o;
}

std::string Metrics(const Ingestor& ingestor) {
  return prometheus::TextSerializer().Serialize(tlsprof::collector::FleetMetrics(ingestor));
}

std::string Json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::collector;
  tlsprof::v1::SubmitRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size)) || !request.has_report()) return 0;
  const tlsprof::v1::AgentReport& report = request.report();
  if (ValidateReport(report, kNowNs)) return 0;

  Ingestor ingestor(Options());
  // --insecure's identity; a validated report has a valid hostname.
  const std::string key = MakeAgentKey("insecure:" + report.host().hostname(), "");
  (void)ingestor.TakeToken(key, kNowNs);
  ApplyResult first = ingestor.Apply(key, report, kNowNs);
  if (first.duplicate) __builtin_trap();  // a fresh ingestor has seen nothing
  ApplyResult again = ingestor.Apply(key, report, kNowNs + 1);
  if (!again.duplicate) __builtin_trap();
  tlsprof::v1::AgentReport next = report;
  next.set_sequence(report.sequence() + 1);
  if (next.sequence() != 0 && !ValidateReport(next, kNowNs)) {
    (void)ingestor.Apply(MakeAgentKey("relay-1", report.host().hostname()), next, kNowNs + 2);
  }

  const std::string metrics = Metrics(ingestor);
  (void)Json(SummaryJson(ingestor, 60, kNowNs));
  (void)Json(TrendJson(ingestor, 60, kNowNs));
  (void)Json(AgentsJson(ingestor, 100, kNowNs));
  (void)ActiveAgents(ingestor, kNowNs, 60'000'000'000);

  // The state directory's snapshot: restoring it gives the same counters.
  Ingestor restored(Options());
  tlsprof::collector::state::State snapshot;
  TakeSnapshot(ingestor, snapshot);
  if (!RestoreSnapshot(snapshot, restored).ok()) __builtin_trap();
  if (const std::string again_metrics = Metrics(restored); again_metrics != metrics) {
    // The first line that differs, to start the diagnosis from.
    size_t at = 0;
    while (at < metrics.size() && at < again_metrics.size() && metrics[at] == again_metrics[at]) ++at;
    const size_t line = metrics.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t from = line == std::string::npos ? 0 : line + 1;
    std::fprintf(stderr, "restored metrics differ at byte %zu:\n  before: %.200s\n  after:  %.200s\n", at,
                 metrics.c_str() + from, again_metrics.c_str() + std::min(from, again_metrics.size()));
    __builtin_trap();
  }
  return 0;
}
