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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "agent/classify/classify.h"
#include "agent/commands/commands.h"
#include "agent/guard/deadline.h"

namespace {

tlsprof::StopSignal g_stop;

void OnSignal(int) { g_stop.Request(); }

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

// `profile`, `demo` and `run`, each with its own options tree (options.h).
struct ProfilingCommand {
  tlsprof::commands::Command command;
  CLI::App* app = nullptr;
  tlsprof::commands::Options options;
};

int main(int argc, char** argv) {
  using tlsprof::commands::Command;
  CLI::App app{"tlsprof-agent: how much of this host's CPU goes to TLS, and to which crypto"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  auto command = [&app](Command command, const char* name, const char* help) {
    return ProfilingCommand{command, app.add_subcommand(name, help), tlsprof::commands::DefaultOptions(command)};
  };
  ProfilingCommand commands[] = {
      command(Command::kProfile, "profile", "Profile the host (or --pid processes) once and print a report"),
      command(Command::kDemo, "demo", "Run the bundled demo TLS workload and profile the host while it runs"),
      command(Command::kRun, "run", "Profile continuously in windows; serve /metrics and ship to a collector"),
  };
  for (ProfilingCommand& c : commands) tlsprof::commands::AddFlags(*c.app, c.command, c.options);
  // CLI11 2.1 reads a config file only for the app that owns the option, so
  // --config belongs to the top level and run's keys go under [run] (or are
  // spelled run.KEY); `run --config F` reaches it by fallthrough.
  app.set_config("--config", "",
                 "Read options from FILE: CLI11 config format, run's options under a [run] section "
                 "(interval = 10); the command line wins");
  // A key that is no option (a typo, or run's key outside [run]) is an error, not silently ignored.
  app.allow_config_extras(CLI::config_extras_mode::error);
  commands[2].app->fallthrough();

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

  ProfilingCommand& c = *std::find_if(std::begin(commands), std::end(commands),
                                      [](const ProfilingCommand& c) { return c.app->parsed(); });
  auto logger = spdlog::stderr_color_mt("tlsprof");
  spdlog::set_default_logger(logger);
  // The daemon logs its windows at info level (docs/fleet.md).
  if (c.command == Command::kRun && app.get_option("--log-level")->count() == 0) log_level = "info";
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Flag errors before the privilege check: they are the user's to fix first.
  if (auto st = tlsprof::commands::Validate(c.options, c.command); !st.ok()) return Fail(st.error().message);
  if (auto st = PrepareToProfile(c.options.sampling.pids); !st.ok()) return Fail(st.error().message);
  c.options.drop_capabilities = true;
  const tlsprof::Status status = c.command == Command::kRun    ? tlsprof::commands::Run(c.options, g_stop)
                                 : c.command == Command::kDemo ? tlsprof::commands::Demo(c.options, g_stop)
                                                               : tlsprof::commands::Profile(c.options, g_stop);
  const int code = status.ok() ? 0 : Fail(status.error().message);
  // A load a tenant blocks (guard/deadline.h) may still run on a detached
  // thread, and it logs: static destructors (spdlog's registry) must not
  // run under it. Everything the agent keeps is written by now.
  if (const int running = tlsprof::guard::DeadlineWorker::DetachedJobs(); running > 0) {
    spdlog::warn("{} file loads a tenant holds up are still running; exiting without waiting for them", running);
    spdlog::default_logger()->flush();
    std::cout.flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
