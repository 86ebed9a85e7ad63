#include "common/remote_write/writer.h"

#include <curl/curl.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/remote_write/encode.h"

namespace tlsprof::remote_write {
namespace {

using Clock = std::chrono::steady_clock;

double UnixNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

struct Queued {
  uint64_t id = 0;
  std::string body;  // snappy-compressed WriteRequest
  uint64_t samples = 0;
};

// What one POST came to.
enum class Outcome { kSent, kRetry, kReject };

class CurlWriter : public RemoteWriter {
 public:
  explicit CurlWriter(WriterOptions options) : options_(std::move(options)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~CurlWriter() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }

  using RemoteWriter::Enqueue;
  const WriterOptions& options() const override { return options_; }

  void Enqueue(const std::vector<::prometheus::WriteRequest>& requests) override {
    std::vector<Queued> encoded;
    for (const ::prometheus::WriteRequest& r : requests) {
      encoded.push_back({0, CompressedBody(r), static_cast<uint64_t>(r.timeseries_size())});
    }
    {
      std::lock_guard lock(mu_);
      for (Queued& q : encoded) {
        if (queue_.size() >= std::max<size_t>(1, options_.max_queued_requests)) {
          queue_.pop_front();
          ++stats_.requests_dropped;
        }
        q.id = next_id_++;
        queue_.push_back(std::move(q));
      }
      stats_.queued_requests = queue_.size();
    }
    wake_.notify_all();
  }

  bool Flush(std::chrono::milliseconds budget) override {
    std::unique_lock lock(mu_);
    return drained_.wait_for(lock, budget, [this] { return queue_.empty() && !sending_; });
  }

  WriterStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  // Sends the queue's head until it is delivered, rejected or pushed out;
  // backs off between failed attempts.
  void Loop() {
    std::chrono::milliseconds backoff = options_.backoff_min;
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (queue_.empty()) {
        drained_.notify_all();
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        continue;
      }
      const Queued head = queue_.front();
      sending_ = true;
      lock.unlock();
      const auto started = Clock::now();
      const Outcome outcome = Post(head.body);
      const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
      lock.lock();
      sending_ = false;
      stats_.send_seconds += seconds;
      if (outcome == Outcome::kRetry) {
        ++stats_.attempts_failed;
        wake_.wait_for(lock, backoff, [this] { return stop_; });
        backoff = std::min(backoff * 2, options_.backoff_max);
        continue;
      }
      backoff = options_.backoff_min;
      // The head may have been pushed out meanwhile: drop it only if it is
      // still the one sent.
      if (!queue_.empty() && queue_.front().id == head.id) queue_.pop_front();
      if (outcome == Outcome::kSent) {
        ++stats_.requests_sent;
        stats_.samples_sent += head.samples;
        stats_.last_success_unix_seconds = UnixNow();
      } else {
        ++stats_.requests_rejected;
      }
      stats_.queued_requests = queue_.size();
    }
  }

  // One handle for the writer's life: its connection cache keeps the TCP
  // connection to the receiver open from one request to the next (a new
  // handle per request cost a connect each).
  Outcome Post(const std::string& body) {
    if (curl_ == nullptr) {
      curl_ = curl_easy_init();
    } else {
      curl_easy_reset(curl_);  // the options; the connection cache stays
    }
    CURL* curl = curl_;
    if (curl == nullptr) return Outcome::kRetry;
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Content-Encoding: snappy");
    headers = curl_slist_append(headers, "Content-Type: application/x-protobuf");
    headers = curl_slist_append(headers, "X-Prometheus-Remote-Write-Version: 0.1.0");
    curl_easy_setopt(curl, CURLOPT_URL, options_.url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "tlsprof");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(
        curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t n, void*) { return size * n; });
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      spdlog::debug("remote write to {}: {}", options_.url, curl_easy_strerror(rc));
      return Outcome::kRetry;
    }
    if (status / 100 == 2) return Outcome::kSent;
    if (status / 100 == 5 || status == 429) return Outcome::kRetry;
    spdlog::warn("remote write to {}: HTTP {}; the request is dropped", options_.url, status);
    return Outcome::kReject;
  }

  const WriterOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_, drained_;
  std::deque<Queued> queue_;
  uint64_t next_id_ = 0;
  bool sending_ = false;
  bool stop_ = false;
  WriterStats stats_;
  CURL* curl_ = nullptr;  // the sending thread's
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<RemoteWriter>> RemoteWriter::Start(const WriterOptions& options) {
  if (options.url.rfind("http://", 0) != 0 && options.url.rfind("https://", 0) != 0) {
    return MakeError("remote write URL {}: expected http://HOST:PORT/PATH or https://…", options.url);
  }
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) return MakeError("libcurl: {}", curl_easy_strerror(init));
  return std::unique_ptr<RemoteWriter>(new CurlWriter(options));
}

}  // namespace tlsprof::remote_write
