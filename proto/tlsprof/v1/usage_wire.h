// The usage telemetry's wire contract beyond the schema (report.proto):
// the fixed latency buckets of CryptoOperations.latency_buckets (exp2 bounds
// from 2^10 ns, ~1 us, to 2^34 ns, ~17 s, then one bucket above), which
// agents and collectors of all of v1 share so that histograms from many
// agents add up, and the rows one report may carry (the collector rejects
// more; the agent never sends more). Pure constants; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tlsprof/v1/report.pb.h"

namespace tlsprof::v1 {

inline constexpr size_t kLatencyFiniteBuckets = 25;
// Every bucket, the last (above 2^34 ns) included: the wire's length.
inline constexpr size_t kLatencyBuckets = kLatencyFiniteBuckets + 1;
inline constexpr uint32_t kLatencyFirstBoundLog2Ns = 10;

// Usage rows one report may carry, over all its services: the agent's BPF
// maps hold at most 4096 handshake and 1024 operation keys (bpf/usage.h),
// and grouping by service only merges them.
inline constexpr size_t kMaxHandshakeRows = 4096;
inline constexpr size_t kMaxOperationRows = 1024;
inline constexpr size_t kMaxConnectionRows = 1024;

// The upper bound of finite bucket i (0 <= i < kLatencyFiniteBuckets), in ns.
constexpr uint64_t LatencyBucketBoundNs(size_t i) { return uint64_t{1} << (kLatencyFirstBoundLog2Ns + i); }

// The same in seconds: Prometheus' `le` values.
inline std::array<double, kLatencyFiniteBuckets> LatencyBucketBoundsSeconds() {
  std::array<double, kLatencyFiniteBuckets> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(LatencyBucketBoundNs(i)) / 1e9;
  return out;
}

// The bucket that holds a latency range [lo, hi) in ns that lies within one
// bucket (an agent's histogram slot): the first bound >= hi.
constexpr size_t LatencyBucketOf(uint64_t hi_ns) {
  for (size_t i = 0; i < kLatencyFiniteBuckets; ++i) {
    if (hi_ns <= LatencyBucketBoundNs(i)) return i;
  }
  return kLatencyFiniteBuckets;
}

// The label values of the usage enums, for the agent's and the collector's
// /metrics alike: "server", "client", "unknown"; "full", "resumed",
// "unknown"; "sign", "verify", "key_exchange" ("unspecified": invalid on the
// wire, never exposed).
constexpr std::string_view SideLabel(Side side) {
  switch (side) {
    case SIDE_SERVER:
      return "server";
    case SIDE_CLIENT:
      return "client";
    default:
      return "unknown";
  }
}

constexpr std::string_view HandshakeKindLabel(HandshakeKind kind) {
  switch (kind) {
    case HANDSHAKE_KIND_FULL:
      return "full";
    case HANDSHAKE_KIND_RESUMED:
      return "resumed";
    default:
      return "unknown";
  }
}

constexpr std::string_view OperationLabel(Operation operation) {
  switch (operation) {
    case OPERATION_SIGN:
      return "sign";
    case OPERATION_VERIFY:
      return "verify";
    case OPERATION_KEY_EXCHANGE:
      return "key_exchange";
    default:
      return "unspecified";
  }
}

}  // namespace tlsprof::v1
