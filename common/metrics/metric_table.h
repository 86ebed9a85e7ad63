// The metric contract: every Prometheus metric that the agent's and the
// collector's /metrics expose, declared once, as data (name, type, label
// names, help, and which side exposes it). The expositions take the name, the
// help and the label names from here; docs/fleet.md's metric tables and the
// dashboards' queries are checked against this table by tests that read it
// through tlsprof-metric-table (JSON). No other C++ spells a metric name.
//
// To add a metric: add its entry below and to kAll (the documentation's
// order), document it in a docs/fleet.md table, then expose it from the side
// the entry names.
//
// Labels are listed in the order the code keeps a series' values in; the
// exposition writes them sorted by name, as prometheus-cpp does.
// container_id and pod_uid are written only when set (docs/fleet.md,
// "Metrics"): they are part of a series' key, so a series never changes its
// label names.
//
// Constant data and pure functions: thread-safe. Header-only, so that it adds
// no link dependency to the code that exposes the metrics.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tlsprof::metrics {

enum class Type { kCounter, kGauge, kHistogram };

// Which /metrics exposes a metric: bits. kReserved: documented, so that
// dashboards may read it, but not produced by any side yet.
enum Side : unsigned { kReserved = 0, kAgent = 1, kCollector = 2, kBoth = kAgent | kCollector };

struct Metric {
  std::string_view name;
  Type type;
  std::span<const std::string_view> labels;
  std::string_view help;
  unsigned sides;  // Side bits
};

// --- Label names, in the order series keep their values.

inline constexpr std::array<std::string_view, 0> kNoLabels = {};
// A service's series: the service and, inside a container, its identity.
inline constexpr std::array<std::string_view, 3> kServiceLabels = {"service", "container_id", "pod_uid"};
inline constexpr std::array<std::string_view, 7> kCpuLabels = {"bucket",  "algorithm",    "phase",  "library",
                                                               "service", "container_id", "pod_uid"};
inline constexpr std::array<std::string_view, 10> kHandshakeLabels = {
    "service", "container_id", "pod_uid",      "library", "side",
    "kind",    "version",      "cipher_suite", "group",   "cert_key_type"};
inline constexpr std::array<std::string_view, 7> kOperationLabels = {
    "service", "container_id", "pod_uid", "library", "operation", "algorithm", "in_handshake"};
inline constexpr std::array<std::string_view, 4> kConnectionLabels = {"service", "container_id", "pod_uid", "library"};
inline constexpr std::array<std::string_view, 2> kHostCpuLabels = {"host", "bucket"};
inline constexpr std::array<std::string_view, 1> kHostLabels = {"host"};
inline constexpr std::array<std::string_view, 1> kResultLabel = {"result"};
inline constexpr std::array<std::string_view, 1> kActionLabel = {"action"};
inline constexpr std::array<std::string_view, 1> kWhatLabel = {"what"};
inline constexpr std::array<std::string_view, 1> kReasonLabel = {"reason"};
// A phase of the agent's window cycle (agent/profiler/phase_clock.h), not a TLS phase.
inline constexpr std::array<std::string_view, 1> kAgentPhaseLabel = {"phase"};
// A remote-write receiver (its URL), and what became of a request sent to it.
inline constexpr std::array<std::string_view, 1> kReceiverLabel = {"receiver"};
inline constexpr std::array<std::string_view, 2> kReceiverResultLabels = {"receiver", "result"};
inline constexpr std::array<std::string_view, 6> kHandshakeCpuLabels = {"service", "container_id", "pod_uid",
                                                                        "library", "kind",         "cert_key_type"};

// Labels written only when their value is not empty.
constexpr bool OnlyWhenSet(std::string_view label) { return label == "container_id" || label == "pod_uid"; }

// --- Data metrics: the agent for its host, the collector for the fleet.

inline constexpr Metric kCpuSeconds{"tlsprof_cpu_seconds_total", Type::kCounter, kCpuLabels,
                                    "CPU-seconds inside TLS code", kBoth};
inline constexpr Metric kBusyCpuSeconds{
    "tlsprof_busy_cpu_seconds_total", Type::kCounter, kServiceLabels,
    "Busy CPU-seconds (user + kernel) of the service's processes; (non-tls) holds the rest", kBoth};
inline constexpr Metric kReports{"tlsprof_reports_total", Type::kCounter, kNoLabels, "Windows counted", kBoth};
inline constexpr Metric kHostCpuSeconds{"tlsprof_host_cpu_seconds_total", Type::kCounter, kHostCpuLabels,
                                        "CPU-seconds inside TLS code, per host", kCollector};
inline constexpr Metric kHostBusyCpuSeconds{"tlsprof_host_busy_cpu_seconds_total", Type::kCounter, kHostLabels,
                                            "Busy CPU-seconds, per host", kCollector};

// --- The collector's health.

inline constexpr Metric kCollectorReports{"tlsprof_collector_reports_total", Type::kCounter, kResultLabel,
                                          "Submit calls by result", kCollector};
inline constexpr Metric kCollectorDroppedSeries{"tlsprof_collector_dropped_series_total", Type::kCounter, kNoLabels,
                                                "Series dropped by the per-agent cardinality caps", kCollector};
inline constexpr Metric kCollectorClockSkew{
    "tlsprof_collector_clock_skew_seconds", Type::kGauge, kNoLabels,
    "Largest |agent clock - collector clock| of the agents seen in the last 5 minutes", kCollector};
inline constexpr Metric kCollectorSkewedReports{
    "tlsprof_collector_skewed_reports_total", Type::kCounter, kNoLabels,
    "Reports accepted from an agent whose clock was off by more than 30 s (counted all the same)", kCollector};
inline constexpr Metric kCollectorAgentKeys{"tlsprof_collector_agent_keys", Type::kGauge, kNoLabels,
                                            "Agent keys held in memory (at most --max-agents)", kCollector};
inline constexpr Metric kCollectorAgentLimit{
    "tlsprof_collector_agent_limit_total", Type::kCounter, kActionLabel,
    "New agent keys at --max-agents: evicted = an idle agent's state forgotten for it, refused = its report "
    "answered RESOURCE_EXHAUSTED",
    kCollector};
inline constexpr Metric kCollectorSeries{"tlsprof_collector_series", Type::kGauge, kNoLabels,
                                         "Data series held (tlsprof_cpu_seconds_total, tlsprof_busy_cpu_seconds_"
                                         "total and the usage telemetry's; at most --max-series)",
                                         kCollector};
inline constexpr Metric kCollectorSeriesLimitDropped{"tlsprof_collector_series_limit_dropped_total", Type::kCounter,
                                                     kNoLabels, "Series dropped because --max-series series are held",
                                                     kCollector};
inline constexpr Metric kCollectorIngestSeconds{"tlsprof_collector_ingest_seconds", Type::kHistogram, kNoLabels,
                                                "Submit handling time, including the journal fsync", kCollector};
inline constexpr Metric kCollectorAgents{"tlsprof_collector_agents", Type::kGauge, kNoLabels,
                                         "Agents seen in the last 5 minutes", kCollector};
inline constexpr Metric kCollectorJournalBytes{"tlsprof_collector_journal_bytes", Type::kGauge, kNoLabels,
                                               "Size of the journal after the last snapshot", kCollector};

// --- The agent's health.

inline constexpr Metric kAgentWindows{"tlsprof_agent_windows_total", Type::kCounter, kNoLabels,
                                      "Profile windows the agent closed", kAgent};
inline constexpr Metric kAgentWindowDuration{"tlsprof_agent_window_duration_seconds", Type::kGauge, kNoLabels,
                                             "Length of the last closed window", kAgent};
inline constexpr Metric kAgentCpuSeconds{"tlsprof_agent_cpu_seconds_total", Type::kCounter, kNoLabels,
                                         "CPU-seconds the agent process used while profiling (user + system)", kAgent};
inline constexpr Metric kAgentPhaseCpuSeconds{
    "tlsprof_agent_phase_cpu_seconds_total", Type::kCounter, kAgentPhaseLabel,
    "CPU-seconds of the agent process (user + system) by phase of its window cycle", kAgent};
inline constexpr Metric kAgentBpfSeconds{"tlsprof_agent_bpf_seconds_total", Type::kCounter, kNoLabels,
                                         "Run time of the agent's sampling BPF program, in the kernel", kAgent};
inline constexpr Metric kAgentSamples{"tlsprof_agent_samples_total", Type::kCounter, kNoLabels,
                                      "Samples the agent's sampling BPF program took, idle ones included", kAgent};
inline constexpr Metric kAgentResidentMemory{"tlsprof_agent_resident_memory_bytes", Type::kGauge, kNoLabels,
                                             "Resident memory of the agent process", kAgent};
inline constexpr Metric kAgentDroppedSamples{"tlsprof_agent_dropped_samples_total", Type::kCounter, kNoLabels,
                                             "Samples the kernel maps had no room for", kAgent};
inline constexpr Metric kAgentUnresolvedSamples{"tlsprof_agent_unresolved_samples_total", Type::kCounter, kNoLabels,
                                                "User samples of processes the agent could not snapshot", kAgent};
inline constexpr Metric kAgentTrackedProcesses{"tlsprof_agent_tracked_processes", Type::kGauge, kNoLabels,
                                               "Processes the agent holds a snapshot of", kAgent};
inline constexpr Metric kAgentPendingProcesses{
    "tlsprof_agent_pending_processes", Type::kGauge, kNoLabels,
    "Processes found but not read yet at the window's close (discovery is behind)", kAgent};
inline constexpr Metric kAgentMemoryLimit{"tlsprof_agent_memory_limit_bytes", Type::kGauge, kNoLabels,
                                          "The agent's memory cap (--memory-limit; 0: none)", kAgent};
inline constexpr Metric kAgentMemoryLimited{
    "tlsprof_agent_memory_limited_total", Type::kCounter, kWhatLabel,
    "Loads the memory cap refused: what (symbols, unwind_table) of a file left out", kAgent};
inline constexpr Metric kAgentImagesRefused{
    "tlsprof_agent_images_refused_total", Type::kCounter, kReasonLabel,
    "Files, tables and /proc reads of other processes refused or cut at one of the agent's caps, by reason "
    "(not_regular, replaced, file_size, elf_headers, section_size, symbols, cfi_rows, pclntab_rows, maps, memory, "
    "deadline, short_read)",
    kAgent};
inline constexpr Metric kAgentUnwindUnregistered{
    "tlsprof_agent_unwind_unregistered_processes_total", Type::kCounter, kNoLabels,
    "TLS processes the unwind_procs map had no room for (leaf-only attribution)", kAgent};
inline constexpr Metric kAgentSpoolBatches{"tlsprof_agent_spool_batches", Type::kGauge, kNoLabels,
                                           "Sealed batches waiting in the spool", kAgent};
inline constexpr Metric kAgentSpoolBytes{"tlsprof_agent_spool_bytes", Type::kGauge, kNoLabels,
                                         "Bytes of the batches waiting in the spool", kAgent};
inline constexpr Metric kAgentSpoolPinnedBatches{
    "tlsprof_agent_spool_pinned_batches", Type::kGauge, kNoLabels,
    "Spooled batches waiting for the collector they were sent to (an answer was lost: retried there only)", kAgent};
inline constexpr Metric kAgentCollectorFailovers{
    "tlsprof_agent_collector_failovers_total", Type::kCounter, kNoLabels,
    "Times the collector taking the agent's new batches changed: a failover, or the return to its own", kAgent};
inline constexpr Metric kAgentBatches{
    "tlsprof_agent_batches_total", Type::kCounter, kResultLabel,
    "Batches by outcome: sealed, accepted, duplicate, rejected (INVALID_ARGUMENT), dropped (spool over its bound or "
    "its disk full), unpersisted (could not be written at all: lost)",
    kAgent};
inline constexpr Metric kAgentSendErrors{"tlsprof_agent_send_errors_total", Type::kCounter, kNoLabels,
                                         "Failed attempts to ship a batch (retried)", kAgent};
inline constexpr Metric kAgentLastSuccess{"tlsprof_agent_last_success_timestamp_seconds", Type::kGauge, kNoLabels,
                                          "Unix time of the last batch the collector took (0: none yet)", kAgent};

// --- Usage telemetry (docs/fleet.md, "Usage telemetry metrics"). Counts are
// estimates, scaled for the probes' duty cycle; the histogram is of the
// observed operations.

inline constexpr Metric kHandshakes{"tlsprof_handshakes_total", Type::kCounter, kHandshakeLabels,
                                    "Completed TLS handshakes (estimated for the usage probes' duty cycle)", kBoth};
inline constexpr Metric kCryptoOperations{"tlsprof_crypto_operations_total", Type::kCounter, kOperationLabels,
                                          "Public-key operations: signatures, verifications, key exchanges (estimated)",
                                          kBoth};
inline constexpr Metric kCryptoOperationCpuSeconds{"tlsprof_crypto_operation_cpu_seconds_total", Type::kCounter,
                                                   kOperationLabels,
                                                   "On-CPU seconds of the public-key operations (estimated)", kBoth};
inline constexpr Metric kCryptoOperationLatency{"tlsprof_crypto_operation_latency_seconds", Type::kHistogram,
                                                kOperationLabels,
                                                "On-CPU latency of the observed public-key operations", kBoth};
inline constexpr Metric kTlsConnections{"tlsprof_tls_connections", Type::kGauge, kConnectionLabels,
                                        "Live TLS connections (handshaken, not yet freed) at the last window's end",
                                        kBoth};
inline constexpr Metric kTlsResidentMemory{
    "tlsprof_tls_resident_memory_bytes", Type::kGauge, kConnectionLabels,
    "Resident memory of the processes holding the live TLS connections, at the last window's end (memory per "
    "connection: its sum over tlsprof_tls_connections' sum)",
    kBoth};
inline constexpr Metric kUsageProbeCpuSeconds{"tlsprof_usage_probe_cpu_seconds_total", Type::kCounter, kNoLabels,
                                              "CPU-seconds the agents' usage probes cost (their estimate)", kCollector};
inline constexpr Metric kUsageProbeHits{"tlsprof_usage_probe_hits_total", Type::kCounter, kNoLabels,
                                        "Usage probe and return-probe runs on the agents", kCollector};
inline constexpr Metric kUsageProbeMinDutyCycle{
    "tlsprof_usage_probe_min_duty_cycle", Type::kGauge, kNoLabels,
    "Lowest duty cycle of the usage probes among the agents reporting usage now", kCollector};
inline constexpr Metric kUsageMaxRelativeError{
    "tlsprof_usage_max_relative_error", Type::kGauge, kNoLabels,
    "Largest relative error (95%) of the usage estimates among the agents reporting usage now", kCollector};
inline constexpr Metric kAgentUsageProbeDutyCycle{
    "tlsprof_agent_usage_probe_duty_cycle", Type::kGauge, kNoLabels,
    "Share of the last window the usage probes counted in (their counts are scaled by its inverse; 1 = always)",
    kAgent};
inline constexpr Metric kAgentUsageProbeCpuSeconds{
    "tlsprof_agent_usage_probe_cpu_seconds_total", Type::kCounter, kNoLabels,
    "CPU-seconds the usage probes cost (estimated from their hits)", kAgent};
inline constexpr Metric kAgentUsageProbeHits{"tlsprof_agent_usage_probe_hits_total", Type::kCounter, kNoLabels,
                                             "Usage probe and return-probe runs", kAgent};
inline constexpr Metric kAgentUsageProbeBudgetCpuSeconds{
    "tlsprof_agent_usage_probe_budget_cpu_seconds_total", Type::kCounter, kNoLabels,
    "CPU-seconds the usage probes' budget allowed (--usage-budget; 0 without one)", kAgent};
inline constexpr Metric kAgentUsageProbeBudgetRatio{
    "tlsprof_agent_usage_probe_budget_ratio", Type::kGauge, kNoLabels,
    "The usage probes' budget as a share of the host's CPUs (--usage-budget; 0: none)", kAgent};
inline constexpr Metric kAgentUsageProbeToggles{"tlsprof_agent_usage_probe_toggles_total", Type::kCounter, kNoLabels,
                                                "Attaches and detaches of the usage probes by their duty cycle",
                                                kAgent};
inline constexpr Metric kUsageProbeBudgetCpuSeconds{
    "tlsprof_usage_probe_budget_cpu_seconds_total", Type::kCounter, kNoLabels,
    "CPU-seconds the agents' usage probe budgets allowed (agents without a budget add 0)", kCollector};
inline constexpr Metric kHandshakeCpuSeconds{
    "tlsprof_handshake_cpu_seconds_total", Type::kCounter, kHandshakeCpuLabels,
    "Handshake-phase TLS CPU-seconds (sampled) split over the handshakes they belonged to (estimated)", kBoth};

inline constexpr Metric kCollectorRemoteWriteRequests{
    "tlsprof_collector_remote_write_requests_total", Type::kCounter, kReceiverResultLabels,
    "Remote-write requests by outcome: sent (2xx), rejected (4xx, dropped), dropped (pushed out of the full queue)",
    kCollector};
inline constexpr Metric kCollectorRemoteWriteSamples{"tlsprof_collector_remote_write_samples_total", Type::kCounter,
                                                     kReceiverLabel, "Samples the receiver accepted", kCollector};
inline constexpr Metric kCollectorRemoteWriteRetries{
    "tlsprof_collector_remote_write_retries_total", Type::kCounter, kReceiverLabel,
    "Remote-write attempts that failed and will be retried (network errors, 5xx, 429)", kCollector};
inline constexpr Metric kCollectorRemoteWriteQueue{"tlsprof_collector_remote_write_queue", Type::kGauge, kReceiverLabel,
                                                   "Remote-write requests waiting to be sent", kCollector};
inline constexpr Metric kCollectorRemoteWriteSendSeconds{
    "tlsprof_collector_remote_write_send_seconds_total", Type::kCounter, kReceiverLabel,
    "Seconds spent in remote-write requests, every attempt (samples / these seconds: the throughput)", kCollector};
inline constexpr Metric kCollectorRemoteWriteEncodeSeconds{
    "tlsprof_collector_remote_write_encode_seconds_total", Type::kCounter, kNoLabels,
    "Seconds spent collecting, encoding and compressing the series of each push", kCollector};

// Every metric, in the order docs/fleet.md lists them.
inline constexpr std::array kAll = {
    &kCpuSeconds,
    &kBusyCpuSeconds,
    &kReports,
    &kHostCpuSeconds,
    &kHostBusyCpuSeconds,
    &kCollectorReports,
    &kCollectorDroppedSeries,
    &kCollectorClockSkew,
    &kCollectorSkewedReports,
    &kCollectorAgentKeys,
    &kCollectorAgentLimit,
    &kCollectorSeries,
    &kCollectorSeriesLimitDropped,
    &kCollectorIngestSeconds,
    &kCollectorAgents,
    &kCollectorJournalBytes,
    &kCollectorRemoteWriteRequests,
    &kCollectorRemoteWriteSamples,
    &kCollectorRemoteWriteRetries,
    &kCollectorRemoteWriteQueue,
    &kCollectorRemoteWriteSendSeconds,
    &kCollectorRemoteWriteEncodeSeconds,
    &kAgentWindows,
    &kAgentWindowDuration,
    &kAgentCpuSeconds,
    &kAgentPhaseCpuSeconds,
    &kAgentBpfSeconds,
    &kAgentSamples,
    &kAgentResidentMemory,
    &kAgentDroppedSamples,
    &kAgentUnresolvedSamples,
    &kAgentTrackedProcesses,
    &kAgentPendingProcesses,
    &kAgentMemoryLimit,
    &kAgentMemoryLimited,
    &kAgentImagesRefused,
    &kAgentUnwindUnregistered,
    &kAgentSpoolBatches,
    &kAgentSpoolBytes,
    &kAgentSpoolPinnedBatches,
    &kAgentCollectorFailovers,
    &kAgentBatches,
    &kAgentSendErrors,
    &kAgentLastSuccess,
    &kHandshakes,
    &kCryptoOperations,
    &kCryptoOperationCpuSeconds,
    &kCryptoOperationLatency,
    &kTlsConnections,
    &kTlsResidentMemory,
    &kUsageProbeCpuSeconds,
    &kUsageProbeHits,
    &kUsageProbeMinDutyCycle,
    &kUsageMaxRelativeError,
    &kAgentUsageProbeDutyCycle,
    &kAgentUsageProbeCpuSeconds,
    &kAgentUsageProbeHits,
    &kAgentUsageProbeBudgetCpuSeconds,
    &kAgentUsageProbeBudgetRatio,
    &kAgentUsageProbeToggles,
    &kUsageProbeBudgetCpuSeconds,
    &kHandshakeCpuSeconds,
};

constexpr std::string_view TypeName(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// A label of one series: (name, value), both views into the caller's data
// and the table.
using LabelView = std::pair<std::string_view, std::string_view>;

// The labels of one series of `metric`, sorted by name, without the
// container labels whose value is empty. `values` holds one value per
// metric.labels, in that order (a container whose elements convert to
// string_view); another count is a bug in the caller (std::logic_error).
template <class Values>
std::vector<LabelView> SeriesLabels(const Metric& metric, const Values& values) {
  if (std::size(values) != metric.labels.size()) {
    throw std::logic_error(std::string(metric.name) + ": " + std::to_string(std::size(values)) + " label values for " +
                           std::to_string(metric.labels.size()) + " labels");
  }
  std::vector<LabelView> out;
  out.reserve(metric.labels.size());
  for (size_t i = 0; i < metric.labels.size(); ++i) {
    const std::string_view value = values[i];
    if (value.empty() && OnlyWhenSet(metric.labels[i])) continue;
    out.emplace_back(metric.labels[i], value);
  }
  std::sort(out.begin(), out.end(), [](const LabelView& a, const LabelView& b) { return a.first < b.first; });
  return out;
}

inline std::vector<LabelView> SeriesLabels(const Metric& metric, std::initializer_list<std::string_view> values) {
  return SeriesLabels(metric, std::span<const std::string_view>(values.begin(), values.size()));
}

}  // namespace tlsprof::metrics
