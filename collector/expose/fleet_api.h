// The collector's JSON API over the fleet's state (docs/fleet.md, "Summary",
// "Trend", "Agents"), served by http.h under /api/v1/ and read by the status
// page.
//
// Thread-safe: the state is read through Ingestor::Read, which holds the
// Ingestor's lock only while values are copied; the JSON is built after.
#pragma once

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "collector/ingest/ingestor.h"

namespace tlsprof::collector {

// GET /api/v1/summary: reports received in the last `minutes` (the current
// minute and the minutes-1 before it, by the collector's clock).
nlohmann::json SummaryJson(const Ingestor& ingestor, int minutes, int64_t now_ns);
// GET /api/v1/trend: the summary's minutes one by one (only those with
// reports), oldest first; the points add up to SummaryJson(minutes, now_ns).
nlohmann::json TrendJson(const Ingestor& ingestor, int minutes, int64_t now_ns);
// GET /api/v1/agents: the agents known (also those silent for long), most
// recently seen first, at most `limit` of them (`truncated` says if more).
nlohmann::json AgentsJson(const Ingestor& ingestor, size_t limit, int64_t now_ns);

}  // namespace tlsprof::collector
