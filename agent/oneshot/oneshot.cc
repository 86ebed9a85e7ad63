#include "agent/oneshot/oneshot.h"

#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "agent/aggregate/profile.h"
#include "agent/discovery/process_registry.h"
#include "agent/report/exports.h"
#include "agent/report/report.h"
#include "agent/sample/sampler.h"
#include "agent/stacks/unwind_registrar.h"

namespace tlsprof::oneshot {
namespace {

using Clock = std::chrono::steady_clock;

double SelfCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

uint64_t MaxRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// Snapshots a process and, if it maps a TLS library, registers it with the
// BPF unwinder. Failures concern one process and are never fatal.
void Discover(pid_t pid, discovery::ProcessRegistry& registry, stacks::UnwindRegistrar* registrar) {
  auto status = registry.Refresh(pid);
  if (!status.ok()) {
    spdlog::debug("{}", status.error().message);
    return;
  }
  if (registrar == nullptr) return;
  const auto* snap = registry.Get(pid);
  if (snap == nullptr || !snap->has_tls()) return;
  auto registered = registrar->Register(pid, *snap);
  if (!registered.ok()) spdlog::debug("process {}: {}", pid, registered.error().message);
}

// Snapshots every process that has samples and that the registry has not seen.
void DiscoverNew(const sample::Sampler& sampler, discovery::ProcessRegistry& registry,
                 stacks::UnwindRegistrar* registrar, std::set<uint32_t>& seen) {
  std::vector<uint32_t> fresh;
  sampler.ForEachPid([&](uint32_t tgid, const pid_counts&) {
    if (tgid != 0 && seen.insert(tgid).second) fresh.push_back(tgid);
  });
  for (uint32_t tgid : fresh) Discover(static_cast<pid_t>(tgid), registry, registrar);
}

}  // namespace

Result<nlohmann::json> Run(const Options& options, const std::atomic<bool>& stop) {
  if (!(options.duration_seconds > 0)) return MakeError("--duration must be > 0 seconds");
  const double cpu_at_start = SelfCpuSeconds();

  sample::SamplerOptions sampler_options;
  sampler_options.frequency_hz = options.frequency_hz;
  sampler_options.target_pids = options.pids;
  auto sampler = sample::Sampler::Start(sampler_options);
  if (!sampler.ok()) return sampler.error();

  symbols::DebugSearch debug;
  debug.debug_roots.insert(debug.debug_roots.begin(), options.debug_dirs.begin(), options.debug_dirs.end());
  discovery::ProcessRegistry registry("/proc", std::move(debug));
  std::optional<stacks::UnwindRegistrar> registrar;
  if (options.stacks) registrar.emplace(**sampler);
  stacks::UnwindRegistrar* unwinder = registrar ? &*registrar : nullptr;
  std::set<uint32_t> seen;
  // Processes that exist now are snapshotted before the window, so their
  // symbol loading is not on the report's critical path and their stacks
  // are unwound from the first sample on. Later ones are found as they get
  // samples.
  const std::vector<pid_t> initial = options.pids.empty() ? discovery::ListPids() : options.pids;
  for (pid_t pid : initial) {
    if (pid == getpid()) continue;
    seen.insert(static_cast<uint32_t>(pid));
    Discover(pid, registry, unwinder);
  }

  // The window starts now: samples taken during the set-up above are
  // dropped, or they would count without being part of its duration.
  (*sampler)->ClearCounts();
  const auto window_start = Clock::now();
  const double cpu_at_window_start = SelfCpuSeconds();
  const auto window = std::chrono::duration<double>(options.duration_seconds);
  const auto poll = std::chrono::duration<double>(options.poll_seconds);
  while (!stop.load()) {
    auto elapsed = Clock::now() - window_start;
    if (elapsed >= window) break;
    auto nap = std::min<Clock::duration>(std::chrono::duration_cast<Clock::duration>(poll),
                                         std::chrono::duration_cast<Clock::duration>(window - elapsed));
    // Sleep in short steps so a signal ends the window promptly.
    const auto wake = Clock::now() + nap;
    while (!stop.load() && Clock::now() < wake) {
      std::this_thread::sleep_for(std::min<Clock::duration>(wake - Clock::now(), std::chrono::milliseconds(50)));
    }
    DiscoverNew(**sampler, registry, unwinder, seen);
  }
  (*sampler)->Stop();
  const auto window_end = Clock::now();
  const double cpu_at_window_end = SelfCpuSeconds();
  const double profiled_seconds = std::chrono::duration<double>(window_end - window_start).count();

  // Processes that were sampled since the last poll, and processes that
  // mapped new code since their snapshot (dlopen), are refreshed once more.
  // Processes that exited keep their last snapshot.
  std::set<uint32_t> sampled;
  (*sampler)->ForEachPid([&](uint32_t tgid, const pid_counts&) {
    if (tgid != 0) sampled.insert(tgid);
  });
  for (uint32_t tgid : sampled) {
    auto status = registry.Refresh(static_cast<pid_t>(tgid));
    if (!status.ok()) spdlog::debug("{}", status.error().message);
  }

  aggregate::Attributor attributor(registry);
  (*sampler)->ForEachPid([&](uint32_t tgid, const pid_counts& counts) {
    if (tgid != 0) attributor.AddProcess(tgid, counts.user, counts.kernel);
  });
  // Stacks first: the samples they cover are taken out of the leaf counts.
  (*sampler)->ForEachStack([&](const stack_key& key, uint64_t count) {
    const uint32_t n = std::min<uint32_t>(key.nr_frames, TLSPROF_UNWIND_MAX_FRAMES);
    std::array<uint64_t, TLSPROF_UNWIND_MAX_FRAMES> ips{};  // __u64 is not uint64_t's type
    std::copy_n(key.ips, n, ips.begin());
    attributor.AddStack(key.tgid, std::span<const uint64_t>(ips.data(), n), count);
  });
  (*sampler)->ForEachIp(
      [&](const sample_key& key, uint64_t count) { attributor.AddUserSamples(key.tgid, key.user_ip, count); });
  const sample::Totals totals = (*sampler)->ReadTotals();
  if (options.pids.empty()) {
    attributor.SetScopeSamples(totals.samples - totals.idle);
  } else {
    uint64_t scope = 0;
    (*sampler)->ForEachPid([&](uint32_t, const pid_counts& c) { scope += c.user + c.kernel; });
    attributor.SetScopeSamples(scope);
  }
  aggregate::Profile profile = attributor.Finish();

  report::RunInfo run;
  run.duration_seconds = profiled_seconds;
  auto monotonic_ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  run.window_start_monotonic_ns = monotonic_ns(window_start);
  run.window_end_monotonic_ns = monotonic_ns(window_end);
  run.frequency_hz = options.frequency_hz;
  run.period_ns = (*sampler)->period_ns();
  run.cpus = (*sampler)->cpu_count();
  run.hostname = HostName();
  run.target_pids = options.pids;
  run.total_samples = totals.samples;
  run.idle_samples = totals.idle;
  run.kernel_samples = totals.kernel;
  run.user_samples = totals.user;
  run.dropped_samples = totals.dropped_ip + totals.dropped_pid;

  const sample::BpfRunStats bpf = (*sampler)->ReadBpfStats();
  report::AgentCost cost;
  cost.window_cpu_seconds = cpu_at_window_end - cpu_at_window_start;
  cost.bpf_seconds = static_cast<double>(bpf.run_time_ns) / 1e9;
  cost.bpf_runs = bpf.run_count;
  cost.bpf_stats_enabled = bpf.enabled;
  cost.max_rss_bytes = MaxRssBytes();
  cost.cpu_seconds = SelfCpuSeconds() - cpu_at_start;
  if (!options.folded_path.empty()) {
    auto written = report::WriteFile(options.folded_path, report::FoldedStacks(profile));
    if (!written.ok()) return written.error();
  }
  if (!options.pprof_path.empty()) {
    auto written =
        report::WriteFile(options.pprof_path, report::PprofProfile(profile, run.period_ns, run.duration_seconds));
    if (!written.ok()) return written.error();
  }
  cost.report_latency_seconds = std::chrono::duration<double>(Clock::now() - window_end).count();
  nlohmann::json doc = report::BuildReport(profile, run, cost);
  if (registrar) {
    const auto& st = registrar->stats();
    doc["agent"]["unwind"] = {{"processes", st.processes},
                              {"tables", st.tables},
                              {"rows", st.rows},
                              {"table_failures", st.table_failures},
                              {"mappings_left_out", st.mappings_left_out},
                              // The in-kernel walks and their cost (bench/unwind_cost.py).
                              {"walks", totals.unwind_walks},
                              {"frames", totals.unwind_frames},
                              {"walk_seconds", static_cast<double>(totals.unwind_ns) / 1e9},
                              {"row_searches", totals.unwind_row_searches},
                              {"stacks", totals.unwound},
                              {"not_tls", totals.unwind_not_tls},
                              {"dropped_stacks", totals.dropped_stack}};
    // Why each counted stack ended: complete ones at a zero return address or
    // an end row; the rest say where unwinding broke (a library whose CFI
    // the tables miss shows as no_row/unreadable).
    const auto& stop = totals.unwind_stop;
    doc["agent"]["unwind"]["stops"] = {{"zero_ip", stop.zero_ip},         {"end", stop.end},
                                       {"max_frames", stop.max_frames},   {"no_mapping", stop.no_mapping},
                                       {"no_row", stop.no_row},           {"cfa_none", stop.cfa_none},
                                       {"bp_unknown", stop.bp_unknown},   {"unreadable", stop.unreadable},
                                       {"not_growing", stop.not_growing}, {"reg_unknown", stop.reg_unknown}};
  }
  return doc;
}

}  // namespace tlsprof::oneshot
