#include "agent/expose/metrics.h"

#include <prometheus/text_serializer.h>

#include <charconv>
#include <exception>

#include "agent/classify/classify.h"
#include "agent/wire/services.h"
#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::expose {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Histogram::BucketBoundaries LatencyBounds() {
  const auto bounds = v1::LatencyBucketBoundsSeconds();
  return {bounds.begin(), bounds.end()};
}

std::string_view BucketLabel(v1::Bucket b) {
  switch (b) {
    case v1::BUCKET_CIPHER:
      return classify::BucketName(classify::Bucket::kCipher);
    case v1::BUCKET_SIGNATURE:
      return classify::BucketName(classify::Bucket::kSignature);
    case v1::BUCKET_KEY_EXCHANGE:
      return classify::BucketName(classify::Bucket::kKeyExchange);
    case v1::BUCKET_HASH:
      return classify::BucketName(classify::Bucket::kHash);
    default:
      return classify::BucketName(classify::Bucket::kOther);
  }
}

std::string_view PhaseLabel(v1::Phase p) {
  switch (p) {
    case v1::PHASE_HANDSHAKE:
      return classify::PhaseName(classify::Phase::kHandshake);
    case v1::PHASE_RECORD:
      return classify::PhaseName(classify::Phase::kRecord);
    default:
      return classify::PhaseName(classify::Phase::kOther);
  }
}

void Advance(prometheus::Counter& counter, uint64_t now, uint64_t before) {
  if (now > before) counter.Increment(static_cast<double>(now - before));
}

}  // namespace

Status CheckListenAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return MakeError("--metrics-listen {}: expected HOST:PORT, e.g. 127.0.0.1:9464", address);
  }
  std::string_view host(address.data(), colon);
  if (host.front() == '[' ? host.back() != ']' : host.find(':') != std::string_view::npos) {
    return MakeError("--metrics-listen {}: an IPv6 host goes in brackets, e.g. [::1]:9464", address);
  }
  std::string_view port(address.data() + colon + 1, address.size() - colon - 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
    return MakeError("--metrics-listen {}: the port must be a number in 1..65535", address);
  }
  return OkStatus();
}

AgentMetrics::AgentMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      cpu_seconds_(BuildCounter()
                       .Name("tlsprof_cpu_seconds_total")
                       .Help("CPU-seconds inside TLS code, by bucket, algorithm, phase, TLS library and service (and "
                             "container_id, pod_uid in a container)")
                       .Register(*registry_)),
      busy_seconds_(
          BuildCounter()
              .Name("tlsprof_busy_cpu_seconds_total")
              .Help("Busy CPU-seconds (user + kernel) of the service's processes (and container_id, pod_uid in a "
                    "container); (non-tls) holds every other process")
              .Register(*registry_)),
      reports_(BuildCounter().Name("tlsprof_reports_total").Help("Windows counted").Register(*registry_).Add({})),
      windows_(BuildCounter()
                   .Name("tlsprof_agent_windows_total")
                   .Help("Profile windows the agent closed")
                   .Register(*registry_)
                   .Add({})),
      window_duration_(BuildGauge()
                           .Name("tlsprof_agent_window_duration_seconds")
                           .Help("Length of the last closed window")
                           .Register(*registry_)
                           .Add({})),
      agent_cpu_(BuildCounter()
                     .Name("tlsprof_agent_cpu_seconds_total")
                     .Help("CPU-seconds the agent process used while profiling (user + system)")
                     .Register(*registry_)
                     .Add({})),
      rss_(BuildGauge()
               .Name("tlsprof_agent_resident_memory_bytes")
               .Help("Resident memory of the agent process")
               .Register(*registry_)
               .Add({})),
      dropped_samples_(BuildCounter()
                           .Name("tlsprof_agent_dropped_samples_total")
                           .Help("Samples the kernel maps had no room for")
                           .Register(*registry_)
                           .Add({})),
      unresolved_samples_(BuildCounter()
                              .Name("tlsprof_agent_unresolved_samples_total")
                              .Help("User samples of processes the agent could not snapshot")
                              .Register(*registry_)
                              .Add({})),
      tracked_processes_(BuildGauge()
                             .Name("tlsprof_agent_tracked_processes")
                             .Help("Processes the agent holds a snapshot of")
                             .Register(*registry_)
                             .Add({})),
      pending_processes_(BuildGauge()
                             .Name("tlsprof_agent_pending_processes")
                             .Help("Processes found but not read yet at the window's close (discovery is behind)")
                             .Register(*registry_)
                             .Add({})),
      spool_batches_(BuildGauge()
                         .Name("tlsprof_agent_spool_batches")
                         .Help("Sealed batches waiting in the spool")
                         .Register(*registry_)
                         .Add({})),
      spool_bytes_(BuildGauge()
                       .Name("tlsprof_agent_spool_bytes")
                       .Help("Bytes of the batches waiting in the spool")
                       .Register(*registry_)
                       .Add({})),
      batches_(BuildCounter()
                   .Name("tlsprof_agent_batches_total")
                   .Help("Batches by outcome: sealed, accepted, duplicate, rejected (INVALID_ARGUMENT), dropped "
                         "(spool over its bound or its disk full), unpersisted (could not be written at all: lost)")
                   .Register(*registry_)),
      send_errors_(BuildCounter()
                       .Name("tlsprof_agent_send_errors_total")
                       .Help("Failed attempts to ship a batch (retried)")
                       .Register(*registry_)
                       .Add({})),
      last_success_(BuildGauge()
                        .Name("tlsprof_agent_last_success_timestamp_seconds")
                        .Help("Unix time of the last batch the collector took (0: none yet)")
                        .Register(*registry_)
                        .Add({})),
      memory_limit_(BuildGauge()
                        .Name("tlsprof_agent_memory_limit_bytes")
                        .Help("The agent's memory cap (--memory-limit; 0: none)")
                        .Register(*registry_)
                        .Add({})),
      memory_limited_(BuildCounter()
                          .Name("tlsprof_agent_memory_limited_total")
                          .Help("Loads the memory cap refused: what (symbols, unwind_table) of a file left out")
                          .Register(*registry_)),
      unwind_unregistered_(BuildCounter()
                               .Name("tlsprof_agent_unwind_unregistered_processes_total")
                               .Help("TLS processes the unwind_procs map had no room for (leaf-only attribution)")
                               .Register(*registry_)
                               .Add({})),
      handshakes_(BuildCounter()
                      .Name("tlsprof_handshakes_total")
                      .Help("Completed TLS handshakes by negotiated parameters (estimated for the usage probes' duty "
                            "cycle), by service and TLS library")
                      .Register(*registry_)),
      operations_(BuildCounter()
                      .Name("tlsprof_crypto_operations_total")
                      .Help("Public-key operations (sign, verify, key_exchange) by algorithm (estimated)")
                      .Register(*registry_)),
      operation_cpu_(BuildCounter()
                         .Name("tlsprof_crypto_operation_cpu_seconds_total")
                         .Help("On-CPU seconds of the public-key operations (estimated)")
                         .Register(*registry_)),
      operation_latency_(BuildHistogram()
                             .Name("tlsprof_crypto_operation_latency_seconds")
                             .Help("On-CPU latency of the observed public-key operations")
                             .Register(*registry_)),
      connections_(BuildGauge()
                       .Name("tlsprof_tls_connections")
                       .Help("Live TLS connections (handshaken, not yet freed) at the last window's end")
                       .Register(*registry_)),
      probe_duty_cycle_(BuildGauge()
                            .Name("tlsprof_agent_usage_probe_duty_cycle")
                            .Help("Share of the last window the usage probes counted in (their counts are scaled by "
                                  "its inverse; 1 = always)")
                            .Register(*registry_)),
      probe_cpu_(BuildCounter()
                     .Name("tlsprof_agent_usage_probe_cpu_seconds_total")
                     .Help("CPU-seconds the usage probes cost (estimated from their hits)")
                     .Register(*registry_)),
      probe_hits_(BuildCounter()
                      .Name("tlsprof_agent_usage_probe_hits_total")
                      .Help("Usage probe and return-probe runs")
                      .Register(*registry_)),
      probe_budget_cpu_(BuildCounter()
                            .Name("tlsprof_agent_usage_probe_budget_cpu_seconds_total")
                            .Help("CPU-seconds the usage probes' budget allowed (--usage-budget; 0 without one)")
                            .Register(*registry_)),
      probe_toggles_(BuildCounter()
                         .Name("tlsprof_agent_usage_probe_toggles_total")
                         .Help("Attaches and detaches of the usage probes by their duty cycle")
                         .Register(*registry_)),
      probe_budget_ratio_(BuildGauge()
                              .Name("tlsprof_agent_usage_probe_budget_ratio")
                              .Help("The usage probes' budget as a share of the host's CPUs (--usage-budget; 0: none)")
                              .Register(*registry_)) {
  for (const char* what : {"symbols", "unwind_table"}) memory_limited_.Add({{"what", what}});
  // Present from the first scrape, at 0.
  for (const char* result : {"sealed", "accepted", "duplicate", "rejected", "dropped"})
    batches_.Add({{"result", result}});
}

Status AgentMetrics::Serve(const std::string& address) {
  if (auto st = CheckListenAddress(address); !st.ok()) return st;
  try {
    // civetweb takes "[::1]:9464" and "127.0.0.1:9464" alike.
    exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return MakeError("--metrics-listen {}: cannot listen there ({}); is the port in use?", address, e.what());
  }
  exposer_->RegisterCollectable(registry_);
  return OkStatus();
}

void AgentMetrics::AddReport(const v1::AgentReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  const double sec_per_sample = static_cast<double>(report.window().period_ns()) / 1e9;
  // The service, container and pod labels of a series: its own while the
  // series is known or under the cap, else service "(overflow)" without a
  // container. The container labels are there only when non-empty
  // (docs/fleet.md, "Metrics"): a series' key holds them, so each series
  // always has the same label names.
  auto labels_for = [this](std::vector<std::string> key, const v1::Service& s) {
    key.insert(key.end(), {s.name(), s.container_id(), s.pod_uid()});
    if (!series_.contains(key) && series_.size() >= kMaxSeries) {
      key.resize(key.size() - 3);
      key.insert(key.end(), {std::string(wire::kOverflowService), "", ""});
    }
    std::map<std::string, std::string> labels{{"service", key[key.size() - 3]}};
    if (!key[key.size() - 2].empty()) labels["container_id"] = key[key.size() - 2];
    if (!key.back().empty()) labels["pod_uid"] = key.back();
    series_.insert(std::move(key));
    return labels;
  };
  for (const v1::Service& s : report.services()) {
    busy_seconds_.Add(labels_for({"busy"}, s)).Increment(static_cast<double>(s.busy_samples()) * sec_per_sample);
    for (const v1::TlsCpu& row : s.tls()) {
      std::string bucket(BucketLabel(row.bucket()));
      std::string phase(PhaseLabel(row.phase()));
      auto labels = labels_for({bucket, row.algorithm(), phase, row.library()}, s);
      labels.insert({{"bucket", bucket}, {"algorithm", row.algorithm()}, {"phase", phase}, {"library", row.library()}});
      cpu_seconds_.Add(labels).Increment(static_cast<double>(row.samples()) * sec_per_sample);
    }
    for (const v1::Handshakes& h : s.handshakes()) {
      const std::string side(v1::SideLabel(h.side())), kind(v1::HandshakeKindLabel(h.kind()));
      auto labels = labels_for(
          {"handshakes", h.library(), side, kind, h.version(), h.cipher_suite(), h.group(), h.cert_key_type()}, s);
      labels.insert({{"library", h.library()},
                     {"side", side},
                     {"kind", kind},
                     {"version", h.version()},
                     {"cipher_suite", h.cipher_suite()},
                     {"group", h.group()},
                     {"cert_key_type", h.cert_key_type()}});
      handshakes_.Add(labels).Increment(h.estimated());
    }
    for (const v1::CryptoOperations& o : s.operations()) {
      const std::string operation(v1::OperationLabel(o.operation())), in_handshake(o.in_handshake() ? "true" : "false");
      auto labels = labels_for({"operations", o.library(), operation, o.algorithm(), in_handshake}, s);
      labels.insert({{"library", o.library()},
                     {"operation", operation},
                     {"algorithm", o.algorithm()},
                     {"in_handshake", in_handshake}});
      operations_.Add(labels).Increment(o.estimated());
      // Estimated CPU: the observed operations' CPU scaled as their count.
      if (o.observed() > 0) {
        operation_cpu_.Add(labels).Increment(o.cpu_seconds() * o.estimated() / static_cast<double>(o.observed()));
      }
      if (o.latency_buckets_size() == static_cast<int>(v1::kLatencyBuckets)) {
        std::vector<double> increments(o.latency_buckets().begin(), o.latency_buckets().end());
        operation_latency_.Add(labels, LatencyBounds()).ObserveMultiple(increments, o.cpu_seconds());
      }
    }
  }
  if (report.has_usage()) {
    // A gauge: this report's values; series of processes gone are removed.
    std::map<std::map<std::string, std::string>, prometheus::Gauge*> now;
    for (const v1::Service& s : report.services()) {
      for (const v1::Connections& c : s.connections()) {
        auto labels = labels_for({"connections", c.library()}, s);
        labels.insert({"library", c.library()});
        auto [it, fresh] = now.try_emplace(labels, nullptr);
        if (fresh) {
          it->second = &connections_.Add(labels);
          it->second->Set(0);
        }
        it->second->Increment(c.estimated());
      }
    }
    for (const auto& [labels, gauge] : connection_gauges_) {
      if (!now.contains(labels)) connections_.Remove(gauge);
    }
    connection_gauges_ = std::move(now);
  }
  reports_.Increment();
}

void AgentMetrics::AddWindow(const WindowHealth& h) {
  windows_.Increment();
  window_duration_.Set(h.duration_seconds);
  if (h.agent_cpu_seconds > 0) agent_cpu_.Increment(h.agent_cpu_seconds);
  rss_.Set(static_cast<double>(h.resident_bytes));
  dropped_samples_.Increment(static_cast<double>(h.dropped_samples));
  unresolved_samples_.Increment(static_cast<double>(h.unresolved_samples));
  tracked_processes_.Set(static_cast<double>(h.tracked_processes));
  pending_processes_.Set(static_cast<double>(h.pending_processes));
  if (h.usage) {
    probe_duty_cycle_.Add({}).Set(h.probe_duty_cycle);
    probe_cpu_.Add({}).Increment(h.probe_cpu_seconds);
    probe_hits_.Add({}).Increment(static_cast<double>(h.probe_hits));
    probe_budget_cpu_.Add({}).Increment(h.probe_budget_cpu_seconds);
    probe_toggles_.Add({}).Increment(static_cast<double>(h.probe_toggles));
    probe_budget_ratio_.Add({}).Set(h.probe_budget_share);
  }
}

void AgentMetrics::SetShip(const ShipHealth& s) {
  std::lock_guard<std::mutex> lock(mu_);
  Advance(batches_.Add({{"result", "sealed"}}), s.sealed, last_ship_.sealed);
  Advance(batches_.Add({{"result", "accepted"}}), s.accepted, last_ship_.accepted);
  Advance(batches_.Add({{"result", "duplicate"}}), s.duplicates, last_ship_.duplicates);
  Advance(batches_.Add({{"result", "rejected"}}), s.rejected, last_ship_.rejected);
  Advance(batches_.Add({{"result", "dropped"}}), s.spool_dropped, last_ship_.spool_dropped);
  Advance(batches_.Add({{"result", "unpersisted"}}), s.unpersisted, last_ship_.unpersisted);
  Advance(send_errors_, s.send_errors, last_ship_.send_errors);
  spool_batches_.Set(static_cast<double>(s.spooled_batches));
  spool_bytes_.Set(static_cast<double>(s.spooled_bytes));
  last_success_.Set(s.last_success_unix_seconds);
  last_ship_ = s;
}

void AgentMetrics::SetBounds(const BoundsHealth& b) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_limit_.Set(static_cast<double>(b.memory_limit_bytes));
  Advance(memory_limited_.Add({{"what", "symbols"}}), b.images_skipped, last_bounds_.images_skipped);
  Advance(memory_limited_.Add({{"what", "unwind_table"}}), b.tables_skipped, last_bounds_.tables_skipped);
  Advance(unwind_unregistered_, b.unwind_process_failures, last_bounds_.unwind_process_failures);
  last_bounds_ = b;
}

std::string AgentMetrics::Text() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace tlsprof::expose
