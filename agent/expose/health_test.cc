#include "agent/expose/health.h"

#include <gtest/gtest.h>

#include "agent/expose/metrics.h"
#include "common/http/test_client.h"

namespace tlsprof::expose {
namespace {

using Clock = LoopHealth::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// An arbitrary origin: the rule only looks at differences.
const Clock::time_point kT0 = Clock::time_point(seconds(1000));
constexpr Clock::duration kInterval = seconds(10);
constexpr Clock::duration kStall = kStallIntervals * kInterval;

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(LoopHealth, HealthyDuringTheSetUpUntilItsLimit) {
  const LoopHealth health(kInterval, kT0);
  EXPECT_TRUE(health.Check(kT0).healthy);
  const HealthVerdict late = health.Check(kT0 + kSetupLimit - milliseconds(1));
  EXPECT_TRUE(late.healthy) << late.text;
  EXPECT_TRUE(Contains(late.text, "setting up")) << late.text;
  const HealthVerdict stuck = health.Check(kT0 + kSetupLimit);
  EXPECT_FALSE(stuck.healthy);
  EXPECT_EQ(stuck.text, "stalled: the set-up has taken 300.0 s (limit 300 s)");
}

TEST(LoopHealth, BeforeTheFirstWindowHealthyForTheStallIntervalsAfterTheLoopStarts) {
  LoopHealth health(kInterval, kT0);
  // A set-up longer than the stall rule does not count against the loop.
  const Clock::time_point start = kT0 + seconds(100);
  health.LoopStarted(start);
  EXPECT_TRUE(health.Check(start).healthy);
  const HealthVerdict waiting = health.Check(start + kStall - milliseconds(1));
  EXPECT_TRUE(waiting.healthy) << waiting.text;
  EXPECT_TRUE(Contains(waiting.text, "no window closed yet")) << waiting.text;
  const HealthVerdict stalled = health.Check(start + kStall);
  EXPECT_FALSE(stalled.healthy);
  EXPECT_EQ(stalled.text,
            "stalled: no window closed since the loop started 30.0 s ago (interval 10 s; stalled after 3 intervals)");
}

TEST(LoopHealth, StalledAfterTheStallIntervalsWithoutAWindowAndRecoversAtTheNext) {
  LoopHealth health(kInterval, kT0);
  health.LoopStarted(kT0);
  Clock::time_point closed = kT0;
  for (int i = 0; i < 5; ++i) {  // windows on time
    closed += kInterval;
    health.WindowClosed(closed);
    EXPECT_TRUE(health.Check(closed + kInterval - milliseconds(1)).healthy);
  }
  // Late windows are not a stall until kStallIntervals intervals have passed.
  const HealthVerdict late = health.Check(closed + kStall - milliseconds(1));
  EXPECT_TRUE(late.healthy) << late.text;
  EXPECT_EQ(late.text, "ok: window 5 closed 30.0 s ago (interval 10 s)");
  const HealthVerdict stalled = health.Check(closed + kStall);
  EXPECT_FALSE(stalled.healthy);
  EXPECT_EQ(stalled.text, "stalled: the last window closed 30.0 s ago (interval 10 s; stalled after 3 intervals)");
  EXPECT_FALSE(health.Check(closed + seconds(3600)).healthy);
  // The loop comes back: the next close makes it healthy at once.
  const Clock::time_point back = closed + seconds(3600);
  health.WindowClosed(back);
  const HealthVerdict recovered = health.Check(back + milliseconds(1));
  EXPECT_TRUE(recovered.healthy) << recovered.text;
  EXPECT_TRUE(Contains(recovered.text, "window 6 closed")) << recovered.text;
  EXPECT_FALSE(health.Check(back + kStall).healthy);
}

TEST(LoopHealth, TheStallFollowsTheInterval) {
  LoopHealth fast(seconds(1), kT0);
  fast.LoopStarted(kT0);
  fast.WindowClosed(kT0 + seconds(1));
  EXPECT_TRUE(fast.Check(kT0 + seconds(3)).healthy);
  EXPECT_FALSE(fast.Check(kT0 + seconds(4)).healthy);
  const HealthVerdict v = fast.Check(kT0 + seconds(4));
  EXPECT_TRUE(Contains(v.text, "interval 1 s")) << v.text;
}

TEST(LoopHealth, ARecordNewerThanTheCheckedTimeIsHealthy) {
  // A Check() that read the clock just before the loop's thread wrote a close.
  LoopHealth health(kInterval, kT0);
  health.LoopStarted(kT0);
  health.WindowClosed(kT0 + seconds(10));
  const HealthVerdict v = health.Check(kT0 + seconds(9));
  EXPECT_TRUE(v.healthy);
  EXPECT_EQ(v.text, "ok: window 1 closed 0.0 s ago (interval 10 s)");
}

// GET /healthz on the agent's --metrics-listen, beside /metrics, answered
// from a LoopHealth whose record the test writes as the loop would.
TEST(Healthz, AnswersFromTheLoopsRecordBesideMetrics) {
  LoopHealth health(seconds(1), Clock::now());  // outlives the server
  AgentMetrics metrics;
  const int port = http::testing::FreePort();
  const auto st = metrics.Serve("127.0.0.1:" + std::to_string(port), &health);
  ASSERT_TRUE(st.ok()) << st.error().message;

  http::testing::Reply r = http::testing::Send(port, "GET", "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/plain; charset=utf-8");
  EXPECT_EQ(r.headers["cache-control"], "no-store");
  EXPECT_TRUE(Contains(r.body, "ok: setting up for ")) << r.body;

  // The loop started 5 s ago and closed nothing: 5 intervals of 1 s.
  health.LoopStarted(Clock::now() - seconds(5));
  r = http::testing::Send(port, "GET", "/healthz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.head.substr(0, r.head.find("\r\n")), "HTTP/1.1 503 Service Unavailable");
  EXPECT_TRUE(Contains(r.body, "stalled: no window closed since the loop started 5.")) << r.body;
  EXPECT_TRUE(Contains(r.body, "(interval 1 s; stalled after 3 intervals)\n")) << r.body;

  health.WindowClosed(Clock::now());
  r = http::testing::Send(port, "GET", "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(Contains(r.body, "ok: window 1 closed 0.")) << r.body;

  r = http::testing::Send(port, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(Contains(r.body, "tlsprof_agent_windows_total")) << r.body.substr(0, 500);
  r = http::testing::Send(port, "GET", "/metrics", "Accept-Encoding: gzip\r\n");
  EXPECT_EQ(r.headers["content-encoding"], "gzip");
  r = http::testing::Send(port, "GET", "/status");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "no such page; try /metrics or /healthz\n");
  EXPECT_EQ(http::testing::Send(port, "POST", "/healthz").status, 405);
}

TEST(Healthz, NotServedWithoutALoop) {
  AgentMetrics metrics;
  const int port = http::testing::FreePort();
  ASSERT_TRUE(metrics.Serve("127.0.0.1:" + std::to_string(port)).ok());
  const http::testing::Reply r = http::testing::Send(port, "GET", "/healthz");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "no such page; try /metrics\n");
}

}  // namespace
}  // namespace tlsprof::expose
