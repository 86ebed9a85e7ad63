#include "collector/ingest/validate.h"

#include <fmt/format.h>

#include <cmath>

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
  }
  if (services_busy > max_samples) {
    return fmt::format("services: busy_samples add up to {:.0f}, more than 1.5 x cpus x seconds x frequency = {:.0f}",
                       services_busy, max_samples);
  }
  return std::nullopt;
}

}  // namespace tlsprof::collector
