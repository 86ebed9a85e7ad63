// tlsprof-agent: command-line entry point. The work happens in the libraries
// beside this file; main only parses flags, wires signals and prints.
#include <linux/capability.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "agent/classify/classify.h"
#include "agent/daemon/daemon.h"
#include "agent/oneshot/oneshot.h"
#include "agent/report/report.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// The agent needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN, or root). Checked
// up front so that an unprivileged run fails with advice, not a libbpf errno.
bool HasProfilingPrivileges() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return geteuid() == 0;
  auto has = [&data](int cap) { return (data[cap / 32].effective & (1u << (cap % 32))) != 0; };
  constexpr int kCapSysAdmin = 21, kCapPerfmon = 38, kCapBpf = 39;
  return has(kCapSysAdmin) || (has(kCapBpf) && has(kCapPerfmon));
}

// What `profile`, `demo` and `run` check before they load BPF: the --pid
// processes exist and the agent may profile; then SIGINT/SIGTERM end the
// window (or the daemon) gracefully.
tlsprof::Status PrepareToProfile(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return tlsprof::MakeError("--pid {}: no such process", pid);
  }
  if (!HasProfilingPrivileges()) {
    return tlsprof::MakeError("profiling needs root, or CAP_BPF and CAP_PERFMON: run it with sudo");
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return tlsprof::OkStatus();
}

int Fail(const std::string& message) {
  std::cerr << "tlsprof-agent: " << message << "\n";
  return 1;
}

int PrintReport(const nlohmann::json& report, const std::string& format, const tlsprof::report::TableOptions& table,
                const std::string& output) {
  std::string text = format == "json" ? report.dump(2) + "\n" : tlsprof::report::RenderTable(report, table);
  if (output.empty() || output == "-") {
    std::cout << text << std::flush;
    return 0;
  }
  std::ofstream out(output);
  if (!out || !(out << text) || !out.flush()) return Fail("cannot write the report to " + output);
  return 0;
}

// The demo: starts the project's demo TLS workload (build/bin/tlsprof-demo,
// beside this binary), profiles the host while it runs, and stops it.
struct DemoWorkload {
  pid_t pid = -1;
  ~DemoWorkload() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

tlsprof::Status StartDemo(DemoWorkload& demo, double seconds) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  fs::path binary = self.parent_path() / "tlsprof-demo";
  if (ec || !fs::exists(binary)) {
    return tlsprof::MakeError("the demo workload {} is missing; build it with 'cmake --build build'", binary.string());
  }
  fs::path ready = fs::temp_directory_path() / fmt::format("tlsprof-demo-{}.ready", getpid());
  fs::remove(ready, ec);
  std::string duration = fmt::format("{:.0f}", seconds);
  pid_t pid = fork();
  if (pid < 0) return tlsprof::MakeError("fork: {}", std::strerror(errno));
  if (pid == 0) {
    // The demo's summary line goes to stderr: stdout carries only the report.
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execl(binary.c_str(), binary.c_str(), "--duration", duration.c_str(), "--ready-file", ready.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  demo.pid = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(ready, ec)) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      demo.pid = -1;
      return tlsprof::MakeError("the demo workload exited before it was ready (status {})", status);
    }
    if (std::chrono::steady_clock::now() > deadline)
      return tlsprof::MakeError("the demo workload was not ready in 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs::remove(ready, ec);
  return tlsprof::OkStatus();
}

// `tlsprof-agent classify`: the rules table as a filter, so that bench/ can
// classify another profiler's symbols (perf's) exactly as the agent does.
int ClassifyNames(const std::string& family_name) {
  using tlsprof::classify::Family;
  Family family = family_name == "go"          ? Family::kGo
                  : family_name == "boringssl" ? Family::kBoringSSL
                                               : Family::kOpenSSL;
  std::string name;
  while (std::getline(std::cin, name)) {
    auto c = tlsprof::classify::ClassifySymbol(family, name);
    if (c) {
      std::cout << name << '\t' << tlsprof::classify::BucketName(c->bucket) << '\t' << c->algorithm << '\n';
    } else {
      std::cout << name << "\t-\t-\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tlsprof-agent: how much of this host's CPU goes to TLS, and to which crypto"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));

  tlsprof::oneshot::Options options;
  std::string format = "table";
  tlsprof::report::TableOptions table;
  std::string output;
  auto add_profile_flags = [&](CLI::App* cmd) {
    cmd->add_option("--duration", options.duration_seconds, "Seconds to profile")->check(CLI::Range(0.1, 86400.0));
    cmd->add_option("--frequency", options.frequency_hz, "Samples per second per CPU")->check(CLI::Range(1, 10000));
    cmd->add_option("--format", format, "table or json")->check(CLI::IsMember({"table", "json"}));
    cmd->add_option("--output,-o", output, "Write the report to this file instead of stdout");
    cmd->add_flag("--all", table.all_rows,
                  "In the table, print every row instead of folding the small ones into 'rest'");
    cmd->add_option("--folded", options.folded_path, "Also write the TLS stacks as folded stacks (flamegraph.pl)");
    cmd->add_option("--pprof", options.pprof_path, "Also write the TLS stacks as a pprof profile (go tool pprof)");
    cmd->add_flag("!--no-stacks", options.stacks, "Leaf-only attribution: do not unwind user stacks");
    cmd->add_flag("--usage", options.usage,
                  "Also count handshakes by negotiated parameters and time public-key operations, with uprobes on "
                  "the TLS library files (docs/usage.md)");
    cmd->add_option_function<double>(
           "--usage-budget", [&](double percent) { options.usage_budget_share = percent / 100; },
           "With --usage: the probes' CPU budget in percent of the host's CPUs (default 0.5); above it they are "
           "attached part of the time and the counts scaled (docs/usage.md, \"Budget\"); 0: always attached")
        ->check(CLI::Range(0.0, 100.0));
    cmd->add_option("--debug-dir", options.debug_dirs,
                    "Also look for separate debug files here (DIR/.build-id/xx/yyyy.debug), before /usr/lib/debug; "
                    "repeatable. debuginfod is queried when DEBUGINFOD_URLS is set")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--max-sample-keys", options.max_sample_keys,
                    "Entries of the per-instruction sample map (default 131072); samples past it are counted as "
                    "dropped")
        ->check(CLI::Range(64, 1 << 24));
    cmd->add_option("--max-stack-keys", options.max_stack_keys,
                    "Entries of the per-stack sample map (default 65536); stacks past it are counted as dropped")
        ->check(CLI::Range(16, 1 << 22));
  };
  CLI::App* profile = app.add_subcommand("profile", "Profile the host (or --pid processes) once and print a report");
  add_profile_flags(profile);
  profile->add_option("--pid", options.pids, "Profile only this process (repeatable)")->check(CLI::PositiveNumber);
  CLI::App* demo = app.add_subcommand("demo", "Run the bundled demo TLS workload and profile the host while it runs");
  add_profile_flags(demo);

  // `run`: the daemon (docs/fleet.md, "Agent daemon").
  tlsprof::daemon::Options run_options;
  CLI::App* run = app.add_subcommand("run", "Profile continuously in windows; serve /metrics and ship to a collector");
  // CLI11 2.1 reads a config file only for the app that owns the option, so
  // --config belongs to the top level and run's keys go under [run] (or are
  // spelled run.KEY); `run --config F` reaches it by fallthrough.
  app.set_config("--config", "",
                 "Read options from FILE: CLI11 config format, run's options under a [run] section "
                 "(interval = 10); the command line wins");
  // A key that is no option (a typo, or run's key outside [run]) is an error, not silently ignored.
  app.allow_config_extras(CLI::config_extras_mode::error);
  run->fallthrough();
  run->add_option("--collector", run_options.collector, "Ship each window to this collector (HOST:PORT)");
  run->add_option("--interval", run_options.interval_seconds, "Seconds per window")->capture_default_str();
  run->add_option(
         "--frequency", run_options.frequency_hz,
         "Samples per second per CPU. 99 Hz: per 10 s window, TLS rate within 3% and each bucket and algorithm "
         "within ~3 pp of ground truth, for 0.29% of a core (49 Hz: 8% and 5-6 pp for 0.24%; 999 Hz: "
         "1-2 pp for 0.58%; bench/README.md, 'frequency_accuracy.py')")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  run->add_option("--metrics-listen", run_options.metrics_listen, "Serve Prometheus /metrics on HOST:PORT")
      ->capture_default_str();
  run->add_option("--state-dir", run_options.state_dir, "Instance id, sequence and spool of sealed windows")
      ->capture_default_str();
  run->add_option("--spool-max-bytes", run_options.spool_max_bytes,
                  "Spool bound; the oldest batches are dropped (and counted) beyond it")
      ->capture_default_str();
  run->add_option("--tls-ca", run_options.tls_ca, "PEM CA that signed the collector's certificate")
      ->check(CLI::ExistingFile);
  run->add_option("--tls-cert", run_options.tls_cert, "PEM certificate of this agent (its identity)")
      ->check(CLI::ExistingFile);
  run->add_option("--tls-key", run_options.tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  run->add_flag("--insecure", run_options.insecure, "Ship in plaintext (tests, or a trusted network)");
  run->add_option("--pid", run_options.pids, "Profile only this process (repeatable)")->check(CLI::PositiveNumber);
  run->add_flag("!--no-stacks", run_options.stacks, "Leaf-only attribution: do not unwind user stacks");
  run->add_flag("!--no-container-labels", run_options.container_labels,
                "Do not tell containers apart: no container_id and pod_uid labels, one series per service "
                "(bounds cardinality on hosts with many short-lived containers)");
  run->add_flag("--usage", run_options.usage,
                "Also count handshakes by negotiated parameters, time public-key operations and count live "
                "connections per service, with uprobes on the TLS library files (docs/usage.md); keeps "
                "CAP_SYS_ADMIN to probe libraries found later");
  run->add_option_function<double>(
         "--usage-budget", [&](double percent) { run_options.usage_budget_share = percent / 100; },
         "With --usage: the probes' CPU budget in percent of the host's CPUs (default 0.5); above it they are "
         "attached part of the time and the counts scaled (docs/usage.md, \"Budget\"); 0: always attached")
      ->check(CLI::Range(0.0, 100.0));
  run->add_option("--debug-dir", run_options.debug_dirs, "Also look for separate debug files here (repeatable)")
      ->check(CLI::ExistingDirectory);
  // docs/fleet.md, "Memory".
  run->add_option("--memory-limit", run_options.memory_limit_bytes,
                  "Memory cap (bytes, or with a unit: 256MiB, 1GiB; 0: none). Past it, new files' symbols and unwind "
                  "tables are not loaded (counted in tlsprof_agent_memory_limited_total), shared libssl/libcrypto "
                  "excepted")
      ->transform(CLI::AsSizeValue(false))
      ->default_str(fmt::format("{}MiB", tlsprof::daemon::Options::kDefaultMemoryLimitBytes >> 20));
  run->add_option("--max-sample-keys", run_options.max_sample_keys,
                  "Entries of the per-instruction sample map (default 131072); samples past it are counted as "
                  "dropped. Smaller bounds the memory a window needs")
      ->check(CLI::Range(64, 1 << 24));
  run->add_option("--max-stack-keys", run_options.max_stack_keys,
                  "Entries of the per-stack sample map (default 65536, ~1.7 KiB of agent memory each at a full "
                  "window); stacks past it are counted as dropped")
      ->check(CLI::Range(16, 1 << 22));

  std::string family_name = "openssl";
  CLI::App* classify_cmd =
      app.add_subcommand("classify", "Classify symbol names read from stdin (one per line) with the rules table");
  classify_cmd->add_option("--family", family_name, "openssl, boringssl or go")
      ->check(CLI::IsMember({"openssl", "boringssl", "go"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (classify_cmd->parsed()) return ClassifyNames(family_name);

  auto logger = spdlog::stderr_color_mt("tlsprof");
  spdlog::set_default_logger(logger);
  // The daemon logs its windows at info level (docs/fleet.md).
  if (run->parsed() && app.get_option("--log-level")->count() == 0) log_level = "info";
  spdlog::set_level(spdlog::level::from_str(log_level));

  if (run->parsed()) {
    // Flag errors before the privilege check: they are the user's to fix first.
    if (auto st = tlsprof::daemon::Validate(run_options); !st.ok()) return Fail(st.error().message);
    if (auto st = PrepareToProfile(run_options.pids); !st.ok()) return Fail(st.error().message);
    run_options.drop_capabilities = true;
    auto status = tlsprof::daemon::Run(run_options, g_stop);
    if (!status.ok()) return Fail(status.error().message);
    return 0;
  }

  if (auto st = PrepareToProfile(options.pids); !st.ok()) return Fail(st.error().message);

  DemoWorkload workload;
  if (demo->parsed()) {
    auto started = StartDemo(workload, options.duration_seconds + 10);
    if (!started.ok()) return Fail(started.error().message);
  }
  options.drop_capabilities = true;
  auto report = tlsprof::oneshot::Run(options, g_stop);
  if (!report.ok()) return Fail(report.error().message);
  return PrintReport(*report, format, table, output);
}
