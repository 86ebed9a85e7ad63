// PhaseClock: where the agent's own CPU goes, per phase of the window cycle
// (docs/report-schema.md, "agent"; tlsprof_agent_phase_cpu_seconds_total).
//
// The thread that closes windows charges its CPU time (CLOCK_THREAD_CPUTIME_ID)
// to the phase it is in; Enter() switches phase for a scope and nests (a
// Discover() inside a Poll charges its unwind registration to
// kUnwindRegistration, the rest to kDiscovery). Time outside every scope is
// kLoop: the window loop's own work. What the other threads of the agent used
// (the metrics server, the shipper, the usage probes' duty cycle) is the
// process's CPU minus this thread's: kOtherThreads, set by Take().
//
// A clock read is a system call (ThreadCpuSeconds): scopes are per window
// step, never per sample or stack.
// Not thread-safe: the thread that constructs a PhaseClock is the only one
// that may use it.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "common/self_cpu.h"

namespace tlsprof::profiler {

enum class AgentPhase : size_t {
  kLoop,                // the window loop outside the phases below
  kDiscovery,           // finding processes, reading /proc/PID/maps, loading symbols
  kUnwindRegistration,  // building unwind tables and writing them to the BPF maps
  kMapRead,             // reading the sampler's and the probes' maps
  kAttribution,         // symbolizing, classifying and aggregating the window's samples and stacks
  kDescribe,            // the window's processes, host and health, read at its close
  kSinks,               // the sinks: report, exports, encoding, /metrics, the shipper's spool
  kOtherThreads,        // every other thread of the agent
};
inline constexpr size_t kAgentPhaseCount = 8;

// The phases' names, as the JSON report and the metric's `phase` label spell them.
constexpr std::string_view AgentPhaseName(AgentPhase phase) {
  constexpr std::array<std::string_view, kAgentPhaseCount> kNames = {
      "loop", "discovery", "unwind_registration", "map_read", "attribution", "describe", "sinks", "other_threads"};
  return kNames[static_cast<size_t>(phase)];
}

// CPU seconds per phase.
using AgentPhaseSeconds = std::array<double, kAgentPhaseCount>;

class PhaseClock {
 public:
  PhaseClock() : last_(ThreadCpuSeconds()), process_mark_(SelfCpuSeconds()), thread_mark_(last_) {}
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  // Charges the time so far to the current phase, then runs the scope in
  // `phase`; its end charges the scope and returns to the phase before.
  class Scope {
   public:
    Scope(PhaseClock& clock, AgentPhase phase) : clock_(clock), outer_(clock.Switch(phase)) {}
    ~Scope() { clock_.Switch(outer_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseClock& clock_;
    AgentPhase outer_;
  };
  [[nodiscard]] Scope Enter(AgentPhase phase) { return Scope(*this, phase); }

  // Every phase's CPU since the previous Take() (since construction for the
  // first), kOtherThreads included; the current phase keeps running.
  AgentPhaseSeconds Take() {
    Switch(current_);
    const double process = SelfCpuSeconds();
    const double thread = last_;
    AgentPhaseSeconds out = seconds_;
    // Both clocks tick at different granularities (getrusage: microseconds,
    // accounted at ticks): a small negative difference is rounding.
    const double others = (process - process_mark_) - (thread - thread_mark_);
    out[static_cast<size_t>(AgentPhase::kOtherThreads)] = others > 0 ? others : 0;
    seconds_ = {};
    process_mark_ = process;
    thread_mark_ = thread;
    return out;
  }

 private:
  // Charges the time since the last switch to the current phase and makes
  // `phase` current; returns the phase it leaves.
  AgentPhase Switch(AgentPhase phase) {
    const double now = ThreadCpuSeconds();
    seconds_[static_cast<size_t>(current_)] += now - last_;
    last_ = now;
    const AgentPhase left = current_;
    current_ = phase;
    return left;
  }

  AgentPhase current_ = AgentPhase::kLoop;
  double last_;
  AgentPhaseSeconds seconds_{};
  double process_mark_, thread_mark_;  // at the last Take()
};

}  // namespace tlsprof::profiler
