#include "agent/ship/ship_sink.h"

#include <spdlog/spdlog.h>

namespace tlsprof::ship {

Status ShipSink::Consume(const profiler::Window&, const v1::AgentReport& report) {
  const int64_t start_ns = report.window().start_unix_ns();
  const int64_t end_ns = report.window().end_unix_ns();
  if (shipper_ == nullptr) {
    uint64_t tls_samples = 0;
    for (const auto& s : report.services()) tls_samples += s.tls_samples();
    spdlog::info("window=[{},{}) busy_samples={} tls_samples={} services={}", start_ns, end_ns, report.busy_samples(),
                 tls_samples, report.services_size());
    return OkStatus();
  }
  auto sealed = shipper_->Seal(v1::AgentReport(report));
  if (!sealed.ok()) return MakeError("cannot seal the window [{},{}): {}", start_ns, end_ns, sealed.error().message);
  return OkStatus();
}

wire::SpoolState ShipSink::spool() const {
  if (shipper_ == nullptr) return {};
  const ShipperStats st = shipper_->stats();
  return {.batches = st.spooled_batches, .dropped = st.spool_dropped};
}

}  // namespace tlsprof::ship
