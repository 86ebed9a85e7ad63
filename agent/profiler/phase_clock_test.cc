// PhaseClock charges this thread's CPU to the phase it is in, nests scopes,
// and counts the other threads' CPU apart.
#include "agent/profiler/phase_clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tlsprof::profiler {
namespace {

// Spins on this thread until it used `seconds` of CPU.
void Burn(double seconds) {
  const double end = ThreadCpuSeconds() + seconds;
  volatile uint64_t x = 0;
  while (ThreadCpuSeconds() < end) x = x + 1;
}

double At(const AgentPhaseSeconds& s, AgentPhase p) { return s[static_cast<size_t>(p)]; }

TEST(PhaseClock, ChargesEachScopeToItsPhaseAndNests) {
  PhaseClock clock;
  Burn(0.02);  // outside every scope: the loop
  {
    const auto discovery = clock.Enter(AgentPhase::kDiscovery);
    Burn(0.03);
    {
      const auto registration = clock.Enter(AgentPhase::kUnwindRegistration);
      Burn(0.05);
    }
    Burn(0.03);  // back in discovery
  }
  const AgentPhaseSeconds s = clock.Take();
  EXPECT_NEAR(At(s, AgentPhase::kLoop), 0.02, 0.01);
  EXPECT_NEAR(At(s, AgentPhase::kDiscovery), 0.06, 0.01);
  EXPECT_NEAR(At(s, AgentPhase::kUnwindRegistration), 0.05, 0.01);
  EXPECT_EQ(At(s, AgentPhase::kAttribution), 0);

  // Take() starts over, and the phase in force keeps running across it.
  {
    const auto attribution = clock.Enter(AgentPhase::kAttribution);
    Burn(0.02);
    EXPECT_NEAR(At(clock.Take(), AgentPhase::kAttribution), 0.02, 0.01);
    Burn(0.03);
  }
  const AgentPhaseSeconds next = clock.Take();
  EXPECT_NEAR(At(next, AgentPhase::kAttribution), 0.03, 0.01);
  EXPECT_LT(At(next, AgentPhase::kDiscovery), 0.001);
}

TEST(PhaseClock, OtherThreadsAreTheProcessMinusThisThread) {
  PhaseClock clock;
  std::thread other([] { Burn(0.1); });
  other.join();
  {
    const auto sinks = clock.Enter(AgentPhase::kSinks);
    Burn(0.02);
  }
  const AgentPhaseSeconds s = clock.Take();
  EXPECT_NEAR(At(s, AgentPhase::kSinks), 0.02, 0.01);
  // getrusage counts in coarser steps than the thread clock.
  EXPECT_NEAR(At(s, AgentPhase::kOtherThreads), 0.1, 0.02);
}

TEST(PhaseClock, NamesEveryPhase) {
  EXPECT_EQ(AgentPhaseName(AgentPhase::kLoop), "loop");
  EXPECT_EQ(AgentPhaseName(AgentPhase::kMapRead), "map_read");
  EXPECT_EQ(AgentPhaseName(AgentPhase::kOtherThreads), "other_threads");
  static_assert(static_cast<size_t>(AgentPhase::kOtherThreads) + 1 == kAgentPhaseCount);
}

}  // namespace
}  // namespace tlsprof::profiler
