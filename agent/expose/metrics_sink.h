// The agent's /metrics as a sink of windows: each window's report is counted
// into AgentMetrics (agent/expose/metrics.h), with the agent's health and
// bounds from the window. Not synchronized; AgentMetrics itself is.
#pragma once

#include "agent/expose/metrics.h"
#include "agent/wire/report_sink.h"

namespace tlsprof::expose {

// The agent's health and bounds as the metrics take them.
WindowHealth HealthOf(const profiler::Window& window, const v1::AgentReport& report);
BoundsHealth BoundsOf(const profiler::Window& window);

class MetricsSink : public wire::ReportSink {
 public:
  explicit MetricsSink(AgentMetrics& metrics) : metrics_(metrics) {}
  Status Consume(const profiler::Window& window, const v1::AgentReport& report) override;

 private:
  AgentMetrics& metrics_;
};

}  // namespace tlsprof::expose
