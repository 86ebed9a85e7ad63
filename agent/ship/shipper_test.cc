// Shipper against a real in-process gRPC collector (insecure, 127.0.0.1).
#include "agent/ship/shipper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "agent/ship/spool.h"
#include "agent/ship/test_collector.h"

namespace tlsprof::ship {
namespace {

using namespace std::chrono_literals;
using testing::CapturedLog;
using testing::MakeReport;
using testing::TempDir;
using testing::TestCollector;
using testing::TestServer;
using testing::UnusedPort;
using testing::WaitFor;

constexpr int64_t kT0 = 1'700'000'000'000'000'000;

// Before main(), so before any thread logs.
const bool kLogCaptureInstalled = (testing::LogCaptureSink(), true);

ShipperOptions FastOptions(const std::string& collector, const std::string& state_dir) {
  ShipperOptions o;
  o.collector = collector;
  o.state_dir = state_dir;
  o.insecure = true;
  o.rpc_timeout = 2s;
  o.backoff_min = 10ms;
  o.backoff_max = 50ms;
  return o;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> v(last - first + 1);
  std::iota(v.begin(), v.end(), first);
  return v;
}

size_t SpoolFiles(const std::string& state_dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(state_dir + "/spool")) {
    if (e.path().extension() == ".batch") ++n;
  }
  return n;
}

std::unique_ptr<Shipper> MustStart(const ShipperOptions& options) {
  auto shipper = Shipper::Start(options);
  EXPECT_TRUE(shipper.ok()) << (shipper.ok() ? "" : shipper.error().message);
  return shipper.ok() ? std::move(*shipper) : nullptr;
}

TEST(ShipperTest, ShipsSealedBatchesAndNumbersThem) {
  TempDir dir;
  TestCollector collector;
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);

  for (int i = 0; i < 3; ++i) {
    auto seq = shipper->Seal(MakeReport(kT0 + i * 10'000'000'000, 100 + i, 10 + i));
    ASSERT_TRUE(seq.ok()) << seq.error().message;
    EXPECT_EQ(*seq, static_cast<uint64_t>(i + 1));
  }
  ASSERT_TRUE(shipper->Flush(5s));
  auto got = collector.accepted();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sequence(), i + 1);
    EXPECT_EQ(got[i].agent_instance().size(), 16u);
    EXPECT_EQ(got[i].agent_instance(), got[0].agent_instance());
    EXPECT_EQ(got[i].busy_samples(), 100 + i);
    EXPECT_EQ(got[i].window().start_unix_ns(), kT0 + static_cast<int64_t>(i) * 10'000'000'000);
  }
  ShipperStats s = shipper->stats();
  EXPECT_EQ(s.sealed, 3u);
  EXPECT_EQ(s.accepted, 3u);
  EXPECT_EQ(s.spooled_batches, 0u);
  EXPECT_EQ(s.spooled_bytes, 0u);
  EXPECT_EQ(s.next_sequence, 4u);
  EXPECT_GT(s.last_success_unix_seconds, 0);
  EXPECT_EQ(SpoolFiles(dir.path()), 0u);
}

TEST(ShipperTest, CollectorDownThenUpDeliversEveryBatchOnceInOrder) {
  TempDir dir;
  int port = UnusedPort();
  ASSERT_GT(port, 0);
  auto shipper = MustStart(FastOptions("127.0.0.1:" + std::to_string(port), dir.path()));
  ASSERT_NE(shipper, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + i * 10'000'000'000, 50, 5)).ok());
  ASSERT_TRUE(WaitFor([&] { return shipper->stats().send_errors >= 2; }, 5s));
  EXPECT_FALSE(shipper->Flush(50ms));
  EXPECT_EQ(shipper->stats().spooled_batches, 5u);
  EXPECT_EQ(SpoolFiles(dir.path()), 5u);

  TestCollector collector;
  TestServer server(&collector, port);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(shipper->Flush(5s));
  EXPECT_EQ(collector.accepted_sequences(), Range(1, 5));
  EXPECT_EQ(collector.calls(), 5u);  // no batch sent twice
  EXPECT_EQ(shipper->stats().accepted, 5u);
  EXPECT_EQ(SpoolFiles(dir.path()), 0u);
}

TEST(ShipperTest, SealWakesAnIdleSenderAndFlushCutsABackoffShort) {
  TempDir dir;
  int port = UnusedPort();
  ShipperOptions options = FastOptions("127.0.0.1:" + std::to_string(port), dir.path());
  options.backoff_min = options.backoff_max = 30s;
  auto shipper = MustStart(options);
  ASSERT_NE(shipper, nullptr);
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return shipper->stats().send_errors == 1; }, 5s));  // now in a 30 s backoff

  TestCollector collector;
  TestServer server(&collector, port);
  ASSERT_TRUE(server.ok());
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(shipper->Flush(5s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(collector.accepted_sequences(), std::vector<uint64_t>{1});

  // Idle (no failure pending): a Seal alone gets the batch out, no Flush.
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + 10'000'000'000, 10, 1)).ok());
  EXPECT_TRUE(WaitFor([&] { return collector.accepted().size() == 2; }, 5s));

  // A shipper in a long backoff stops at once.
  server.Stop();
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + 20'000'000'000, 10, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return shipper->stats().send_errors == 2; }, 5s));
  start = std::chrono::steady_clock::now();
  shipper.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(ShipperTest, ConcurrentSealsGetDistinctSequencesShippedInOrder) {
  TempDir dir;
  TestCollector collector;
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        if (!shipper->Seal(MakeReport(kT0 + (t * 8 + i) * 10'000'000'000, 10, 1)).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(shipper->Flush(5s));
  EXPECT_EQ(collector.accepted_sequences(), Range(1, 32));
  EXPECT_EQ(collector.calls(), 32u);
}

TEST(ShipperTest, FailuresAreLoggedRateLimited) {
  TempDir dir;
  ShipperOptions options = FastOptions("127.0.0.1:" + std::to_string(UnusedPort()), dir.path());
  options.backoff_min = options.backoff_max = 1ms;
  CapturedLog log;
  {
    auto shipper = MustStart(options);
    ASSERT_NE(shipper, nullptr);
    ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
    EXPECT_TRUE(WaitFor([&] { return shipper->stats().send_errors >= 30; }, 5s));
  }
  size_t warnings = log.count("cannot ship batch");
  EXPECT_EQ(warnings, 1u);
}

TEST(ShipperTest, SealReportsADiskErrorAndTheShipperGoesOn) {
  TempDir dir;
  TestCollector collector;
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  std::filesystem::remove_all(dir.path() + "/spool");
  auto failed = shipper->Seal(MakeReport(kT0, 10, 1));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message.find("spool"), std::string::npos) << failed.error().message;
  std::filesystem::create_directory(dir.path() + "/spool");
  auto seq = shipper->Seal(MakeReport(kT0 + 10'000'000'000, 10, 1));
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 2u);  // 1 was handed out, then lost with its window: never reused
  ASSERT_TRUE(shipper->Flush(5s));
  EXPECT_EQ(collector.accepted_sequences(), std::vector<uint64_t>{2});
}

TEST(ShipperTest, DuplicateDeletesTheBatch) {
  TempDir dir;
  TestCollector collector;
  collector.set_script([](size_t, const v1::SubmitRequest&, v1::SubmitResponse* response) {
    response->set_result(v1::SubmitResponse::DUPLICATE);
    return grpc::Status::OK;
  });
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + 10'000'000'000, 10, 1)).ok());
  ASSERT_TRUE(shipper->Flush(5s));
  ShipperStats s = shipper->stats();
  EXPECT_EQ(s.duplicates, 2u);
  EXPECT_EQ(s.accepted, 0u);
  EXPECT_EQ(s.send_errors, 0u);
  EXPECT_EQ(collector.calls(), 2u);
  EXPECT_EQ(SpoolFiles(dir.path()), 0u);
}

// Seals batches 1 and 2 against a collector that answers batch 1 with
// `first` and accepts the rest; a permanent error must drop batch 1 without a
// retry, and batch 2 must still arrive.
void ExpectFirstBatchDroppedNotRetried(const grpc::Status& first) {
  TempDir dir;
  TestCollector collector;
  collector.set_script([first](size_t, const v1::SubmitRequest& request, v1::SubmitResponse* response) {
    if (request.report().sequence() == 1) return first;
    response->set_result(v1::SubmitResponse::ACCEPTED);
    return grpc::Status::OK;
  });
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + 10'000'000'000, 10, 1)).ok());
  ASSERT_TRUE(shipper->Flush(5s));
  ShipperStats s = shipper->stats();
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(s.send_errors, 0u);
  EXPECT_EQ(collector.calls(), 2u);  // not retried
  EXPECT_EQ(collector.accepted_sequences(), std::vector<uint64_t>{2});
}

TEST(ShipperTest, InvalidArgumentDropsTheBatchAndLogsTheCollectorsMessage) {
  CapturedLog log;
  ExpectFirstBatchDroppedNotRetried(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "window: end_unix_ns must be after start_unix_ns"));
  bool logged = false;
  for (const std::string& line : log.lines()) {
    if (line.find("sequence=1") != std::string::npos &&
        line.find("end_unix_ns must be after start_unix_ns") != std::string::npos) {
      logged = true;
    }
  }
  EXPECT_TRUE(logged);
}

TEST(ShipperTest, UnavailableIsRetriedWithBackoff) {
  TempDir dir;
  TestCollector collector;
  collector.set_script([](size_t call, const v1::SubmitRequest&, v1::SubmitResponse* response) {
    // Every code but INVALID_ARGUMENT (and a size-limit RESOURCE_EXHAUSTED) is retried.
    if (call == 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "journal busy");
    if (call == 1) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rate limit: 1 report/s per agent");
    if (call == 2) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no client certificate");
    response->set_result(v1::SubmitResponse::ACCEPTED);
    return grpc::Status::OK;
  });
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(shipper->Flush(5s));
  auto took = std::chrono::steady_clock::now() - start;
  ShipperStats s = shipper->stats();
  EXPECT_EQ(s.send_errors, 3u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(collector.calls(), 4u);
  EXPECT_EQ(collector.accepted_sequences(), std::vector<uint64_t>{1});
  // Three backoffs of at least backoff_min (10 ms) each.
  EXPECT_GE(took, 30ms);
}

TEST(ShipperTest, OversizedBatchIsDroppedNotRetriedForever) {
  TempDir dir;
  TestCollector collector;
  // gRPC's own limit answers RESOURCE_EXHAUSTED "Received message larger than max".
  TestServer server(&collector, 0, grpc::InsecureServerCredentials(), 4096);
  ASSERT_TRUE(server.ok());
  auto shipper = MustStart(FastOptions(server.address(), dir.path()));
  ASSERT_NE(shipper, nullptr);
  v1::AgentReport big = MakeReport(kT0, 10, 1);
  for (int i = 0; i < 200; ++i) big.add_services()->set_name("service-with-a-long-name-" + std::to_string(i));
  ASSERT_TRUE(shipper->Seal(big).ok());
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + 10'000'000'000, 10, 1)).ok());
  ASSERT_TRUE(shipper->Flush(5s));
  ShipperStats s = shipper->stats();
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(collector.accepted_sequences(), std::vector<uint64_t>{2});
}

// tlsprof-collector checks --max-message-bytes itself (below gRPC's limit)
// and answers with its own wording (collector/server/service.cc).
TEST(ShipperTest, CollectorsOwnSizeLimitDropsTheBatchToo) {
  ExpectFirstBatchDroppedNotRetried(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                                 "message of 5000000 bytes exceeds --max-message-bytes 4194304"));
}

TEST(ShipperTest, HangingCollectorBlocksNeitherSealNorShutdown) {
  TempDir dir;
  TestCollector collector;
  collector.set_hang(true);
  TestServer server(&collector);
  ASSERT_TRUE(server.ok());
  ShipperOptions options = FastOptions(server.address(), dir.path());
  options.rpc_timeout = 30s;
  auto shipper = MustStart(options);
  ASSERT_NE(shipper, nullptr);
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return collector.calls() >= 1; }, 5s));  // the RPC now hangs
  auto start = std::chrono::steady_clock::now();
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + i * 10'000'000'000, 10, 1)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(shipper->stats().sealed, 6u);
  EXPECT_FALSE(shipper->Flush(100ms));
  start = std::chrono::steady_clock::now();
  shipper.reset();  // cancels the RPC in flight
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(SpoolFiles(dir.path()), 6u);  // all still there for the next start
  collector.set_hang(false);
}

TEST(ShipperTest, FlushReturnsFalseWhileTheCollectorIsDown) {
  TempDir dir;
  auto shipper = MustStart(FastOptions("127.0.0.1:" + std::to_string(UnusedPort()), dir.path()));
  ASSERT_NE(shipper, nullptr);
  EXPECT_TRUE(shipper->Flush(10ms));  // nothing to ship
  ASSERT_TRUE(shipper->Seal(MakeReport(kT0, 10, 1)).ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(shipper->Flush(200ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_GT(shipper->stats().send_errors, 0u);
}

TEST(ShipperTest, SealLogsTheTruthLine) {
  TempDir dir;
  auto shipper = MustStart(FastOptions("127.0.0.1:" + std::to_string(UnusedPort()), dir.path()));
  ASSERT_NE(shipper, nullptr);
  CapturedLog log;
  v1::AgentReport report = MakeReport(kT0, 1234, 77);
  auto* second = report.add_services();
  second->set_name("(non-tls)");
  second->set_busy_samples(500);
  second->set_tls_samples(0);
  auto* third = report.add_services();
  third->set_name("envoy");
  third->set_tls_samples(23);
  ASSERT_TRUE(shipper->Seal(report).ok());
  std::vector<std::string> lines = log.lines();
  std::string want =
      "sealed batch sequence=1 window=[1700000000000000000,1700000010000000000) busy_samples=1234 "
      "tls_samples=100";
  EXPECT_TRUE(std::find(lines.begin(), lines.end(), want) != lines.end()) << (lines.empty() ? "" : lines.back());
}

TEST(ShipperTest, RestartShipsLeftoversFirstAndContinuesSequences) {
  TempDir dir;
  int port = UnusedPort();
  std::string instance;
  {
    auto shipper = MustStart(FastOptions("127.0.0.1:" + std::to_string(port), dir.path()));
    ASSERT_NE(shipper, nullptr);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(shipper->Seal(MakeReport(kT0 + i * 10'000'000'000, 10, 1)).ok());
  }
  EXPECT_EQ(SpoolFiles(dir.path()), 3u);
  TestCollector collector;
  TestServer server(&collector, port);
  ASSERT_TRUE(server.ok());
  {
    auto shipper = MustStart(FastOptions(server.address(), dir.path()));
    ASSERT_NE(shipper, nullptr);
    EXPECT_EQ(shipper->stats().next_sequence, 4u);
    for (int i = 3; i < 5; ++i) {
      auto seq = shipper->Seal(MakeReport(kT0 + i * 10'000'000'000, 10, 1));
      ASSERT_TRUE(seq.ok());
      EXPECT_EQ(*seq, static_cast<uint64_t>(i + 1));
    }
    ASSERT_TRUE(shipper->Flush(5s));
  }
  EXPECT_EQ(collector.accepted_sequences(), Range(1, 5));
  auto got = collector.accepted();
  for (const auto& r : got) EXPECT_EQ(r.agent_instance(), got[0].agent_instance());
  // An empty spool: the next run still continues the sequence.
  {
    auto shipper = MustStart(FastOptions(server.address(), dir.path()));
    ASSERT_NE(shipper, nullptr);
    auto seq = shipper->Seal(MakeReport(kT0 + 50'000'000'000, 10, 1));
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, 6u);
    ASSERT_TRUE(shipper->Flush(5s));
  }
  EXPECT_EQ(collector.accepted_sequences(), Range(1, 6));
}

}  // namespace
}  // namespace tlsprof::ship
