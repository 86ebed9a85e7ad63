// The shipper as a sink of windows: each window's report is sealed into the
// spool (Shipper::Seal), which logs the sealed line. Without a collector
// the window's line is logged instead (docs/fleet.md, "Agent daemon").
// Not synchronized; the Shipper itself is.
#pragma once

#include "agent/ship/shipper.h"
#include "agent/wire/report_sink.h"

namespace tlsprof::ship {

class ShipSink : public wire::ReportSink {
 public:
  explicit ShipSink(Shipper* shipper) : shipper_(shipper) {}  // null: log only
  Status Consume(const profiler::Window& window, const v1::AgentReport& report) override;
  // The spool as the next report carries it.
  wire::SpoolState spool() const;

 private:
  Shipper* shipper_;
};

}  // namespace tlsprof::ship
