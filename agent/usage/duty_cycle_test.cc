// DutyCycle on simulated probes: a steady cost below and above the budget,
// a load that comes and goes, and toggles that cost something. No
// privileges needed.
#include "agent/usage/duty_cycle.h"

#include <cmath>

#include <gtest/gtest.h>

namespace tlsprof::usage {
namespace {

struct Simulation {
  double on_seconds = 0, cost = 0, events = 0, estimated = 0;
  unsigned long toggles = 0;
  double phases = 0;  // on-phases (a phase wrapped around its cycle's end counts twice)
};

// Runs `seconds` of 20 ms ticks. Events arrive at `rate(t)` per second;
// each costs `per_event` CPU-s while the probes are attached, and is then
// counted with the cycle's weight. Each toggle costs `toggle`.
template <typename Rate>
Simulation Simulate(DutyCycle& duty, double seconds, Rate rate, double per_event, double toggle) {
  Simulation sim;
  double cost = 0;
  for (double now = 0; now < seconds; now += 0.02) {
    const double n = rate(now) * 0.02;
    sim.events += n;
    if (duty.on()) {
      cost += n * per_event;
      sim.estimated += n * duty.scale();
    }
    switch (duty.Tick(now, cost)) {
      case DutyCycle::Action::kAttach:
        duty.Toggled(now, true, toggle);
        ++sim.phases;
        break;
      case DutyCycle::Action::kDetach:
        duty.Toggled(now, false, toggle);
        break;
      case DutyCycle::Action::kNone:
        break;
    }
  }
  sim.on_seconds = duty.on_seconds(seconds);
  sim.cost = duty.cost_seconds();
  sim.toggles = duty.toggles();
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
// the budget: on about 1/45 of the time, in cycles of min_on_seconds / share
// (~22 s), the cost (toggles included) at the budget, and the weighted count
// the true one.
TEST(DutyCycle, OnAShareOfTheTimeAboveIt) {
  DutyCycle duty({.budget = 0.01, .min_on_seconds = 0.5, .seed = 2}, 0);
  Simulation sim = Simulate(
      duty, 1200, [](double) { return 3000.0; }, 150e-6, 0.0005);
  const double share = sim.on_seconds / 1200;
  EXPECT_NEAR(share, 0.01 / 0.45, 0.004);
  // The budget, plus the first cycle (probes on until the rate is known).
  EXPECT_LE(sim.cost, 0.01 * 1200 * 1.05 + 0.45 * 1.0);
  EXPECT_GE(sim.cost, 0.01 * 1200 * 0.9);
  EXPECT_GE(sim.phases, 1200 / 23.0);
  EXPECT_LE(sim.phases, 2 * 1200 / 22.0 + 2);
  EXPECT_NEAR(sim.estimated / sim.events, 1.0, 0.05);
}

// A load that comes and goes every 3 s: a share that followed it (probes on
// while it is quiet) would undercount; the planned share does not. One run
// samples only ~80 cycles of an on/off load (one run's estimate is within
// about 11%), so the mean of 100 runs' is what must be right.
TEST(DutyCycle, UnbiasedWhenTheLoadChanges) {
  auto bursty = [](double t) { return std::fmod(t, 6.0) < 3.0 ? 3000.0 : 0.0; };
  double ratio = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    DutyCycle duty({.budget = 0.01, .min_on_seconds = 0.5, .seed = seed}, 0);
    Simulation sim = Simulate(duty, 1800, bursty, 150e-6, 0.0005);
    ratio += sim.estimated / sim.events / 100;
    EXPECT_LE(sim.cost, 0.01 * 1800 * 1.1 + 0.45 * 1.0) << seed;
  }
  EXPECT_NEAR(ratio, 1.0, 0.05);
}

// Dear toggles are paid from the budget: the probes are on less.
TEST(DutyCycle, TogglesAreCounted) {
  DutyCycle cheap({.budget = 0.01, .seed = 4}, 0), dear({.budget = 0.01, .seed = 4}, 0);
  Simulation a = Simulate(
      cheap, 600, [](double) { return 1000.0; }, 200e-6, 0.0);
  Simulation b = Simulate(
      dear, 600, [](double) { return 1000.0; }, 200e-6, 0.01);
  EXPECT_LT(b.on_seconds, a.on_seconds);
  EXPECT_LE(b.cost, 0.01 * 600 * 1.1 + 0.2);
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
