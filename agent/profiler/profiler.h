// Profiler: the path of a sample, end to end, for one window or for many.
// Sample (sample::Sampler) → discover and symbolize (discovery::ProcessRegistry,
// stacks::UnwindRegistrar) → classify and aggregate (aggregate::Attributor).
//
// `tlsprof-agent profile` runs one window (agent/oneshot); `tlsprof-agent run`
// closes a window every interval for as long as it runs (agent/daemon). The
// sampler, the process registry and the unwind registrations live across
// windows; windows are contiguous (sample::Sampler::ReadWindow). Processes
// that exited are forgotten once they had no sample for a window, with their
// unwind registration and the images no one else maps, so memory follows
// the processes alive.
// Not thread-safe: one thread owns a Profiler.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "agent/aggregate/attribution.h"
#include "agent/discovery/process_registry.h"
#include "agent/guard/memory_budget.h"
#include "agent/profiler/phase_clock.h"
#include "agent/profiler/window.h"
#include "agent/sample/sampler.h"
#include "agent/stacks/unwind_registrar.h"
#include "agent/usage/usage_probes.h"
#include "common/result.h"
#include "common/sanitizer.h"

namespace tlsprof::profiler {

// What to sample and how: the flags `profile`, `demo` and `run` share
// (agent/commands/options.h maps them onto this struct).
struct SamplingOptions {
  uint32_t frequency_hz = 999;
  std::vector<pid_t> pids;  // empty: the whole host
  // Unwind user stacks of TLS processes in BPF (stack-aware attribution).
  // Off: leaf-only attribution.
  bool stacks = true;
  // Extra directories searched for separate debug files of stripped binaries
  // (<dir>/.build-id/xx/yyyy.debug, and debuglink paths under <dir>), before
  // the system's /usr/lib/debug. debuginfod is used when $DEBUGINFOD_URLS is set.
  std::vector<std::string> debug_dirs;
  // The agent's memory cap in bytes (guard/memory_budget.h); 0: none. The
  // window machinery's bound for the maps' sizes (sample::WindowMemoryBound)
  // is kept aside; files are loaded only while the rest fits.
  uint64_t memory_limit_bytes = 0;
  // Sizes of the in-kernel aggregates (sample::SamplerOptions); 0: defaults.
  uint32_t max_sample_keys = 0;
  uint32_t max_stack_keys = 0;
  // Usage telemetry (agent/usage, docs/usage.md): uprobes on the TLS
  // library files of the processes found, counting handshakes and timing
  // public-key operations. The steady state then keeps CAP_BPF and
  // CAP_PERFMON, to attach to libraries found later.
  bool usage = false;
  // The usage probes' CPU budget, as a share of the host's CPUs (0.005:
  // 0.5%); the probes are duty-cycled to stay inside it (usage/duty_cycle.h).
  // <= 0: always on.
  double usage_budget_share = 0.005;
};

struct Options {
  SamplingOptions sampling;
  // At the end of a window, re-read the maps of every process that was
  // sampled (the one-shot report: catches a dlopen late in the window). Off,
  // only processes with samples outside their known mappings are re-read,
  // which is what a long-running agent can afford every window.
  bool refresh_all_sampled = false;
  // Each window's Attribution lists its stacks (aggregate::Attribution::stacks)
  // for the folded and pprof exports; the daemon ships counts only.
  bool keep_stacks = true;
  // Least privilege: once the sampler is loaded and attached, drop every
  // capability but the steady state's (steady_state.h). Off in tests that
  // share their process with other tests.
  bool drop_capabilities = false;
  // Runs after the sampler is started (and capabilities dropped), before the
  // first processes are read: the daemon starts its threads here (metrics
  // server, shipper), after the drop, since threads keep their creator's
  // capabilities. An error stops Start().
  std::function<Status()> after_setup;
};

class Profiler {
 public:
  // Starts the sampler, drops capabilities (Options::drop_capabilities), runs
  // Options::after_setup, snapshots the processes that exist now (and registers
  // those with a TLS library with the unwinder), then starts the first window.
  static Result<std::unique_ptr<Profiler>> Start(const Options& options);
  // Gives loads still running on the loader up to kLoaderDrain to end, so
  // that an orderly stop leaves no thread behind; one a tenant holds longer
  // is left to run (guard::DeadlineWorker::DetachedJobs).
  ~Profiler();
  static constexpr std::chrono::milliseconds kLoaderDrain{2000};

  // Snapshots the processes that got their first samples since the last
  // call (Sampler::ForEachNewPid: nothing to walk when none is new). Call it often (every 0.5 s): a process is unwound
  // only from its snapshot on. It stops at `deadline` (the next window's close): under exec churn on a starved host the
  // processes not read yet wait for the next call, so windows still close on time (test_faults_discovery).
  void Poll(std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  // Processes found but not read yet (Poll ran out of time).
  size_t pending() const { return pending_set_.size(); }
  // Restarts the current window now, dropping what it counted so far.
  void RestartWindow();
  // Stops sampling; the current window can still be closed, and ends here.
  void Stop();
  // Ends the current window and starts the next one: reads the sampler's
  // and the probes' counts, snapshots what is new, attributes the samples
  // and describes the processes, the host and the agent's own cost, so that
  // the Window is all a sink needs (window.h).
  Window CloseWindow();

  sample::Sampler& sampler() { return *sampler_; }
  const discovery::ProcessRegistry& registry() const { return registry_; }
  const stacks::UnwindRegistrar* registrar() const { return registrar_ ? &*registrar_ : nullptr; }
  const Options& options() const { return options_; }
  const guard::MemoryBudget& memory_budget() const { return *budget_; }
  // The CPU clock of the thread that owns the profiler, per phase: the
  // window loop charges its sinks here (AgentPhase::kSinks), and each Window's
  // AgentCost::phases is what it counted since the previous close.
  PhaseClock& phases() { return phases_; }
  // Null unless Options::usage.
  const usage::UsageProbes* usage() const { return usage_.get(); }
  usage::UsageProbes* usage() { return usage_.get(); }

 private:
  Profiler(const Options& options, std::unique_ptr<sample::Sampler> sampler);
  void Discover(pid_t pid);
  // Registers a TLS process with the BPF unwinder (with stacks on).
  void Register(pid_t pid, const discovery::ProcessSnapshot& snap);
  // Attaches the usage probes to the process's TLS library files (each file
  // once, for every process).
  void AttachUsage(const discovery::ProcessSnapshot& snap);
  static int64_t UnixNowNs();
  // Waits for files to load (or unwind tables to build) end by `deadline`.
  void SetDeadline(std::chrono::steady_clock::time_point deadline);
  // Queues the processes whose late loads have ended to be read again.
  void QueueLoaded();
  // The longest a load or table build is waited for (guard/deadline.h);
  // slower ones finish on the loader thread and are used from the next
  // Poll. The close of a window waits for them kCloseLoadWait at most. Both
  // are the release build's times the sanitizer factor (common/sanitizer.h).
  static constexpr std::chrono::milliseconds kLoadWait{static_cast<int64_t>(2000 * kSanitizerTimeFactor)};
  static constexpr std::chrono::milliseconds kCloseLoadWait{static_cast<int64_t>(1000 * kSanitizerTimeFactor)};
  // The steps of CloseWindow, in order.
  void MarkWindowEnd(Window& window);
  size_t ForgetExited(const std::set<uint32_t>& sampled);
  void ReadAgain(const std::set<uint32_t>& sampled, const sample::WindowCounts& counts);
  void ReadStale(const sample::WindowCounts& counts);
  aggregate::Attribution Attribute(sample::WindowCounts& counts, AgentCost& cost);
  void Describe(Window& window) const;
  ProcessInfo DescribeProcess(uint32_t tgid, bool read_proc) const;

  Options options_;
  std::unique_ptr<sample::Sampler> sampler_;
  std::unique_ptr<usage::UsageProbes> usage_;
  std::shared_ptr<guard::MemoryBudget> budget_;  // before its users (and shared with loads on the worker)
  // Work on files a tenant can make block runs here (guard/deadline.h):
  // before its users, so it outlives them.
  guard::DeadlineWorker loader_{"tlsprof-load"};
  discovery::ProcessRegistry registry_;
  std::optional<stacks::UnwindRegistrar> registrar_;
  std::set<uint32_t> seen_;  // processes snapshotted (or tried), or pending
  // Found by Poll, not read yet: in the order found; the set is the truth
  // (CloseWindow reads the sampled ones itself and takes them out).
  std::deque<uint32_t> pending_;
  std::unordered_set<uint32_t> pending_set_;
  // Young processes read before their libraries were mapped (with usage
  // probes): read again at the next Poll. Their pid map entry is not new
  // then, so the sampler's ring of new pids would not name them again.
  std::vector<uint32_t> read_again_;
  usage::UsageSnapshot usage_mark_;  // the usage maps at the window's start
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_start_unix_ns_ = 0;
  // The agent's own CPU and the BPF program's run time at the window's start;
  // the CPU at Start().
  double cpu_mark_ = 0;
  sample::BpfRunStats bpf_mark_;
  double cpu_at_start_ = 0;
  std::string hostname_, machine_id_;  // read once, at Start()
  PhaseClock phases_;
  aggregate::StackCache stack_cache_;  // stack verdicts across windows
  // Set by Stop(): the current window ends there.
  std::optional<std::pair<std::chrono::steady_clock::time_point, int64_t>> stopped_at_;
};

}  // namespace tlsprof::profiler
