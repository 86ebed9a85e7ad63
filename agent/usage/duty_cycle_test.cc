// DutyCycle on simulated probes: a steady cost rate below and above the
// budget, a burst, and toggles that cost something. No privileges needed.
#include "agent/usage/duty_cycle.h"

#include <gtest/gtest.h>

namespace tlsprof::usage {
namespace {

struct Simulation {
  double on_seconds = 0, cost = 0;
  unsigned long toggles = 0;
  double shortest_on = 1e9;
};

// Runs `seconds` of 20 ms ticks with probes that cost `rate` CPU-s per s
// while attached and `toggle` per attach or detach.
Simulation Simulate(DutyCycle& duty, double seconds, double rate, double toggle, double start = 0) {
  Simulation sim;
  double cost = 0, phase_start = start;
  for (double now = start; now < start + seconds; now += 0.02) {
    if (duty.on()) cost += rate * 0.02;
    switch (duty.Tick(now, cost)) {
      case DutyCycle::Action::kAttach:
        duty.Toggled(now, true, toggle);
        phase_start = now;
        break;
      case DutyCycle::Action::kDetach:
        duty.Toggled(now, false, toggle);
        // The first phase spends the bucket's start; the rest are planned.
        if (duty.toggles() > 1) sim.shortest_on = std::min(sim.shortest_on, now - phase_start);
        break;
      case DutyCycle::Action::kNone:
        break;
    }
  }
  sim.on_seconds = duty.on_seconds(start + seconds);
  sim.cost = duty.cost_seconds();
  sim.toggles = duty.toggles();
  return sim;
}

TEST(DutyCycle, AlwaysOnBelowTheBudget) {
  DutyCycle duty({.budget = 0.01}, 0);
  Simulation sim = Simulate(duty, 100, 0.008, 0.001);
  EXPECT_TRUE(duty.on());
  EXPECT_EQ(sim.toggles, 0u);
  EXPECT_NEAR(sim.on_seconds, 100, 0.05);
}

// 45 times the budget (3,000 handshakes/s at 150 us of probes each against
// 0.5% of 2 CPUs): on about 1/45 of the time, in phases of about
// min_on_seconds, and the cost, toggles included, within the budget.
TEST(DutyCycle, OnAShareOfTheTimeAboveIt) {
  DutyCycle duty({.budget = 0.01, .min_on_seconds = 0.2, .capacity_seconds = 2}, 0);
  Simulation sim = Simulate(duty, 600, 0.45, 0.0005);
  const double share = sim.on_seconds / 600;
  EXPECT_GT(share, 0.01 / 0.45 * 0.8);
  EXPECT_LT(share, 0.01 / 0.45);
  EXPECT_LE(sim.cost, 0.01 * 600 + 0.01 * 2 + 0.45 * 0.02);  // the budget, the bucket, one tick
  EXPECT_GT(sim.cost, 0.01 * 600 * 0.9);
  EXPECT_GE(sim.shortest_on, 0.2 - 0.04);
  EXPECT_GT(sim.toggles, 100u);
}

// Toggles are paid from the bucket: dear toggles mean fewer, longer-off phases.
TEST(DutyCycle, TogglesAreCounted) {
  DutyCycle cheap({.budget = 0.01}, 0), dear({.budget = 0.01}, 0);
  Simulation a = Simulate(cheap, 300, 0.2, 0.0);
  Simulation b = Simulate(dear, 300, 0.2, 0.004);
  EXPECT_LT(b.on_seconds, a.on_seconds);
  EXPECT_LE(b.cost, 0.01 * 300 + 0.01 * 2 + 0.2 * 0.02 + 0.004);
}

// No budget: never toggles, whatever the cost.
TEST(DutyCycle, NoBudget) {
  DutyCycle duty({.budget = 0}, 0);
  Simulation sim = Simulate(duty, 10, 5.0, 0.1);
  EXPECT_EQ(sim.toggles, 0u);
  EXPECT_NEAR(sim.cost, 50, 0.2);
  EXPECT_EQ(duty.allowed_seconds(10), 0.0);
}

}  // namespace
}  // namespace tlsprof::usage
