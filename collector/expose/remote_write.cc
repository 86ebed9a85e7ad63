#include "collector/expose/remote_write.h"

#include <spdlog/spdlog.h>

#include "common/metrics/metric_table.h"
#include "common/metrics/prometheus.h"

namespace tlsprof::collector {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

prometheus::ClientMetric Value(std::vector<prometheus::ClientMetric::Label> labels, double value, bool counter) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  (counter ? m.counter.value : m.gauge.value) = value;
  return m;
}

}  // namespace

RemoteWritePusher::RemoteWritePusher(const RemoteWriteOptions& options, Collect collect)
    : options_(options), collect_(std::move(collect)) {}

Result<std::unique_ptr<RemoteWritePusher>> RemoteWritePusher::Start(const RemoteWriteOptions& options,
                                                                    Collect collect) {
  std::unique_ptr<RemoteWritePusher> p(new RemoteWritePusher(options, std::move(collect)));
  for (const std::string& url : options.urls) {
    remote_write::WriterOptions wo;
    wo.url = url;
    auto writer = remote_write::RemoteWriter::Start(wo);
    if (!writer.ok()) return MakeError("--remote-write: {}", writer.error().message);
    p->writers_.push_back(std::move(writer).value());
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

RemoteWritePusher::~RemoteWritePusher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  Push();
  const auto deadline = std::chrono::steady_clock::now() + options_.flush;
  for (const auto& writer : writers_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!writer->Flush(std::max(left, std::chrono::milliseconds(0)))) {
      spdlog::warn("remote write: {} requests not delivered at stop", writer->stats().queued_requests);
    }
  }
}

void RemoteWritePusher::Push() {
  const auto started = std::chrono::steady_clock::now();
  std::vector<prometheus::MetricFamily> families = collect_();
  std::vector<prometheus::MetricFamily> own = Families();
  families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
  // Encoded once: every receiver gets the same requests.
  const std::vector<::prometheus::WriteRequest> requests = remote_write::Encode(
      families, NowUnixMs(), remote_write::WriterOptions{}.max_series_per_request, options_.external_labels);
  for (const auto& writer : writers_) writer->Enqueue(requests);  // each compresses its copy
  encode_seconds_ = encode_seconds_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void RemoteWritePusher::Loop() {
  std::unique_lock lock(mu_);
  while (!wake_.wait_for(lock, options_.interval, [this] { return stop_; })) {
    lock.unlock();
    Push();
    lock.lock();
  }
}

std::vector<prometheus::MetricFamily> RemoteWritePusher::Families() const {
  prometheus::MetricFamily requests = metrics::Family(metrics::kCollectorRemoteWriteRequests);
  prometheus::MetricFamily samples = metrics::Family(metrics::kCollectorRemoteWriteSamples);
  prometheus::MetricFamily retries = metrics::Family(metrics::kCollectorRemoteWriteRetries);
  prometheus::MetricFamily queue = metrics::Family(metrics::kCollectorRemoteWriteQueue);
  prometheus::MetricFamily send = metrics::Family(metrics::kCollectorRemoteWriteSendSeconds);
  prometheus::MetricFamily encode = metrics::Family(metrics::kCollectorRemoteWriteEncodeSeconds);
  encode.metric.push_back(Value({}, encode_seconds_.load(), true));
  for (size_t i = 0; i < writers_.size(); ++i) {
    const remote_write::WriterStats st = writers_[i]->stats();
    const std::string_view url = options_.urls[i];
    auto result = [&](std::string_view r) {
      return metrics::ClientLabels(metrics::kCollectorRemoteWriteRequests, {url, r});
    };
    requests.metric.push_back(Value(result("sent"), static_cast<double>(st.requests_sent), true));
    requests.metric.push_back(Value(result("rejected"), static_cast<double>(st.requests_rejected), true));
    requests.metric.push_back(Value(result("dropped"), static_cast<double>(st.requests_dropped), true));
    samples.metric.push_back(Value(metrics::ClientLabels(metrics::kCollectorRemoteWriteSamples, {url}),
                                   static_cast<double>(st.samples_sent), true));
    retries.metric.push_back(Value(metrics::ClientLabels(metrics::kCollectorRemoteWriteRetries, {url}),
                                   static_cast<double>(st.attempts_failed), true));
    queue.metric.push_back(Value(metrics::ClientLabels(metrics::kCollectorRemoteWriteQueue, {url}),
                                 static_cast<double>(st.queued_requests), false));
    send.metric.push_back(
        Value(metrics::ClientLabels(metrics::kCollectorRemoteWriteSendSeconds, {url}), st.send_seconds, true));
  }
  return {std::move(requests), std::move(samples), std::move(retries),
          std::move(queue),    std::move(send),    std::move(encode)};
}

}  // namespace tlsprof::collector
