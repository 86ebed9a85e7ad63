#include "agent/daemon/daemon.h"
#include "common/self_usage.h"

#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "agent/daemon/encode.h"
#include "agent/daemon/metrics.h"
#include "agent/daemon/services.h"
#include "agent/profiler/profiler.h"
#include "agent/ship/shipper.h"

namespace tlsprof::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// Current resident memory (not the peak): the number to watch over hours.
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::string MachineId() {
  std::ifstream in("/etc/machine-id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::string ReadComm(uint32_t pid) {
  std::ifstream in(fmt::format("/proc/{}/comm", pid));
  std::string comm;
  std::getline(in, comm);
  return comm;
}

// The service of a process the registry holds no snapshot of (it did TLS
// handshakes but had no sample yet): from /proc while it lives, else
// "(exited)" (a short-lived client, e.g. curl, gone before the window closed).
ServiceKey ServiceKeyFromProc(uint32_t pid, bool container_labels) {
  const std::string comm = ReadComm(pid);
  if (comm.empty()) return ServiceKey{std::string(kExitedService)};
  const std::string cgroup = discovery::ReadCgroupFile(static_cast<pid_t>(pid));
  return ServiceKeyOf(discovery::CgroupV2Path(cgroup), comm, discovery::IdentityFromCgroupFile(cgroup),
                      container_labels);
}

// Sleeps until `until` or a stop request, in short steps.
void SleepUntil(Clock::time_point until, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    const auto now = Clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(until - now, std::chrono::milliseconds(50)));
  }
}

}  // namespace

Status Validate(const Options& o) {
  if (!(o.interval_seconds > 0)) return MakeError("--interval must be > 0 seconds (got {})", o.interval_seconds);
  if (o.interval_seconds > 3600) return MakeError("--interval must be at most 3600 seconds (the collector's limit)");
  if (auto st = CheckListenAddress(o.metrics_listen); !st.ok()) return st;
  const bool any_tls = !o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_key.empty();
  const bool all_tls = !o.tls_ca.empty() && !o.tls_cert.empty() && !o.tls_key.empty();
  if (any_tls && o.insecure) return MakeError("--insecure and --tls-* exclude each other: pick one");
  if (any_tls && !all_tls) {
    return MakeError("--tls-ca, --tls-cert and --tls-key go together: give all three (missing: {}{}{})",
                     o.tls_ca.empty() ? "--tls-ca " : "", o.tls_cert.empty() ? "--tls-cert " : "",
                     o.tls_key.empty() ? "--tls-key" : "");
  }
  if (!o.collector.empty()) {
    if (!all_tls && !o.insecure) {
      return MakeError(
          "--collector needs --tls-ca, --tls-cert and --tls-key (mTLS), or --insecure to ship in plaintext");
    }
    if (o.collector.rfind(':') == std::string::npos) {
      return MakeError("--collector {}: expected HOST:PORT", o.collector);
    }
    if (o.state_dir.empty()) return MakeError("--state-dir must not be empty with --collector");
    if (o.spool_max_bytes == 0) return MakeError("--spool-max-bytes must be > 0");
  }
  return OkStatus();
}

Status Run(const Options& options, const std::atomic<bool>& stop) {
  if (auto st = Validate(options); !st.ok()) return st;
  // Order: the sampler (the only step needing CAP_BPF + CAP_PERFMON), then
  // the capability drop, then the threads (metrics server, shipper: a thread
  // keeps the capabilities of the thread that created it), then the first
  // snapshot of every process, the slow part. So a port in use still fails
  // before that.
  AgentMetrics metrics;
  std::unique_ptr<ship::Shipper> shipper;
  profiler::Options po;
  po.frequency_hz = options.frequency_hz;
  po.pids = options.pids;
  po.stacks = options.stacks;
  po.debug_dirs = options.debug_dirs;
  po.drop_capabilities = options.drop_capabilities;
  po.memory_limit_bytes = options.memory_limit_bytes;
  po.max_sample_keys = options.max_sample_keys;
  po.max_stack_keys = options.max_stack_keys;
  po.usage = options.usage;
  po.usage_budget_share = options.usage_budget_share;
  po.after_setup = [&]() -> Status {
    if (auto st = metrics.Serve(options.metrics_listen); !st.ok()) return st;
    if (options.collector.empty()) return OkStatus();
    ship::ShipperOptions so;
    so.collector = options.collector;
    so.state_dir = options.state_dir;
    so.spool_max_bytes = options.spool_max_bytes;
    so.insecure = options.insecure;
    so.tls = {options.tls_ca, options.tls_cert, options.tls_key};
    auto shipper_started = ship::Shipper::Start(so);
    if (!shipper_started.ok()) return shipper_started.error();
    shipper = std::move(shipper_started).value();
    return OkStatus();
  };
  auto started = profiler::Profiler::Start(po);
  if (!started.ok()) return started.error();
  profiler::Profiler& profiler = **started;

  v1::Host host;
  host.set_hostname(HostName());
  host.set_machine_id(MachineId());
  host.set_agent_version(TLSPROF_VERSION);
  host.set_cpus(static_cast<uint32_t>(profiler.sampler().cpu_count()));
  spdlog::info("profiling {} at {} Hz in {} s windows; /metrics on {}{}",
               options.pids.empty() ? "the host" : fmt::format("{} processes", options.pids.size()),
               options.frequency_hz, options.interval_seconds, options.metrics_listen,
               options.collector.empty() ? "" : fmt::format(", shipping to {}", options.collector));

  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.interval_seconds));
  const auto poll = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.poll_seconds));
  // The sender thread moves batches at any time: its counters are mirrored
  // at every poll, not only at window ends.
  auto update_ship_metrics = [&shipper, &metrics] {
    if (!shipper) return;
    const ship::ShipperStats st = shipper->stats();
    metrics.SetShip({st.sealed, st.accepted, st.duplicates, st.rejected, st.spool_dropped, st.send_errors,
                     st.spooled_batches, st.spooled_bytes, st.last_success_unix_seconds, st.unpersisted});
  };
  double cpu_mark = SelfCpuSeconds();
  auto next_close = Clock::now() + interval;
  for (;;) {
    SleepUntil(std::min(next_close, Clock::now() + poll), stop);
    if (!stop.load() && Clock::now() < next_close) {
      profiler.Poll(next_close);
      update_ship_metrics();
      continue;
    }
    // Close the window: on schedule, or the partial one at a stop request.
    const bool stopping = stop.load();
    profiler::Window window = profiler.CloseWindow();
    const auto& profile = window.profile;
    const auto& registry = profiler.registry();
    const double cpu_now = SelfCpuSeconds();
    const double window_cpu = cpu_now - cpu_mark;
    cpu_mark = cpu_now;
    const uint64_t scope = profile.scope_samples;
    auto services = GroupServices(profile, scope, [&registry, &options](const aggregate::ProcessProfile& p) {
      const auto* snap = registry.Get(p.pid);
      return ServiceKeyOf(snap ? std::string_view(snap->cgroup) : std::string_view(), p.comm,
                          snap ? snap->container : discovery::ContainerIdentity{}, options.container_labels);
    });
    WindowInfo info;
    info.start_unix_ns = window.start_unix_ns;
    info.end_unix_ns = window.end_unix_ns;
    info.frequency_hz = options.frequency_hz;
    info.period_ns = profiler.sampler().period_ns();
    v1::AgentStats agent;
    agent.set_cpu_seconds(window_cpu);
    agent.set_max_rss_bytes(ResidentBytes());
    agent.set_dropped_samples(window.totals.dropped_ip + window.totals.dropped_pid + window.totals.dropped_stack);
    agent.set_unresolved_samples(profile.unresolved_samples);
    if (shipper) {
      const ship::ShipperStats st = shipper->stats();
      agent.set_spooled_batches(st.spooled_batches);
      agent.set_spool_dropped_batches(st.spool_dropped);
    }
    std::optional<v1::UsageStats> usage_stats;
    const usage::UsageProbes* probes = profiler.usage();
    if (probes) {
      std::map<uint16_t, std::string> library;
      for (const usage::AttachedFile& f : probes->files()) library[f.lib] = f.library;
      const uint32_t self = static_cast<uint32_t>(getpid());
      auto service_of = [&](uint32_t tgid) -> std::optional<ServiceKey> {
        // The agent's own calibration and processes outside --pid are not reported (as in usage_report.cc).
        if (tgid == self) return std::nullopt;
        if (!options.pids.empty() &&
            std::find(options.pids.begin(), options.pids.end(), static_cast<pid_t>(tgid)) == options.pids.end()) {
          return std::nullopt;
        }
        if (const auto* snap = registry.Get(static_cast<pid_t>(tgid))) {
          return ServiceKeyOf(snap->cgroup, snap->comm, snap->container, options.container_labels);
        }
        return ServiceKeyFromProc(tgid, options.container_labels);
      };
      auto library_of = [&library](uint16_t lib) {
        auto it = library.find(lib);
        return it == library.end() || it->second.empty() ? std::string("unknown") : it->second;
      };
      if (const size_t dropped = AddUsage(services, window.usage, service_of, library_of); dropped > 0) {
        spdlog::warn("usage: {} rows past the per-report caps left out of this window", dropped);
      }
      usage_stats = UsageStatsOf(window.usage);
    }
    v1::AgentReport report = EncodeReport(services, scope, info, host, agent, usage_stats);
    uint64_t tls_samples = 0;
    for (const auto& s : report.services()) tls_samples += s.tls_samples();
    metrics.AddReport(report);
    WindowHealth health;
    health.duration_seconds = std::chrono::duration<double>(window.end - window.start).count();
    health.agent_cpu_seconds = window_cpu;
    health.resident_bytes = agent.max_rss_bytes();
    health.dropped_samples = agent.dropped_samples();
    health.unresolved_samples = agent.unresolved_samples();
    health.tracked_processes = registry.processes().size();
    health.pending_processes = profiler.pending();
    if (usage_stats) {
      health.usage = true;
      health.probe_duty_cycle = usage_stats->duty_cycle();
      health.probe_cpu_seconds = usage_stats->probe_cpu_seconds();
      health.probe_hits = usage_stats->probe_hits();
      health.probe_budget_cpu_seconds = usage_stats->budget_cpu_seconds();
      health.probe_toggles = window.usage.budget.toggles;
      health.probe_budget_share = probes->budget() > 0 ? options.usage_budget_share : 0;
    }
    metrics.AddWindow(health);
    // What the agent holds across windows: it must follow the processes
    // alive, not every process ever seen (test_faults_discovery.py).
    spdlog::info("registry: processes={} images={} cached_images={} images_changed={} processes_replaced={} pending={}",
                 registry.processes().size(), registry.image_count(), registry.cached_image_count(),
                 registry.stats().images_changed, registry.stats().processes_replaced, profiler.pending());
    BoundsHealth bounds;
    bounds.memory_limit_bytes = profiler.memory_budget().limit_bytes();
    bounds.images_skipped = profiler.memory_budget().skipped(MemoryBudget::kImage);
    bounds.tables_skipped = profiler.memory_budget().skipped(MemoryBudget::kUnwindTable);
    if (const auto* registrar = profiler.registrar()) {
      bounds.unwind_process_failures = registrar->stats().process_failures;
    }
    metrics.SetBounds(bounds);
    if (shipper) {
      const int64_t start_ns = report.window().start_unix_ns();
      const int64_t end_ns = report.window().end_unix_ns();
      // The shipper logs the sealed line (docs/fleet.md).
      auto sealed = shipper->Seal(std::move(report));
      if (!sealed.ok()) spdlog::error("cannot seal the window [{},{}): {}", start_ns, end_ns, sealed.error().message);
      update_ship_metrics();
    } else {
      spdlog::info("window=[{},{}) busy_samples={} tls_samples={} services={}", report.window().start_unix_ns(),
                   report.window().end_unix_ns(), report.busy_samples(), tls_samples, report.services_size());
    }
    if (stopping) break;
    next_close += interval;
    // A window that took longer than the interval to close (a stalled host):
    // the next one starts now rather than closing at once.
    if (next_close < Clock::now()) next_close = Clock::now() + interval;
  }
  profiler.Stop();
  if (shipper) {
    const auto budget = std::chrono::milliseconds(static_cast<int64_t>(options.flush_seconds * 1000));
    const bool empty = shipper->Flush(budget);
    update_ship_metrics();
    if (empty) {
      spdlog::info("spool empty; exiting");
    } else {
      spdlog::warn("{} batches left in the spool for the next start", shipper->stats().spooled_batches);
    }
  }
  return OkStatus();
}

}  // namespace tlsprof::daemon
