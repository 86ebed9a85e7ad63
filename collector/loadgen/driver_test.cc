// The driver against a real in-process gRPC server on 127.0.0.1 that records
// what arrives and answers like a collector would.
#include "collector/loadgen/driver.h"

#include <map>
#include <mutex>
#include <set>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tlsprof/v1/report.grpc.pb.h"

namespace tlsprof::loadgen {
namespace {

class Sink final : public v1::Collector::Service {
 public:
  // Every `reject_every`-th first attempt (by arrival) gets `reject_code`.
  uint64_t reject_every = 0;
  grpc::StatusCode reject_code = grpc::StatusCode::RESOURCE_EXHAUSTED;

  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    std::lock_guard guard(mu_);
    const auto& r = req->report();
    auto key = std::make_pair(r.agent_instance(), r.sequence());
    ++calls_;
    if (reject_every && calls_ % reject_every == 0 && !rejected_.count(key)) {
      rejected_.insert(key);
      return grpc::Status(reject_code, "sink rejects this one");
    }
    if (!seen_.insert(key).second) {
      resp->set_result(v1::SubmitResponse::DUPLICATE);
      return grpc::Status::OK;
    }
    windows_[r.host().hostname()].emplace_back(r.window().start_unix_ns(), r.window().end_unix_ns());
    sequences_[r.host().hostname()].push_back(r.sequence());
    ReportTotals t = Totals(r);
    tls_ += t.tls_samples;
    busy_ += t.busy_samples;
    resp->set_result(v1::SubmitResponse::ACCEPTED);
    return grpc::Status::OK;
  }

  std::mutex mu_;
  uint64_t calls_ = 0, tls_ = 0, busy_ = 0;
  std::set<std::pair<std::string, uint64_t>> seen_, rejected_;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> windows_;
  std::map<std::string, std::vector<uint64_t>> sequences_;
};

class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&sink_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { server_->Shutdown(); }

  DriverOptions Options() {
    DriverOptions o;
    o.collectors = {"127.0.0.1:" + std::to_string(port_)};
    o.insecure = true;
    o.connections = 4;
    o.threads = 2;
    return o;
  }

  Sink sink_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(DriverTest, TotalWindowsSendsEachWindowOnceAndInOrder) {
  auto fleet = Fleet::Make({.seed = 5, .agents = 37, .series = 20, .interval_seconds = 10});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  o.total_windows = 6;
  o.max_in_flight = 16;
  auto r = RunLoad(*fleet, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->planned, 37u * 6);
  EXPECT_EQ(r->sent, 37u * 6);
  EXPECT_EQ(r->accepted, 37u * 6);
  EXPECT_EQ(r->failed, 0u);
  EXPECT_TRUE(r->errors.empty());
  EXPECT_EQ(r->series, 37u * 6 * 20);
  EXPECT_EQ(r->accepted_totals.tls_samples, sink_.tls_);
  EXPECT_EQ(r->accepted_totals.busy_samples, sink_.busy_);
  ASSERT_EQ(sink_.windows_.size(), 37u);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& [host, windows] : sink_.windows_) {
    SCOPED_TRACE(host);
    std::sort(windows.begin(), windows.end());
    ASSERT_EQ(windows.size(), 6u);
    for (size_t i = 1; i < windows.size(); ++i) EXPECT_EQ(windows[i].first, windows[i - 1].second);
    EXPECT_EQ(windows.back().second - windows.front().first, 6 * fleet->interval_ns());
    EXPECT_LE(windows.back().second, now);  // the collector rejects windows in the future
    // One agent's windows arrive in sequence order (the agent's spool order).
    const auto& seqs = sink_.sequences_[host];
    EXPECT_TRUE(std::is_sorted(seqs.begin(), seqs.end()));
  }
}

TEST_F(DriverTest, SameSeedAgainIsAllDuplicates) {
  auto fleet = Fleet::Make({.seed = 11, .agents = 10, .series = 10});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  o.total_windows = 3;
  auto first = RunLoad(*fleet, o);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->accepted, 30u);
  auto again = RunLoad(*fleet, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->accepted, 0u);
  EXPECT_EQ(again->duplicate, 30u);
  EXPECT_EQ(again->failed, 0u);
}

TEST_F(DriverTest, RetriesResourceExhaustedUntilAccepted) {
  sink_.reject_every = 4;
  auto fleet = Fleet::Make({.seed = 2, .agents = 20, .series = 10});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  o.total_windows = 4;
  auto r = RunLoad(*fleet, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->accepted, 80u);
  EXPECT_EQ(r->failed, 0u);
  EXPECT_GT(r->retried, 0u);
  EXPECT_EQ(r->errors["RESOURCE_EXHAUSTED"], r->retried);
  EXPECT_EQ(r->attempts, 80u + r->retried);
  EXPECT_EQ(sink_.seen_.size(), 80u);
}

TEST_F(DriverTest, InvalidArgumentIsNotRetried) {
  sink_.reject_every = 5;
  sink_.reject_code = grpc::StatusCode::INVALID_ARGUMENT;
  auto fleet = Fleet::Make({.seed = 2, .agents = 20, .series = 10});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  o.total_windows = 5;
  auto r = RunLoad(*fleet, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->failed, 20u);  // every 5th of 100 calls
  EXPECT_EQ(r->accepted, 80u);
  EXPECT_EQ(r->retried, 0u);
  EXPECT_EQ(r->errors["INVALID_ARGUMENT"], 20u);
  EXPECT_EQ(r->error_examples["INVALID_ARGUMENT"], "sink rejects this one");
}

TEST_F(DriverTest, PacedRunSpreadsReportsOverTheInterval) {
  // 40 agents at a 1 s interval for 2 s: 80 reports, 40 per second, each
  // agent's windows contiguous and ending when they are sent.
  auto fleet = Fleet::Make({.seed = 1, .agents = 40, .series = 10, .interval_seconds = 1});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  o.duration_seconds = 2;
  auto start = std::chrono::steady_clock::now();
  auto r = RunLoad(*fleet, o);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->planned, 80u);
  EXPECT_EQ(r->accepted, 80u);
  EXPECT_GE(took, 1.9);  // the last report is due at 1.975 s
  EXPECT_NEAR(r->elapsed_seconds, 2.0, 0.5);
  for (auto& [host, windows] : sink_.windows_) {
    ASSERT_EQ(windows.size(), 2u);
    EXPECT_EQ(windows[1].first, windows[0].second);
  }
}

TEST_F(DriverTest, UnreachableCollectorIsAnError) {
  auto fleet = Fleet::Make({.agents = 1, .series = 10});
  ASSERT_TRUE(fleet.ok());
  DriverOptions o = Options();
  server_->Shutdown();
  server_->Wait();
  o.connect_timeout = std::chrono::milliseconds(300);
  o.total_windows = 1;
  auto r = RunLoad(*fleet, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot connect"), std::string::npos);
}

}  // namespace
}  // namespace tlsprof::loadgen
