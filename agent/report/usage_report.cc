#include "agent/report/usage_report.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "agent/usage/handshake_cost.h"
#include "agent/usage/names.h"

namespace tlsprof::report {
namespace {

using nlohmann::json;

// The report names a process by its snapshot's comm only ("" otherwise).
std::string Comm(const profiler::Window& w, uint32_t tgid) {
  const profiler::ProcessInfo& info = w.process(tgid);
  return info.snapshotted ? info.comm : "";
}

std::string OpName(uint8_t op) {
  switch (op) {
    case USAGE_OP_SIGN:
      return "sign";
    case USAGE_OP_VERIFY:
      return "verify";
    case USAGE_OP_DERIVE:
      return "key_exchange";
  }
  return "unknown";
}

// What the window's sections share: the window, its usage, and per-process
// sampled CPU.
struct Context {
  const profiler::Window& w;
  const profiler::UsageInfo& usage;
  std::map<uint16_t, std::string> library;  // probe cookie → file path

  std::string LibPath(uint16_t lib) const {
    auto it = library.find(lib);
    return it == library.end() ? std::string("unknown") : it->second;
  }
  const aggregate::ProcessAttribution* Process(uint32_t tgid) const {
    auto it = w.attribution.processes.find(static_cast<pid_t>(tgid));
    return it == w.attribution.processes.end() ? nullptr : &it->second;
  }
  // TLS CPU of the handshake phase (sampled) of a process.
  double HandshakeTlsCpu(uint32_t tgid) const {
    const auto* p = Process(tgid);
    if (p == nullptr) return 0.0;
    return static_cast<double>(p->crypto.phases[static_cast<size_t>(classify::Phase::kHandshake)]) *
           w.seconds_per_sample();
  }
  // The handshake phase's TLS CPU in one algorithm (sampled): ML-KEM's is the
  // post-quantum share of a handshake (docs/usage.md).
  double HandshakeAlgorithmCpu(uint32_t tgid, std::string_view algorithm) const {
    const auto* p = Process(tgid);
    if (p == nullptr) return 0.0;
    uint64_t samples = 0;
    for (const auto& [key, n] : p->crypto.algorithms) {
      if (key.phase == classify::Phase::kHandshake && key.algorithm == algorithm) samples += n;
    }
    return static_cast<double>(samples) * w.seconds_per_sample();
  }
  double ProcessCpu(uint32_t tgid) const {
    const auto* p = Process(tgid);
    return p == nullptr ? 0.0 : static_cast<double>(p->samples) * w.seconds_per_sample();
  }
};

struct PerProcess {
  uint64_t handshakes = 0, full = 0, resumed = 0;
  double estimated = 0;
};

// Handshakes, merged over the raw key's fields that are not labels; fills
// each process's handshake counts for HandshakeCpuJson.
json HandshakesJson(const Context& cx, std::map<uint32_t, PerProcess>& per_process) {
  const usage::UsageSnapshot& window = cx.usage.counts;
  const std::vector<usage::HandshakeCost> costs =
      usage::SplitHandshakeCpu(window, [&cx](uint32_t tgid) { return cx.HandshakeTlsCpu(tgid); });
  using HandshakeLabels =
      std::tuple<uint32_t, std::string, std::string, std::string, std::string, std::string, std::string, std::string>;
  struct Merged {
    uint64_t count = 0;
    double estimated = 0;  // scaled for the duty cycle
    double cpu = 0;        // the modelled TLS CPU of these handshakes
  };
  std::map<HandshakeLabels, Merged> handshakes;
  for (size_t i = 0; i < window.handshakes.size(); ++i) {
    const usage::HandshakeCount& h = window.handshakes[i];
    if (!cx.w.in_scope(h.key.tgid)) continue;
    const std::string side = h.key.is_server == 1 ? "server" : h.key.is_server == 0 ? "client" : "unknown";
    const std::string kind = h.key.resumed == 1 ? "resumed" : h.key.resumed == 0 ? "full" : "unknown";
    Merged& m = handshakes[{h.key.tgid, cx.LibPath(h.key.lib), side, kind, usage::VersionName(h.key.version),
                            usage::CipherSuiteName(h.key.cipher), usage::GroupName(h.key.kx_type, h.key.kx_len),
                            usage::CertKeyTypeName(h.key.cert_type)}];
    m.count += h.count;
    m.estimated += h.estimated;
    m.cpu += costs[i].cpu_seconds;
    PerProcess& p = per_process[h.key.tgid];
    p.handshakes += h.count;
    p.estimated += h.estimated;
    (h.key.resumed == 1 ? p.resumed : p.full) += h.count;
  }
  json rows = json::array();
  for (const auto& [labels, m] : handshakes) {
    const auto& [tgid, lib, side, kind, version, suite, group, cert] = labels;
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(cx.w, tgid)},
                    {"library", lib},
                    {"side", side},
                    {"kind", kind},
                    {"version", version},
                    {"cipher_suite", suite},
                    {"group", group},
                    {"cert_key_type", cert},
                    {"count", m.count},
                    {"estimated_count", m.estimated},
                    {"cpu_seconds_per_handshake", m.estimated > 0 ? m.cpu / m.estimated : 0.0}});
  }
  return rows;
}

// Operations, merged over their raw key the same way; histograms add up.
json OperationsJson(const Context& cx) {
  using OpLabels = std::tuple<uint32_t, std::string, std::string, std::string, bool>;
  std::map<OpLabels, usage::OperationStats> ops;
  for (const usage::OperationStats& op : cx.usage.counts.operations) {
    if (!cx.w.in_scope(op.key.tgid) || op.key.op == USAGE_OP_CALIBRATE) continue;
    const std::string algorithm = op.key.op == USAGE_OP_DERIVE
                                      ? usage::KeyExchangeAlgorithm(op.key.key_type, op.key.len)
                                      : usage::SignatureAlgorithm(op.key.key_type, op.key.len);
    auto [it, fresh] = ops.try_emplace(
        {op.key.tgid, cx.LibPath(op.key.lib), OpName(op.key.op), algorithm, op.key.in_handshake != 0}, op);
    if (fresh) continue;
    it->second.count += op.count;
    it->second.estimated += op.estimated;
    it->second.cpu_ns += op.cpu_ns;
    it->second.wall_ns += op.wall_ns;
    for (size_t i = 0; i < it->second.slots.size() && i < op.slots.size(); ++i) it->second.slots[i] += op.slots[i];
  }
  json rows = json::array();
  for (const auto& [labels, op] : ops) {
    const auto& [tgid, lib, name, algorithm, in_handshake] = labels;
    // The probes' own time (calibrated at start) is already taken off, in BPF.
    auto net_us = [](double ns) { return ns / 1e3; };
    const double count = static_cast<double>(op.count);
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(cx.w, tgid)},
                    {"library", lib},
                    {"operation", name},
                    {"algorithm", algorithm},
                    {"in_handshake", in_handshake},
                    {"count", op.count},
                    {"estimated_count", op.estimated},
                    {"cpu_seconds", static_cast<double>(op.cpu_ns) / 1e9},
                    {"latency_mean_us", net_us(static_cast<double>(op.cpu_ns) / count)},
                    {"latency_p50_us", net_us(usage::HistogramQuantile(op.slots, 0.50))},
                    {"latency_p99_us", net_us(usage::HistogramQuantile(op.slots, 0.99))}});
  }
  return rows;
}

// What HandshakeCpuJson adds up over the processes, for the observer's bias.
struct HandshakeTotals {
  double handshaking_cpu = 0, seen = 0, estimated = 0;
};

// TLS CPU in the handshake phase (sampled) over the handshakes completed
// (probed), per process: docs/usage.md, "Cost per handshake". The process's
// whole CPU per handshake too: for a server that mostly handshakes, what the
// Go study measured (kernel time included).
json HandshakeCpuJson(const Context& cx, const std::map<uint32_t, PerProcess>& per_process, HandshakeTotals& totals) {
  json rows = json::array();
  for (const auto& [tgid, p] : per_process) {
    const double cpu = cx.HandshakeTlsCpu(tgid), all = cx.ProcessCpu(tgid);
    const double ml_kem = cx.HandshakeAlgorithmCpu(tgid, "ML-KEM");
    const double n = p.estimated;
    totals.handshaking_cpu += all;
    totals.seen += static_cast<double>(p.handshakes);
    totals.estimated += n;
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(cx.w, tgid)},
                    {"handshakes", p.handshakes},
                    {"estimated_handshakes", p.estimated},
                    {"full", p.full},
                    {"resumed", p.resumed},
                    {"handshake_tls_cpu_seconds", cpu},
                    {"cpu_seconds_per_handshake", n ? cpu / n : 0.0},
                    {"ml_kem_cpu_seconds", ml_kem},
                    {"ml_kem_share", cpu > 0 ? ml_kem / cpu : 0.0},
                    {"process_cpu_seconds", all},
                    {"process_cpu_seconds_per_handshake", n ? all / n : 0.0}});
  }
  return rows;
}

// Live TLS connections beside the process's resident memory: an SRE reads
// off memory per connection (docs/usage.md, "Live connections"). Null when
// the probes paused in the window: connections that began or ended
// meanwhile were not seen.
json ConnectionsJson(const Context& cx) {
  if (!cx.usage.counts.connections_known) return nullptr;
  json rows = json::array();
  for (const usage::ConnectionCount& c : cx.usage.counts.connections) {
    if (!cx.w.in_scope(c.tgid)) continue;
    const uint64_t rss = cx.w.process(c.tgid).resident_bytes;
    rows.push_back({{"pid", c.tgid},
                    {"comm", Comm(cx.w, c.tgid)},
                    {"library", cx.LibPath(c.lib)},
                    {"live_connections", c.estimated},
                    {"rss_bytes", rss},
                    {"rss_bytes_per_connection", c.estimated >= 1 ? static_cast<double>(rss) / c.estimated : 0.0}});
  }
  return rows;
}

json PerInstruction(const std::array<double, INSN_NR>& ns) {
  return {{"push", ns[INSN_EMULATED_PUSH] / 1e3},
          {"endbr64", ns[INSN_ENDBR64] / 1e3},
          {"single_stepped", ns[INSN_SINGLE_STEPPED] / 1e3},
          {"go", ns[INSN_GO] / 1e3}};
}

// The probes' files, cost, budget and totals (agent.usage).
json AgentUsageJson(const Context& cx, const HandshakeTotals& t) {
  const usage::UsageSnapshot& window = cx.usage.counts;
  // The observer's bias: a process with no CPU to spare handshakes slower
  // while the probes are attached (their traps cost it CPU), so the phases
  // see a lower rate than the rest and the scaled counts read low by up to
  // the probes' cost per handshake over the process's CPU per handshake
  // (theirs included). 0 (none) while always on; for a process with idle
  // CPU (clients elsewhere set the rate) there is none either: the bound
  // is for an SRE to weigh against the process's CPU use.
  double cpu_bound_bias = 0;
  if (window.budget.duty_cycle < 1.0 && t.seen > 0 && t.estimated > 0 && t.handshaking_cpu > 0) {
    const double probe = window.budget.probe_cpu_seconds / t.seen;
    cpu_bound_bias = std::min(1.0, probe / std::max(probe, t.handshaking_cpu / t.estimated));
  }
  json attached = json::array();
  for (const usage::AttachedFile& f : cx.usage.files) {
    attached.push_back({{"path", f.path}, {"functions", f.functions}, {"fields", f.fields}});
  }
  return {{"files", std::move(attached)},
          {"probe_overhead_us", PerInstruction(cx.usage.probe_overhead_ns)},
          {"call_cost_us", PerInstruction(cx.usage.call_cost_ns)},
          {"budget",
           {{"cpu_seconds_per_second", cx.usage.budget_cpu_per_second},
            {"cpu_bound_bias", cpu_bound_bias},
            {"budget_cpu_seconds", window.budget.budget_cpu_seconds},
            {"probe_cpu_seconds", window.budget.probe_cpu_seconds},
            {"duty_cycle", window.budget.duty_cycle},
            {"attached", window.budget.attached},
            {"relative_error", window.budget.relative_error},
            {"toggles", window.budget.toggles}}},
          {"probe_hits", window.totals.hits},
          {"handshake_calls", window.totals.handshake_calls},
          {"handshakes", window.totals.handshakes},
          {"operations", window.totals.ops},
          {"nested_calls", window.totals.nested},
          {"dropped_keys", window.totals.dropped_keys},
          {"read_errors", window.totals.read_errors},
          {"go_unmatched_returns", window.totals.go_unmatched},
          {"go_migrated_operations", window.totals.go_migrated},
          {"connection_ends", window.totals.closes},
          {"connections_not_tracked", window.totals.live_full}};
}

}  // namespace

void AddUsage(json& doc, const profiler::Window& w) {
  if (!w.usage) return;
  Context cx{w, *w.usage, {}};
  for (const usage::AttachedFile& f : w.usage->files) cx.library[f.lib] = f.path;
  std::map<uint32_t, PerProcess> per_process;
  doc["handshakes"] = HandshakesJson(cx, per_process);
  doc["operations"] = OperationsJson(cx);
  HandshakeTotals totals;
  doc["handshake_cpu"] = HandshakeCpuJson(cx, per_process, totals);
  doc["connections"] = ConnectionsJson(cx);
  doc["agent"]["usage"] = AgentUsageJson(cx, totals);
}

}  // namespace tlsprof::report
