// The one-shot report: a JSON document (schema docs/report-schema.md,
// "tlsprof.report.v1") built from one Window, and a table rendered from that
// same document, so the two can never disagree. Pure functions; thread-safe.
//
// The table is for a person at a terminal: a headline, the buckets split by
// phase, the algorithms, the processes, the agent's cost and, when the
// document has them, the usage sections. By default it fits on one screen:
// each section prints its largest rows and folds the others into one "rest"
// row that says how many rows it holds.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/profiler/window.h"

namespace tlsprof::report {

inline constexpr std::string_view kSchema = "tlsprof.report.v1";

// The report of one window: the document, with the usage sections when the
// window has usage counts (usage_report.h) and the unwinder's figures when it
// was taken with stacks.
nlohmann::json BuildReport(const profiler::Window& window);

// How the table is rendered; the document is the same either way.
struct TableOptions {
  // Print every row of every section, none folded (--all).
  bool all_rows = false;
};

// Renders a BuildReport() document (AddUsage's sections included). Without
// all_rows, a document with no usage sections renders to at most
// kTableScreenLines lines, whatever its size.
inline constexpr size_t kTableScreenLines = 40;
std::string RenderTable(const nlohmann::json& report, const TableOptions& options = {});

}  // namespace tlsprof::report
