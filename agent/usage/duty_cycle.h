// DutyCycle: keeps the usage probes' CPU cost inside a budget by attaching
// them for part of the time only (docs/usage.md, "Budget").
//
// A probe hit costs the probed process a trap into the kernel (~9 us on
// this VM, 0.3-1.7 us on bare metal), whether the BPF program then does
// anything or not, so the only way to spend less is to have fewer probes
// attached. Time is cut into cycles; in each, the probes are on for a share
// d of it, at a random offset, and every event they count in that cycle
// stands for 1/d events (the BPF side adds that weight; `scale()`). d is
// planned at the cycle's start from the cost rate measured in the on-phases
// before (the calibrated cost per probed call x the calls) against the
// budget, with what was overspent or saved paid back over the next cycles.
// Because d is fixed before the cycle's events, the scaled counts are
// unbiased whatever the load does inside it (a share that followed the
// load, probes on while it is quiet, would not be). A cycle is long enough
// for an on-phase of `min_on_seconds`, so handshakes cut at the phase's
// edges are few (a 2 ms handshake in a 0.5 s phase: 0.4%).
//
// The caller owns the probes: it calls Tick() often (every ~20 ms) with the
// probes' cumulative cost, does what it answers (setting scale() in BPF
// before attaching), and reports each toggle with Toggled(). Times are
// seconds on one monotonic clock. Not thread-safe: one thread owns it.
#pragma once

#include <cstdint>
#include <random>

namespace tlsprof::usage {

class DutyCycle {
 public:
  struct Options {
    double budget = 0;              // CPU-seconds per second (0.5% of 2 CPUs: 0.01); <= 0: always on
    double min_on_seconds = 0.5;    // the shortest on-phase
    double min_cycle_seconds = 1;   // cycles are at least this long...
    double max_cycle_seconds = 60;  // ... and at most this (the share's floor: min_on / max_cycle)
    double repay_seconds = 10;      // overspending (or savings) is paid back over this long
    uint64_t seed = 0;              // the on-phases' offsets (0: from the clock)
  };
  enum class Action { kNone, kAttach, kDetach };

  DutyCycle(const Options& options, double now);

  // `cost` is the probes' cumulative cost so far (CPU-s, never decreasing).
  Action Tick(double now, double cost);
  // The caller attached (on) or detached the probes at `now`; `toggle_cost`
  // is what that took (CPU-s), paid from the budget.
  void Toggled(double now, bool on, double toggle_cost);

  bool on() const { return on_; }
  double share() const { return share_; }  // this cycle's planned d
  double scale() const { return 1.0 / share_; }
  // Cumulative: time the probes were on, what they and their toggles cost,
  // what the budget allowed, and the toggles.
  double on_seconds(double now) const;
  double cost_seconds() const { return cost_ + toggle_cost_; }
  double allowed_seconds(double now) const;
  unsigned long toggles() const { return toggles_; }
  // The cost rate measured while on (CPU-s per s; 0 before any).
  double rate() const { return rate_; }

 private:
  void PlanCycle(double now);

  Options options_;
  std::mt19937_64 random_;
  double start_;
  bool on_ = true;
  double last_cost_ = -1;  // not read yet
  double cost_ = 0, toggle_cost_ = 0;
  double balance_ = 0;  // allowed minus spent so far
  double last_now_;
  // The current cycle: [cycle_start_, cycle_end_), on in [on_begin_,
  // on_end_) and in [cycle_start_, wrap_end_) (the phase's wrapped part).
  double cycle_start_, cycle_end_, on_begin_, on_end_, wrap_end_;
  double share_ = 1;
  double cycle_on_cost_ = 0;  // the probes' cost in this cycle's on-phase
  double on_since_;
  double on_total_ = 0;
  double cycle_on_seconds_at_start_ = 0;
  double rate_ = 0;
  unsigned long toggles_ = 0;
};

}  // namespace tlsprof::usage
