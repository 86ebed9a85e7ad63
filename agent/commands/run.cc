// `run`: windows for as long as it runs, into /metrics and the shipper.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "agent/commands/commands.h"
#include "agent/expose/health.h"
#include "agent/expose/metrics_sink.h"
#include "agent/expose/systemd_notify.h"
#include "agent/ship/ship_sink.h"

namespace tlsprof::commands {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The shipper's counters, mirrored into /metrics: the sender thread moves
// batches at any time, so this runs at every poll, not only at window ends.
void MirrorShipper(const ship::Shipper* shipper, expose::AgentMetrics& metrics) {
  if (shipper == nullptr) return;
  metrics.SetShip(shipper->stats());
}

// The threads the daemon serves from (/metrics and /healthz, systemd's
// watchdog, the shipper), started after the capability drop: a thread keeps
// the capabilities of its creator.
Status StartServices(const RunOptions& run, const expose::LoopHealth& health, expose::AgentMetrics& metrics,
                     expose::SystemdNotifier& notifier, std::unique_ptr<ship::Shipper>& shipper) {
  if (auto st = metrics.Serve(run.metrics_listen, &health); !st.ok()) return st;
  notifier.StartWatchdog();
  if (run.ship.collectors.empty()) return OkStatus();
  auto started = ship::Shipper::Start(run.ship);
  if (!started.ok()) return started.error();
  shipper = std::move(started).value();
  return OkStatus();
}

// What the agent holds across windows: it must follow the processes alive,
// not every process ever seen (test_faults_discovery.py reads this line).
void LogRegistry(const profiler::Window& w) {
  spdlog::info(
      "registry: processes={} images={} cached_images={} images_changed={} processes_replaced={} pending={} "
      "stack_verdicts={} (hits={} misses={})",
      w.health.tracked_processes, w.health.images, w.health.cached_images, w.health.images_changed,
      w.health.processes_replaced, w.health.pending_processes, w.cost.stack_cache_entries, w.cost.stack_cache_hits,
      w.cost.stack_cache_misses);
}

}  // namespace

Status Run(const Options& options, const StopSignal& stop) {
  // Order: the sampler (the only step needing CAP_BPF + CAP_PERFMON), the
  // capability drop, the threads, then the first snapshot of every process,
  // the slow part; so a port in use still fails before that.
  // The loop's health (GET /healthz, the watchdog's pings) is declared first:
  // the server and the watchdog thread that read it stop before it goes.
  const auto interval = Seconds(options.run.interval_seconds);
  expose::LoopHealth health(interval, Clock::now());
  expose::AgentMetrics metrics;
  expose::SystemdNotifier notifier(health);
  std::unique_ptr<ship::Shipper> shipper;
  profiler::Options po = ProfilerOptions(options, Command::kRun);
  po.after_setup = [&] { return StartServices(options.run, health, metrics, notifier, shipper); };
  auto started = profiler::Profiler::Start(po);
  if (!started.ok()) return started.error();
  profiler::Profiler& profiler = **started;
  expose::MetricsSink metrics_sink(metrics);
  ship::ShipSink ship_sink(shipper.get());
  wire::ReportFanout sinks({.container_labels = options.run.container_labels}, [&] { return ship_sink.spool(); },
                           {&metrics_sink, &ship_sink});
  const auto& s = options.sampling;
  spdlog::info("profiling {} at {} Hz in {} s windows; /metrics and /healthz on {}{}",
               s.pids.empty() ? "the host" : fmt::format("{} processes", s.pids.size()), s.frequency_hz,
               options.run.interval_seconds, options.run.metrics_listen,
               options.run.ship.collectors.empty()
                   ? ""
                   : fmt::format(", shipping to {}", fmt::join(options.run.ship.collectors, " or ")));
  auto next_close = Clock::now() + interval;
  health.LoopStarted(Clock::now());
  notifier.Ready();
  for (bool stopping = false; !stopping;) {
    stopping = stop.SleepUntil(std::min(next_close, Clock::now() + Seconds(options.poll_seconds)));
    if (!stopping && Clock::now() < next_close) {
      profiler.Poll(next_close);
      MirrorShipper(shipper.get(), metrics);
      continue;
    }
    // Close the window: on schedule, or the partial one at a stop request.
    const profiler::Window window = profiler.CloseWindow();
    {
      const auto scope = profiler.phases().Enter(profiler::AgentPhase::kSinks);
      if (auto st = sinks.Consume(window); !st.ok()) spdlog::error("{}", st.error().message);
    }
    LogRegistry(window);
    MirrorShipper(shipper.get(), metrics);
    health.WindowClosed(Clock::now());
    // A window that took longer than the interval to close (a stalled host):
    // the next one starts now rather than closing at once.
    next_close += interval;
    if (next_close < Clock::now()) next_close = Clock::now() + interval;
  }
  notifier.Stopping();
  profiler.Stop();
  if (!shipper) return OkStatus();
  const bool empty = shipper->Flush(std::chrono::milliseconds(static_cast<int64_t>(options.run.flush_seconds * 1000)));
  MirrorShipper(shipper.get(), metrics);
  if (empty) {
    spdlog::info("spool empty; exiting");
  } else {
    spdlog::warn("{} batches left in the spool for the next start", shipper->stats().spooled_batches);
  }
  return OkStatus();
}

}  // namespace tlsprof::commands
