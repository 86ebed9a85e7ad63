// The usage telemetry's part of the one-shot report (docs/report-schema.md,
// "handshakes", "operations", "handshake_cpu", "agent.usage"): handshake
// counts by negotiated parameters, public-key operation latency, and TLS CPU
// in the handshake phase per handshake. Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "agent/profiler/window.h"

namespace tlsprof::report {

// Adds the sections to `doc` (a BuildReport() document) from the window's
// usage counts; nothing without them. Rows of the agent's own process are
// left out, and with --pid so are those of other processes: the probes count
// for every process that maps the library. The probes' files and calibration
// go under agent.usage.
void AddUsage(nlohmann::json& doc, const profiler::Window& window);

}  // namespace tlsprof::report
