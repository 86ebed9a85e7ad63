// The usage telemetry's wire contract beyond the schema (report.proto):
// the fixed latency buckets of CryptoOperations.latency_buckets (two per
// octave, 2^k and 1.5 x 2^k ns, from 2^10 ns, ~1 us, to 2^34 ns, ~17 s, then
// one bucket above), which agents and collectors of all of v1 share so that
// histograms from many agents add up, and the rows one report may carry (the
// collector rejects more; the agent never sends more). Pure constants;
// thread-safe.
//
// Why half octaves: Prometheus' histogram_quantile() interpolates linearly
// inside a bucket, so plain exp2 buckets read a signature's p50 well above
// the agent's own histogram (8 sub-buckets per octave); half octaves come
// close for twice the series (docs/fleet.md has the figures). Both bounds
// are slot bounds of the agent's histogram, so no slot is split.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tlsprof/v1/report.pb.h"

namespace tlsprof::v1 {

// 24 octaves of 2 buckets, then the bound 2^34 ns.
inline constexpr size_t kLatencyFiniteBuckets = 24 * 2 + 1;
// Every bucket, the last (above 2^34 ns) included: the wire's length.
inline constexpr size_t kLatencyBuckets = kLatencyFiniteBuckets + 1;
inline constexpr uint32_t kLatencyFirstBoundLog2Ns = 10;

// Usage rows one report may carry, over all its services: the agent's BPF
// maps hold at most 4096 handshake and 1024 operation keys (bpf/usage.h),
// and grouping by service only merges them.
inline constexpr size_t kMaxHandshakeRows = 4096;
inline constexpr size_t kMaxOperationRows = 1024;
inline constexpr size_t kMaxConnectionRows = 1024;

// The upper bound of finite bucket i (0 <= i < kLatencyFiniteBuckets), in ns:
// 1024, 1536, 2048, 3072, ..., 2^34.
constexpr uint64_t LatencyBucketBoundNs(size_t i) {
  const uint64_t octave = uint64_t{1} << (kLatencyFirstBoundLog2Ns + i / 2);
  return i % 2 == 0 ? octave : octave + octave / 2;
}

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
