// `tlsprof-agent run`: continuous profiling in windows (docs/fleet.md, "Agent
// daemon"). Every interval the profiler's window is closed, encoded as a
// tlsprof.v1.AgentReport, counted into the agent's /metrics and, with a
// collector, sealed into the spool for the shipper. A stop request seals the
// partial window and gives the shipper up to 10 s to empty the spool.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/sanitizer.h"

namespace tlsprof::daemon {

struct Options {
  std::string collector;  // HOST:PORT; empty: /metrics only
  double interval_seconds = 10;
  uint32_t frequency_hz = 99;  // bench/README.md, frequency_accuracy.py
  std::string metrics_listen = "127.0.0.1:9464";
  std::string state_dir = "/var/lib/tlsprof-agent";
  uint64_t spool_max_bytes = 64ull << 20;
  std::string tls_ca, tls_cert, tls_key;
  bool insecure = false;
  std::vector<pid_t> pids;  // empty: the whole host
  bool stacks = true;
  // Services in containers carry their container's id and pod's UID
  // (docs/fleet.md, "Services"); --no-container-labels turns that off.
  bool container_labels = true;
  std::vector<std::string> debug_dirs;
  double poll_seconds = 0.5;  // how often new processes are snapshotted
  double flush_seconds = 10;  // at stop, how long the shipper may empty the spool
  // Least privilege after set-up (agent/profiler/steady_state.h); main.cc
  // turns it on, tests that run the daemon in their own process may not.
  bool drop_capabilities = false;
  // The memory cap and the in-kernel aggregates' sizes (docs/fleet.md,
  // "Memory"; profiler::Options). 0: no cap, default sizes. The default is
  // 512 MiB (kSanitizerMemoryFactor times that in the ASan build).
  static constexpr uint64_t kDefaultMemoryLimitBytes = (512ull << 20) * kSanitizerMemoryFactor;
  uint64_t memory_limit_bytes = kDefaultMemoryLimitBytes;
  uint32_t max_sample_keys = 0;
  uint32_t max_stack_keys = 0;
  // Usage telemetry (docs/usage.md, docs/fleet.md "Usage telemetry"):
  // handshakes, public-key operations and live connections per service,
  // from uprobes on the TLS libraries (profiler::Options::usage).
  bool usage = false;
  // Their CPU budget, a share of the host's CPUs (profiler::Options); <= 0:
  // always attached.
  double usage_budget_share = 0.005;
};

// Checks the options' consistency (no I/O): an error says which flag is wrong
// and what to do.
Status Validate(const Options& options);

// Runs until `stop` is set. Errors at start (a flag, a port in use, no
// privileges) are returned; later failures of one window are logged.
Status Run(const Options& options, const std::atomic<bool>& stop);

}  // namespace tlsprof::daemon
