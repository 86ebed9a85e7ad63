#include "collector/ingest/ingestor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "collector/expose/fleet_api.h"
#include "collector/expose/fleet_metrics.h"
#include "collector/ingest/test_report.h"
#include "collector/store/snapshot.h"

namespace tlsprof::collector {
namespace {

using testing::kTestNowNs;
using testing::MakeReport;
using testing::MakeUsageReport;

// The value of one series of one family, or -1 when absent.
double Value(const Ingestor& ingestor, const std::string& family, const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : FleetMetrics(ingestor)) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return m.counter.value;
    }
  }
  return -1;
}

size_t SeriesCount(const Ingestor& ingestor, const std::string& family) {
  for (const prometheus::MetricFamily& f : FleetMetrics(ingestor)) {
    if (f.name == family) return f.metric.size();
  }
  return 0;
}

const std::map<std::string, std::string> kAesGcm = {{"bucket", "cipher"},
                                                    {"algorithm", "AES-GCM"},
                                                    {"phase", "record"},
                                                    {"library", "openssl-3"},
                                                    {"service", "nginx"}};

TEST(SequenceWindow, InOrderOutOfOrderAndTooOld) {
  SequenceWindow w;
  EXPECT_EQ(w.Test(1), SequenceWindow::Check::kNew);
  w.Mark(1);
  EXPECT_EQ(w.Test(1), SequenceWindow::Check::kDuplicate);
  w.Mark(2);
  w.Mark(5);  // 3 and 4 are late
  EXPECT_EQ(w.Test(3), SequenceWindow::Check::kNew);
  EXPECT_EQ(w.Test(4), SequenceWindow::Check::kNew);
  EXPECT_EQ(w.Test(2), SequenceWindow::Check::kDuplicate);
  w.Mark(4);
  EXPECT_EQ(w.Test(4), SequenceWindow::Check::kDuplicate);
  EXPECT_EQ(w.Test(3), SequenceWindow::Check::kNew);
  w.Mark(5 + SequenceWindow::kWidth - 1);
  EXPECT_EQ(w.Test(5), SequenceWindow::Check::kDuplicate);  // still inside the window
  EXPECT_EQ(w.Test(6), SequenceWindow::Check::kNew);
  EXPECT_EQ(w.Test(3), SequenceWindow::Check::kTooOld);
  // A jump wider than the window forgets everything below it.
  w.Mark(100000);
  EXPECT_EQ(w.Test(100000 - SequenceWindow::kWidth + 1), SequenceWindow::Check::kNew);
  EXPECT_EQ(w.Test(100000 - SequenceWindow::kWidth), SequenceWindow::Check::kTooOld);

  SequenceWindow copy = SequenceWindow::FromWords(w.highest(), w.Words());
  for (uint64_t s = 99000; s <= 100001; ++s) EXPECT_EQ(copy.Test(s), w.Test(s)) << s;
}

TEST(TokenBucket, BurstThenRate) {
  TokenBucket b;
  int64_t t = kTestNowNs;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(b.Take(t, 2.0, 3)) << i;
  EXPECT_FALSE(b.Take(t, 2.0, 3));
  EXPECT_FALSE(b.Take(t + 400'000'000, 2.0, 3));  // 0.8 tokens
  EXPECT_TRUE(b.Take(t + 500'000'000, 2.0, 3));   // 1.0
  EXPECT_FALSE(b.Take(t + 500'000'000, 2.0, 3));
  // Refills up to the burst, not beyond.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(b.Take(t + 100'000'000'000, 2.0, 3)) << i;
  EXPECT_FALSE(b.Take(t + 100'000'000'000, 2.0, 3));
}

TEST(Ingestor, CountsBaseUnitsOnceAndKeepsAgentsApart) {
  Ingestor ingestor(IngestOptions{});
  const double period = 1'000'000'000 / 99;
  EXPECT_FALSE(ingestor.Apply("agent-1", MakeReport(1), kTestNowNs).duplicate);
  EXPECT_TRUE(ingestor.Apply("agent-1", MakeReport(1), kTestNowNs).duplicate);
  // The same (instance, sequence) from another agent is another batch.
  EXPECT_FALSE(ingestor.Apply("agent-2", MakeReport(1), kTestNowNs).duplicate);
  // ... and so is another instance of the same agent.
  EXPECT_FALSE(ingestor.Apply("agent-1", MakeReport(1, std::string(16, 'j')), kTestNowNs).duplicate);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_cpu_seconds_total", kAesGcm), 3 * 300 * period / 1e9);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_busy_cpu_seconds_total", {{"service", "nginx"}}), 3 * 800 * period / 1e9);
  EXPECT_EQ(Value(ingestor, "tlsprof_reports_total", {}), 3);
  // Host series only with --host-labels.
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_host_busy_cpu_seconds_total"), 0u);
  EXPECT_EQ(ActiveAgents(ingestor, kTestNowNs, 1), 2u);
}

TEST(Ingestor, CommitRunsOnlyForNewReports) {
  Ingestor ingestor(IngestOptions{});
  int commits = 0;
  ingestor.Apply("a", MakeReport(7), kTestNowNs, [&] { ++commits; });
  ingestor.Apply("a", MakeReport(7), kTestNowNs, [&] { ++commits; });
  EXPECT_EQ(commits, 1);
}

v1::AgentReport ManySeries(uint64_t sequence, int services, int algorithms_per_service) {
  v1::AgentReport r = MakeReport(sequence);
  r.clear_services();
  for (int s = 0; s < services; ++s) {
    v1::Service* service = r.add_services();
    service->set_name("svc-" + std::to_string(s));
    service->set_busy_samples(algorithms_per_service);
    service->set_tls_samples(algorithms_per_service);
    for (int a = 0; a < algorithms_per_service; ++a) {
      v1::TlsCpu* t = service->add_tls();
      t->set_bucket(v1::BUCKET_HASH);
      t->set_algorithm("alg-" + std::to_string(a));
      t->set_phase(v1::PHASE_OTHER);
      t->set_library("lib");
      t->set_samples(1);
    }
  }
  return r;
}

TEST(Ingestor, SeriesCapDropsNewSeriesButKeepsCountingKnownOnes) {
  IngestOptions options;
  options.max_series_per_agent = 10;
  Ingestor ingestor(options);
  ApplyResult first = ingestor.Apply("bomb", ManySeries(1, 1, 5000), kTestNowNs);
  EXPECT_EQ(first.dropped_series, 4990u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_cpu_seconds_total"), 10u);
  // The next report: the 10 known series still count, the rest is dropped again.
  ApplyResult second = ingestor.Apply("bomb", ManySeries(2, 1, 5000), kTestNowNs);
  EXPECT_EQ(second.dropped_series, 4990u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_cpu_seconds_total"), 10u);
  const double period = 1'000'000'000 / 99;
  EXPECT_DOUBLE_EQ(
      Value(ingestor, "tlsprof_cpu_seconds_total",
            {{"bucket", "hash"}, {"algorithm", "alg-0"}, {"phase", "other"}, {"library", "lib"}, {"service", "svc-0"}}),
      2 * period / 1e9);
  // Another agent has its own budget.
  EXPECT_EQ(ingestor.Apply("other", ManySeries(1, 1, 5), kTestNowNs).dropped_series, 0u);
}

TEST(Ingestor, ServiceCapDropsTheServiceWithItsSeries) {
  IngestOptions options;
  options.max_services_per_agent = 2;
  Ingestor ingestor(options);
  ApplyResult r = ingestor.Apply("a", ManySeries(1, 4, 3), kTestNowNs);
  EXPECT_EQ(r.dropped_series, 2u * (1 + 3));
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_busy_cpu_seconds_total"), 2u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_cpu_seconds_total"), 6u);
}

const std::string kPod = "8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2e";

// MakeReport's nginx, twice more: in containers a and b of one pod.
v1::AgentReport WithContainers(uint64_t sequence) {
  v1::AgentReport r = MakeReport(sequence);
  r.set_busy_samples(2400);
  for (const char* id : {"aaaaaaaaaaaa", "bbbbbbbbbbbb"}) {
    v1::Service* s = r.add_services();
    *s = r.services(0);
    s->set_container_id(id);
    s->set_pod_uid(kPod);
  }
  return r;
}

std::map<std::string, std::string> InContainer(std::map<std::string, std::string> labels, std::string id) {
  labels["container_id"] = std::move(id);
  labels["pod_uid"] = kPod;
  return labels;
}

TEST(Ingestor, ContainersAreSeparateSeriesWithLabelsOnlyWhenSet) {
  Ingestor ingestor(IngestOptions{});
  ingestor.Apply("a", WithContainers(1), kTestNowNs);
  ingestor.Apply("a", WithContainers(2), kTestNowNs);
  const double period = 1'000'000'000 / 99;
  for (const char* id : {"aaaaaaaaaaaa", "bbbbbbbbbbbb"}) {
    EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_cpu_seconds_total", InContainer(kAesGcm, id)), 2 * 300 * period / 1e9);
    EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_busy_cpu_seconds_total", InContainer({{"service", "nginx"}}, id)),
                     2 * 800 * period / 1e9);
  }
  // The host's nginx: exactly the old label set, no empty container labels.
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_cpu_seconds_total", kAesGcm), 2 * 300 * period / 1e9);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_busy_cpu_seconds_total", {{"service", "nginx"}}), 2 * 800 * period / 1e9);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_cpu_seconds_total"), 3u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_busy_cpu_seconds_total"), 3u);
}

TEST(Ingestor, ContainersCountTowardTheCaps) {
  IngestOptions options;
  options.max_services_per_agent = 2;
  Ingestor services_capped(options);
  // Three services of one name: the third (container b) is dropped with its series.
  EXPECT_EQ(services_capped.Apply("a", WithContainers(1), kTestNowNs).dropped_series, 2u);
  EXPECT_LT(
      Value(services_capped, "tlsprof_busy_cpu_seconds_total", InContainer({{"service", "nginx"}}, "bbbbbbbbbbbb")), 0);

  options = {};
  options.max_series_per_agent = 2;
  Ingestor series_capped(options);
  EXPECT_EQ(series_capped.Apply("a", WithContainers(1), kTestNowNs).dropped_series, 1u);
  EXPECT_EQ(SeriesCount(series_capped, "tlsprof_cpu_seconds_total"), 2u);
}

// FNV-1a as the collector hashed a series before container labels existed
// (five labels, each followed by 0xff). The state directories of that
// collector hold these hashes.
uint64_t OldSeriesHash(std::initializer_list<std::string_view> parts) {
  uint64_t h = 1469598103934665603ULL;
  for (std::string_view part : parts) {
    for (unsigned char c : part) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
  }
  return h;
}

TEST(Ingestor, StateWrittenBeforeContainerLabelsStillRestores) {
  // A snapshot as the previous collector wrote it: no container fields, and
  // the agent's caps full with the old hashes of its one series and service.
  state::State old;
  state::CpuSeries* c = old.add_cpu();
  c->set_bucket("cipher");
  c->set_algorithm("AES-GCM");
  c->set_phase("record");
  c->set_library("openssl-3");
  c->set_service("nginx");
  c->set_seconds(1.5);
  state::NamedSeconds* b = old.add_busy();
  b->set_name("nginx");
  b->set_seconds(4);
  state::Agent* agent = old.add_agents();
  agent->set_key("a");
  agent->add_series(OldSeriesHash({"cipher", "AES-GCM", "record", "openssl-3", "nginx"}));
  agent->add_services(OldSeriesHash({"nginx"}));
  old.set_reports(1);

  IngestOptions options;
  options.max_series_per_agent = 1;
  options.max_services_per_agent = 1;
  Ingestor ingestor(options);
  ASSERT_TRUE(RestoreSnapshot(old, ingestor).ok());
  // The same series from a new report: counted onto the restored one, not
  // dropped as a second series past the cap.
  EXPECT_EQ(ingestor.Apply("a", MakeReport(1), kTestNowNs).dropped_series, 0u);
  const double period = 1'000'000'000 / 99;
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_cpu_seconds_total", kAesGcm), 1.5 + 300 * period / 1e9);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_busy_cpu_seconds_total", {{"service", "nginx"}}), 4 + 800 * period / 1e9);
  // A container of it is a new service and a new series: over both caps.
  EXPECT_EQ(ingestor.Apply("a", WithContainers(2), kTestNowNs).dropped_series, 2u * (1 + 1));

  // Container series survive a snapshot and a restore with their labels.
  Ingestor wide(IngestOptions{});
  wide.Apply("a", WithContainers(1), kTestNowNs);
  state::State snapshot;
  TakeSnapshot(wide, snapshot);
  Ingestor back(IngestOptions{});
  ASSERT_TRUE(RestoreSnapshot(snapshot, back).ok());
  EXPECT_DOUBLE_EQ(Value(back, "tlsprof_cpu_seconds_total", InContainer(kAesGcm, "aaaaaaaaaaaa")), 300 * period / 1e9);
  EXPECT_DOUBLE_EQ(Value(back, "tlsprof_busy_cpu_seconds_total", InContainer({{"service", "nginx"}}, "bbbbbbbbbbbb")),
                   800 * period / 1e9);
  EXPECT_TRUE(back.Apply("a", WithContainers(1), kTestNowNs).duplicate);
  EXPECT_EQ(back.Apply("a", WithContainers(2), kTestNowNs).dropped_series, 0u);
}

TEST(Ingestor, JournalRecordsReplayWithAndWithoutContainers) {
  Ingestor live(IngestOptions{}), replayed(IngestOptions{});
  std::vector<state::JournalRecord> journal;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const v1::AgentReport r = seq == 2 ? WithContainers(seq) : MakeReport(seq);
    live.Apply("a", r, kTestNowNs);
    state::JournalRecord record;
    record.set_agent_key("a");
    record.set_received_unix_ns(kTestNowNs);
    if (seq == 1) {
      *record.mutable_report() = r;  // the older record form
    } else {
      v1::SubmitRequest request;
      *request.mutable_report() = r;
      record.set_submit_request(request.SerializeAsString());
    }
    journal.push_back(record);
  }
  for (const state::JournalRecord& record : journal) ASSERT_TRUE(ReplayRecord(record, replayed).ok());
  for (const char* family : {"tlsprof_cpu_seconds_total", "tlsprof_busy_cpu_seconds_total"}) {
    EXPECT_EQ(SeriesCount(replayed, family), 3u) << family;
  }
  EXPECT_DOUBLE_EQ(Value(replayed, "tlsprof_cpu_seconds_total", InContainer(kAesGcm, "bbbbbbbbbbbb")),
                   Value(live, "tlsprof_cpu_seconds_total", InContainer(kAesGcm, "bbbbbbbbbbbb")));
  EXPECT_DOUBLE_EQ(Value(replayed, "tlsprof_cpu_seconds_total", kAesGcm),
                   Value(live, "tlsprof_cpu_seconds_total", kAesGcm));
}

TEST(Ingestor, HostLabelsOverflow) {
  IngestOptions options;
  options.host_labels = true;
  options.max_hosts = 2;
  Ingestor ingestor(options);
  for (int h = 0; h < 4; ++h) {
    v1::AgentReport r = MakeReport(1);
    r.mutable_host()->set_hostname("h" + std::to_string(h));
    ingestor.Apply(MakeAgentKey("relay", r.host().hostname()), r, kTestNowNs);
  }
  const double busy = 1000.0 * (1'000'000'000 / 99) / 1e9;
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_host_busy_cpu_seconds_total", {{"host", "h0"}}), busy);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_host_busy_cpu_seconds_total", {{"host", "h1"}}), busy);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_host_busy_cpu_seconds_total", {{"host", "(overflow)"}}), 2 * busy);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_host_busy_cpu_seconds_total"), 3u);
}

// A host silent for idle_expiry_ns gives its --max-hosts slot up, with its
// series; the slots and their last-seen times survive a snapshot.
TEST(Ingestor, HostSlotsExpireWithTheirSeries) {
  IngestOptions options;
  options.host_labels = true;
  options.max_hosts = 2;
  options.idle_expiry_ns = 10'000'000'000;
  auto report = [](const std::string& host, uint64_t sequence) {
    v1::AgentReport r = MakeReport(sequence);
    r.mutable_host()->set_hostname(host);
    return r;
  };
  Ingestor a(options);
  a.Apply(MakeAgentKey("relay", "h0"), report("h0", 1), kTestNowNs);
  a.Apply(MakeAgentKey("relay", "h1"), report("h1", 1), kTestNowNs + 5'000'000'000);
  a.Apply(MakeAgentKey("relay", "h2"), report("h2", 1), kTestNowNs + 6'000'000'000);
  const double busy = 1000.0 * (1'000'000'000 / 99) / 1e9;
  EXPECT_DOUBLE_EQ(Value(a, "tlsprof_host_busy_cpu_seconds_total", {{"host", "(overflow)"}}), busy);

  state::State snapshot;
  TakeSnapshot(a, snapshot);
  Ingestor b(options);
  ASSERT_TRUE(RestoreSnapshot(snapshot, b).ok());
  for (Ingestor* ingestor : {&a, &b}) {
    // h0 is 10 s silent, h1 only 5 s: h2 takes h0's slot, and h0's series go.
    ingestor->Apply(MakeAgentKey("relay", "h2"), report("h2", 2), kTestNowNs + 10'000'000'000);
    EXPECT_DOUBLE_EQ(Value(*ingestor, "tlsprof_host_busy_cpu_seconds_total", {{"host", "h2"}}), busy);
    EXPECT_DOUBLE_EQ(Value(*ingestor, "tlsprof_host_busy_cpu_seconds_total", {{"host", "h1"}}), busy);
    EXPECT_EQ(SeriesCount(*ingestor, "tlsprof_host_busy_cpu_seconds_total"), 3u);  // h1, h2, (overflow)
    EXPECT_EQ(SeriesCount(*ingestor, "tlsprof_host_cpu_seconds_total"), 3u);       // one bucket each
  }
}

TEST(Ingestor, SnapshotRestoreKeepsCountersDedupAndCaps) {
  IngestOptions options;
  options.max_series_per_agent = 3;
  options.host_labels = true;
  Ingestor a(options);
  a.Apply("x", ManySeries(1, 1, 5), kTestNowNs);
  a.Apply("x", MakeReport(3), kTestNowNs);  // sequence 2 missing
  state::State snapshot;
  TakeSnapshot(a, snapshot);

  Ingestor b(options);
  ASSERT_TRUE(RestoreSnapshot(snapshot, b).ok());
  EXPECT_EQ(FleetMetrics(b).size(), FleetMetrics(a).size());
  for (const char* family : {"tlsprof_cpu_seconds_total", "tlsprof_busy_cpu_seconds_total",
                             "tlsprof_host_cpu_seconds_total", "tlsprof_host_busy_cpu_seconds_total"}) {
    EXPECT_EQ(SeriesCount(b, family), SeriesCount(a, family)) << family;
  }
  EXPECT_EQ(Value(b, "tlsprof_reports_total", {}), 2);
  EXPECT_TRUE(b.Apply("x", MakeReport(3), kTestNowNs).duplicate);
  EXPECT_TRUE(b.Apply("x", ManySeries(1, 1, 5), kTestNowNs).duplicate);
  // The cap is full (3 alg series): the AES-GCM series of sequence 2 is dropped in both.
  EXPECT_EQ(b.Apply("x", MakeReport(2), kTestNowNs).dropped_series,
            a.Apply("x", MakeReport(2), kTestNowNs).dropped_series);
  EXPECT_EQ(SummaryJson(b, 5, kTestNowNs).dump(), SummaryJson(a, 5, kTestNowNs).dump());
}

TEST(Ingestor, SummaryOverTheLastMinutes) {
  Ingestor ingestor(IngestOptions{});
  const int64_t minute = 60'000'000'000;
  ingestor.Apply("a", MakeReport(1, std::string(16, 'i'), kTestNowNs), kTestNowNs);
  // Filed by the receive time (a window from a skewed clock lands in the minute it arrived).
  ingestor.Apply("b", MakeReport(1, std::string(16, 'i'), kTestNowNs - 10 * minute), kTestNowNs - 10 * minute);
  nlohmann::json five = SummaryJson(ingestor, 5, kTestNowNs);
  const double period = 1'000'000'000 / 99;
  EXPECT_EQ(five["reports"], 1);
  EXPECT_EQ(five["agents"], 1);
  EXPECT_DOUBLE_EQ(five["busy_cpu_seconds"].get<double>(), 800 * period / 1e9);
  EXPECT_DOUBLE_EQ(five["tls_cpu_seconds"].get<double>(), 300 * period / 1e9);
  EXPECT_DOUBLE_EQ(five["tls_share"].get<double>(), 300.0 / 800.0);
  ASSERT_EQ(five["buckets"].size(), 5u);
  EXPECT_EQ(five["buckets"][0]["bucket"], "cipher");
  EXPECT_DOUBLE_EQ(five["buckets"][0]["share_of_tls"].get<double>(), 1.0);
  ASSERT_EQ(five["algorithms"].size(), 1u);
  EXPECT_EQ(five["algorithms"][0]["algorithm"], "AES-GCM");
  nlohmann::json sixty = SummaryJson(ingestor, 60, kTestNowNs);
  EXPECT_EQ(sixty["reports"], 2);
  EXPECT_EQ(sixty["agents"], 2);
}

TEST(Ingestor, TrendHasOnePointPerMinuteWithReportsAndAddsUpToSummary) {
  Ingestor ingestor(IngestOptions{});
  const int64_t minute = 60'000'000'000;
  const int64_t this_minute = kTestNowNs / minute * minute;
  // Two reports in this minute (one with a signature row), one a minute ago,
  // one 10 minutes ago; none in between.
  v1::AgentReport with_signature = MakeReport(2, std::string(16, 'i'), this_minute + 1);
  v1::TlsCpu* rsa = with_signature.mutable_services(0)->add_tls();
  rsa->set_bucket(v1::BUCKET_SIGNATURE);
  rsa->set_algorithm("RSA");
  rsa->set_phase(v1::PHASE_HANDSHAKE);
  rsa->set_library("openssl-3");
  rsa->set_samples(100);
  ingestor.Apply("a", MakeReport(1, std::string(16, 'i'), kTestNowNs), kTestNowNs);
  ingestor.Apply("b", with_signature, this_minute + 1);
  ingestor.Apply("a", MakeReport(3, std::string(16, 'i'), kTestNowNs - minute), kTestNowNs - minute);
  ingestor.Apply("a", MakeReport(4, std::string(16, 'i'), kTestNowNs - 10 * minute), kTestNowNs - 10 * minute);

  const double period = 1'000'000'000 / 99;
  nlohmann::json trend = TrendJson(ingestor, 60, kTestNowNs);
  EXPECT_EQ(trend["minutes"], 60);
  EXPECT_EQ(trend["now"], kTestNowNs / 1'000'000'000);
  const nlohmann::json& points = trend["points"];
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0]["minute"], (this_minute - 10 * minute) / 1'000'000'000);
  EXPECT_EQ(points[1]["minute"], (this_minute - minute) / 1'000'000'000);
  EXPECT_EQ(points[2]["minute"], this_minute / 1'000'000'000);
  EXPECT_EQ(points[2]["reports"], 2);
  EXPECT_EQ(points[2]["agents"], 2);
  EXPECT_EQ(points[1]["agents"], 1);
  EXPECT_DOUBLE_EQ(points[2]["busy_cpu_seconds"].get<double>(), 2 * 800 * period / 1e9);
  EXPECT_DOUBLE_EQ(points[2]["tls_cpu_seconds"].get<double>(), (2 * 300 + 100) * period / 1e9);
  EXPECT_DOUBLE_EQ(points[2]["tls_share"].get<double>(), 700.0 / 1600.0);
  EXPECT_DOUBLE_EQ(points[2]["bucket_cpu_seconds"]["cipher"].get<double>(), 600 * period / 1e9);
  EXPECT_DOUBLE_EQ(points[2]["bucket_cpu_seconds"]["signature"].get<double>(), 100 * period / 1e9);
  EXPECT_EQ(points[2]["bucket_cpu_seconds"]["hash"], 0.0);
  EXPECT_EQ(points[2]["bucket_cpu_seconds"].size(), 5u);
  EXPECT_DOUBLE_EQ(points[0]["tls_share"].get<double>(), 300.0 / 800.0);

  // The points add up to the summary over the same minutes.
  for (int minutes : {1, 2, 5, 60}) {
    nlohmann::json summary = SummaryJson(ingestor, minutes, kTestNowNs);
    nlohmann::json t = TrendJson(ingestor, minutes, kTestNowNs);
    double busy = 0, tls = 0;
    uint64_t reports = 0;
    for (const auto& p : t["points"]) {
      busy += p["busy_cpu_seconds"].get<double>();
      tls += p["tls_cpu_seconds"].get<double>();
      reports += p["reports"].get<uint64_t>();
    }
    EXPECT_EQ(reports, summary["reports"].get<uint64_t>()) << minutes;
    EXPECT_NEAR(busy, summary["busy_cpu_seconds"].get<double>(), 1e-9) << minutes;
    EXPECT_NEAR(tls, summary["tls_cpu_seconds"].get<double>(), 1e-9) << minutes;
  }
  EXPECT_EQ(TrendJson(ingestor, 1, kTestNowNs)["points"].size(), 1u);
  EXPECT_EQ(TrendJson(ingestor, 2, kTestNowNs)["points"].size(), 2u);
  EXPECT_EQ(TrendJson(ingestor, 10, kTestNowNs)["points"].size(), 2u);
  EXPECT_EQ(TrendJson(ingestor, 11, kTestNowNs)["points"].size(), 3u);
  // An hour later everything has left the window.
  EXPECT_EQ(TrendJson(ingestor, 60, kTestNowNs + 61 * minute)["points"].size(), 0u);
}

TEST(Ingestor, AgentsMostRecentFirstWithCountsAndRelayHosts) {
  Ingestor ingestor(IngestOptions{});
  const int64_t s = 1'000'000'000;
  ingestor.Apply("old", MakeReport(1), kTestNowNs - 600 * s);
  ingestor.Apply("busy", MakeReport(1), kTestNowNs - 30 * s);
  ingestor.Apply("busy", MakeReport(2), kTestNowNs - 20 * s);
  ingestor.Apply("busy", MakeReport(2), kTestNowNs - 15 * s);                        // duplicate: not counted, not seen
  ingestor.Apply("busy", MakeReport(1, std::string(16, 'j')), kTestNowNs - 10 * s);  // a restarted agent
  v1::AgentReport relayed = ManySeries(1, 3, 2);
  relayed.mutable_host()->set_hostname("web-7");
  ingestor.Apply(MakeAgentKey("relay-cn", "web-7"), relayed, kTestNowNs - 5 * s);

  nlohmann::json list = AgentsJson(ingestor, 1000, kTestNowNs);
  EXPECT_EQ(list["now"], kTestNowNs / s);
  EXPECT_EQ(list["total"], 3);
  EXPECT_EQ(list["truncated"], false);
  const nlohmann::json& agents = list["agents"];
  ASSERT_EQ(agents.size(), 3u);
  EXPECT_EQ(agents[0]["identity"], "relay-cn");
  EXPECT_EQ(agents[0]["relay_host"], "web-7");
  EXPECT_EQ(agents[0]["hostname"], "web-7");
  EXPECT_EQ(agents[0]["services"], 3);
  EXPECT_EQ(agents[0]["series"], 6);
  EXPECT_DOUBLE_EQ(agents[0]["age_seconds"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(agents[0]["last_seen"].get<double>(), static_cast<double>(kTestNowNs - 5 * s) / 1e9);

  EXPECT_EQ(agents[1]["identity"], "busy");
  EXPECT_EQ(agents[1]["relay_host"], "");
  EXPECT_EQ(agents[1]["hostname"], "host-1");
  EXPECT_EQ(agents[1]["reports"], 3);
  EXPECT_EQ(agents[1]["instances"], 2);
  EXPECT_EQ(agents[1]["services"], 1);
  EXPECT_EQ(agents[1]["series"], 1);
  EXPECT_DOUBLE_EQ(agents[1]["age_seconds"].get<double>(), 10.0);
  EXPECT_EQ(agents[2]["identity"], "old");
  EXPECT_EQ(agents[2]["reports"], 1);
  EXPECT_DOUBLE_EQ(agents[2]["age_seconds"].get<double>(), 600.0);

  nlohmann::json two = AgentsJson(ingestor, 2, kTestNowNs);
  EXPECT_EQ(two["total"], 3);
  EXPECT_EQ(two["truncated"], true);
  ASSERT_EQ(two["agents"].size(), 2u);
  EXPECT_EQ(two["agents"][1]["identity"], "busy");

  // The counts survive a snapshot.
  state::State snapshot;
  TakeSnapshot(ingestor, snapshot);
  Ingestor restored(IngestOptions{});
  ASSERT_TRUE(RestoreSnapshot(snapshot, restored).ok());
  EXPECT_EQ(AgentsJson(restored, 1000, kTestNowNs).dump(), list.dump());
}

TEST(Ingestor, TrendAndAgentsOfAnEmptyCollector) {
  Ingestor ingestor(IngestOptions{});
  nlohmann::json trend = TrendJson(ingestor, 60, kTestNowNs);
  EXPECT_TRUE(trend["points"].is_array());
  EXPECT_TRUE(trend["points"].empty());
  nlohmann::json agents = AgentsJson(ingestor, 1000, kTestNowNs);
  EXPECT_TRUE(agents["agents"].is_array());
  EXPECT_TRUE(agents["agents"].empty());
  EXPECT_EQ(agents["total"], 0);
  EXPECT_EQ(agents["truncated"], false);
}

// A gauge or counter without labels from CollectData(now), or -1 when absent.
double Scalar(const Ingestor& ingestor, const std::string& family, int64_t now_ns = kTestNowNs,
              const std::map<std::string, std::string>& labels = {}) {
  for (const prometheus::MetricFamily& f : FleetMetrics(ingestor, now_ns)) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return f.type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
    }
  }
  return -1;
}

TEST(Ingestor, SkewedClocksAreCountedMeasuredAndFiledByReceiveTime) {
  Ingestor ingestor(IngestOptions{});
  const int64_t hour = 3600LL * 1'000'000'000;
  const int64_t minute = 60'000'000'000;
  // An hour ahead (send time given), a day behind (send time given), and an
  // older agent without a send time whose window ends 2 h in our future.
  EXPECT_FALSE(
      ingestor.Apply("ahead", MakeReport(1, std::string(16, 'a'), kTestNowNs + hour), kTestNowNs, {}, kTestNowNs + hour)
          .duplicate);
  EXPECT_FALSE(ingestor
                   .Apply("behind", MakeReport(1, std::string(16, 'b'), kTestNowNs - 24 * hour), kTestNowNs, {},
                          kTestNowNs - 24 * hour)
                   .duplicate);
  ingestor.Apply("old", MakeReport(1, std::string(16, 'c'), kTestNowNs + 2 * hour), kTestNowNs);
  // In sync, and a late batch from the spool (an old window, sent now): no skew.
  ingestor.Apply("synced", MakeReport(1, std::string(16, 'd'), kTestNowNs - 5 * hour), kTestNowNs, {}, kTestNowNs + 1);

  // All four counted, once, in the minute they were received.
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_reports_total", {}), 4);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_cpu_seconds_total", kAesGcm),
                   4 * 300 * static_cast<double>(1'000'000'000 / 99) / 1e9);
  EXPECT_EQ(SummaryJson(ingestor, 1, kTestNowNs)["reports"], 4);
  nlohmann::json trend = TrendJson(ingestor, 60, kTestNowNs);
  ASSERT_EQ(trend["points"].size(), 1u);
  EXPECT_EQ(trend["points"][0]["minute"], kTestNowNs / minute * 60);
  // The ring holds no minute of the agents' clocks (they would never be pruned).
  EXPECT_EQ(TrendJson(ingestor, 60, kTestNowNs + 2 * hour)["points"].size(), 0u);

  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_skewed_reports_total"), 3);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_clock_skew_seconds"), 24 * 3600.0);
  // Past the 5 minute horizon nobody is current: the gauge falls back to 0.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_clock_skew_seconds", kTestNowNs + 6 * minute), 0);
  std::map<std::string, nlohmann::json> skew;
  const nlohmann::json listed = AgentsJson(ingestor, 10, kTestNowNs);
  for (const auto& a : listed["agents"]) skew[a["identity"].get<std::string>()] = a["clock_skew_seconds"];
  EXPECT_DOUBLE_EQ(skew["ahead"].get<double>(), 3600.0);
  EXPECT_DOUBLE_EQ(skew["behind"].get<double>(), -86400.0);
  EXPECT_DOUBLE_EQ(skew["old"].get<double>(), 7200.0);
  EXPECT_NEAR(skew["synced"].get<double>(), 0.0, 1e-6);

  // A counter like the rest: a restart from the state directory does not reset it (found by
  // collector_ingest_fuzz, tests/fuzz/corpus/collector_ingest/crash-skewed-reports-not-restored).
  state::State snapshot;
  TakeSnapshot(ingestor, snapshot);
  Ingestor restored{IngestOptions{}};
  ASSERT_TRUE(RestoreSnapshot(snapshot, restored).ok());
  EXPECT_DOUBLE_EQ(Scalar(restored, "tlsprof_collector_skewed_reports_total"), 3);
}

TEST(Ingestor, MaxAgentsEvictsOnlyIdleAgentsAndRefusesOtherwise) {
  IngestOptions options;
  options.max_agents = 3;
  Ingestor ingestor(options);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(ingestor.Apply("a" + std::to_string(i), MakeReport(1), kTestNowNs + i).refused);
  }
  // Nobody idle for an hour: a fourth key is refused, nothing counted.
  ApplyResult refused = ingestor.Apply("new", MakeReport(1), kTestNowNs + 10);
  EXPECT_TRUE(refused.refused);
  EXPECT_DOUBLE_EQ(Value(ingestor, "tlsprof_reports_total", {}), 3);
  // Known agents go on.
  EXPECT_FALSE(ingestor.Apply("a0", MakeReport(2), kTestNowNs + 20).refused);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_agent_keys"), 3);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_agent_limit_total", kTestNowNs, {{"action", "refused"}}), 1);
  // An hour later a1 (the least recently seen) is idle: it makes room.
  const int64_t later = kTestNowNs + kAgentIdleEvictNs + 5;
  EXPECT_FALSE(ingestor.Apply("new", MakeReport(1), later).refused);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_agent_limit_total", later, {{"action", "evicted"}}), 1);
  std::set<std::string> held;
  const nlohmann::json after = AgentsJson(ingestor, 10, later);
  for (const auto& a : after["agents"]) held.insert(a["identity"].get<std::string>());
  EXPECT_EQ(held, (std::set<std::string>{"a0", "a2", "new"}));
}

TEST(Ingestor, MaxSeriesBoundsSeriesOverAllAgents) {
  IngestOptions options;
  options.max_series = 10;
  Ingestor ingestor(options);
  // Each report: one busy series and one cpu series of its own service.
  for (int i = 0; i < 20; ++i) {
    v1::AgentReport r = MakeReport(1, std::string(16, 'i'));
    r.mutable_services(0)->set_name("svc-" + std::to_string(i));
    ApplyResult result = ingestor.Apply("agent-" + std::to_string(i), r, kTestNowNs);
    EXPECT_EQ(result.dropped_series, i < 5 ? 0u : 2u) << i;
  }
  EXPECT_EQ(
      SeriesCount(ingestor, "tlsprof_cpu_seconds_total") + SeriesCount(ingestor, "tlsprof_busy_cpu_seconds_total"),
      10u);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_series"), 10);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_series_limit_dropped_total"), 30);
  // A series that exists is still counted, from any agent.
  v1::AgentReport again = MakeReport(1, std::string(16, 'j'));
  again.mutable_services(0)->set_name("svc-0");
  EXPECT_EQ(ingestor.Apply("agent-19", again, kTestNowNs).dropped_series, 0u);
}

// --- Usage telemetry.

const std::map<std::string, std::string> kFullHandshakes = {
    {"service", "nginx"}, {"library", "openssl-3"},  {"side", "server"},
    {"kind", "full"},     {"version", "TLSv1.3"},    {"cipher_suite", "TLS_AES_128_GCM_SHA256"},
    {"group", "X25519"},  {"cert_key_type", "ECDSA"}};
const std::map<std::string, std::string> kSigns = {{"service", "nginx"},
                                                   {"library", "openssl-3"},
                                                   {"operation", "sign"},
                                                   {"algorithm", "ECDSA-P256"},
                                                   {"in_handshake", "true"}};
const std::map<std::string, std::string> kConnections = {{"service", "nginx"}, {"library", "openssl-3"}};

// The histogram series of `labels`, or nullptr.
std::optional<prometheus::ClientMetric::Histogram> Histogram(const Ingestor& ingestor,
                                                             const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : FleetMetrics(ingestor, kTestNowNs)) {
    if (f.name != "tlsprof_crypto_operation_latency_seconds") continue;
    EXPECT_EQ(f.type, prometheus::MetricType::Histogram);
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return m.histogram;
    }
  }
  return std::nullopt;
}

TEST(Ingestor, UsageCountsEstimatesAndAddsHistograms) {
  Ingestor ingestor({});
  ingestor.Apply("a", MakeUsageReport(1), kTestNowNs);
  v1::AgentReport scaled = MakeUsageReport(2);
  // A window at duty cycle 0.5: the estimates are twice what was observed.
  scaled.mutable_usage()->set_duty_cycle(0.5);
  scaled.mutable_services(0)->mutable_handshakes(0)->set_estimated(20);
  scaled.mutable_services(0)->mutable_operations(0)->set_estimated(20);
  ingestor.Apply("a", scaled, kTestNowNs);
  ingestor.Apply("b", MakeUsageReport(1), kTestNowNs);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_handshakes_total", kTestNowNs, kFullHandshakes), 10 + 20 + 10);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_crypto_operations_total", kTestNowNs, kSigns), 40);
  // CPU scaled like the count: 0.00025 + 2 x 0.00025 + 0.00025.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_crypto_operation_cpu_seconds_total", kTestNowNs, kSigns), 0.001);
  // The histogram is of the 30 observed signatures: 24 in [24.576, 32.768) us, 6 in [49.152, 65.536).
  auto h = Histogram(ingestor, kSigns);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->sample_count, 30u);
  EXPECT_DOUBLE_EQ(h->sample_sum, 0.00075);
  ASSERT_EQ(h->bucket.size(), 50u);
  EXPECT_DOUBLE_EQ(h->bucket[0].upper_bound, 1.024e-6);
  EXPECT_DOUBLE_EQ(h->bucket[1].upper_bound, 1.536e-6);
  EXPECT_DOUBLE_EQ(h->bucket[10].upper_bound, 32.768e-6);
  EXPECT_DOUBLE_EQ(h->bucket[48].upper_bound, 17.179869184);
  EXPECT_EQ(h->bucket[9].cumulative_count, 0u);
  EXPECT_EQ(h->bucket[10].cumulative_count, 24u);
  EXPECT_EQ(h->bucket[11].cumulative_count, 24u);
  EXPECT_EQ(h->bucket[12].cumulative_count, 30u);
  EXPECT_EQ(h->bucket[49].cumulative_count, 30u);
  EXPECT_TRUE(std::isinf(h->bucket[49].upper_bound));
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_usage_probe_cpu_seconds_total"), 0.006);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_usage_probe_hits_total"), 300);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_usage_probe_budget_cpu_seconds_total"), 0.3);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_usage_probe_min_duty_cycle"), 0.5);
  // Connections are a gauge: each agent's latest value, summed over agents.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs, kConnections), 14);
}

TEST(Ingestor, ConnectionsAreTheLatestOfEachCurrentAgent) {
  Ingestor ingestor({});
  auto with_connections = [](uint64_t sequence, double n, std::string instance = std::string(16, 'i')) {
    v1::AgentReport r = MakeUsageReport(sequence, std::move(instance));
    r.mutable_services(0)->mutable_connections(0)->set_estimated(n);
    return r;
  };
  ingestor.Apply("a", with_connections(3, 30), kTestNowNs);
  ingestor.Apply("b", with_connections(1, 5), kTestNowNs);
  // A late batch of a lower sequence does not replace the newer value.
  ingestor.Apply("a", with_connections(2, 20), kTestNowNs);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs, kConnections), 35);
  // A new instance (the agent restarted with a new state directory) does.
  ingestor.Apply("a", with_connections(1, 12, std::string(16, 'j')), kTestNowNs + 1);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs + 1, kConnections), 17);
  // Silent agents drop out after 3 of their windows (10 s each): 30 s.
  const int64_t s = 1'000'000'000;
  ingestor.Apply("b", with_connections(2, 6), kTestNowNs + 20 * s);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs + 30 * s, kConnections), 18);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs + 31 * s, kConnections), 6);
  EXPECT_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs + 51 * s, kConnections), -1);
  EXPECT_EQ(Scalar(ingestor, "tlsprof_usage_probe_min_duty_cycle", kTestNowNs + 51 * s), -1);
  // The counters stay.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_handshakes_total", kTestNowNs + 51 * s, kFullHandshakes), 50);
}

TEST(Ingestor, EvictedAgentsLeaveTheConnectionsGauge) {
  IngestOptions options;
  options.max_agents = 1;
  Ingestor ingestor(options);
  ingestor.Apply("old", MakeUsageReport(1), kTestNowNs);
  // The horizon of 30 s has not passed for the gauge's query time, but the agent is gone.
  const int64_t later = kTestNowNs + kAgentIdleEvictNs + 1;
  ingestor.Apply("new", MakeReport(1), later);
  EXPECT_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs + 1, kConnections), -1);
  // nginx's busy and cpu series, 2 handshake and 1 operation series (counters stay); no connections.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_series", later), 5);
}

// MakeUsageReport with handshake CPU: `full` and `resumed` seconds on its
// two rows, and `resident` bytes beside its 7 connections.
v1::AgentReport WithCosts(v1::AgentReport r, double full, double resumed, uint64_t resident) {
  v1::Service* s = r.mutable_services(0);
  s->mutable_handshakes(0)->set_cpu_seconds(full);
  s->mutable_handshakes(1)->set_cpu_seconds(resumed);
  s->mutable_connections(0)->set_resident_bytes(resident);
  return r;
}

const std::map<std::string, std::string> kFullCpu = {
    {"service", "nginx"}, {"library", "openssl-3"}, {"kind", "full"}, {"cert_key_type", "ECDSA"}};
const std::map<std::string, std::string> kResumedCpu = {
    {"service", "nginx"}, {"library", "openssl-3"}, {"kind", "resumed"}, {"cert_key_type", "ECDSA"}};

TEST(Ingestor, HandshakeCpuAddsUpOverReportsAgentsAndRowsOfOneKindAndKey) {
  Ingestor ingestor({});
  ingestor.Apply("a", WithCosts(MakeUsageReport(1), 0.02, 0.001, 0), kTestNowNs);
  ingestor.Apply("a", WithCosts(MakeUsageReport(2), 0.03, 0.002, 0), kTestNowNs);
  // Another agent's, with a second full row that differs only in labels the
  // CPU series does not carry (its group): one series.
  v1::AgentReport b = WithCosts(MakeUsageReport(1), 0.01, 0, 0);
  v1::Handshakes* p256 = b.mutable_services(0)->add_handshakes();
  *p256 = b.services(0).handshakes(0);
  p256->set_group("P-256");
  p256->set_cpu_seconds(0.005);
  ingestor.Apply("b", b, kTestNowNs);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_handshake_cpu_seconds_total", kTestNowNs, kFullCpu),
                   0.02 + 0.03 + 0.01 + 0.005);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_handshake_cpu_seconds_total", kTestNowNs, kResumedCpu), 0.003);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_handshake_cpu_seconds_total"), 2u);
  // A duplicate is not counted again.
  EXPECT_TRUE(ingestor.Apply("a", WithCosts(MakeUsageReport(2), 0.03, 0.002, 0), kTestNowNs).duplicate);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_handshake_cpu_seconds_total", kTestNowNs, kResumedCpu), 0.003);
  // Rows without CPU make no series (reports of older agents, windows without samples).
  Ingestor plain({});
  plain.Apply("a", MakeUsageReport(1), kTestNowNs);
  EXPECT_EQ(SeriesCount(plain, "tlsprof_handshake_cpu_seconds_total"), 0u);
  // Its series count in the caps like the rest: the AES-GCM series, the full
  // row's two, the resumed row's handshake series; the rest is dropped.
  IngestOptions options;
  options.max_series_per_agent = 4;
  Ingestor capped(options);
  EXPECT_EQ(capped.Apply("a", WithCosts(MakeUsageReport(1), 0.02, 0.001, 0), kTestNowNs).dropped_series, 3u);
  EXPECT_EQ(SeriesCount(capped, "tlsprof_handshake_cpu_seconds_total"), 1u);
}

TEST(Ingestor, ResidentMemoryIsTheLatestOfEachAgentBesideItsConnections) {
  Ingestor ingestor({});
  const uint64_t mib = 1 << 20;
  ingestor.Apply("a", WithCosts(MakeUsageReport(2), 0, 0, 70 * mib), kTestNowNs);
  ingestor.Apply("a", WithCosts(MakeUsageReport(1), 0, 0, 999 * mib), kTestNowNs);  // late: not the latest
  ingestor.Apply("b", WithCosts(MakeUsageReport(1), 0, 0, 35 * mib), kTestNowNs);
  // Summed over agents like the connections, so that sum / sum is memory per connection.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_resident_memory_bytes", kTestNowNs, kConnections), 105.0 * mib);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_connections", kTestNowNs, kConnections), 14);
  // Not a series of its own: busy, cpu, 2 handshake and 1 operation series,
  // and each agent's connection series.
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_collector_series"), 1 + 1 + 2 + 1 + 2);
  // A report without connections empties both gauges of its agent.
  v1::AgentReport none = WithCosts(MakeUsageReport(3), 0, 0, 0);
  none.mutable_services(0)->clear_connections();
  ingestor.Apply("a", none, kTestNowNs);
  EXPECT_DOUBLE_EQ(Scalar(ingestor, "tlsprof_tls_resident_memory_bytes", kTestNowNs, kConnections), 35.0 * mib);
  // Silent agents drop out with their connections (after 30 s here).
  EXPECT_EQ(Scalar(ingestor, "tlsprof_tls_resident_memory_bytes", kTestNowNs + 31'000'000'000, kConnections), -1);
}

TEST(Ingestor, UsageRowsCountInTheSeriesCaps) {
  IngestOptions options;
  options.max_series_per_agent = 3;  // the AES-GCM series, then 2 of the 4 usage rows
  Ingestor ingestor(options);
  EXPECT_EQ(ingestor.Apply("a", MakeUsageReport(1), kTestNowNs).dropped_series, 2u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_handshakes_total"), 2u);
  EXPECT_EQ(SeriesCount(ingestor, "tlsprof_crypto_operations_total"), 0u);
  options.max_series_per_agent = 2000;
  options.max_series = 4;  // busy + cpu + 2 handshake series
  Ingestor global(options);
  EXPECT_EQ(global.Apply("a", MakeUsageReport(1), kTestNowNs).dropped_series, 2u);
  EXPECT_DOUBLE_EQ(Scalar(global, "tlsprof_collector_series"), 4);
  EXPECT_DOUBLE_EQ(Scalar(global, "tlsprof_collector_series_limit_dropped_total"), 2);
  // A service past --max-services-per-agent goes with every usage row.
  options.max_series = 100000;
  options.max_services_per_agent = 1;
  Ingestor services(options);
  v1::AgentReport two = MakeUsageReport(1);
  *two.add_services() = two.services(0);
  two.mutable_services(1)->set_name("other");
  two.set_busy_samples(1600);
  EXPECT_EQ(services.Apply("a", two, kTestNowNs).dropped_series, 1u + 1 + 4);
}

TEST(Ingestor, UsageSurvivesSnapshotAndJournalReplay) {
  Ingestor a({});
  a.Apply("x", MakeUsageReport(1), kTestNowNs);
  a.Apply("x", MakeUsageReport(2), kTestNowNs);
  state::State snapshot;
  TakeSnapshot(a, snapshot);
  Ingestor b({});
  ASSERT_TRUE(RestoreSnapshot(snapshot, b).ok());
  // And one more report through the journal's path, in both.
  state::JournalRecord record;
  record.set_agent_key("x");
  record.set_received_unix_ns(kTestNowNs);
  v1::SubmitRequest request;
  *request.mutable_report() = MakeUsageReport(3);
  record.set_submit_request(request.SerializeAsString());
  ASSERT_TRUE(ReplayRecord(record, b).ok());
  a.Apply("x", MakeUsageReport(3), kTestNowNs);
  for (const char* family :
       {"tlsprof_handshakes_total", "tlsprof_crypto_operations_total", "tlsprof_crypto_operation_cpu_seconds_total",
        "tlsprof_tls_connections", "tlsprof_usage_probe_cpu_seconds_total", "tlsprof_usage_probe_hits_total",
        "tlsprof_usage_probe_budget_cpu_seconds_total", "tlsprof_usage_probe_min_duty_cycle"}) {
    EXPECT_EQ(SeriesCount(b, family), SeriesCount(a, family)) << family;
  }
  EXPECT_DOUBLE_EQ(Scalar(b, "tlsprof_handshakes_total", kTestNowNs, kFullHandshakes), 30);
  EXPECT_DOUBLE_EQ(Scalar(b, "tlsprof_tls_connections", kTestNowNs, kConnections), 7);
  EXPECT_DOUBLE_EQ(Scalar(b, "tlsprof_usage_probe_hits_total"), 300);
  EXPECT_DOUBLE_EQ(Scalar(b, "tlsprof_usage_probe_budget_cpu_seconds_total"), 0.3);
  auto ha = Histogram(a, kSigns), hb = Histogram(b, kSigns);
  ASSERT_TRUE(ha && hb);
  EXPECT_EQ(hb->sample_count, 30u);
  for (size_t i = 0; i < ha->bucket.size(); ++i)
    EXPECT_EQ(hb->bucket[i].cumulative_count, ha->bucket[i].cumulative_count);
  EXPECT_TRUE(b.Apply("x", MakeUsageReport(2), kTestNowNs).duplicate);
  // A corrupt snapshot is an error, not a crash.
  snapshot.mutable_handshakes(0)->mutable_labels()->RemoveLast();
  Ingestor c({});
  EXPECT_FALSE(RestoreSnapshot(snapshot, c).ok());
}

TEST(Ingestor, SweepingRateLimitBucketsKeepsTheAgents) {
  IngestOptions options;
  options.max_agents = 5;
  options.rate_per_agent = 1;
  options.rate_burst = 1;
  Ingestor ingestor(options);
  ingestor.Apply("kept", MakeReport(1), kTestNowNs);
  EXPECT_TRUE(ingestor.TakeToken("kept", kTestNowNs));
  // Keys that never become agents: their buckets are swept, the agent's is not.
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(ingestor.TakeToken("junk-" + std::to_string(i), kTestNowNs));
  EXPECT_FALSE(ingestor.TakeToken("kept", kTestNowNs));  // its empty bucket survived the sweeps
}

}  // namespace
}  // namespace tlsprof::collector
