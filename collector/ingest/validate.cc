#include "collector/ingest/validate.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <utility>

#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::collector {
namespace {

bool IsLabelChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == ':' || c == '/' || c == '(' || c == ')' || c == '+' || c == ' ' || c == '-';
}

bool IsHostnameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == ':' || c == '-';
}

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

constexpr char kLabelRule[] = "must be 1-64 characters of [A-Za-z0-9._:/()+ -]";

// A count of the usage telemetry: finite, non-negative, at most `max`.
std::optional<std::string> CheckAmount(double value, double max, std::string_view field) {
  if (!std::isfinite(value) || value < 0) return fmt::format("{}: must be a finite number >= 0, got {}", field, value);
  if (value > max) return fmt::format("{}: {} exceeds {:.0f}", field, value, max);
  return std::nullopt;
}

// observed (an integer) and estimated (scaled up for the duty cycle, so
// never below it) of a handshake or operation row.
std::optional<std::string> CheckCounts(uint64_t observed, double estimated, double max, std::string_view field) {
  if (static_cast<double>(observed) > max) {
    return fmt::format("{}.observed: {} exceeds {:.0f} (1e6 per CPU-second of the window)", field, observed, max);
  }
  if (auto e = CheckAmount(estimated, max, fmt::format("{}.estimated", field))) return e;
  if (observed == 0 && estimated != 0) {
    return fmt::format("{}.estimated: {} with observed 0 (estimates scale the observed count up)", field, estimated);
  }
  // Relative slack for the rounding of observed / duty_cycle.
  if (estimated < static_cast<double>(observed) * (1 - 1e-9)) {
    return fmt::format("{}.estimated: {} is below observed {} (estimates scale the observed count up)", field,
                       estimated, observed);
  }
  return std::nullopt;
}

// The usage rows of services[i]; `max_events`: handshakes or operations a
// row may count in this window.
std::optional<std::string> ValidateServiceUsage(const v1::Service& s, int i, double max_events,
                                                double max_cpu_seconds) {
  for (int j = 0; j < s.handshakes_size(); ++j) {
    const v1::Handshakes& h = s.handshakes(j);
    const std::string field = fmt::format("services[{}].handshakes[{}]", i, j);
    if (h.side() == v1::SIDE_UNSPECIFIED || !v1::Side_IsValid(h.side())) {
      return fmt::format("{}.side: must be a specified tlsprof.v1.Side, got {}", field, static_cast<int>(h.side()));
    }
    if (h.kind() == v1::HANDSHAKE_KIND_UNSPECIFIED || !v1::HandshakeKind_IsValid(h.kind())) {
      return fmt::format("{}.kind: must be a specified tlsprof.v1.HandshakeKind, got {}", field,
                         static_cast<int>(h.kind()));
    }
    const std::array<std::pair<std::string_view, std::string_view>, 5> labels = {{{"version", h.version()},
                                                                                  {"cipher_suite", h.cipher_suite()},
                                                                                  {"group", h.group()},
                                                                                  {"cert_key_type", h.cert_key_type()},
                                                                                  {"library", h.library()}}};
    for (const auto& [name, value] : labels) {
      if (!IsValidLabelValue(value)) return fmt::format("{}.{}: {}", field, name, kLabelRule);
    }
    if (auto e = CheckCounts(h.observed(), h.estimated(), max_events, field)) return e;
    if (auto e = CheckAmount(h.cpu_seconds(), max_cpu_seconds, field + ".cpu_seconds")) return e;
  }
  for (int j = 0; j < s.operations_size(); ++j) {
    const v1::CryptoOperations& o = s.operations(j);
    const std::string field = fmt::format("services[{}].operations[{}]", i, j);
    if (o.operation() == v1::OPERATION_UNSPECIFIED || !v1::Operation_IsValid(o.operation())) {
      return fmt::format("{}.operation: must be a specified tlsprof.v1.Operation, got {}", field,
                         static_cast<int>(o.operation()));
    }
    if (!IsValidLabelValue(o.algorithm())) return fmt::format("{}.algorithm: {}", field, kLabelRule);
    if (!IsValidLabelValue(o.library())) return fmt::format("{}.library: {}", field, kLabelRule);
    if (auto e = CheckCounts(o.observed(), o.estimated(), max_events, field)) return e;
    if (auto e = CheckAmount(o.cpu_seconds(), max_cpu_seconds, field + ".cpu_seconds")) return e;
    if (o.latency_buckets_size() != 0) {
      if (o.latency_buckets_size() != static_cast<int>(v1::kLatencyBuckets)) {
        return fmt::format("{}.latency_buckets: must be empty or hold exactly {} buckets, got {}", field,
                           v1::kLatencyBuckets, o.latency_buckets_size());
      }
      uint64_t sum = 0;
      for (uint64_t n : o.latency_buckets()) {
        // Each term <= observed: the sum cannot overflow before it is caught.
        if (n > o.observed() || (sum += n) > o.observed()) break;
      }
      if (sum != o.observed()) {
        return fmt::format("{}.latency_buckets: must add up to observed {}", field, o.observed());
      }
    }
  }
  for (int j = 0; j < s.connections_size(); ++j) {
    const v1::Connections& c = s.connections(j);
    const std::string field = fmt::format("services[{}].connections[{}]", i, j);
    if (!IsValidLabelValue(c.library())) return fmt::format("{}.library: {}", field, kLabelRule);
    if (auto e = CheckAmount(c.estimated(), kMaxConnections, field + ".estimated")) return e;
    if (c.resident_bytes() > kMaxResidentBytes) {
      return fmt::format("{}.resident_bytes: {} exceeds {} (1 PiB)", field, c.resident_bytes(), kMaxResidentBytes);
    }
  }
  return std::nullopt;
}

}  // namespace

bool IsValidLabelValue(std::string_view value) {
  if (value.empty() || value.size() > 64) return false;
  for (char c : value) {
    if (!IsLabelChar(c)) return false;
  }
  return true;
}

bool IsValidContainerId(std::string_view value) {
  if (value.size() > 64) return false;
  for (char c : value) {
    if (!IsLowerHex(c)) return false;
  }
  return true;
}

bool IsValidPodUid(std::string_view value) {
  if (value.empty()) return true;
  if (value.size() != 36) return false;
  for (size_t i = 0; i < value.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? value[i] != '-' : !IsLowerHex(value[i])) return false;
  }
  return true;
}

bool IsValidHostname(std::string_view value) {
  if (value.empty() || value.size() > 253) return false;
  for (char c : value) {
    if (!IsHostnameChar(c)) return false;
  }
  return true;
}

std::string_view BucketName(v1::Bucket bucket) {
  switch (bucket) {
    case v1::BUCKET_CIPHER:
      return "cipher";
    case v1::BUCKET_SIGNATURE:
      return "signature";
    case v1::BUCKET_KEY_EXCHANGE:
      return "key_exchange";
    case v1::BUCKET_HASH:
      return "hash";
    case v1::BUCKET_OTHER:
      return "other";
    default:
      return "unspecified";
  }
}

std::string_view PhaseName(v1::Phase phase) {
  switch (phase) {
    case v1::PHASE_HANDSHAKE:
      return "handshake";
    case v1::PHASE_RECORD:
      return "record";
    case v1::PHASE_OTHER:
      return "other";
    default:
      return "unspecified";
  }
}

std::optional<std::string> ValidateReport(const v1::AgentReport& r, int64_t /*now_unix_ns*/) {
  if (r.agent_instance().size() != kAgentInstanceBytes) {
    return fmt::format("agent_instance: must be {} bytes, got {}", kAgentInstanceBytes, r.agent_instance().size());
  }
  if (r.sequence() < 1) return std::string("sequence: must be >= 1");
  if (!IsValidHostname(r.host().hostname())) {
    return std::string("host.hostname: must be 1-253 characters of [A-Za-z0-9._:-]");
  }
  if (r.host().cpus() < 1) return std::string("host.cpus: must be >= 1");
  if (r.host().cpus() > kMaxHostCpus) {
    return fmt::format("host.cpus: {} exceeds {}, the most CPUs a Linux kernel supports", r.host().cpus(),
                       kMaxHostCpus);
  }

  const v1::Window& w = r.window();
  if (w.end_unix_ns() <= w.start_unix_ns()) return std::string("window: end_unix_ns must be > start_unix_ns");
  // Subtraction in unsigned: start may be negative and the difference must not overflow.
  const uint64_t length_ns = static_cast<uint64_t>(w.end_unix_ns()) - static_cast<uint64_t>(w.start_unix_ns());
  if (length_ns > static_cast<uint64_t>(kMaxWindowNs)) return std::string("window: longer than 1 h");
  if (w.frequency_hz() < 1 || w.frequency_hz() > 1000000) {
    return std::string("window.frequency_hz: must be 1-1000000");
  }
  const uint64_t expected_period = 1000000000ULL / w.frequency_hz();
  if (w.period_ns() + 1 < expected_period || w.period_ns() > expected_period + 1) {
    return fmt::format("window.period_ns: must be 1e9/frequency_hz = {} (+-1), got {}", expected_period, w.period_ns());
  }

  const double max_samples = kSampleSlack * static_cast<double>(r.host().cpus()) *
                             (static_cast<double>(length_ns) / 1e9) * static_cast<double>(w.frequency_hz());
  if (static_cast<double>(r.busy_samples()) > max_samples) {
    return fmt::format("busy_samples: {} exceeds 1.5 x cpus x seconds x frequency = {:.0f}", r.busy_samples(),
                       max_samples);
  }
  const double window_cpu_seconds = static_cast<double>(r.host().cpus()) * (static_cast<double>(length_ns) / 1e9);
  if (r.has_usage()) {
    const v1::UsageStats& u = r.usage();
    // 0: the probes were off for the whole window (then nothing is observed).
    if (!std::isfinite(u.duty_cycle()) || u.duty_cycle() < 0 || u.duty_cycle() > 1) {
      return fmt::format("usage.duty_cycle: must be in [0, 1], got {}", u.duty_cycle());
    }
    if (auto e = CheckAmount(u.relative_error(), 1e6, "usage.relative_error")) return e;
    if (auto e = CheckAmount(u.probe_cpu_seconds(), kSampleSlack * window_cpu_seconds, "usage.probe_cpu_seconds")) {
      return e;
    }
    if (auto e = CheckAmount(u.budget_cpu_seconds(), kSampleSlack * window_cpu_seconds, "usage.budget_cpu_seconds")) {
      return e;
    }
  }
  const double max_events = kMaxUsageEventsPerCpuSecond * window_cpu_seconds;
  size_t handshake_rows = 0, operation_rows = 0, connection_rows = 0;
  double services_busy = 0;
  for (int i = 0; i < r.services_size(); ++i) {
    const v1::Service& s = r.services(i);
    // The field name is formatted only for the error: this runs per row of every report.
    if (!IsValidLabelValue(s.name())) return fmt::format("services[{}].name: {}", i, kLabelRule);
    if (!IsValidContainerId(s.container_id())) {
      return fmt::format("services[{}].container_id: must be empty or 1-64 lowercase hex digits", i);
    }
    if (!IsValidPodUid(s.pod_uid())) {
      return fmt::format("services[{}].pod_uid: must be empty or a lowercase UUID (8-4-4-4-12 hex digits)", i);
    }
    if (static_cast<double>(s.busy_samples()) > max_samples) {
      return fmt::format("services[{}].busy_samples: {} exceeds 1.5 x cpus x seconds x frequency = {:.0f}", i,
                         s.busy_samples(), max_samples);
    }
    services_busy += static_cast<double>(s.busy_samples());
    if (s.tls_samples() > s.busy_samples()) {
      return fmt::format("services[{}].tls_samples: {} exceeds busy_samples {}", i, s.tls_samples(), s.busy_samples());
    }
    uint64_t sum = 0;
    for (int j = 0; j < s.tls_size(); ++j) {
      const v1::TlsCpu& t = s.tls(j);
      if (t.bucket() == v1::BUCKET_UNSPECIFIED || !v1::Bucket_IsValid(t.bucket())) {
        return fmt::format("services[{}].tls[{}].bucket: must be a specified tlsprof.v1.Bucket, got {}", i, j,
                           static_cast<int>(t.bucket()));
      }
      if (t.phase() == v1::PHASE_UNSPECIFIED || !v1::Phase_IsValid(t.phase())) {
        return fmt::format("services[{}].tls[{}].phase: must be a specified tlsprof.v1.Phase, got {}", i, j,
                           static_cast<int>(t.phase()));
      }
      if (!IsValidLabelValue(t.algorithm())) return fmt::format("services[{}].tls[{}].algorithm: {}", i, j, kLabelRule);
      if (!IsValidLabelValue(t.library())) return fmt::format("services[{}].tls[{}].library: {}", i, j, kLabelRule);
      if (t.samples() > s.tls_samples()) {
        return fmt::format("services[{}].tls[{}].samples: {} exceeds the service's tls_samples {}", i, j, t.samples(),
                           s.tls_samples());
      }
      sum += t.samples();  // each term <= tls_samples, so no overflow before the check below trips
      if (sum > s.tls_samples()) break;
    }
    if (sum != s.tls_samples()) {
      return fmt::format("services[{}].tls_samples: {} != sum of its tls[].samples", i, s.tls_samples());
    }
    if (s.handshakes_size() + s.operations_size() + s.connections_size() > 0) {
      if (!r.has_usage()) {
        return fmt::format(
            "services[{}]: usage rows (handshakes, operations, connections) need the report's usage "
            "block",
            i);
      }
      handshake_rows += static_cast<size_t>(s.handshakes_size());
      operation_rows += static_cast<size_t>(s.operations_size());
      connection_rows += static_cast<size_t>(s.connections_size());
      if (handshake_rows > v1::kMaxHandshakeRows) {
        return fmt::format("services[].handshakes: more than {} rows in one report", v1::kMaxHandshakeRows);
      }
      if (operation_rows > v1::kMaxOperationRows) {
        return fmt::format("services[].operations: more than {} rows in one report", v1::kMaxOperationRows);
      }
      if (connection_rows > v1::kMaxConnectionRows) {
        return fmt::format("services[].connections: more than {} rows in one report", v1::kMaxConnectionRows);
      }
      if (auto e = ValidateServiceUsage(s, i, max_events, kSampleSlack * window_cpu_seconds)) return e;
    }
  }
  if (services_busy > max_samples) {
    return fmt::format("services: busy_samples add up to {:.0f}, more than 1.5 x cpus x seconds x frequency = {:.0f}",
                       services_busy, max_samples);
  }
  return std::nullopt;
}

}  // namespace tlsprof::collector
