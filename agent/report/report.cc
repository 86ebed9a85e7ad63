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

json LibrariesJson(const aggregate::ProcessProfile& p) {
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
json TopSymbolsJson(const aggregate::ProcessProfile& p, double sec_per_sample, size_t limit) {
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

std::string Percent(double share) { return fmt::format("{:.1f}%", share * 100.0); }

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

json ProcessesJson(const aggregate::Profile& profile, double sec_per_sample) {
  std::vector<const aggregate::ProcessProfile*> procs;
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
  const aggregate::Profile& profile = w.profile;
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

std::string RenderTable(const json& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  std::string scope = r["scope"]["kind"] == "host"
                          ? fmt::format("host {} ({} CPUs)", r["host"].get<std::string>(), r["cpus"].get<int>())
                          : fmt::format("pids {}", r["scope"]["pids"].dump());
  line(fmt::format("tlsprof: {:.1f} s at {} Hz, {}", r["duration_seconds"].get<double>(),
                   r["frequency_hz"].get<uint32_t>(), scope));
  line("");
  line(fmt::format("TLS = {} of CPU   ({:.3f} of {:.3f} busy CPU-seconds)", Percent(r["tls_share"].get<double>()),
                   r["tls_cpu_seconds"].get<double>(), r["cpu_seconds"].get<double>()));
  line("");
  line(fmt::format("{:<14} {:>10} {:>13}", "bucket", "cpu_s", "share_of_tls"));
  for (const auto& b : r["buckets"]) {
    line(fmt::format("{:<14} {:>10.3f} {:>13}", b["bucket"].get<std::string>(), b["cpu_seconds"].get<double>(),
                     Percent(b["share_of_tls"].get<double>())));
  }
  line("");
  line(fmt::format("{:<11} {:>10} {:>13}", "phase", "cpu_s", "share_of_tls"));
  for (const auto& ph : r["phases"]) {
    line(fmt::format("{:<11} {:>10.3f} {:>13}", ph["phase"].get<std::string>(), ph["cpu_seconds"].get<double>(),
                     Percent(ph["share_of_tls"].get<double>())));
  }
  line("");
  line(fmt::format("{:<24} {:<14} {:<11} {:>10} {:>13}", "algorithm", "bucket", "phase", "cpu_s", "share_of_tls"));
  for (const auto& a : r["algorithms"]) {
    line(fmt::format("{:<24} {:<14} {:<11} {:>10.3f} {:>13}", a["algorithm"].get<std::string>(),
                     a["bucket"].get<std::string>(), a["phase"].get<std::string>(), a["cpu_seconds"].get<double>(),
                     Percent(a["share_of_tls"].get<double>())));
  }
  line("");
  line(fmt::format("{:>8} {:<16} {:>8} {:>8} {:>7}  {}", "pid", "comm", "cpu_s", "tls_s", "tls%", "tls libraries"));
  for (const auto& p : r["processes"]) {
    std::string libs;
    for (const auto& l : p["libraries"]) {
      if (!libs.empty()) libs += ", ";
      libs += fmt::format("{} {} ({}, {})", l["kind"].get<std::string>(), l["linkage"].get<std::string>(),
                          l["path"].get<std::string>(), l["symbols"].get<std::string>());
    }
    line(fmt::format("{:>8} {:<16} {:>8.3f} {:>8.3f} {:>7}  {}", p["pid"].get<int>(), p["comm"].get<std::string>(),
                     p["cpu_seconds"].get<double>(), p["tls_cpu_seconds"].get<double>(),
                     Percent(p["tls_share"].get<double>()), libs));
  }
  const auto& a = r["agent"];
  line("");
  line(
      fmt::format("agent: {:.3f} CPU-s in window + {:.3f} s BPF = {} of one core; {:.3f} CPU-s in all; "
                  "max RSS {:.1f} MB; report ready {:.0f} ms after the window",
                  a["window_cpu_seconds"].get<double>(), a["bpf_seconds"].get<double>(),
                  Percent(a["cpu_share_of_core"].get<double>()), a["cpu_seconds"].get<double>(),
                  a["max_rss_bytes"].get<double>() / 1e6, a["report_latency_seconds"].get<double>() * 1000));
  const auto& s = r["samples"];
  line(fmt::format("samples: {} total, {} busy, {} TLS, {} idle, {} dropped, {} unresolved", s["total"].get<uint64_t>(),
                   s["busy"].get<uint64_t>(), s["tls"].get<uint64_t>(), s["idle"].get<uint64_t>(),
                   s["dropped"].get<uint64_t>(), s["unresolved"].get<uint64_t>()));
  // Usage telemetry (tlsprof-agent profile --usage).
  if (r.contains("handshakes")) {
    line("");
    line(fmt::format("{:<7} {:<16} {:<7} {:<8} {:<8} {:<44} {:<8} {:<8} {:>8}", "pid", "comm", "side", "kind",
                     "version", "cipher_suite", "group", "cert", "count"));
    for (const auto& h : r["handshakes"]) {
      line(fmt::format("{:<7} {:<16} {:<7} {:<8} {:<8} {:<44} {:<8} {:<8} {:>8}", h["pid"].get<uint32_t>(),
                       h["comm"].get<std::string>(), h["side"].get<std::string>(), h["kind"].get<std::string>(),
                       h["version"].get<std::string>(), h["cipher_suite"].get<std::string>(),
                       h["group"].get<std::string>(), h["cert_key_type"].get<std::string>(),
                       h["count"].get<uint64_t>()));
    }
    line("");
    line(fmt::format("{:<7} {:<16} {:<13} {:<12} {:>8} {:>10} {:>10}", "pid", "comm", "operation", "algorithm", "count",
                     "p50_us", "p99_us"));
    for (const auto& o : r["operations"]) {
      line(fmt::format("{:<7} {:<16} {:<13} {:<12} {:>8} {:>10.1f} {:>10.1f}", o["pid"].get<uint32_t>(),
                       o["comm"].get<std::string>(), o["operation"].get<std::string>(),
                       o["algorithm"].get<std::string>(), o["count"].get<uint64_t>(), o["latency_p50_us"].get<double>(),
                       o["latency_p99_us"].get<double>()));
    }
    line("");
    line(fmt::format("{:<7} {:<16} {:>10} {:>10} {:>14}", "pid", "comm", "handshakes", "hs_cpu_s", "us_per_hs"));
    for (const auto& c : r["handshake_cpu"]) {
      line(fmt::format("{:<7} {:<16} {:>10} {:>10.3f} {:>14.1f}", c["pid"].get<uint32_t>(),
                       c["comm"].get<std::string>(), c["handshakes"].get<uint64_t>(),
                       c["handshake_tls_cpu_seconds"].get<double>(),
                       c["cpu_seconds_per_handshake"].get<double>() * 1e6));
    }
  }
  return out;
}

}  // namespace tlsprof::report
