// RemoteWriter: delivers remote-write requests to one receiver's URL
// (Prometheus' /api/v1/write, VictoriaMetrics' /api/v1/write) from a bounded
// queue, on its own thread. A request that fails with a network error, a
// 5xx or 429 is retried with exponential backoff, in order, until it is
// delivered or pushed out of a full queue (the oldest goes first, counted);
// one answered with another 4xx is dropped and counted, since sending it
// again would fail again. Requests carry cumulative counters (encode.h), so
// a retry never double-counts.
// Thread-safe: Enqueue(), Flush() and stats() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/metric_family.h>

#include "common/remote_write/encode.h"
#include "common/result.h"

namespace tlsprof::remote_write {

struct WriterOptions {
  std::string url;                 // http(s)://HOST:PORT/PATH
  ExternalLabels external_labels;  // added to every series
  size_t max_queued_requests = 256;
  size_t max_series_per_request = 2000;
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds backoff_min{250};
  std::chrono::milliseconds backoff_max{30000};
};

struct WriterStats {
  uint64_t requests_sent = 0;  // answered 2xx
  uint64_t samples_sent = 0;
  uint64_t attempts_failed = 0;    // network errors, 5xx and 429: retried
  uint64_t requests_rejected = 0;  // other 4xx: dropped
  uint64_t requests_dropped = 0;   // pushed out of the full queue
  uint64_t queued_requests = 0;    // waiting now
  double send_seconds = 0;         // in POSTs, every attempt: samples_sent / send_seconds is the throughput
  double last_success_unix_seconds = 0;
};

class RemoteWriter {
 public:
  // Checks the URL and starts the sending thread; nothing is sent yet.
  static Result<std::unique_ptr<RemoteWriter>> Start(const WriterOptions& options);
  virtual ~RemoteWriter() = default;

  // Queues requests (Encode's, with this writer's external labels or not).
  virtual void Enqueue(const std::vector<::prometheus::WriteRequest>& requests) = 0;
  // Encodes the families' series at `timestamp_ms` with the options'
  // external labels and queues them.
  void Enqueue(const std::vector<::prometheus::MetricFamily>& families, int64_t timestamp_ms) {
    Enqueue(Encode(families, timestamp_ms, options().max_series_per_request, options().external_labels));
  }
  virtual const WriterOptions& options() const = 0;
  // Waits up to `budget` for the queue to empty; true if it did.
  virtual bool Flush(std::chrono::milliseconds budget) = 0;
  virtual WriterStats stats() const = 0;
};

}  // namespace tlsprof::remote_write
