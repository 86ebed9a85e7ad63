#include "agent/oneshot/oneshot.h"

#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <set>
#include <thread>

#include "agent/aggregate/profile.h"
#include "agent/discovery/process_registry.h"
#include "agent/report/report.h"
#include "agent/sample/sampler.h"

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

// Snapshots every process that has samples and that the registry has not seen.
void DiscoverNew(const sample::Sampler& sampler, discovery::ProcessRegistry& registry, std::set<uint32_t>& seen) {
  sampler.ForEachPid([&](uint32_t tgid, const pid_counts&) {
    if (tgid == 0 || !seen.insert(tgid).second) return;
    auto status = registry.Refresh(static_cast<pid_t>(tgid));
    if (!status.ok()) spdlog::debug("{}", status.error().message);
  });
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

  discovery::ProcessRegistry registry;
  std::set<uint32_t> seen;
  // The target processes are known up front: snapshot them before the window
  // so that their symbol loading is not on the report's critical path.
  for (pid_t pid : options.pids) {
    seen.insert(static_cast<uint32_t>(pid));
    auto status = registry.Refresh(pid);
    if (!status.ok()) spdlog::warn("{}", status.error().message);
  }

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
    DiscoverNew(**sampler, registry, seen);
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
  cost.report_latency_seconds = std::chrono::duration<double>(Clock::now() - window_end).count();
  return report::BuildReport(profile, run, cost);
}

}  // namespace tlsprof::oneshot
