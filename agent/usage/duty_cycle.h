// DutyCycle: keeps the usage probes' CPU cost inside a budget by attaching
// them for part of the time only (docs/usage.md, "Budget").
//
// A probe hit costs the probed process a trap into the kernel (~9 us on
// this VM, 0.3-1.7 us on bare metal), whether the BPF program then does
// anything or not, so the only way to spend less is to have fewer probes
// attached. A token bucket decides when: tokens (CPU-seconds) accrue at the
// budget's rate up to `capacity_seconds` of it; while attached, the probes'
// measured cost (hits x the calibrated cost per call) and each attach or
// detach (the agent's own CPU for it) are taken out (the bucket holds at
// least one shortest on-phase's worth). At zero the probes are
// detached; they are attached again once the bucket holds enough for an
// on-phase of `min_on_seconds` at the rate last measured. So at a cost rate
// R above the budget B the probes are on a share B/R of the time, in phases
// of about min_on_seconds, and always on below it.
//
// The caller owns the probes: it calls Tick() often (every ~20 ms) with the
// probes' cumulative cost, does what it answers, and reports each toggle
// with Toggled(). Times are seconds on one monotonic clock. Not
// thread-safe: one thread owns it.
#pragma once

namespace tlsprof::usage {

class DutyCycle {
 public:
  struct Options {
    double budget = 0;            // CPU-seconds per second (0.5% of 2 CPUs: 0.01); <= 0: no budget
    double min_on_seconds = 0.2;  // the shortest on-phase worth its toggles
    double capacity_seconds = 2;  // the bucket holds this many seconds of budget (a burst)
  };
  enum class Action { kNone, kAttach, kDetach };

  DutyCycle(const Options& options, double now);

  // `cost` is the probes' cumulative cost so far (CPU-s, never decreasing).
  Action Tick(double now, double cost);
  // The caller attached (on) or detached the probes at `now`; `toggle_cost`
  // is what that took (CPU-s), paid from the bucket.
  void Toggled(double now, bool on, double toggle_cost);

  bool on() const { return on_; }
  // Cumulative: time the probes were on, what they and their toggles cost,
  // what the budget allowed, and the toggles.
  double on_seconds(double now) const;
  double cost_seconds() const { return cost_ + toggle_cost_; }
  double allowed_seconds(double now) const;
  unsigned long toggles() const { return toggles_; }
  // The cost rate measured while on (CPU-s per s; 0 before any).
  double rate() const { return rate_; }

 private:
  Options options_;
  double start_;
  bool on_ = true;
  double tokens_;
  double last_now_;
  double last_cost_ = -1;  // not read yet
  double cost_ = 0, toggle_cost_ = 0;
  double on_since_;
  double on_total_ = 0;
  double rate_ = 0;
  unsigned long toggles_ = 0;
};

}  // namespace tlsprof::usage
