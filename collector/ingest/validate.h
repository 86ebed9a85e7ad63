// Validation of one AgentReport (docs/fleet.md, "Ingest", step 4).
//
// Pure functions, no state: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tlsprof/v1/report.pb.h"

namespace tlsprof::collector {

// Longest window a report may cover. Where the window lies in time is not
// checked: a host whose clock is wrong still has its CPU counted (the
// collector keys its per-minute ring by its own receive time and measures
// the skew instead; docs/fleet.md, "Clock skew").
inline constexpr int64_t kMaxWindowNs = 3600LL * 1000 * 1000 * 1000;
// Sample counts may exceed cpus × seconds × frequency by this factor (timer
// jitter, windows that are closed a little late).
inline constexpr double kSampleSlack = 1.5;
inline constexpr size_t kAgentInstanceBytes = 16;
// Usage rows per report: v1::kMaxHandshakeRows & co. (proto/tlsprof/v1/usage_wire.h).
// Handshakes or operations per CPU-second of the window: a bound far above
// any real rate (a resumed TLS 1.3 handshake costs tens of microseconds),
// so that a broken agent cannot push counters to 1e300.
inline constexpr double kMaxUsageEventsPerCpuSecond = 1e6;
// Live connections one row may report.
inline constexpr double kMaxConnections = 1e8;
// Resident memory one connection row may report (the processes holding
// them): 1 PiB, far above any host, so that a broken agent cannot push the
// gauge's sums to absurd values.
inline constexpr uint64_t kMaxResidentBytes = uint64_t{1} << 50;
// CPUs one host may report: Linux's largest NR_CPUS (CONFIG_MAXSMP, x86-64)
// is 8192, so no kernel an agent runs on can show more. host.cpus scales the
// sample and usage bounds below, so an unbounded value would lift them all.
inline constexpr uint32_t kMaxHostCpus = 8192;

// A label value (service, algorithm, library): 1–64 characters of
// [A-Za-z0-9._:/()+ -]. Nothing that could close a label or inject a series.
bool IsValidLabelValue(std::string_view value);
// A container id: "" (not in a container) or 1-64 lowercase hex digits.
bool IsValidContainerId(std::string_view value);
// A pod UID: "" (not in a pod) or a lowercase dashed UUID, 8-4-4-4-12.
bool IsValidPodUid(std::string_view value);
// A hostname as the collector uses it (relay and insecure identities, host
// labels): 1–253 characters of [A-Za-z0-9._:-].
bool IsValidHostname(std::string_view value);

// Returns std::nullopt when `report` is acceptable, else "<field>: <reason>"
// naming the first rule it breaks. `now_unix_ns` is not used any more (the
// window's position in time is not checked); kept for the callers.
std::optional<std::string> ValidateReport(const v1::AgentReport& report, int64_t now_unix_ns);

// Lower-case label values of the enums ("cipher", "handshake", ...).
std::string_view BucketName(v1::Bucket bucket);
std::string_view PhaseName(v1::Phase phase);
std::string_view SideName(v1::Side side);                    // server, client, unknown
std::string_view HandshakeKindName(v1::HandshakeKind kind);  // full, resumed, unknown
std::string_view OperationName(v1::Operation operation);     // sign, verify, key_exchange

}  // namespace tlsprof::collector
