#include "agent/expose/metrics_sink.h"

namespace tlsprof::expose {

WindowHealth HealthOf(const profiler::Window& window, const v1::AgentReport& report) {
  WindowHealth health;
  health.duration_seconds = window.duration_seconds();
  health.agent_cpu_seconds = window.cost.window_cpu_seconds;
  health.phase_cpu_seconds = window.cost.phases;
  health.bpf_seconds = window.cost.bpf_seconds;
  health.samples = window.totals.samples;
  health.resident_bytes = window.cost.resident_bytes;
  health.dropped_samples = window.totals.dropped_ip + window.totals.dropped_pid + window.totals.dropped_stack;
  health.unresolved_samples = window.attribution.unresolved_samples;
  health.tracked_processes = window.health.tracked_processes;
  health.pending_processes = window.health.pending_processes;
  if (window.usage) {
    // The report's usage block: the values as the collector accepts them.
    health.usage = true;
    health.probe_duty_cycle = report.usage().duty_cycle();
    health.probe_cpu_seconds = report.usage().probe_cpu_seconds();
    health.probe_hits = report.usage().probe_hits();
    health.probe_budget_cpu_seconds = report.usage().budget_cpu_seconds();
    health.probe_toggles = window.usage->counts.budget.toggles;
    health.probe_budget_share = window.usage->budget_share;
  }
  return health;
}

BoundsHealth BoundsOf(const profiler::Window& window) {
  BoundsHealth bounds;
  bounds.memory_limit_bytes = window.health.memory_limit_bytes;
  bounds.images_skipped = window.health.images_skipped;
  bounds.tables_skipped = window.health.tables_skipped;
  for (size_t i = 0; i < bounds.refused.size(); ++i) {
    auto it = window.health.refused.find(std::string(guard::ReasonName(static_cast<guard::Reason>(i))));
    if (it != window.health.refused.end()) bounds.refused[i] = it->second;
  }
  if (window.health.unwind) bounds.unwind_process_failures = window.health.unwind->process_failures;
  return bounds;
}

Status MetricsSink::Consume(const profiler::Window& window, const v1::AgentReport& report) {
  metrics_.AddReport(report);
  metrics_.AddWindow(HealthOf(window, report));
  metrics_.SetBounds(BoundsOf(window));
  return OkStatus();
}

}  // namespace tlsprof::expose
