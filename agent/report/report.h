// The one-shot report: a JSON document (schema docs/report-schema.md,
// "tlsprof.report.v1") and a table rendered from that same document, so the
// two can never disagree. Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/profiler/window.h"

namespace tlsprof::report {

inline constexpr std::string_view kSchema = "tlsprof.report.v1";

// The report of one window: the document, with the usage sections when the
// window has usage counts (usage_report.h) and the unwinder's figures when it
// was taken with stacks.
nlohmann::json BuildReport(const profiler::Window& window);
std::string RenderTable(const nlohmann::json& report);

}  // namespace tlsprof::report
