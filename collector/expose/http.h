// The collector's HTTP endpoints on --metrics-listen: GET /metrics (Prometheus
// text format) and GET /api/v1/summary?minutes=N (JSON). One CivetServer
// serves both. Thread-safe: the callbacks are called from civetweb's worker
// threads concurrently, so they must be thread-safe themselves.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/metric_family.h>
#include <nlohmann/json.hpp>

#include "agent/common/result.h"

class CivetServer;

namespace tlsprof::collector {

struct HttpCallbacks {
  std::function<std::vector<prometheus::MetricFamily>()> collect;  // everything /metrics shows
  std::function<nlohmann::json(int minutes)> summary;
};

// The summary's `minutes` parameter: 1-60, default 5.
inline constexpr int kDefaultSummaryMinutes = 5;
inline constexpr int kMaxSummaryMinutes = 60;
// Parses the query string's `minutes`; an error message for a bad value.
Result<int> ParseSummaryMinutes(const char* query_string);

class HttpServer {
 public:
  // `listen` is HOST:PORT ("0.0.0.0:9465", "127.0.0.1:9465", "[::1]:9465").
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& listen, HttpCallbacks callbacks);
  ~HttpServer();

 private:
  class Handler;
  HttpServer() = default;
  HttpCallbacks callbacks_;
  std::unique_ptr<Handler> metrics_, summary_;
  std::unique_ptr<CivetServer> server_;
};

}  // namespace tlsprof::collector
