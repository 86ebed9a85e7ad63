// Window: everything one profiling window produced, as one value. The
// profiler builds it once (Profiler::CloseWindow); sinks consume it: the JSON
// report and the table, the folded and pprof exports (agent/report), the
// fleet encoding and the agent's /metrics and the shipper (agent/wire,
// agent/daemon, agent/ship). A sink reads nothing else: no registry, no
// /proc, no BPF object, so a recorded window (window_record.h) replays
// through every sink exactly as the live one did.
// A plain value: copyable, no pointers into the profiler; not synchronized.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/aggregate/attribution.h"
#include "agent/discovery/cgroup_identity.h"
#include "agent/profiler/phase_clock.h"
#include "agent/sample/sampler.h"
#include "agent/stacks/unwind_registrar.h"
#include "agent/usage/usage_probes.h"
#include "common/result.h"

namespace tlsprof::profiler {

// The host and the sampling set-up the window was taken with.
struct HostInfo {
  std::string hostname;
  std::string machine_id;  // /etc/machine-id, "" if unreadable
  int cpus = 0;
  uint32_t frequency_hz = 0;
  uint64_t period_ns = 0;         // CPU time one sample stands for
  std::vector<pid_t> scope_pids;  // --pid; empty: the whole host
  pid_t agent_pid = 0;            // the agent itself: its own usage rows are not reported
};

// A process the window names (it has samples or usage rows), as read when
// the window closed: from the agent's snapshot, else from /proc.
struct ProcessInfo {
  std::string comm;                        // "" when the process was gone and never snapshotted
  std::string cgroup;                      // cgroup v2 path, "" if unknown
  discovery::ContainerIdentity container;  // empty on the host
  uint64_t resident_bytes = 0;             // at the close, for processes with live TLS connections; 0 if gone
  bool snapshotted = false;                // the agent held a snapshot of it
};

// What the usage probes saw in the window (--usage), and their set-up.
struct UsageInfo {
  usage::UsageSnapshot counts;             // the window's difference (usage::Subtract)
  std::vector<usage::AttachedFile> files;  // every file probed so far
  std::array<double, INSN_NR> probe_overhead_ns{};
  std::array<double, INSN_NR> call_cost_ns{};
  double budget_cpu_per_second = 0;  // UsageProbes::budget(): 0 when always on
  double budget_share = 0;           // --usage-budget as a share of the host's CPUs (0: none)
};

// The agent's own cost.
struct AgentCost {
  double window_cpu_seconds = 0;  // user + system CPU of the agent from the window's start to its end
  double cpu_seconds = 0;         // since the profiler started, up to the window's attribution
  double bpf_seconds = 0;         // BPF run time in the window (the kernel's BPF stats)
  uint64_t bpf_runs = 0;
  bool bpf_stats_enabled = false;
  uint64_t max_rss_bytes = 0;         // peak resident memory so far
  uint64_t resident_bytes = 0;        // resident memory at the close
  double report_latency_seconds = 0;  // window end → attribution done (symbolization included)
  // The agent's CPU per phase (phase_clock.h) over its window cycle: from
  // the previous window's close (or this window's start, for the first) to
  // the end of this one's close. It holds the previous window's sinks and
  // this window's attribution, which window_cpu_seconds splits at the
  // window's end; in steady state both add up to the same cost per window.
  AgentPhaseSeconds phases{};
  // The window's stacks whose verdict was already made (aggregate::StackCache:
  // in an earlier window, or earlier in this one), those judged anew, and
  // the verdicts kept at the close.
  uint64_t stack_cache_hits = 0;
  uint64_t stack_cache_misses = 0;
  uint64_t stack_cache_entries = 0;
};

// The agent's state across windows, at the close.
struct AgentHealth {
  uint64_t tracked_processes = 0;  // snapshots held
  uint64_t pending_processes = 0;  // found, not read yet (Profiler::pending)
  uint64_t forgotten_processes = 0;
  uint64_t images = 0;
  uint64_t cached_images = 0;
  uint64_t images_changed = 0;
  uint64_t processes_replaced = 0;
  // Bounds (docs/fleet.md, "Memory"): cumulative.
  uint64_t memory_limit_bytes = 0;  // 0: none
  uint64_t images_skipped = 0;
  uint64_t tables_skipped = 0;
  // Inputs of other processes refused or cut at a guard cap, by reason
  // (guard::ReasonName; guard/limits.h): cumulative, process-wide, the
  // reasons never counted left out.
  std::map<std::string, uint64_t> refused;
  // The unwinder's registrations (with stacks on).
  std::optional<stacks::RegistrarStats> unwind;
};

struct Window {
  aggregate::Attribution attribution;
  sample::Totals totals;  // the sampler's totals over the window
  // CLOCK_MONOTONIC (steady_clock), so other programs' timelines (the
  // ground-truth workloads') can be cut to the same window, and the wall
  // clock; a window starts where the previous one ended.
  int64_t start_monotonic_ns = 0;
  int64_t end_monotonic_ns = 0;
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  HostInfo host;
  std::map<uint32_t, ProcessInfo> processes;  // by tgid
  std::optional<UsageInfo> usage;             // with --usage
  AgentCost cost;
  AgentHealth health;

  double duration_seconds() const { return static_cast<double>(end_monotonic_ns - start_monotonic_ns) / 1e9; }
  double seconds_per_sample() const { return static_cast<double>(host.period_ns) / 1e9; }
  // The process's info; an empty one (no comm) for a tgid the window does not name.
  const ProcessInfo& process(uint32_t tgid) const;
  // Rows of this process are reported: not the agent, and inside --pid.
  bool in_scope(uint32_t tgid) const;
};

// A consumer of windows: a report, an export, the agent's /metrics, the
// shipper. Consume() is called once per window, in order, on the thread that
// closes windows; an error concerns this window and this sink only.
class WindowSink {
 public:
  virtual ~WindowSink() = default;
  virtual Status Consume(const Window& window) = 0;
};

}  // namespace tlsprof::profiler
