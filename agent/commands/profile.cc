// `profile` and `demo`: one window, its sinks.
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "agent/commands/commands.h"
#include "agent/profiler/window_record.h"
#include "agent/report/progress.h"
#include "agent/report/sinks.h"

namespace tlsprof::commands {
namespace {

using Clock = std::chrono::steady_clock;

// Polls for new processes until the window's duration has passed or a stop
// is requested (which ends the sleep at once).
void SampleFor(profiler::Profiler& profiler, double seconds, double poll_seconds, const StopSignal& stop) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto poll = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(poll_seconds));
  for (report::Countdown countdown; !stop.requested() && Clock::now() < end;) {  // cleared however the loop ends
    countdown.Show(end - Clock::now());
    if (stop.SleepUntil(std::min(end, Clock::now() + poll))) break;
    profiler.Poll();
  }
}

std::vector<std::unique_ptr<profiler::WindowSink>> Sinks(const ReportOptions& r) {
  std::vector<std::unique_ptr<profiler::WindowSink>> sinks;
  using Stacks = report::StacksWriter;
  if (!r.folded_path.empty()) sinks.push_back(std::make_unique<Stacks>(Stacks::Format::kFolded, r.folded_path));
  if (!r.pprof_path.empty()) sinks.push_back(std::make_unique<Stacks>(Stacks::Format::kPprof, r.pprof_path));
  sinks.push_back(
      std::make_unique<report::ReportWriter>(report::ReportFormat{r.format, r.output, {.all_rows = r.all_rows}}));
  return sinks;
}

// The demo workload: started before the window, stopped with this value.
struct DemoWorkload {
  pid_t pid = -1;
  ~DemoWorkload() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

Status StartDemo(DemoWorkload& demo, double seconds) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path binary = fs::read_symlink("/proc/self/exe", ec).parent_path() / "tlsprof-demo";
  if (ec || !fs::exists(binary)) {
    return MakeError("the demo workload {} is missing; build it with 'cmake --build build'", binary.string());
  }
  const fs::path ready = fs::temp_directory_path() / fmt::format("tlsprof-demo-{}.ready", getpid());
  fs::remove(ready, ec);
  const std::string duration = fmt::format("{:.0f}", seconds);
  const pid_t pid = fork();
  if (pid < 0) return MakeError("fork: {}", std::strerror(errno));
  if (pid == 0) {
    // The demo's summary line goes to stderr: stdout carries only the report.
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execl(binary.c_str(), binary.c_str(), "--duration", duration.c_str(), "--ready-file", ready.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  demo.pid = pid;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!fs::exists(ready, ec)) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      demo.pid = -1;
      return MakeError("the demo workload exited before it was ready (status {})", status);
    }
    if (Clock::now() > deadline) return MakeError("the demo workload was not ready in 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs::remove(ready, ec);
  return OkStatus();
}

}  // namespace

Status Profile(const Options& options, const StopSignal& stop) {
  auto started = profiler::Profiler::Start(ProfilerOptions(options, Command::kProfile));
  if (!started.ok()) return started.error();
  profiler::Profiler& profiler = **started;
  // Tests wait on this line, not on a guess, before they start what the window must see.
  spdlog::info("profile: window open for {} s", options.report.duration_seconds);
  SampleFor(profiler, options.report.duration_seconds, options.poll_seconds, stop);
  profiler.Stop();
  const profiler::Window window = profiler.CloseWindow();
  if (!options.report.record_path.empty()) {
    if (auto st = profiler::WriteWindowRecord(options.report.record_path, window); !st.ok()) return st;
  }
  for (const auto& sink : Sinks(options.report)) {
    if (auto st = sink->Consume(window); !st.ok()) return st;
  }
  return OkStatus();
}

Status Demo(const Options& options, const StopSignal& stop) {
  DemoWorkload workload;
  if (auto st = StartDemo(workload, options.report.duration_seconds + 10); !st.ok()) return st;
  return Profile(options, stop);
}

}  // namespace tlsprof::commands
