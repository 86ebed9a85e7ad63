// The one-shot report: a JSON document (schema docs/report-schema.md,
// "tlsprof.report.v1") and a table rendered from that same document, so the
// two can never disagree. Pure functions; thread-safe.
//
// The table is for a person at a terminal: a headline, the buckets split by
// phase, the algorithms, the processes, the agent's cost and, when the
// document has them, the usage sections. By default it fits on one screen:
// each section prints its largest rows and folds the others into one "rest"
// row that says how many rows it holds.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/aggregate/profile.h"

namespace tlsprof::report {

inline constexpr std::string_view kSchema = "tlsprof.report.v1";

struct RunInfo {
  double duration_seconds = 0;
  // The window on CLOCK_MONOTONIC (steady_clock), so other programs' own
  // timelines (the ground-truth workloads') can be cut to the same window.
  int64_t window_start_monotonic_ns = 0;
  int64_t window_end_monotonic_ns = 0;
  uint32_t frequency_hz = 0;
  uint64_t period_ns = 0;  // CPU time one sample stands for
  int cpus = 0;
  std::string hostname;
  std::vector<pid_t> target_pids;  // empty: the whole host
  // Sampler totals, in samples.
  uint64_t total_samples = 0;
  uint64_t idle_samples = 0;
  uint64_t kernel_samples = 0;
  uint64_t user_samples = 0;
  uint64_t dropped_samples = 0;
};

// The agent's own cost over the run.
struct AgentCost {
  double cpu_seconds = 0;         // user + system CPU of the agent process, start to report
  double window_cpu_seconds = 0;  // of which during the sampling window
  double bpf_seconds = 0;         // BPF program run time, from the kernel's BPF stats
  uint64_t bpf_runs = 0;
  bool bpf_stats_enabled = false;
  uint64_t max_rss_bytes = 0;
  double report_latency_seconds = 0;  // window end → report ready (symbolization included)
};

// How the table is rendered; the document is the same either way.
struct TableOptions {
  // Print every row of every section, none folded (--all).
  bool all_rows = false;
};

nlohmann::json BuildReport(const aggregate::Profile& profile, const RunInfo& run, const AgentCost& cost);

// Renders a BuildReport() document (AddUsage's sections included). Without
// all_rows, a document with no usage sections renders to at most
// kTableScreenLines lines, whatever its size.
inline constexpr size_t kTableScreenLines = 40;
std::string RenderTable(const nlohmann::json& report, const TableOptions& options = {});

}  // namespace tlsprof::report
