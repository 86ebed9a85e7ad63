#include "agent/oneshot/oneshot.h"
#include "common/self_usage.h"

#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "agent/aggregate/profile.h"
#include "agent/profiler/profiler.h"
#include "agent/report/exports.h"
#include "agent/report/progress.h"
#include "agent/report/report.h"
#include "agent/report/usage_report.h"

namespace tlsprof::oneshot {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t MaxRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace

Result<nlohmann::json> Run(const Options& options, const std::atomic<bool>& stop) {
  if (!(options.duration_seconds > 0)) return MakeError("--duration must be > 0 seconds");
  const double cpu_at_start = SelfCpuSeconds();

  profiler::Options profiler_options;
  profiler_options.frequency_hz = options.frequency_hz;
  profiler_options.pids = options.pids;
  profiler_options.stacks = options.stacks;
  profiler_options.debug_dirs = options.debug_dirs;
  profiler_options.refresh_all_sampled = true;
  profiler_options.drop_capabilities = options.drop_capabilities;
  profiler_options.max_sample_keys = options.max_sample_keys;
  profiler_options.max_stack_keys = options.max_stack_keys;
  profiler_options.usage = options.usage;
  profiler_options.usage_budget_share = options.usage_budget_share;
  auto started = profiler::Profiler::Start(profiler_options);
  if (!started.ok()) return started.error();
  profiler::Profiler& profiler = **started;
  sample::Sampler& sampler = profiler.sampler();

  // The window starts after the set-up (Profiler::Start).
  const auto window_start = Clock::now();
  const double cpu_at_window_start = SelfCpuSeconds();
  // The probes' maps count from their attachment: the window is a difference.
  const usage::UsageSnapshot usage_at_start = profiler.usage() ? profiler.usage()->Snapshot() : usage::UsageSnapshot{};
  // Tests wait on this line, not on a guess, before they start what the window must see.
  spdlog::info("profile: window open for {} s", options.duration_seconds);
  const auto window = std::chrono::duration<double>(options.duration_seconds);
  const auto poll = std::chrono::duration<double>(options.poll_seconds);
  for (report::Countdown countdown; !stop.load();) {  // scoped to the loop: cleared however it ends
    auto elapsed = Clock::now() - window_start;
    countdown.Show(window - elapsed);
    if (elapsed >= window) break;
    auto nap = std::min<Clock::duration>(std::chrono::duration_cast<Clock::duration>(poll),
                                         std::chrono::duration_cast<Clock::duration>(window - elapsed));
    // Sleep in short steps so a signal ends the window promptly.
    const auto wake = Clock::now() + nap;
    while (!stop.load() && Clock::now() < wake) {
      std::this_thread::sleep_for(std::min<Clock::duration>(wake - Clock::now(), std::chrono::milliseconds(50)));
    }
    profiler.Poll();
  }
  profiler.Stop();
  const usage::UsageSnapshot usage_at_end = profiler.usage() ? profiler.usage()->Snapshot() : usage::UsageSnapshot{};
  const auto window_end = Clock::now();
  const double cpu_at_window_end = SelfCpuSeconds();

  profiler::Window closed = profiler.CloseWindow();
  const aggregate::Profile& profile = closed.profile;
  const sample::Totals& totals = closed.totals;
  const double profiled_seconds = std::chrono::duration<double>(window_end - closed.start).count();

  report::RunInfo run;
  run.duration_seconds = profiled_seconds;
  auto monotonic_ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  run.window_start_monotonic_ns = monotonic_ns(closed.start);
  run.window_end_monotonic_ns = monotonic_ns(window_end);
  run.frequency_hz = options.frequency_hz;
  run.period_ns = sampler.period_ns();
  run.cpus = sampler.cpu_count();
  run.hostname = HostName();
  run.target_pids = options.pids;
  run.total_samples = totals.samples;
  run.idle_samples = totals.idle;
  run.kernel_samples = totals.kernel;
  run.user_samples = totals.user;
  run.dropped_samples = totals.dropped_ip + totals.dropped_pid;

  const sample::BpfRunStats bpf = sampler.ReadBpfStats();
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
  if (const usage::UsageProbes* probes = profiler.usage()) {
    report::AddUsage(doc, usage::Subtract(usage_at_end, usage_at_start), *probes, profile, profiler.registry(),
                     run.period_ns, getpid(), options.pids);
  }
  if (const stacks::UnwindRegistrar* registrar = profiler.registrar()) {
    const auto& st = registrar->stats();
    doc["agent"]["unwind"] = {{"processes", st.processes},
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
