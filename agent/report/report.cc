#include "agent/report/report.h"

#include <fmt/format.h>

#include <algorithm>

#include "agent/report/usage_report.h"

namespace tlsprof::report {
namespace {

using classify::Bucket;
using nlohmann::json;

constexpr size_t kTopSymbols = 20;

double Share(uint64_t part, uint64_t whole) { return whole == 0 ? 0.0 : static_cast<double>(part) / whole; }

json BucketsJson(const aggregate::CryptoTime& crypto, double sec_per_sample) {
  json out = json::array();
  for (int i = 0; i < classify::kBucketCount; ++i) {
    uint64_t n = crypto.buckets[i];
    out.push_back({{"bucket", classify::BucketName(static_cast<Bucket>(i))},
                   {"cpu_seconds", n * sec_per_sample},
                   {"samples", n},
                   {"share_of_tls", Share(n, crypto.tls)}});
  }
  return out;
}

json PhasesJson(const aggregate::CryptoTime& crypto, double sec_per_sample) {
  json out = json::array();
  for (size_t i = 0; i < aggregate::kPhaseCount; ++i) {
    uint64_t n = crypto.phases[i];
    out.push_back({{"phase", classify::PhaseName(static_cast<classify::Phase>(i))},
                   {"cpu_seconds", n * sec_per_sample},
                   {"samples", n},
                   {"share_of_tls", Share(n, crypto.tls)}});
  }
  return out;
}

json AlgorithmsJson(const aggregate::CryptoTime& crypto, double sec_per_sample) {
  std::vector<std::pair<aggregate::AlgorithmKey, uint64_t>> rows(crypto.algorithms.begin(), crypto.algorithms.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  json out = json::array();
  for (const auto& [key, n] : rows) {
    out.push_back({{"bucket", classify::BucketName(key.bucket)},
                   {"algorithm", key.algorithm},
                   {"phase", classify::PhaseName(key.phase)},
                   {"cpu_seconds", n * sec_per_sample},
                   {"samples", n},
                   {"share_of_tls", Share(n, crypto.tls)}});
  }
  return out;
}

json LibrariesJson(const aggregate::ProcessAttribution& p) {
  json out = json::array();
  for (const auto& use : p.libraries) {
    const aggregate::LibraryFile& file = use.file;
    out.push_back({{"path", file.path},
                   {"kind", classify::LibraryKindName(file.kind)},
                   {"linkage", file.shared ? "shared" : "static"},
                   {"build_id", file.build_id},
                   {"symbols", file.symbol_source},
                   {"symbol_count", file.symbol_count},
                   {"tls_samples", use.tls_samples},
                   {"named_share", Share(use.named_samples, use.tls_samples)},
                   {"bucket_share", Share(use.bucket_samples, use.tls_samples)},
                   {"algorithm_share", Share(use.algorithm_samples, use.tls_samples)},
                   {"stack_share", Share(use.stack_samples, use.tls_samples)}});
  }
  return out;
}

// The TLS symbols with the most samples: what to look at first, and how a
// reader checks the rules table against a real profile.
json TopSymbolsJson(const aggregate::ProcessAttribution& p, double sec_per_sample, size_t limit) {
  std::vector<aggregate::SymbolRow> rows = p.symbols;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.samples > b.samples; });
  if (rows.size() > limit) rows.resize(limit);
  json out = json::array();
  for (const aggregate::SymbolRow& count : rows) {
    out.push_back({{"symbol", count.symbol},
                   {"library", count.library},
                   {"bucket", classify::BucketName(count.classification.bucket)},
                   {"algorithm", count.classification.algorithm},
                   {"cpu_seconds", count.samples * sec_per_sample},
                   {"samples", count.samples},
                   {"share_of_tls", Share(count.samples, p.crypto.tls)}});
  }
  return out;
}

// The agent's own cost and, with stacks, the unwinder's work.
json AgentJson(const profiler::Window& w) {
  const profiler::AgentCost& cost = w.cost;
  const double duration = w.duration_seconds();
  json agent = {{"cpu_seconds", cost.cpu_seconds},
                {"window_cpu_seconds", cost.window_cpu_seconds},
                {"bpf_seconds", cost.bpf_seconds},
                {"bpf_runs", cost.bpf_runs},
                {"bpf_stats_enabled", cost.bpf_stats_enabled},
                {"cpu_share_of_core", duration > 0 ? (cost.window_cpu_seconds + cost.bpf_seconds) / duration : 0.0},
                {"max_rss_bytes", cost.max_rss_bytes},
                {"report_latency_seconds", cost.report_latency_seconds}};
  // Where the agent's CPU went over the window's cycle, and per sample taken.
  json phases = json::object();
  double cycle = 0;
  for (size_t i = 0; i < cost.phases.size(); ++i) {
    phases[std::string(profiler::AgentPhaseName(static_cast<profiler::AgentPhase>(i)))] = cost.phases[i];
    cycle += cost.phases[i];
  }
  agent["phase_cpu_seconds"] = std::move(phases);
  agent["cycle_cpu_seconds"] = cycle;
  const double samples = static_cast<double>(w.totals.samples);
  agent["user_us_per_sample"] = samples > 0 ? cycle / samples * 1e6 : 0.0;
  agent["bpf_us_per_sample"] = cost.bpf_runs > 0 ? cost.bpf_seconds / static_cast<double>(cost.bpf_runs) * 1e6 : 0.0;
  agent["stack_cache"] = {
      {"hits", cost.stack_cache_hits}, {"misses", cost.stack_cache_misses}, {"entries", cost.stack_cache_entries}};
  if (!w.health.unwind) return agent;
  const stacks::RegistrarStats& st = *w.health.unwind;
  const sample::Totals& totals = w.totals;
  agent["unwind"] = {{"processes", st.processes},
                     {"tables", st.tables},
                     {"rows", st.rows},
                     {"table_failures", st.table_failures},
                     {"mappings_left_out", st.mappings_left_out},
                     {"process_failures", st.process_failures},
                     // The in-kernel walks and their cost (bench/unwind_cost.py).
                     {"walks", totals.unwind_walks},
                     {"frames", totals.unwind_frames},
                     {"walk_seconds", static_cast<double>(totals.unwind_ns) / 1e9},
                     {"row_searches", totals.unwind_row_searches},
                     {"stacks", totals.unwound},
                     {"not_tls", totals.unwind_not_tls},
                     {"dropped_stacks", totals.dropped_stack}};
  // Why each counted stack ended: complete ones at a zero return address or
  // an end row; the rest say where unwinding broke (a library whose CFI the
  // tables miss shows as no_row/unreadable).
  const auto& stop = totals.unwind_stop;
  agent["unwind"]["stops"] = {{"zero_ip", stop.zero_ip},         {"end", stop.end},
                              {"max_frames", stop.max_frames},   {"no_mapping", stop.no_mapping},
                              {"no_row", stop.no_row},           {"cfa_none", stop.cfa_none},
                              {"bp_unknown", stop.bp_unknown},   {"unreadable", stop.unreadable},
                              {"not_growing", stop.not_growing}, {"reg_unknown", stop.reg_unknown}};
  return agent;
}

json ProcessesJson(const aggregate::Attribution& profile, double sec_per_sample) {
  std::vector<const aggregate::ProcessAttribution*> procs;
  for (const auto& [pid, p] : profile.processes) {
    if (p.crypto.tls > 0 || !p.libraries.empty()) procs.push_back(&p);
  }
  std::stable_sort(procs.begin(), procs.end(), [](const auto* a, const auto* b) {
    return a->crypto.tls != b->crypto.tls ? a->crypto.tls > b->crypto.tls : a->samples > b->samples;
  });
  json processes = json::array();
  for (const auto* p : procs) {
    processes.push_back({{"pid", p->pid},
                         {"comm", p->comm},
                         {"container_id", p->container.ShortId()},
                         {"pod_uid", p->container.pod_uid},
                         {"container_runtime", p->container.runtime},
                         {"cpu_seconds", p->samples * sec_per_sample},
                         {"tls_cpu_seconds", p->crypto.tls * sec_per_sample},
                         {"tls_share", Share(p->crypto.tls, p->samples)},
                         {"buckets", BucketsJson(p->crypto, sec_per_sample)},
                         {"phases", PhasesJson(p->crypto, sec_per_sample)},
                         {"algorithms", AlgorithmsJson(p->crypto, sec_per_sample)},
                         // How much of its algorithm time no frame named (docs/attribution.md, "Algorithm").
                         {"algorithm_inferred",
                          {{"from_operation_share", Share(p->inferred_from_operation, p->crypto.tls)},
                           {"from_process_share", Share(p->inferred_from_process, p->crypto.tls)}}},
                         {"libraries", LibrariesJson(*p)},
                         {"top_symbols", TopSymbolsJson(*p, sec_per_sample, kTopSymbols)}});
  }
  return processes;
}

}  // namespace

json BuildReport(const profiler::Window& w) {
  const aggregate::Attribution& profile = w.attribution;
  const double sec_per_sample = w.seconds_per_sample();
  json doc;
  doc["schema"] = kSchema;
  doc["host"] = w.host.hostname;
  doc["cpus"] = w.host.cpus;
  doc["duration_seconds"] = w.duration_seconds();
  doc["window"] = {{"start_monotonic_ns", w.start_monotonic_ns}, {"end_monotonic_ns", w.end_monotonic_ns}};
  doc["frequency_hz"] = w.host.frequency_hz;
  doc["scope"] = {{"kind", w.host.scope_pids.empty() ? "host" : "pids"}, {"pids", w.host.scope_pids}};
  doc["cpu_seconds"] = profile.scope_samples * sec_per_sample;
  doc["tls_cpu_seconds"] = profile.crypto.tls * sec_per_sample;
  doc["tls_share"] = Share(profile.crypto.tls, profile.scope_samples);
  doc["buckets"] = BucketsJson(profile.crypto, sec_per_sample);
  doc["phases"] = PhasesJson(profile.crypto, sec_per_sample);
  doc["algorithms"] = AlgorithmsJson(profile.crypto, sec_per_sample);

  doc["processes"] = ProcessesJson(profile, sec_per_sample);
  doc["samples"] = {{"total", w.totals.samples},
                    {"busy", profile.scope_samples},
                    {"tls", profile.crypto.tls},
                    {"tls_with_stack", profile.stack_samples},
                    {"idle", w.totals.idle},
                    {"kernel", w.totals.kernel},
                    {"user", w.totals.user},
                    {"dropped", w.totals.dropped_ip + w.totals.dropped_pid},
                    {"unresolved", profile.unresolved_samples},
                    {"syscall_return", profile.syscall_return_samples}};
  doc["agent"] = AgentJson(w);
  if (w.usage) AddUsage(doc, w);
  return doc;
}

}  // namespace tlsprof::report
