// One profile of the host (or of some processes) over a fixed window: the
// path of a sample, end to end. Sample (sample::Sampler) → discover and
// symbolize (discovery::ProcessRegistry) → classify and aggregate
// (aggregate::Attributor) → report (report::BuildReport).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace tlsprof::oneshot {

struct Options {
  double duration_seconds = 10;
  uint32_t frequency_hz = 999;
  std::vector<pid_t> pids;  // empty: the whole host
  // How often new processes are snapshotted while the window runs. Short
  // enough to catch short-lived processes, long enough to cost nothing.
  double poll_seconds = 0.5;
  // Unwind user stacks of TLS processes in BPF (stack-aware attribution).
  // Off: leaf-only attribution, the foundation's behaviour (and its cost).
  bool stacks = true;
  // Extra directories searched for separate debug files of stripped binaries
  // (<dir>/.build-id/xx/yyyy.debug, and debuglink paths under <dir>), before
  // the system's /usr/lib/debug. debuginfod is used when $DEBUGINFOD_URLS is set.
  std::vector<std::string> debug_dirs;
  // Usage telemetry (docs/usage.md): handshakes, operations, handshake_cpu.
  bool usage = false;
  // Their CPU budget, a share of the host's CPUs (profiler::Options).
  double usage_budget_share = 0.005;
  // Exports of the TLS stacks; empty: not written.
  std::string folded_path;
  std::string pprof_path;
  // Least privilege after set-up (agent/profiler/steady_state.h); main.cc
  // turns it on.
  bool drop_capabilities = false;
  // Sizes of the in-kernel aggregates (sample::SamplerOptions); 0: defaults.
  uint32_t max_sample_keys = 0;
  uint32_t max_stack_keys = 0;
};

// Runs the profile and returns the report document. `stop` ends the window
// early (SIGINT/SIGTERM); the report then covers the time actually profiled.
Result<nlohmann::json> Run(const Options& options, const std::atomic<bool>& stop);

}  // namespace tlsprof::oneshot
