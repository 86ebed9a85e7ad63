// The collector's HTTP endpoints on --metrics-listen: GET /metrics (Prometheus
// text format), the JSON API (/api/v1/summary?minutes=N, /api/v1/trend?minutes=N,
// /api/v1/agents?limit=N) and the status page at / (embedded files, see
// web_assets.h). The shared server of common/http serves them all.
// Thread-safe: the callbacks are called from its worker threads concurrently,
// so they must be thread-safe themselves.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/metric_family.h>
#include <nlohmann/json.hpp>

#include "common/http/server.h"
#include "common/result.h"

namespace tlsprof::collector {

struct HttpCallbacks {
  std::function<std::vector<prometheus::MetricFamily>()> collect;  // everything /metrics shows
  std::function<nlohmann::json(int minutes)> summary;
  std::function<nlohmann::json(int minutes)> trend;
  std::function<nlohmann::json(int limit)> agents;
  // GET /healthz, the liveness check: (healthy, one line saying why).
  std::function<std::pair<bool, std::string>()> health;
};

// The summary's `minutes` parameter: 1-60, default 5.
inline constexpr int kDefaultSummaryMinutes = 5;
inline constexpr int kMaxSummaryMinutes = 60;
// The trend's: 1-60, default 60 (the last hour).
inline constexpr int kDefaultTrendMinutes = 60;
// /api/v1/agents lists at most this many (`limit`, default the same).
inline constexpr int kMaxAgentsListed = 1000;
// Parses the query string's `name` as an integer in [min, max]; `fallback`
// when absent; "<name>: must be an integer <min>-<max>, got '<value>'" when bad.
Result<int> ParseIntParam(const char* query_string, const char* name, int fallback, int min, int max);
// ParseIntParam(query_string, "minutes", kDefaultSummaryMinutes, 1, kMaxSummaryMinutes).
Result<int> ParseSummaryMinutes(const char* query_string);

// The headers every response of the status page and the API carries: no
// inline or foreign script, style or connection (the page shows
// agent-supplied strings), no framing, no MIME sniffing.
inline constexpr char kSecurityHeaders[] =
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n";

class HttpServer {
 public:
  // `listen` is HOST:PORT ("0.0.0.0:9465", "127.0.0.1:9465", "[::1]:9465").
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& listen, HttpCallbacks callbacks);
  ~HttpServer();

 private:
  class Routes;
  HttpServer() = default;
  // Destroyed in reverse: the server (which waits for requests in flight)
  // before the routes and callbacks its handlers use.
  HttpCallbacks callbacks_;
  std::unique_ptr<Routes> routes_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace tlsprof::collector
