#include "agent/profiler/window_record.h"

#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

// An optional is null or its value.
NLOHMANN_JSON_NAMESPACE_BEGIN
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& value) {
    if (value) {
      j = *value;
    } else {
      j = nullptr;
    }
  }
  static void from_json(const json& j, std::optional<T>& value) {
    if (j.is_null()) {
      value.reset();
    } else {
      value = j.get<T>();
    }
  }
};
NLOHMANN_JSON_NAMESPACE_END

// BPF's plain structs (bpf/usage.h) live in the global namespace, and so
// must their conversions, for argument-dependent lookup to find them.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(handshake_key, tgid, lib, version, cipher, is_server, resumed, kx_type, kx_len,
                                   cert_type, sig_len)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(op_key, tgid, lib, op, in_handshake, key_type, len)

namespace tlsprof {
namespace classify {

// Algorithm names are static strings in the agent; a replayed one is kept
// in a set that lives as long as the process.
static std::string_view Intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> names;
  std::lock_guard lock(mu);
  return *names.insert(name).first;
}

static void to_json(nlohmann::json& j, const Classification& c) {
  j = {{"bucket", c.bucket}, {"algorithm", c.algorithm}};
}
static void from_json(const nlohmann::json& j, Classification& c) {
  j.at("bucket").get_to(c.bucket);
  c.algorithm = Intern(j.at("algorithm").get<std::string>());
}

}  // namespace classify

namespace discovery {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ContainerIdentity, container_id, pod_uid, runtime)
}  // namespace discovery

namespace stacks {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RegistrarStats, processes, tables, rows, table_failures, mappings_left_out,
                                   process_failures, tables_over_budget)
}  // namespace stacks

namespace aggregate {

static void to_json(nlohmann::json& j, const AlgorithmKey& k) {
  j = {{"bucket", k.bucket}, {"algorithm", k.algorithm}, {"phase", k.phase}};
}
static void from_json(const nlohmann::json& j, AlgorithmKey& k) {
  classify::Classification c;
  from_json(j, c);
  k.bucket = c.bucket;
  k.algorithm = c.algorithm;
  j.at("phase").get_to(k.phase);
}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LibraryAlgorithmKey, algorithm, library)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CryptoTime, tls, buckets, phases, algorithms, library_algorithms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LibraryFile, path, kind, shared, build_id, symbol_source, symbol_count)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LibraryUse, file, tls_samples, named_samples, bucket_samples, algorithm_samples,
                                   stack_samples)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SymbolRow, symbol, library, classification, samples)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ProcessAttribution, pid, comm, container, samples, kernel_samples, crypto, libraries,
                                   symbols, inferred_from_operation, inferred_from_process)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StackSample, pid, frames, classification, phase, samples)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Attribution, scope_samples, crypto, processes, unresolved_samples, stack_samples,
                                   syscall_return_samples, stacks)

}  // namespace aggregate

namespace sample {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Totals::UnwindStops, zero_ip, end, max_frames, no_mapping, no_row, cfa_none,
                                   bp_unknown, unreadable, not_growing, reg_unknown)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Totals, samples, idle, kernel, user, dropped_ip, dropped_pid, unwound, dropped_stack,
                                   unwind_not_tls, unwind_stop, unwind_walks, unwind_frames, unwind_ns,
                                   unwind_row_searches)
}  // namespace sample

namespace usage {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(AttachedFile, path, dev, inode, lib, library, functions, fields)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HandshakeCount, key, count, estimated)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OperationStats, key, count, cpu_ns, wall_ns, slots, estimated)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ConnectionCount, tgid, lib, estimated)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(UsageBudget, duty_cycle, attached, relative_error, probe_cpu_seconds,
                                   budget_cpu_seconds, toggles)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(UsageClock, at, on, counted, variance, pending_variance, cost, allowed, toggles,
                                   connections_since)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(UsageTotals, hits, handshake_calls, handshakes, ops, nested, dropped_keys,
                                   read_errors, go_unmatched, go_migrated, closes, live_full)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(UsageSnapshot, handshakes, operations, totals, connections, budget, clock,
                                   connections_known)
}  // namespace usage

namespace profiler {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HostInfo, hostname, machine_id, cpus, frequency_hz, period_ns, scope_pids, agent_pid)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ProcessInfo, comm, cgroup, container, resident_bytes, snapshotted)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(UsageInfo, counts, files, probe_overhead_ns, call_cost_ns, budget_cpu_per_second,
                                   budget_share)
// With defaults: recordings made before `phases` existed replay with zeros.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentCost, window_cpu_seconds, cpu_seconds, bpf_seconds, bpf_runs,
                                                bpf_stats_enabled, max_rss_bytes, resident_bytes,
                                                report_latency_seconds, phases, stack_cache_hits, stack_cache_misses,
                                                stack_cache_entries)
// With defaults: recordings made before `refused` existed replay with zeros.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AgentHealth, tracked_processes, pending_processes, forgotten_processes,
                                                images, cached_images, images_changed, processes_replaced,
                                                memory_limit_bytes, images_skipped, tables_skipped, refused, unwind)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Window, attribution, totals, start_monotonic_ns, end_monotonic_ns, start_unix_ns,
                                   end_unix_ns, host, processes, usage, cost, health)

nlohmann::json RecordWindow(const Window& window) {
  nlohmann::json j = window;
  j["schema"] = kWindowRecordSchema;
  return j;
}

Result<Window> ReplayWindow(const nlohmann::json& record) {
  if (!record.is_object() || record.value("schema", "") != kWindowRecordSchema) {
    return MakeError("not a window recording: expected an object with \"schema\": \"{}\"", kWindowRecordSchema);
  }
  try {
    return record.get<Window>();
  } catch (const nlohmann::json::exception& e) {
    return MakeError("window recording: {}", e.what());
  }
}

Status WriteWindowRecord(const std::string& path, const Window& window) {
  std::ofstream out(path);
  if (!out || !(out << RecordWindow(window).dump(1) << '\n') || !out.flush()) {
    return MakeError("cannot write the window recording to {}", path);
  }
  return OkStatus();
}

Result<Window> ReadWindowRecord(const std::string& path) {
  std::ifstream in(path);  // guarded-io: a recording the operator names
  if (!in) return MakeError("cannot open the window recording {}", path);
  nlohmann::json record = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return MakeError("{}: not JSON", path);
  auto window = ReplayWindow(record);
  if (!window.ok()) return MakeError("{}: {}", path, window.error().message);
  return window;
}

}  // namespace profiler
}  // namespace tlsprof
