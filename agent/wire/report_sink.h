// The fleet report's consumers: a window is encoded once (EncodeWindow) and
// every ReportSink gets the window with its report: the agent's /metrics
// (agent/expose) and the shipper (agent/ship/ship_sink.h).
// Not synchronized: the thread that closes windows drives them.
#pragma once

#include <functional>
#include <vector>

#include "agent/profiler/window.h"
#include "agent/wire/encode.h"

namespace tlsprof::wire {

class ReportSink {
 public:
  virtual ~ReportSink() = default;
  virtual Status Consume(const profiler::Window& window, const v1::AgentReport& report) = 0;
};

// A WindowSink that encodes each window and hands it to its report sinks,
// in order. `spool` gives the spool's state at the moment of encoding.
class ReportFanout : public profiler::WindowSink {
 public:
  ReportFanout(EncodeOptions options, std::function<SpoolState()> spool, std::vector<ReportSink*> sinks)
      : options_(options), spool_(std::move(spool)), sinks_(std::move(sinks)) {}
  Status Consume(const profiler::Window& window) override {
    const v1::AgentReport report = EncodeWindow(window, options_, spool_ ? spool_() : SpoolState{});
    Status status = OkStatus();
    for (ReportSink* sink : sinks_) {
      if (auto st = sink->Consume(window, report); !st.ok() && status.ok()) status = st;
    }
    return status;
  }

 private:
  EncodeOptions options_;
  std::function<SpoolState()> spool_;
  std::vector<ReportSink*> sinks_;
};

}  // namespace tlsprof::wire
