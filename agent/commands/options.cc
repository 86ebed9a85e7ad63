#include "agent/commands/options.h"

#include <fmt/format.h>

#include "agent/expose/metrics.h"

namespace tlsprof::commands {
namespace {

// What every profiling command samples.
void AddSamplingFlags(CLI::App& app, Command command, profiler::SamplingOptions& s) {
  app.add_option("--frequency", s.frequency_hz,
                 "Samples per second per CPU (bench/README.md, frequency_accuracy.py: accuracy and cost by rate)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  if (command != Command::kDemo) {
    app.add_option("--pid", s.pids, "Profile only this process (repeatable)")->check(CLI::PositiveNumber);
  }
  app.add_flag("!--no-stacks", s.stacks, "Leaf-only attribution: do not unwind user stacks");
  app.add_flag("--usage", s.usage,
               "Also count handshakes by negotiated parameters, time public-key operations and count live "
               "connections, with uprobes on the TLS library files (docs/usage.md)");
  app.add_option_function<double>(
         "--usage-budget", [&s](double percent) { s.usage_budget_share = percent / 100; },
         "With --usage: the probes' CPU budget in percent of the host's CPUs (default 0.5); above it they are "
         "attached part of the time and the counts scaled (docs/usage.md, \"Budget\"); 0: always attached")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--debug-dir", s.debug_dirs,
                 "Also look for separate debug files here (DIR/.build-id/xx/yyyy.debug), before /usr/lib/debug; "
                 "repeatable. debuginfod is queried when DEBUGINFOD_URLS is set")
      ->check(CLI::ExistingDirectory);
  app.add_option("--max-sample-keys", s.max_sample_keys,
                 "Keys one window can hold in the per-instruction sample maps (two, one per window; default 65536); "
                 "samples past it are counted as dropped")
      ->check(CLI::Range(64, 1 << 24));
  app.add_option("--max-stack-keys", s.max_stack_keys,
                 "Stacks one window can hold in the per-stack sample maps (two, one per window; default 32768); "
                 "stacks past it are counted as dropped")
      ->check(CLI::Range(16, 1 << 22));
  if (command != Command::kRun) return;
  // docs/fleet.md, "Memory".
  app.add_option("--memory-limit", s.memory_limit_bytes,
                 "Memory cap (bytes, or with a unit: 256MiB, 1GiB; 0: none). Past it, new files' symbols and unwind "
                 "tables are not loaded (counted in tlsprof_agent_memory_limited_total), shared libssl/libcrypto "
                 "excepted")
      ->transform(CLI::AsSizeValue(false))
      ->default_str(fmt::format("{}MiB", kDefaultRunMemoryLimitBytes >> 20));
}

void AddReportFlags(CLI::App& app, ReportOptions& r) {
  app.add_option("--duration", r.duration_seconds, "Seconds to profile")->check(CLI::Range(0.1, 86400.0));
  app.add_option("--format", r.format, "table or json")->check(CLI::IsMember({"table", "json"}));
  app.add_option("--output,-o", r.output, "Write the report to this file instead of stdout");
  app.add_flag("--all", r.all_rows, "In the table, print every row instead of folding the small ones into 'rest'");
  app.add_option("--folded", r.folded_path, "Also write the TLS stacks as folded stacks (flamegraph.pl)");
  app.add_option("--pprof", r.pprof_path, "Also write the TLS stacks as a pprof profile (go tool pprof)");
  // What every sink consumed, for replaying it (agent/profiler/window_record.h); for tests and bug reports.
  app.add_option("--record-window", r.record_path, "Also write the window itself as JSON (a recording)")->group("");
}

void AddRunFlags(CLI::App& app, RunOptions& r) {
  app.add_option("--collector", r.ship.collectors,
                 "Ship each window to a collector (HOST:PORT; repeat for several: the agent takes one by hashing its "
                 "identity and fails over to the next while it is down)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--interval", r.interval_seconds, "Seconds per window")->capture_default_str();
  app.add_option(
         "--metrics-listen", r.metrics_listen,
         "Serve Prometheus /metrics, and /healthz (503 once no window has closed for 3 intervals), on HOST:PORT")
      ->capture_default_str();
  app.add_option("--state-dir", r.ship.state_dir, "Instance id, sequence and spool of sealed windows")
      ->capture_default_str();
  app.add_option("--spool-max-bytes", r.ship.spool_max_bytes,
                 "Spool bound; the oldest batches are dropped (and counted) beyond it")
      ->capture_default_str();
  app.add_option("--tls-ca", r.ship.tls.ca, "PEM CA that signed the collector's certificate")->check(CLI::ExistingFile);
  app.add_option("--tls-cert", r.ship.tls.cert, "PEM certificate of this agent (its identity)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", r.ship.tls.key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  app.add_flag("--insecure", r.ship.insecure, "Ship in plaintext (tests, or a trusted network)");
  app.add_flag("!--no-container-labels", r.container_labels,
               "Do not tell containers apart: no container_id and pod_uid labels, one series per service "
               "(bounds cardinality on hosts with many short-lived containers)");
}

Status ValidateRun(const RunOptions& run) {
  const ship::ShipperOptions& o = run.ship;
  if (!(run.interval_seconds > 0)) return MakeError("--interval must be > 0 seconds (got {})", run.interval_seconds);
  if (run.interval_seconds > 3600) return MakeError("--interval must be at most 3600 seconds (the collector's limit)");
  if (auto st = expose::CheckListenAddress(run.metrics_listen); !st.ok()) return st;
  const bool any_tls = !o.tls.ca.empty() || !o.tls.cert.empty() || !o.tls.key.empty();
  const bool all_tls = !o.tls.ca.empty() && !o.tls.cert.empty() && !o.tls.key.empty();
  if (any_tls && o.insecure) return MakeError("--insecure and --tls-* exclude each other: pick one");
  if (any_tls && !all_tls) {
    return MakeError("--tls-ca, --tls-cert and --tls-key go together: give all three (missing: {}{}{})",
                     o.tls.ca.empty() ? "--tls-ca " : "", o.tls.cert.empty() ? "--tls-cert " : "",
                     o.tls.key.empty() ? "--tls-key" : "");
  }
  if (o.collectors.empty()) return OkStatus();
  if (!all_tls && !o.insecure) {
    return MakeError("--collector needs --tls-ca, --tls-cert and --tls-key (mTLS), or --insecure to ship in plaintext");
  }
  for (const std::string& c : o.collectors) {
    if (c.rfind(':') == std::string::npos) return MakeError("--collector {}: expected HOST:PORT", c);
  }
  if (o.state_dir.empty()) return MakeError("--state-dir must not be empty with --collector");
  if (o.spool_max_bytes == 0) return MakeError("--spool-max-bytes must be > 0");
  return OkStatus();
}

}  // namespace

Options DefaultOptions(Command command) {
  Options o;
  if (command == Command::kRun) {
    o.sampling.frequency_hz = 99;
    o.sampling.memory_limit_bytes = kDefaultRunMemoryLimitBytes;
    o.run.ship.state_dir = "/var/lib/tlsprof-agent";
  }
  return o;
}

void AddFlags(CLI::App& app, Command command, Options& options) {
  AddSamplingFlags(app, command, options.sampling);
  if (command == Command::kRun) {
    AddRunFlags(app, options.run);
  } else {
    AddReportFlags(app, options.report);
  }
}

Status Validate(const Options& o, Command command) {
  if (command == Command::kRun) return ValidateRun(o.run);
  if (!(o.report.duration_seconds > 0)) return MakeError("--duration must be > 0 seconds");
  return OkStatus();
}

profiler::Options ProfilerOptions(const Options& options, Command command) {
  profiler::Options po;
  po.sampling = options.sampling;
  // One window: every sampled process is read again at its end (a dlopen
  // late in the window); a long-running agent reads only what moved.
  po.refresh_all_sampled = command != Command::kRun;
  po.keep_stacks = command != Command::kRun;
  po.drop_capabilities = options.drop_capabilities;
  return po;
}

}  // namespace tlsprof::commands
