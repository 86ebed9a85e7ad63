#include "collector/loadgen/fleet.h"

#include <regex>
#include <set>

#include <gtest/gtest.h>

namespace tlsprof::loadgen {
namespace {

constexpr int64_t kStart = 1'780'000'000'000'000'000;

Fleet MakeFleet(FleetOptions o) {
  auto f = Fleet::Make(o);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
  return std::move(f).value();
}

// The collector's validation rules (docs/fleet.md, "Ingest", step 4), checked
// independently of the code that drew the report.
void ExpectValid(const v1::AgentReport& r, uint32_t series) {
  SCOPED_TRACE(r.host().hostname() + " sequence " + std::to_string(r.sequence()));
  static const std::regex kLabel("[A-Za-z0-9._:/()+ -]{1,64}");
  EXPECT_EQ(r.agent_instance().size(), 16u);
  EXPECT_GE(r.sequence(), 1u);
  const auto& w = r.window();
  EXPECT_GT(w.end_unix_ns(), w.start_unix_ns());
  EXPECT_LE(w.end_unix_ns() - w.start_unix_ns(), 3600'000'000'000);
  ASSERT_GT(w.frequency_hz(), 0u);
  EXPECT_NEAR(static_cast<double>(w.period_ns()), 1e9 / w.frequency_hz(), 1.0);
  const double capacity = static_cast<double>(r.host().cpus()) *
                          static_cast<double>(w.end_unix_ns() - w.start_unix_ns()) / 1e9 * w.frequency_hz();
  EXPECT_LE(static_cast<double>(r.busy_samples()), 1.5 * capacity);
  uint64_t busy = 0, rows = 0;
  std::set<std::string> names;
  for (const auto& s : r.services()) {
    EXPECT_TRUE(std::regex_match(s.name(), kLabel)) << s.name();
    EXPECT_TRUE(names.insert(s.name()).second) << "service twice: " << s.name();
    uint64_t tls = 0;
    std::set<std::tuple<int, std::string, int, std::string>> keys;
    for (const auto& t : s.tls()) {
      EXPECT_NE(t.bucket(), v1::BUCKET_UNSPECIFIED);
      EXPECT_NE(t.phase(), v1::PHASE_UNSPECIFIED);
      EXPECT_TRUE(std::regex_match(t.algorithm(), kLabel)) << t.algorithm();
      EXPECT_TRUE(std::regex_match(t.library(), kLabel)) << t.library();
      EXPECT_GE(t.samples(), 1u);
      EXPECT_TRUE(keys.insert({t.bucket(), t.algorithm(), t.phase(), t.library()}).second) << "row twice";
      tls += t.samples();
    }
    EXPECT_EQ(s.tls_samples(), tls);
    EXPECT_LE(s.tls_samples(), s.busy_samples());
    busy += s.busy_samples();
    rows += s.tls_size();
  }
  EXPECT_EQ(names.count("(non-tls)"), 1u);
  EXPECT_EQ(r.busy_samples(), busy);
  EXPECT_EQ(rows, series);
}

TEST(FleetTest, ReportsPassTheCollectorsChecks) {
  for (auto [series, interval, frequency] : {std::tuple{100u, 10.0, 99u}, {20u, 1.0, 99u}, {200u, 10.0, 999u}}) {
    Fleet f =
        MakeFleet({.seed = 7, .agents = 50, .series = series, .interval_seconds = interval, .frequency_hz = frequency});
    v1::AgentReport r;
    for (uint32_t a = 0; a < f.agents(); ++a) {
      for (uint64_t s = 1; s <= 3; ++s) {
        f.BuildReport(a, s, kStart, &r);
        ExpectValid(r, series);
      }
    }
  }
}

TEST(FleetTest, SameSeedSameReports) {
  FleetOptions o{.seed = 3, .agents = 20};
  Fleet a = MakeFleet(o), b = MakeFleet(o);
  v1::AgentReport ra, rb;
  // Built in different orders: a report depends on (seed, agent, sequence) only.
  for (uint32_t i = 0; i < 20; ++i) {
    for (uint64_t s = 1; s <= 4; ++s) {
      a.BuildReport(i, s, kStart, &ra);
      b.BuildReport(19 - i, 5 - s, kStart, &rb);
      b.BuildReport(i, s, kStart, &rb);
      EXPECT_EQ(ra.SerializeAsString(), rb.SerializeAsString());
    }
  }
  o.seed = 4;
  Fleet c = MakeFleet(o);
  c.BuildReport(0, 1, kStart, &rb);
  a.BuildReport(0, 1, kStart, &ra);
  EXPECT_NE(ra.agent_instance(), rb.agent_instance());
  EXPECT_NE(ra.SerializeAsString(), rb.SerializeAsString());
}

TEST(FleetTest, AgentsAreDistinctAndKeepTheirShape) {
  Fleet f = MakeFleet({.seed = 1, .agents = 200, .series = 100});
  std::set<std::string> instances, hosts;
  v1::AgentReport r1, r2;
  for (uint32_t i = 0; i < f.agents(); ++i) {
    instances.insert(f.agent(i).instance);
    hosts.insert(f.agent(i).hostname);
    f.BuildReport(i, 1, kStart, &r1);
    f.BuildReport(i, 2, kStart + f.interval_ns(), &r2);
    // Same services and rows from window to window, other counts.
    ASSERT_EQ(r1.services_size(), r2.services_size());
    for (int s = 0; s < r1.services_size(); ++s) {
      EXPECT_EQ(r1.services(s).name(), r2.services(s).name());
      ASSERT_EQ(r1.services(s).tls_size(), r2.services(s).tls_size());
      for (int t = 0; t < r1.services(s).tls_size(); ++t) {
        EXPECT_EQ(r1.services(s).tls(t).algorithm(), r2.services(s).tls(t).algorithm());
      }
    }
    EXPECT_NE(r1.SerializeAsString(), r2.SerializeAsString());
    // Contiguous windows.
    EXPECT_EQ(r1.window().end_unix_ns(), r2.window().start_unix_ns());
    EXPECT_EQ(r2.sequence(), r1.sequence() + 1);
  }
  EXPECT_EQ(instances.size(), 200u);
  EXPECT_EQ(hosts.size(), 200u);
  EXPECT_TRUE(hosts.count("loadgen-0") && hosts.count("loadgen-199"));
}

TEST(FleetTest, TheFleetCoversTheCombinations) {
  // A fleet's rows together span every bucket and phase, several libraries
  // and algorithms: the collector's label sets are exercised, not one path.
  Fleet f = MakeFleet({.seed = 1, .agents = 100, .series = 100});
  std::set<int> buckets, phases;
  std::set<std::string> libraries, algorithms, services;
  v1::AgentReport r;
  for (uint32_t i = 0; i < f.agents(); ++i) {
    f.BuildReport(i, 1, kStart, &r);
    for (const auto& s : r.services()) {
      services.insert(s.name());
      for (const auto& t : s.tls()) {
        buckets.insert(t.bucket());
        phases.insert(t.phase());
        libraries.insert(t.library());
        algorithms.insert(t.algorithm());
      }
    }
  }
  EXPECT_EQ(buckets.size(), 5u);
  EXPECT_EQ(phases.size(), 3u);
  EXPECT_EQ(libraries.size(), 4u);
  EXPECT_GE(algorithms.size(), 15u);
  EXPECT_EQ(services.size(), 21u);  // the pool of 20 and (non-tls)
}

TEST(FleetTest, RejectsWhatCannotBeValid) {
  EXPECT_FALSE(Fleet::Make({.agents = 0}).ok());
  EXPECT_FALSE(Fleet::Make({.agents = 1, .series = 10'000, .services = 2}).ok());
  // 100 rows of ≥ 1 sample do not fit a 2-CPU host's 0.1 s at 99 Hz.
  EXPECT_FALSE(Fleet::Make({.agents = 1, .series = 100, .interval_seconds = 0.1}).ok());
  EXPECT_FALSE(Fleet::Make({.agents = 1, .interval_seconds = 7200}).ok());
}

TEST(FleetTest, TotalsAddUpTheRows) {
  Fleet f = MakeFleet({.seed = 9, .agents = 3, .series = 30});
  v1::AgentReport r;
  f.BuildReport(2, 5, kStart, &r);
  ReportTotals t = Totals(r);
  uint64_t tls = 0;
  for (const auto& s : r.services()) {
    for (const auto& row : s.tls()) tls += row.samples();
  }
  EXPECT_EQ(t.tls_samples, tls);
  EXPECT_EQ(t.busy_samples, r.busy_samples());
  EXPECT_EQ(t.rows, 30u);
}

}  // namespace
}  // namespace tlsprof::loadgen
