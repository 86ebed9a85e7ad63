// The collector's series pushed to remote-write receivers (docs/fleet.md,
// "Remote write"): every interval, what /metrics would show is encoded once
// and queued to each receiver's RemoteWriter (common/remote_write), which
// retries; at a stop, a last push and up to `flush` to deliver it. Counters
// are cumulative, so a retried or replayed write never double-counts, and
// the external labels tell the collectors of a tier apart.
// Thread-safe: one pushing thread; Families() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/metric_family.h>

#include "common/remote_write/writer.h"
#include "common/result.h"

namespace tlsprof::collector {

struct RemoteWriteOptions {
  std::vector<std::string> urls;  // one RemoteWriter each
  remote_write::ExternalLabels external_labels;
  std::chrono::milliseconds interval{15000};
  std::chrono::milliseconds flush{5000};
};

class RemoteWritePusher {
 public:
  // What /metrics shows but the pusher's own families, which it adds.
  using Collect = std::function<std::vector<prometheus::MetricFamily>()>;
  // Starts a writer per URL and the pushing thread; a bad URL is an error.
  static Result<std::unique_ptr<RemoteWritePusher>> Start(const RemoteWriteOptions& options, Collect collect);
  ~RemoteWritePusher();  // a last push, then up to `flush` to deliver

  // tlsprof_collector_remote_write_*, from the writers' counters.
  std::vector<prometheus::MetricFamily> Families() const;

 private:
  RemoteWritePusher(const RemoteWriteOptions& options, Collect collect);
  void Push();
  void Loop();

  RemoteWriteOptions options_;
  Collect collect_;
  std::vector<std::unique_ptr<remote_write::RemoteWriter>> writers_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<double> encode_seconds_{0};  // written by the pushing thread, read by Families()
  std::thread thread_;
};

}  // namespace tlsprof::collector
