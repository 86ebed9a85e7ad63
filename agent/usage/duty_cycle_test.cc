// DutyCycle on simulated probes: a steady cost below and above the budget,
// a load that comes and goes, and toggles that cost something. No
// privileges needed.
#include "agent/usage/duty_cycle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

namespace tlsprof::usage {
namespace {

struct Simulation {
  double on_seconds = 0, cost = 0, events = 0, estimated = 0;
  double variance = 0;  // the stated one, at the end
  unsigned long toggles = 0;
  double phases = 0;   // attaches
  double ticks = 0;    // Tick() calls
  double watched = 0;  // ... of them while a share-1 cycle was attached
};

// Runs `seconds` in steps of 5 ms. Events arrive at `rate(t)` per second;
// each costs `per_event` CPU-s while the probes are attached, and is
// counted, with its weight, if it began inside the gate (as the BPF side
// does: an event here is as short as a step). Each toggle costs `toggle`.
// Tick() is called as the agent's thread calls it: at the first step at or
// after next_tick() (`every_step`: at every step).
template <typename Rate>
Simulation Simulate(DutyCycle& duty, double seconds, Rate rate, double per_event, double toggle, int stall_ticks = 0,
                    int detach_ticks = 0, bool every_step = false) {
  Simulation sim;
  double cost = 0;
  int stalled = 0, detaching = 0;
  bool pending = false;  // an action not taken yet (stalled): asked again at the next step
  const double tick = 0.005;
  for (double now = 0; now < seconds; now += tick) {
    DutyCycle::Action action = DutyCycle::Action::kNone;
    if (every_step || pending || now + 1e-9 >= duty.next_tick()) {
      sim.watched += duty.on() && duty.share() >= 1.0;
      ++sim.ticks;
      action = duty.Tick(now, cost, sim.estimated);
    }
    pending = action != DutyCycle::Action::kNone;
    // A busy host: the agent's thread gets to act `stall_ticks` late.
    if (action != DutyCycle::Action::kNone && stalled++ >= stall_ticks) {
      stalled = 0;
      pending = false;
      duty.Toggled(now, action == DutyCycle::Action::kAttach, toggle);
      sim.phases += action == DutyCycle::Action::kAttach;
      if (action == DutyCycle::Action::kDetach) detaching = detach_ticks;
    }
    // The events of [now, now + tick).
    const double n = rate(now) * tick;
    sim.events += n;
    // A detach that takes its time: the probes still trap (the caller
    // reports it done at its start).
    if (!duty.on() && detaching > 0) {
      --detaching;
      cost += n * per_event;
    }
    if (duty.on()) {
      cost += n * per_event;
      const DutyCycle::Gate g = duty.gate(now);
      const double inside = std::min(now + tick, g.close) - std::max(now, g.open);
      if (inside > 0) sim.estimated += n * g.weight * inside / tick;  // arrivals spread over the tick
    }
  }
  sim.on_seconds = duty.on_seconds(seconds);
  sim.cost = duty.cost_seconds();
  sim.toggles = duty.toggles();
  sim.variance = duty.variance() + duty.pending_variance(seconds, sim.estimated);
  return sim;
}

TEST(DutyCycle, AlwaysOnBelowTheBudget) {
  DutyCycle duty({.budget = 0.01, .seed = 1}, 0);
  Simulation sim = Simulate(
      duty, 100, [](double) { return 100.0; }, 80e-6, 0.001);  // 0.008 CPU-s/s
  EXPECT_TRUE(duty.on());
  EXPECT_EQ(sim.toggles, 0u);
  EXPECT_NEAR(sim.on_seconds, 100, 0.05);
  EXPECT_NEAR(sim.estimated, sim.events, 1e-6);
}

// 3,000 events/s at 150 us of probes each against 0.5% of 2 CPUs, 45 times
// the budget: attached about 1/45 of the time (each shortest phase plus its
// grace), in cycles of min_on_seconds / share (~3.7 s), the cost (toggles
// included) at the budget, and the weighted count the true one. The first
// cycle (share 1, the rate unknown) ends as soon as it has spent a cycle's
// budget: no burst to repay.
TEST(DutyCycle, OnAShareOfTheTimeAboveIt) {
  DutyCycle duty({.budget = 0.01, .seed = 2}, 0);
  Simulation sim = Simulate(
      duty, 1200, [](double) { return 3000.0; }, 150e-6, 0.0005);
  const double attached = sim.on_seconds / 1200;
  EXPECT_NEAR(attached, 0.01 / 0.45, 0.004);
  EXPECT_NEAR(duty.counted_seconds(1200) / sim.on_seconds, 0.05 / 0.08, 0.08);  // phase / (phase + grace)
  EXPECT_LE(sim.cost, 0.01 * 1200 * 1.05);
  EXPECT_GE(sim.cost, 0.01 * 1200 * 0.9);
  const double cycle = 0.05 / duty.share();
  EXPECT_GE(sim.phases, 0.8 * 1200 / cycle);
  EXPECT_LE(sim.phases, 2.2 * 1200 / cycle);
  EXPECT_NEAR(sim.estimated / sim.events, 1.0, 0.03);
}

// The agent's thread ticks at next_tick(): through a sampled cycle only at
// its phase's edges and once a second, so over 10 minutes at 45 times the
// budget it wakes about twice a second. The cycles come out as with a tick
// at every 5 ms step (200 a second), with the same seed: the same toggles,
// cost and count. A share-1 cycle is watched every 20-100 ms while attached.
TEST(DutyCycle, TicksOnlyWhereSomethingIsDecided) {
  auto load = [](double) { return 3000.0; };
  DutyCycle sparse_duty({.budget = 0.01, .seed = 3}, 0), dense_duty({.budget = 0.01, .seed = 3}, 0);
  const Simulation sparse = Simulate(sparse_duty, 600, load, 150e-6, 0.0005);
  const Simulation dense = Simulate(dense_duty, 600, load, 150e-6, 0.0005, 0, 0, true);
  std::printf(
      "600 s at 45x the budget: %.0f ticks (%.0f watching a share-1 cycle), %.0f at every step; "
      "toggles %lu / %lu, cost %.4f / %.4f, estimate/true %.4f / %.4f\n",
      sparse.ticks, sparse.watched, dense.ticks, sparse.toggles, dense.toggles, sparse.cost, dense.cost,
      sparse.estimated / sparse.events, dense.estimated / dense.events);
  EXPECT_LT(sparse.ticks, 3 * 600);
  EXPECT_GT(sparse.ticks, 2.0 * sparse.phases);  // an attach and a detach tick per phase, at least
  EXPECT_NEAR(double(sparse.toggles), double(dense.toggles), 0.05 * dense.toggles);
  EXPECT_NEAR(sparse.cost, dense.cost, 0.05 * dense.cost);
  EXPECT_NEAR(sparse.estimated / sparse.events, dense.estimated / dense.events, 0.03);

  // Below the budget (80% of it): one share-1 cycle after another, attached
  // throughout, watched at most every 100 ms while far from the cycle's
  // budget and every 20 ms close to it: between 10 and 50 times a second.
  DutyCycle below({.budget = 0.01, .seed = 4}, 0);
  const Simulation on = Simulate(
      below, 60, [](double) { return 100.0; }, 80e-6, 0.001);
  std::printf("60 s at 80%% of the budget: %.0f ticks watching share-1 cycles\n", on.watched);
  EXPECT_EQ(on.toggles, 0u);
  EXPECT_GE(on.watched, 60 / 0.1);
  EXPECT_LT(on.watched, 60 / 0.02 / 2);
}

// A load that comes and goes every 3 s: a share that followed it (probes on
// while it is quiet) would undercount; the planned share does not. The mean
// of 100 runs' estimates is right, and each run's stated 95% error holds
// its own in at least 90 of them.
TEST(DutyCycle, UnbiasedWhenTheLoadChanges) {
  auto bursty = [](double t) { return std::fmod(t, 6.0) < 3.0 ? 3000.0 : 0.0; };
  double ratio = 0;
  int covered = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    DutyCycle duty({.budget = 0.01, .seed = seed}, 0);
    Simulation sim = Simulate(duty, 300, bursty, 150e-6, 0.0005);
    ratio += sim.estimated / sim.events / 100;
    covered += std::abs(sim.estimated - sim.events) <= 1.96 * std::sqrt(sim.variance);
    EXPECT_LE(sim.cost, 0.01 * 300 * 1.1) << seed;
  }
  EXPECT_NEAR(ratio, 1.0, 0.03);
  EXPECT_GE(covered, 90);
}

// A steady load that starts after a quiet spell and stops 60 s later,
// before the run ends (bench/usage_budget.py's shape): the share-1 cycle
// that sees it start ends within 100 ms (max_watch_seconds; the quiet
// cycles are watched that often), and the cycle it stops in
// (~3.4 s, its phase before or after the stop) is the error's main part,
// about half a cycle's events (3% of 60 s). The stated error covers 90% of
// the 200 runs (all within 10%): the 10% it misses are stops whose cycle
// counted its phase before the stop and was read before the next cycle
// could show the drop; a 95% interval is for steadier loads.
TEST(DutyCycle, ALoadThatStartsAndStops) {
  auto load = [](double t) { return t >= 2 && t < 62 ? 5000.0 : 0.0; };
  int covered = 0, within_10 = 0;
  double ratio = 0, rel_error = 0, max_cost = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    DutyCycle duty({.budget = 0.01, .seed = seed}, 0);
    Simulation sim = Simulate(duty, 65, load, 80e-6, 0.001);
    ratio += sim.estimated / sim.events / 200;
    max_cost = std::max(max_cost, sim.cost / (0.01 * 65));
    const double stated = 1.96 * std::sqrt(sim.variance);
    covered += std::abs(sim.estimated - sim.events) <= stated;
    within_10 += std::abs(sim.estimated / sim.events - 1) <= 0.10;
    rel_error += stated / sim.events / 200;
    EXPECT_LE(sim.cost, 0.01 * 65 * 1.1) << seed;
  }
  std::printf(
      "a 60 s load, 200 seeds: mean estimate/true %.4f, mean stated error %.1f%%, covered %d, within 10%% %d, "
      "most spent %.3f of the budget\n",
      ratio, 100 * rel_error, covered, within_10, max_cost);
  EXPECT_NEAR(ratio, 1.0, 0.02);
  EXPECT_GE(covered, 180) << "mean stated error " << rel_error;
  EXPECT_GE(within_10, 180) << "mean stated error " << rel_error;
}

// Ten quiet minutes, then a heavy load: what the quiet saved does not pay
// for the load at twice the budget; the load's minute costs the budget.
TEST(DutyCycle, AQuietSpellSavesNothingForLater) {
  DutyCycle duty({.budget = 0.01, .seed = 5}, 0);
  Simulate(
      duty, 600, [](double) { return 0.0; }, 150e-6, 0.0005);
  const double before = duty.cost_seconds();
  // Continue the same clock: a second simulation from t = 600.
  double cost = 0, estimated = 0;
  for (double now = 600; now < 660; now += 0.005) {
    const DutyCycle::Action action = duty.Tick(now, cost, estimated);
    if (action != DutyCycle::Action::kNone) duty.Toggled(now, action == DutyCycle::Action::kAttach, 0.0005);
    if (duty.on()) cost += 3000 * 0.005 * 150e-6;
  }
  EXPECT_LE(duty.cost_seconds() - before, 0.01 * 60 * 1.25);
}

// The agent's thread acts 20 ms late on every toggle (starved beside the
// load): attached late, detached late. The gate counts only the planned
// phase from the actual attach on, weighted up for the part missed, so the
// estimate stays right; the cost runs over by the late detaches.
TEST(DutyCycle, LateTogglesKeepTheEstimate) {
  double ratio = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    DutyCycle duty({.budget = 0.01, .seed = seed}, 0);
    Simulation sim = Simulate(
        duty, 600, [](double) { return 3000.0; }, 150e-6, 0.0005, 4);
    ratio += sim.estimated / sim.events / 20;
  }
  EXPECT_NEAR(ratio, 1.0, 0.05);
}

// Detaches that take 100 ms while the probes still cost (the caller's
// clock says attached only up to the call): the cost per second counted is
// measured, so the cycles still keep to the budget.
TEST(DutyCycle, SlowDetachesKeepTheBudget) {
  DutyCycle duty({.budget = 0.01, .seed = 6}, 0);
  Simulation sim = Simulate(
      duty, 600, [](double) { return 3000.0; }, 150e-6, 0.0005, 0, 20);
  EXPECT_LE(sim.cost, 0.01 * 600 * 1.05);
  EXPECT_GE(sim.cost, 0.01 * 600 * 0.85);
}

// Dear toggles are paid from the budget: the probes are on less.
TEST(DutyCycle, TogglesAreCounted) {
  DutyCycle cheap({.budget = 0.01, .seed = 4}, 0), dear({.budget = 0.01, .seed = 4}, 0);
  Simulation a = Simulate(
      cheap, 600, [](double) { return 1000.0; }, 200e-6, 0.0);
  Simulation b = Simulate(
      dear, 600, [](double) { return 1000.0; }, 200e-6, 0.002);
  EXPECT_LT(b.on_seconds, a.on_seconds);
  EXPECT_LE(b.cost, 0.01 * 600 * 1.1);
}

// No budget: never toggles, whatever the cost, and every event counts once.
TEST(DutyCycle, NoBudget) {
  DutyCycle duty({.budget = 0}, 0);
  Simulation sim = Simulate(
      duty, 10, [](double) { return 5000.0; }, 1e-3, 0.1);
  EXPECT_EQ(sim.toggles, 0u);
  EXPECT_NEAR(sim.cost, 50, 0.2);
  EXPECT_EQ(duty.allowed_seconds(10), 0.0);
  EXPECT_NEAR(sim.estimated, sim.events, 1e-6);
}

}  // namespace
}  // namespace tlsprof::usage
