// The agent's options: one tree for every command, filled by the command
// line and, for `run`, by the config file (CLI11 maps both onto it), and
// checked by one Validate(). Plain values; not synchronized.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "agent/profiler/profiler.h"
#include "agent/ship/shipper.h"
#include "common/result.h"
#include "common/sanitizer.h"

namespace tlsprof::commands {

enum class Command { kProfile, kDemo, kRun };

// `profile` and `demo`: one window, then a report.
struct ReportOptions {
  double duration_seconds = 10;
  std::string format = "table";  // table or json
  std::string output;            // "" or "-": stdout
  std::string folded_path;       // "": not written
  std::string pprof_path;
  std::string record_path;  // the Window as a recording (window_record.h); "": not written
  bool all_rows = false;    // the table prints every row (--all)
};

// `run`: windows for as long as it runs, /metrics, a collector.
struct RunOptions {
  double interval_seconds = 10;
  std::string metrics_listen = "127.0.0.1:9464";
  // The collector (empty: /metrics only), the state directory, the spool's
  // bound and the mTLS files, as the shipper takes them.
  ship::ShipperOptions ship;  // state_dir: /var/lib/tlsprof-agent by default
  // Services in containers carry their container's id and pod's UID
  // (docs/fleet.md, "Services").
  bool container_labels = true;
  double flush_seconds = 10;  // at stop, how long the shipper may empty the spool
};

struct Options {
  profiler::SamplingOptions sampling;
  ReportOptions report;
  RunOptions run;
  double poll_seconds = 0.5;  // how often new processes are snapshotted
  // Least privilege after set-up (agent/profiler/steady_state.h): main turns
  // it on; tests that run a command in their own process may not.
  bool drop_capabilities = false;
};

// A command's defaults: `run` samples at 99 Hz under a memory cap (512 MiB,
// kSanitizerMemoryFactor times that in the ASan build); `profile` and `demo`
// at 999 Hz without one.
inline constexpr uint64_t kDefaultRunMemoryLimitBytes = (512ull << 20) * kSanitizerMemoryFactor;
Options DefaultOptions(Command command);

// Registers the command's flags on `app`, bound to `options`.
void AddFlags(CLI::App& app, Command command, Options& options);

// Checks the options' consistency (no I/O): an error says which flag is
// wrong and what to do.
Status Validate(const Options& options, Command command);

// The profiler's options for a command.
profiler::Options ProfilerOptions(const Options& options, Command command);

}  // namespace tlsprof::commands
