// DutyCycle: keeps the usage probes' CPU cost inside a budget by attaching
// them for part of the time only (docs/usage.md, "Budget").
//
// A probe hit costs the probed process a trap into the kernel (docs/usage.md
// gives figures), whether the BPF program then does anything or not, so the only way to spend less is to have fewer
// probes attached. Time is cut into cycles; in each, events are counted for a share d of it (the on-phase, at a random
// offset), and every event counted in that cycle stands for 1/d events (the BPF side adds that weight; `gate()`). An
// event counts by when it *began* (a handshake's first step, an operation's entry): the probes stay attached
// `grace_seconds` past the phase's close so that what began inside it can end, and what began before the attach never
// counts, so the phase's edges lose nothing. d is planned at the cycle's start from the cost rate measured while
// attached (the calibrated cost per probed call x the calls) against the budget, with what was overspent or saved paid
// back over the next cycles. Because d is fixed before the cycle's events, the scaled counts are unbiased whatever the
// load does inside it (a share that followed the load, probes on while it is quiet, would not be). The one exception is
// a cycle at share 1, where everything counts: it ends as soon as it has spent its budget, so a load that jumps is
// measured within 100 ms (next_tick()).
//
// The estimate's error: each sampled cycle's weighted count e_c varies
// with where its phase fell and with the load's changes inside the cycle.
// Its variance is taken from the cycle before, (L_c (r_c - r_prev))^2 / 2
// on the per-second rates r (the successive-difference estimator of
// systematic sampling; not halved after a share-1 cycle, which has no
// error of its own; it counts real changes of the load as error, so it
// errs on the safe side), and never below the binomial e_c (1/d - 1). A
// difference speaks for both cycles: the one before is raised to it too
// (a load that stopped inside it, its phase before the stop, showed no
// change there).
//
// The caller owns the probes: it calls Tick() at next_tick() with the
// probes' cumulative cost and weighted count, does what it answers (setting
// gate() in BPF after), and reports each toggle with Toggled(). Times are
// seconds on one monotonic clock. Not thread-safe: one thread owns it.
#pragma once

#include <cstdint>
#include <random>

namespace tlsprof::usage {

class DutyCycle {
 public:
  struct Options {
    double budget = 0;               // CPU-seconds per second (0.5% of 2 CPUs: 0.01); <= 0: always on
    double min_on_seconds = 0.05;    // the shortest on-phase
    double grace_seconds = 0.03;     // attached past the phase's close, for what began in it to end
    double min_cycle_seconds = 1;    // cycles are at least this long...
    double max_cycle_seconds = 30;   // ... and at most this (the share's floor: min_on / max_cycle)
    double repay_seconds = 10;       // overspending (or savings) is paid back over this long
    double watch_seconds = 0.02;     // Tick() period while a share-1 cycle is attached and near its budget...
    double max_watch_seconds = 0.1;  // ... and far from it (see next_tick())
    double idle_tick_seconds = 1;    // the longest gap between Tick()s
    uint64_t seed = 0;               // the on-phases' offsets (0: from the clock)
  };
  enum class Action { kNone, kAttach, kDetach };

  DutyCycle(const Options& options, double now);

  // `cost`: the probes' cumulative cost so far (CPU-s, never decreasing);
  // `weighted`: the cumulative weighted count of the events the error is
  // stated for (handshakes), for the error's variance.
  Action Tick(double now, double cost, double weighted = 0);
  // The caller attached (on) or detached the probes at `now`; `toggle_cost`
  // is what that took (CPU-s), paid from the budget.
  void Toggled(double now, bool on, double toggle_cost);
  // When Tick() next wants to toggle (or a cycle ends), if nothing changes.
  double next_change() const;
  // When the caller should call Tick() next: at next_change(), at least
  // every idle_tick_seconds, and while a share-1 cycle is attached (the one
  // cycle that ends on what it spent) when a quarter of what it has left
  // would be spent at four times the rate measured (or the budget's), within
  // [watch_seconds, max_watch_seconds]. A sampled cycle's decisions are all
  // planned, so its on-phase is not watched: its cost is read whole at the
  // phase's edges. Each tick is a wake-up and a map read: ticking every
  // 20 ms while attached was most of the agent's --usage cost
  // (bench/README.md).
  double next_tick() const;

  bool on() const { return on_; }
  double share() const { return share_; }  // this cycle's planned d

  // Where events beginning now count, and what each stands for: the planned
  // on-phase part that holds `now`, from when the probes were actually on
  // (an attach made late by a busy host shortens it, and the weight makes
  // up for it). Closed in the grace period and while off. Without a
  // budget, or at a share of 1: always open, weight 1.
  struct Gate {
    double open = 0, close = 0;  // seconds on the caller's clock; open == close: closed
    double weight = 1;
  };
  Gate gate(double now) const;
  // Cumulative: time the probes were attached, time events were counted
  // in (the gate's), what the probes and their toggles cost, what the
  // budget allowed, and the toggles.
  double on_seconds(double now) const;
  double counted_seconds(double now) const;
  double cost_seconds() const { return cost_ + toggle_cost_; }
  double allowed_seconds(double now) const;
  unsigned long toggles() const { return toggles_; }
  // The cost rate measured while on (CPU-s per s; 0 before any).
  double rate() const { return rate_; }
  // The variance of the weighted count (events^2): cumulative over the
  // cycles completed, and that of the cycle under way given `weighted` now.
  double variance() const { return variance_; }
  double pending_variance(double now, double weighted) const;

 private:
  // A cycle ends: its error, the cost rates it measured.
  void EndCycle(double now, double weighted);
  // The next one: its share, length and phase.
  void PlanCycle(double now);
  bool Wanted(double now) const;
  // Attached time the gate left out (grace, a detach's or a late attach's
  // part): counted time is on_seconds() minus it, so that it is the
  // attached time exactly while always on.
  double uncounted_seconds(double now) const;
  void FoldUncounted(double now);

  Options options_;
  std::mt19937_64 random_;
  double start_;
  bool on_ = true;
  double last_cost_ = -1;  // not read yet
  double cost_ = 0, toggle_cost_ = 0;
  double balance_ = 0;  // allowed minus spent so far
  double last_now_;
  // The current cycle: [cycle_start_, cycle_end_), counting in [on_begin_,
  // on_end_) and in [cycle_start_, wrap_end_) (the phase's wrapped part).
  double cycle_start_, cycle_end_, on_begin_, on_end_, wrap_end_;
  double grace_until_ = 0;  // attached until then (the last phase's grace)
  double share_ = 1;
  double cycle_cost_ = 0;  // the probes' cost in this cycle (while attached, and detaches' tails)
  double on_since_;
  double on_total_ = 0;
  double cycle_on_seconds_at_start_ = 0;
  double rate_ = 0;         // the probes' cost per second attached
  double per_counted_ = 0;  // ... per second counted, in sampled cycles (0: none yet)
  double cycle_counted_at_start_ = 0;
  double toggle_avg_ = 0;  // a toggle's cost (CPU-s), smoothed
  unsigned long toggles_ = 0;
  double uncounted_ = 0, uncounted_at_ = 0;  // uncounted_seconds() up to uncounted_at_
  // The error's bookkeeping.
  double cycle_weighted_start_ = 0;
  double variance_ = 0;
  bool have_prev_ = false;     // a cycle before this one
  bool prev_sampled_ = false;  // ... sampled (share < 1), not counted whole
  double prev_rate_ = 0;       // its weighted count per second
  double prev_variance_ = 0;   // and its variance, as counted
};

}  // namespace tlsprof::usage
