#include "agent/report/usage_report.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "agent/usage/names.h"

namespace tlsprof::report {
namespace {

using nlohmann::json;

std::string Comm(const discovery::ProcessRegistry& registry, uint32_t tgid) {
  const discovery::ProcessSnapshot* snap = registry.Get(static_cast<pid_t>(tgid));
  return snap ? snap->comm : "";
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

}  // namespace

void AddUsage(json& doc, const usage::UsageSnapshot& window, const usage::UsageProbes& probes,
              const aggregate::Profile& profile, const discovery::ProcessRegistry& registry, uint64_t period_ns,
              pid_t self, const std::vector<pid_t>& scope) {
  auto excluded = [&](uint32_t tgid) {
    if (tgid == static_cast<uint32_t>(self)) return true;
    return !scope.empty() && std::find(scope.begin(), scope.end(), static_cast<pid_t>(tgid)) == scope.end();
  };
  const std::vector<usage::AttachedFile>& files = probes.files();
  std::map<uint16_t, std::string> library;
  for (const usage::AttachedFile& f : files) library[f.lib] = f.path;
  auto lib_path = [&](uint16_t lib) {
    auto it = library.find(lib);
    return it == library.end() ? std::string("unknown") : it->second;
  };

  // Handshakes, merged over the raw key's fields that are not labels.
  using HandshakeLabels =
      std::tuple<uint32_t, std::string, std::string, std::string, std::string, std::string, std::string, std::string>;
  std::map<HandshakeLabels, uint64_t> handshakes;
  struct PerProcess {
    uint64_t handshakes = 0, full = 0, resumed = 0;
  };
  std::map<uint32_t, PerProcess> per_process;
  for (const usage::HandshakeCount& h : window.handshakes) {
    if (excluded(h.key.tgid)) continue;
    const std::string side = h.key.is_server == 1 ? "server" : h.key.is_server == 0 ? "client" : "unknown";
    const std::string kind = h.key.resumed == 1 ? "resumed" : h.key.resumed == 0 ? "full" : "unknown";
    handshakes[{h.key.tgid, lib_path(h.key.lib), side, kind, usage::VersionName(h.key.version),
                usage::CipherSuiteName(h.key.cipher), usage::GroupName(h.key.kx_type, h.key.kx_len),
                usage::CertKeyTypeName(h.key.cert_type)}] += h.count;
    PerProcess& p = per_process[h.key.tgid];
    p.handshakes += h.count;
    (h.key.resumed == 1 ? p.resumed : p.full) += h.count;
  }
  json rows = json::array();
  for (const auto& [labels, count] : handshakes) {
    const auto& [tgid, lib, side, kind, version, suite, group, cert] = labels;
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(registry, tgid)},
                    {"library", lib},
                    {"side", side},
                    {"kind", kind},
                    {"version", version},
                    {"cipher_suite", suite},
                    {"group", group},
                    {"cert_key_type", cert},
                    {"count", count}});
  }
  doc["handshakes"] = std::move(rows);

  // Operations, merged over their raw key the same way; histograms add up.
  using OpLabels = std::tuple<uint32_t, std::string, std::string, std::string, bool>;
  std::map<OpLabels, usage::OperationStats> ops;
  for (const usage::OperationStats& op : window.operations) {
    if (excluded(op.key.tgid) || op.key.op == USAGE_OP_CALIBRATE) continue;
    const std::string algorithm = op.key.op == USAGE_OP_DERIVE
                                      ? usage::KeyExchangeAlgorithm(op.key.key_type, op.key.len)
                                      : usage::SignatureAlgorithm(op.key.key_type, op.key.len);
    auto [it, fresh] = ops.try_emplace(
        {op.key.tgid, lib_path(op.key.lib), OpName(op.key.op), algorithm, op.key.in_handshake != 0}, op);
    if (fresh) continue;
    it->second.count += op.count;
    it->second.cpu_ns += op.cpu_ns;
    it->second.wall_ns += op.wall_ns;
    for (size_t i = 0; i < it->second.slots.size() && i < op.slots.size(); ++i) it->second.slots[i] += op.slots[i];
  }
  rows = json::array();
  for (const auto& [labels, op] : ops) {
    const auto& [tgid, lib, name, algorithm, in_handshake] = labels;
    // The probes' own time (calibrated at start) is already taken off, in BPF.
    auto net_us = [](double ns) { return ns / 1e3; };
    const double count = static_cast<double>(op.count);
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(registry, tgid)},
                    {"library", lib},
                    {"operation", name},
                    {"algorithm", algorithm},
                    {"in_handshake", in_handshake},
                    {"count", op.count},
                    {"cpu_seconds", static_cast<double>(op.cpu_ns) / 1e9},
                    {"latency_mean_us", net_us(static_cast<double>(op.cpu_ns) / count)},
                    {"latency_p50_us", net_us(usage::HistogramQuantile(op.slots, 0.50))},
                    {"latency_p99_us", net_us(usage::HistogramQuantile(op.slots, 0.99))}});
  }
  doc["operations"] = std::move(rows);

  // TLS CPU in the handshake phase (sampled) over the handshakes completed
  // (probed), per process: docs/usage.md, "Cost per handshake".
  rows = json::array();
  const double period_s = static_cast<double>(period_ns) / 1e9;
  for (const auto& [tgid, p] : per_process) {
    auto it = profile.processes.find(static_cast<pid_t>(tgid));
    const uint64_t samples =
        it == profile.processes.end() ? 0 : it->second.crypto.phases[static_cast<size_t>(classify::Phase::kHandshake)];
    const double cpu = static_cast<double>(samples) * period_s;
    rows.push_back({{"pid", tgid},
                    {"comm", Comm(registry, tgid)},
                    {"handshakes", p.handshakes},
                    {"full", p.full},
                    {"resumed", p.resumed},
                    {"handshake_tls_cpu_seconds", cpu},
                    {"cpu_seconds_per_handshake", p.handshakes ? cpu / static_cast<double>(p.handshakes) : 0.0}});
  }
  doc["handshake_cpu"] = std::move(rows);

  json attached = json::array();
  for (const usage::AttachedFile& f : files) {
    attached.push_back({{"path", f.path}, {"functions", f.functions}, {"fields", f.fields}});
  }
  doc["agent"]["usage"] = {{"files", std::move(attached)},
                           {"probe_overhead_us",
                            {{"push", probes.probe_overhead_ns()[INSN_EMULATED_PUSH] / 1e3},
                             {"endbr64", probes.probe_overhead_ns()[INSN_ENDBR64] / 1e3},
                             {"single_stepped", probes.probe_overhead_ns()[INSN_SINGLE_STEPPED] / 1e3},
                             {"go", probes.probe_overhead_ns()[INSN_GO] / 1e3}}},
                           {"probe_hits", window.totals.hits},
                           {"handshake_calls", window.totals.handshake_calls},
                           {"handshakes", window.totals.handshakes},
                           {"operations", window.totals.ops},
                           {"nested_calls", window.totals.nested},
                           {"dropped_keys", window.totals.dropped_keys},
                           {"read_errors", window.totals.read_errors},
                           {"go_unmatched_returns", window.totals.go_unmatched},
                           {"go_migrated_operations", window.totals.go_migrated}};
}

}  // namespace tlsprof::report
