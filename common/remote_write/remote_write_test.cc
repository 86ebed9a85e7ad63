// The remote-write encoding and delivery against a real HTTP server
// (civetweb) that decodes what it is sent, and can answer 5xx or 4xx.
#include <CivetServer.h>
#include <gtest/gtest.h>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/remote_write/encode.h"
#include "common/remote_write/writer.h"

namespace tlsprof::remote_write {
namespace {

// "name{a=b,...}" of a series, labels in their order on the wire.
std::string Key(const ::prometheus::TimeSeries& s) {
  std::string key;
  for (const auto& l : s.labels()) key += (key.empty() ? "" : ",") + l.name() + "=" + l.value();
  return key;
}

std::vector<::prometheus::MetricFamily> SampleFamilies() {
  auto registry = std::make_shared<::prometheus::Registry>();
  auto& c = ::prometheus::BuildCounter().Name("tlsprof_cpu_seconds_total").Help("h").Register(*registry);
  c.Add({{"service", "nginx"}, {"bucket", "cipher"}}).Increment(2.5);
  ::prometheus::BuildGauge().Name("tlsprof_agents").Help("h").Register(*registry).Add({}).Set(3);
  auto& h = ::prometheus::BuildHistogram().Name("tlsprof_latency_seconds").Help("h").Register(*registry);
  h.Add({{"op", "sign"}}, ::prometheus::Histogram::BucketBoundaries{0.001, 0.01}).Observe(0.005);
  return registry->Collect();
}

TEST(Encode, EverySeriesWithSortedLabelsAndName) {
  auto requests = Encode(SampleFamilies(), 1'700'000'000'000, 100);
  ASSERT_EQ(requests.size(), 1u);
  std::map<std::string, double> got;
  for (const auto& s : requests[0].timeseries()) {
    ASSERT_EQ(s.samples_size(), 1);
    EXPECT_EQ(s.samples(0).timestamp(), 1'700'000'000'000);
    for (int i = 1; i < s.labels_size(); ++i) EXPECT_LT(s.labels(i - 1).name(), s.labels(i).name()) << Key(s);
    got[Key(s)] = s.samples(0).value();
  }
  EXPECT_EQ(got.at("__name__=tlsprof_cpu_seconds_total,bucket=cipher,service=nginx"), 2.5);
  EXPECT_EQ(got.at("__name__=tlsprof_agents"), 3);
  EXPECT_EQ(got.at("__name__=tlsprof_latency_seconds_bucket,le=0.01,op=sign"), 1);
  EXPECT_EQ(got.at("__name__=tlsprof_latency_seconds_bucket,le=0.001,op=sign"), 0);
  EXPECT_EQ(got.at("__name__=tlsprof_latency_seconds_bucket,le=+Inf,op=sign"), 1);
  EXPECT_EQ(got.at("__name__=tlsprof_latency_seconds_count,op=sign"), 1);
  EXPECT_DOUBLE_EQ(got.at("__name__=tlsprof_latency_seconds_sum,op=sign"), 0.005);
  EXPECT_EQ(got.size(), 7u);
}

TEST(Encode, ExternalLabelsGoOnEverySeries) {
  auto requests = Encode(SampleFamilies(), 1, 100, {{"collector", "c1"}});
  ASSERT_EQ(requests.size(), 1u);
  for (const auto& s : requests[0].timeseries()) EXPECT_NE(Key(s).find("collector=c1"), std::string::npos) << Key(s);
}

TEST(Encode, CutsIntoRequestsAndRoundTripsThroughSnappy) {
  auto requests = Encode(SampleFamilies(), 1, 3);
  ASSERT_EQ(requests.size(), 3u);  // 7 series, 3 per request
  ::prometheus::WriteRequest back;
  ASSERT_TRUE(DecodeBody(CompressedBody(requests[2]), back));
  EXPECT_EQ(back.timeseries_size(), 1);
  EXPECT_FALSE(DecodeBody("not snappy", back));
}

// A receiver: decodes each POST; answers the next scripted status codes, then 204.
class Receiver : public CivetHandler {
 public:
  Receiver() : server_({"listening_ports", "127.0.0.1:0", "num_threads", "2"}) {
    server_.addHandler("/api/v1/write", this);
  }
  std::string url() { return "http://127.0.0.1:" + std::to_string(server_.getListeningPorts()[0]) + "/api/v1/write"; }
  void Script(std::vector<int> codes) {
    std::lock_guard lock(mu_);
    codes_ = std::move(codes);
  }
  bool handlePost(CivetServer*, mg_connection* conn) override {
    std::string body;
    char buf[4096];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) body.append(buf, static_cast<size_t>(n));
    const char* encoding = mg_get_header(conn, "Content-Encoding");
    int code = 204;
    {
      std::lock_guard lock(mu_);
      if (!codes_.empty()) {
        code = codes_.front();
        codes_.erase(codes_.begin());
      }
      ++posts_;
      ::prometheus::WriteRequest request;
      if (code == 204 && encoding != nullptr && std::string(encoding) == "snappy" && DecodeBody(body, request)) {
        for (const auto& s : request.timeseries()) samples_[Key(s)] = s.samples(0).value();
      }
    }
    mg_printf(conn, "HTTP/1.1 %d X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", code);
    return true;
  }
  std::map<std::string, double> samples() {
    std::lock_guard lock(mu_);
    return samples_;
  }
  int posts() {
    std::lock_guard lock(mu_);
    return posts_;
  }

 private:
  CivetServer server_;
  std::mutex mu_;
  std::vector<int> codes_;
  std::map<std::string, double> samples_;
  int posts_ = 0;
};

WriterOptions Fast(const std::string& url) {
  WriterOptions o;
  o.url = url;
  o.backoff_min = std::chrono::milliseconds(10);
  o.backoff_max = std::chrono::milliseconds(40);
  return o;
}

TEST(Writer, DeliversAndRetriesServerErrorsInOrder) {
  Receiver receiver;
  receiver.Script({503, 429});
  auto writer = RemoteWriter::Start(Fast(receiver.url()));
  ASSERT_TRUE(writer.ok()) << writer.error().message;
  (*writer)->Enqueue(SampleFamilies(), 1000);
  ASSERT_TRUE((*writer)->Flush(std::chrono::seconds(10)));
  const WriterStats st = (*writer)->stats();
  EXPECT_EQ(st.attempts_failed, 2u);
  EXPECT_EQ(st.requests_sent, 1u);
  EXPECT_EQ(st.samples_sent, 7u);
  EXPECT_EQ(receiver.posts(), 3);
  EXPECT_EQ(receiver.samples().at("__name__=tlsprof_cpu_seconds_total,bucket=cipher,service=nginx"), 2.5);
}

TEST(Writer, ClientErrorsAreDroppedNotRetried) {
  Receiver receiver;
  receiver.Script({400});
  auto writer = RemoteWriter::Start(Fast(receiver.url()));
  ASSERT_TRUE(writer.ok());
  (*writer)->Enqueue(SampleFamilies(), 1000);
  ASSERT_TRUE((*writer)->Flush(std::chrono::seconds(10)));
  EXPECT_EQ((*writer)->stats().requests_rejected, 1u);
  EXPECT_EQ((*writer)->stats().requests_sent, 0u);
  EXPECT_EQ(receiver.posts(), 1);
}

TEST(Writer, AFullQueueDropsTheOldestWhileTheReceiverIsDown) {
  WriterOptions o = Fast("http://127.0.0.1:1/api/v1/write");  // nothing listens
  o.max_queued_requests = 2;
  auto writer = RemoteWriter::Start(o);
  ASSERT_TRUE(writer.ok());
  for (int i = 0; i < 5; ++i) (*writer)->Enqueue(SampleFamilies(), 1000 + i);
  EXPECT_FALSE((*writer)->Flush(std::chrono::milliseconds(100)));
  const WriterStats st = (*writer)->stats();
  EXPECT_EQ(st.requests_dropped, 3u);
  EXPECT_EQ(st.queued_requests, 2u);
  EXPECT_GT(st.attempts_failed, 0u);
}

TEST(Writer, ABadUrlIsAClearError) {
  WriterOptions o;
  o.url = "victoria:8428";
  auto writer = RemoteWriter::Start(o);
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.error().message.find("http://"), std::string::npos);
}

}  // namespace
}  // namespace tlsprof::remote_write
