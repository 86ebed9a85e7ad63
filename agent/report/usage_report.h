// The usage telemetry's part of the one-shot report (docs/report-schema.md,
// "handshakes", "operations", "handshake_cpu", "agent.usage"): handshake
// counts by negotiated parameters, public-key operation latency, and TLS CPU
// in the handshake phase per handshake. Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "agent/aggregate/profile.h"
#include "agent/discovery/process_registry.h"
#include "agent/usage/usage_probes.h"

namespace tlsprof::report {

// Adds the sections to `doc` (a BuildReport() document). `window` is what
// the probes counted over the report's window; `period_ns` the CPU time one
// sample stands for. Rows of the agent's own process (`self`) are left out,
// and with a non-empty `scope` (--pid) so are those of other processes: the
// probes count for every process that maps the library. `probes` gives the
// attached files and the calibration (reported under agent.usage).
void AddUsage(nlohmann::json& doc, const usage::UsageSnapshot& window, const usage::UsageProbes& probes,
              const aggregate::Profile& profile, const discovery::ProcessRegistry& registry, uint64_t period_ns,
              pid_t self, const std::vector<pid_t>& scope);

}  // namespace tlsprof::report
