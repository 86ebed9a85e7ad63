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
using namespace testing;

// Before main(), so before any thread logs.
const bool kLogCaptureInstalled = (testing::LogCaptureSink(), true);

ShipperOptions FastOptions(const std::string& collector, const std::string& state_dir) {
  ShipperOptions o;
  o.collectors = {collector};
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

std::unique_ptr<Shipper> MustStart(const ShipperOptions& options) {
  auto shipper = Shipper::Start(options);
  EXPECT_TRUE(shipper.ok()) << (shipper.ok() ? "" : shipper.error().message);
  return shipper.ok() ? std::move(*shipper) : nullptr;
}

// A shipper in a state directory of its own, and the collector it ships to
// (served by Serve(), scripted before that).
class ShipperTest : public ::testing::Test {
 protected:
  // Serves collector_ on `port` (0: an ephemeral one).
  void Serve(int port = 0, int max_receive_message_bytes = -1) {
    server_ =
        std::make_unique<TestServer>(&collector_, port, grpc::InsecureServerCredentials(), max_receive_message_bytes);
    ASSERT_TRUE(server_->ok());
  }

  // FastOptions against the server, or against `port` (where nothing may
  // listen yet).
  ShipperOptions Options(int port = 0) const {
    return FastOptions(port != 0 ? "127.0.0.1:" + std::to_string(port) : server_->address(), dir_.path());
  }

  void StartShipper(const ShipperOptions& options) {
    shipper_ = MustStart(options);
    ASSERT_NE(shipper_, nullptr);
  }

  // Serves collector_ on an ephemeral port and starts a shipper at it.
  void ServeAndStart() {
    ASSERT_NO_FATAL_FAILURE(Serve());
    ASSERT_NO_FATAL_FAILURE(StartShipper(Options()));
  }

  // ServeAndStart, then the small batches 1 and 2 sealed and flushed.
  void ShipTwoSmallBatches() {
    ASSERT_NO_FATAL_FAILURE(ServeAndStart());
    ASSERT_NO_FATAL_FAILURE(SealSmall(0, 2));
    ASSERT_TRUE(shipper_->Flush(5s));
  }

  // What became of the batches (each answered, none failed to send), and the
  // collector's calls.
  void ExpectAnswered(uint64_t accepted, uint64_t rejected, uint64_t duplicates, size_t calls) {
    ShipperStats s = shipper_->stats();
    EXPECT_EQ(s.accepted, accepted);
    EXPECT_EQ(s.rejected, rejected);
    EXPECT_EQ(s.duplicates, duplicates);
    EXPECT_EQ(s.send_errors, 0u);
    EXPECT_EQ(collector_.calls(), calls);
  }

  // Seals the small reports of windows [first, first + n).
  void SealSmall(int first, int n) {
    for (int i = first; i < first + n; ++i) ASSERT_TRUE(shipper_->Seal(MakeReport(WindowStart(i), 10, 1)).ok());
  }

  size_t SpoolFiles() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/spool")) {
      if (e.path().extension() == ".batch") ++n;
    }
    return n;
  }

  // Seals batches 1 and 2 against a collector that answers batch 1 with
  // `first` and accepts the rest; a permanent error must drop batch 1
  // without a retry, and batch 2 must still arrive.
  void ExpectFirstBatchDroppedNotRetried(const grpc::Status& first) {
    collector_.set_script([first](size_t, const v1::SubmitRequest& request, v1::SubmitResponse* response) {
      if (request.report().sequence() == 1) return first;
      response->set_result(v1::SubmitResponse::ACCEPTED);
      return grpc::Status::OK;
    });
    ASSERT_NO_FATAL_FAILURE(ShipTwoSmallBatches());
    ExpectAnswered(/*accepted=*/1, /*rejected=*/1, /*duplicates=*/0, /*calls=*/2);  // not retried
    EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{2});
  }

  TempDir dir_;
  TestCollector collector_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Shipper> shipper_;  // stopped before the server
};

TEST_F(ShipperTest, ShipsSealedBatchesAndNumbersThem) {
  ASSERT_NO_FATAL_FAILURE(ServeAndStart());
  for (int i = 0; i < 3; ++i) {
    auto seq = shipper_->Seal(MakeReport(WindowStart(i), 100 + i, 10 + i));
    ASSERT_TRUE(seq.ok()) << seq.error().message;
    EXPECT_EQ(*seq, static_cast<uint64_t>(i + 1));
  }
  ASSERT_TRUE(shipper_->Flush(5s));
  auto got = collector_.accepted();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sequence(), i + 1);
    EXPECT_EQ(got[i].agent_instance().size(), 16u);
    EXPECT_EQ(got[i].agent_instance(), got[0].agent_instance());
    EXPECT_EQ(got[i].busy_samples(), 100 + i);
    EXPECT_EQ(got[i].window().start_unix_ns(), WindowStart(static_cast<int>(i)));
  }
  ShipperStats s = shipper_->stats();
  EXPECT_EQ(s.sealed, 3u);
  EXPECT_EQ(s.accepted, 3u);
  EXPECT_EQ(s.spooled_batches, 0u);
  EXPECT_EQ(s.spooled_bytes, 0u);
  EXPECT_EQ(s.next_sequence, 4u);
  EXPECT_GT(s.last_success_unix_seconds, 0);
  EXPECT_EQ(SpoolFiles(), 0u);
}

TEST_F(ShipperTest, CollectorDownThenUpDeliversEveryBatchOnceInOrder) {
  int port = UnusedPort();
  ASSERT_GT(port, 0);
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options(port)));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(shipper_->Seal(MakeReport(WindowStart(i), 50, 5)).ok());
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().send_errors >= 2; }, 5s));
  EXPECT_FALSE(shipper_->Flush(50ms));
  EXPECT_EQ(shipper_->stats().spooled_batches, 5u);
  EXPECT_EQ(SpoolFiles(), 5u);

  ASSERT_NO_FATAL_FAILURE(Serve(port));
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_EQ(collector_.accepted_sequences(), Range(1, 5));
  EXPECT_EQ(collector_.calls(), 5u);  // no batch sent twice
  EXPECT_EQ(shipper_->stats().accepted, 5u);
  EXPECT_EQ(SpoolFiles(), 0u);
}

TEST_F(ShipperTest, SealWakesAnIdleSenderAndFlushCutsABackoffShort) {
  int port = UnusedPort();
  ShipperOptions options = Options(port);
  options.backoff_min = options.backoff_max = 30s;
  ASSERT_NO_FATAL_FAILURE(StartShipper(options));
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 1));
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().send_errors == 1; }, 5s));  // now in a 30 s backoff

  ASSERT_NO_FATAL_FAILURE(Serve(port));
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{1});

  // Idle (no failure pending): a Seal alone gets the batch out, no Flush.
  ASSERT_NO_FATAL_FAILURE(SealSmall(1, 1));
  EXPECT_TRUE(WaitFor([&] { return collector_.accepted().size() == 2; }, 5s));

  // A shipper in a long backoff stops at once.
  server_->Stop();
  ASSERT_NO_FATAL_FAILURE(SealSmall(2, 1));
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().send_errors == 2; }, 5s));
  start = std::chrono::steady_clock::now();
  shipper_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_F(ShipperTest, ConcurrentSealsGetDistinctSequencesShippedInOrder) {
  ASSERT_NO_FATAL_FAILURE(ServeAndStart());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        if (!shipper_->Seal(MakeReport(WindowStart(t * 8 + i), 10, 1)).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_EQ(collector_.accepted_sequences(), Range(1, 32));
  EXPECT_EQ(collector_.calls(), 32u);
}

TEST_F(ShipperTest, FailuresAreLoggedRateLimited) {
  ShipperOptions options = Options(UnusedPort());
  options.backoff_min = options.backoff_max = 1ms;
  CapturedLog log;
  ASSERT_NO_FATAL_FAILURE(StartShipper(options));
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 1));
  EXPECT_TRUE(WaitFor([&] { return shipper_->stats().send_errors >= 30; }, 5s));
  shipper_.reset();
  size_t warnings = log.count("cannot ship batch");
  EXPECT_EQ(warnings, 1u);
}

TEST_F(ShipperTest, SealReportsADiskErrorAndTheShipperGoesOn) {
  ASSERT_NO_FATAL_FAILURE(ServeAndStart());
  std::filesystem::remove_all(dir_.path() + "/spool");
  auto failed = shipper_->Seal(MakeReport(WindowStart(0), 10, 1));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message.find("spool"), std::string::npos) << failed.error().message;
  std::filesystem::create_directory(dir_.path() + "/spool");
  auto seq = shipper_->Seal(MakeReport(WindowStart(1), 10, 1));
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 2u);  // 1 was handed out, then lost with its window: never reused
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{2});
}

TEST_F(ShipperTest, DuplicateDeletesTheBatch) {
  collector_.set_script([](size_t, const v1::SubmitRequest&, v1::SubmitResponse* response) {
    response->set_result(v1::SubmitResponse::DUPLICATE);
    return grpc::Status::OK;
  });
  ASSERT_NO_FATAL_FAILURE(ShipTwoSmallBatches());
  ExpectAnswered(/*accepted=*/0, /*rejected=*/0, /*duplicates=*/2, /*calls=*/2);
  EXPECT_EQ(SpoolFiles(), 0u);
}

TEST_F(ShipperTest, InvalidArgumentDropsTheBatchAndLogsTheCollectorsMessage) {
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

TEST_F(ShipperTest, UnavailableIsRetriedWithBackoff) {
  collector_.set_script([](size_t call, const v1::SubmitRequest&, v1::SubmitResponse* response) {
    // Every code but INVALID_ARGUMENT (and a size-limit RESOURCE_EXHAUSTED) is retried.
    if (call == 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "journal busy");
    if (call == 1) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rate limit: 1 report/s per agent");
    if (call == 2) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no client certificate");
    response->set_result(v1::SubmitResponse::ACCEPTED);
    return grpc::Status::OK;
  });
  ASSERT_NO_FATAL_FAILURE(ServeAndStart());
  auto start = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 1));
  ASSERT_TRUE(shipper_->Flush(5s));
  auto took = std::chrono::steady_clock::now() - start;
  ShipperStats s = shipper_->stats();
  EXPECT_EQ(s.send_errors, 3u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(collector_.calls(), 4u);
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{1});
  // Three backoffs of at least backoff_min (10 ms) each.
  EXPECT_GE(took, 30ms);
}

TEST_F(ShipperTest, OversizedBatchIsDroppedNotRetriedForever) {
  // gRPC's own limit answers RESOURCE_EXHAUSTED "Received message larger than max".
  ASSERT_NO_FATAL_FAILURE(Serve(0, 4096));
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options()));
  v1::AgentReport big = MakeReport(WindowStart(0), 10, 1);
  for (int i = 0; i < 200; ++i) big.add_services()->set_name("service-with-a-long-name-" + std::to_string(i));
  ASSERT_TRUE(shipper_->Seal(big).ok());
  ASSERT_NO_FATAL_FAILURE(SealSmall(1, 1));
  ASSERT_TRUE(shipper_->Flush(5s));
  ShipperStats s = shipper_->stats();
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{2});
}

// tlsprof-collector checks --max-message-bytes itself (below gRPC's limit)
// and answers with its own wording (collector/server/service.cc).
TEST_F(ShipperTest, CollectorsOwnSizeLimitDropsTheBatchToo) {
  ExpectFirstBatchDroppedNotRetried(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                                 "message of 5000000 bytes exceeds --max-message-bytes 4194304"));
}

TEST_F(ShipperTest, HangingCollectorBlocksNeitherSealNorShutdown) {
  collector_.set_hang(true);
  ASSERT_NO_FATAL_FAILURE(Serve());
  ShipperOptions options = Options();
  options.rpc_timeout = 30s;
  ASSERT_NO_FATAL_FAILURE(StartShipper(options));
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 1));
  ASSERT_TRUE(WaitFor([&] { return collector_.calls() >= 1; }, 5s));  // the RPC now hangs
  auto start = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(SealSmall(1, 5));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(shipper_->stats().sealed, 6u);
  EXPECT_FALSE(shipper_->Flush(100ms));
  start = std::chrono::steady_clock::now();
  shipper_.reset();  // cancels the RPC in flight
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(SpoolFiles(), 6u);  // all still there for the next start
  collector_.set_hang(false);
}

TEST_F(ShipperTest, FlushReturnsFalseWhileTheCollectorIsDown) {
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options(UnusedPort())));
  EXPECT_TRUE(shipper_->Flush(10ms));  // nothing to ship
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 1));
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(shipper_->Flush(200ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_GT(shipper_->stats().send_errors, 0u);
}

TEST_F(ShipperTest, SealLogsTheTruthLine) {
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options(UnusedPort())));
  CapturedLog log;
  v1::AgentReport report = MakeReport(kT0, 1234, 77);
  auto* second = report.add_services();
  second->set_name("(non-tls)");
  second->set_busy_samples(500);
  second->set_tls_samples(0);
  auto* third = report.add_services();
  third->set_name("envoy");
  third->set_tls_samples(23);
  ASSERT_TRUE(shipper_->Seal(report).ok());
  std::vector<std::string> lines = log.lines();
  std::string want =
      "sealed batch sequence=1 window=[1700000000000000000,1700000010000000000) busy_samples=1234 "
      "tls_samples=100";
  EXPECT_TRUE(std::find(lines.begin(), lines.end(), want) != lines.end()) << (lines.empty() ? "" : lines.back());
}

TEST_F(ShipperTest, RestartShipsLeftoversFirstAndContinuesSequences) {
  int port = UnusedPort();
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options(port)));
  ASSERT_NO_FATAL_FAILURE(SealSmall(0, 3));
  shipper_.reset();
  EXPECT_EQ(SpoolFiles(), 3u);
  ASSERT_NO_FATAL_FAILURE(Serve(port));
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options()));
  EXPECT_EQ(shipper_->stats().next_sequence, 4u);
  for (int i = 3; i < 5; ++i) {
    auto seq = shipper_->Seal(MakeReport(WindowStart(i), 10, 1));
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, static_cast<uint64_t>(i + 1));
  }
  ASSERT_TRUE(shipper_->Flush(5s));
  shipper_.reset();
  EXPECT_EQ(collector_.accepted_sequences(), Range(1, 5));
  auto got = collector_.accepted();
  for (const auto& r : got) EXPECT_EQ(r.agent_instance(), got[0].agent_instance());
  // An empty spool: the next run still continues the sequence.
  ASSERT_NO_FATAL_FAILURE(StartShipper(Options()));
  auto seq = shipper_->Seal(MakeReport(WindowStart(5), 10, 1));
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 6u);
  ASSERT_TRUE(shipper_->Flush(5s));
  shipper_.reset();
  EXPECT_EQ(collector_.accepted_sequences(), Range(1, 6));
}

}  // namespace
}  // namespace tlsprof::ship
