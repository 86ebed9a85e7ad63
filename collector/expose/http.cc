#include "collector/expose/http.h"

#include <prometheus/text_serializer.h>

#include <charconv>
#include <map>

#include "collector/expose/web_assets.h"

namespace tlsprof::collector {
namespace {

// `extra` is zero or more "Name: value\r\n" lines.
http::Response Reply(int code, const char* reason, const char* content_type, std::string body,
                     const std::string& extra = "") {
  return http::Response{code, reason, content_type, std::move(body), extra};
}

http::Response ReplyJson(int code, const char* reason, const nlohmann::json& body) {
  // Agent identities are certificate CNs, which need not be UTF-8: replace
  // what is not rather than throw.
  return Reply(code, reason, "application/json",
               body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
               std::string("Cache-Control: no-store\r\n") + kSecurityHeaders);
}

http::Response ReplyError(int code, const char* reason, const std::string& message) {
  return ReplyJson(code, reason, nlohmann::json{{"error", message}});
}

// A strong validator for an embedded file: FNV-1a of its bytes.
std::string ETag(std::string_view body) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : body) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[24];
  std::snprintf(buf, sizeof(buf), "\"%016llx\"", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

Result<int> ParseIntParam(const char* query_string, const char* name, int fallback, int min, int max) {
  const std::optional<std::string> param = http::QueryParam(query_string, name);
  if (!param) return fallback;
  const std::string& value = *param;
  int parsed = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (ec != std::errc() || end != value.data() + value.size() || parsed < min || parsed > max) {
    return MakeError("{}: must be an integer {}-{}, got '{}'", name, min, max, value);
  }
  return parsed;
}

Result<int> ParseSummaryMinutes(const char* query_string) {
  return ParseIntParam(query_string, "minutes", kDefaultSummaryMinutes, 1, kMaxSummaryMinutes);
}

class HttpServer::Routes {
 public:
  explicit Routes(const HttpCallbacks* callbacks) : callbacks_(callbacks) {
    for (const WebAsset& asset : WebAssets()) assets_.emplace(asset.path, Asset{&asset, ETag(asset.body)});
  }

  http::Response Get(const http::Request& request) const {
    const std::string_view path = request.path();
    if (path == "/metrics") {
      return Reply(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                   prometheus::TextSerializer().Serialize(callbacks_->collect()));
    } else if (path == "/api/v1/summary") {
      return Api(ParseSummaryMinutes(request.query()), callbacks_->summary);
    } else if (path == "/api/v1/trend") {
      return Api(ParseIntParam(request.query(), "minutes", kDefaultTrendMinutes, 1, kMaxSummaryMinutes),
                 callbacks_->trend);
    } else if (path == "/healthz" && callbacks_->health) {
      const auto [healthy, text] = callbacks_->health();
      return http::Response{healthy ? 200 : 503, healthy ? "OK" : "Service Unavailable", "text/plain; charset=utf-8",
                            text + "\n", "Cache-Control: no-store\r\n"};
    } else if (path == "/api/v1/agents") {
      return Api(ParseIntParam(request.query(), "limit", kMaxAgentsListed, 1, kMaxAgentsListed), callbacks_->agents);
    } else if (auto it = assets_.find(path == "/status" ? "/" : path); it != assets_.end()) {
      return Static(request, it->second);
    }
    return ReplyError(404, "Not Found",
                      "no such page; try / (status page), /metrics, /healthz, /api/v1/summary, /api/v1/trend, "
                      "/api/v1/agents");
  }

 private:
  struct Asset {
    const WebAsset* file;
    std::string etag;
  };

  static http::Response Api(const Result<int>& param, const std::function<nlohmann::json(int)>& fn) {
    if (!param.ok()) return ReplyError(400, "Bad Request", param.error().message);
    if (!fn) return ReplyError(404, "Not Found", "this endpoint is not served here");
    return ReplyJson(200, "OK", fn(*param));
  }

  static http::Response Static(const http::Request& request, const Asset& asset) {
    // no-cache: revalidate every load (the names carry no version, and a new
    // binary may serve new files); the ETag makes that a 304.
    const std::string headers = "Cache-Control: no-cache\r\nETag: " + asset.etag + "\r\n" + kSecurityHeaders;
    const char* if_none_match = request.header("If-None-Match");
    if (if_none_match != nullptr && asset.etag == if_none_match) {
      return http::Response{304, "Not Modified", "", "", headers};  // no content headers
    }
    return Reply(200, "OK", std::string(asset.file->content_type).c_str(), std::string(asset.file->body), headers);
  }

  const HttpCallbacks* callbacks_;
  std::map<std::string_view, Asset, std::less<>> assets_;
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen, HttpCallbacks callbacks) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->callbacks_ = std::move(callbacks);
  server->routes_ = std::make_unique<Routes>(&server->callbacks_);
  http::Options options;
  options.listen = listen;  // common/http's default workers and request timeout
  // Everything here is read-only.
  options.not_allowed = Reply(405, "Method Not Allowed", "application/json",
                              nlohmann::json{{"error", "only GET is served here"}}.dump() + "\n",
                              std::string("Allow: GET\r\n") + kSecurityHeaders);
  options.internal_error = [](const std::string& what) { return ReplyError(500, "Internal Server Error", what); };
  // One handler routes by exact path; "/" catches the rest (a 404 unless it
  // is a page file).
  const Routes* routes = server->routes_.get();
  for (const char* path : {"/metrics", "/healthz", "/api/v1/summary", "/api/v1/trend", "/api/v1/agents", "/"}) {
    options.routes.emplace_back(path, [routes](const http::Request& request) { return routes->Get(request); });
  }
  auto started = http::Server::Start(std::move(options));
  if (!started.ok()) {
    return MakeError("--metrics-listen {}: cannot listen ({}); is the address valid and the port free?", listen,
                     started.error().message);
  }
  server->server_ = std::move(started).value();
  return server;
}

HttpServer::~HttpServer() = default;

}  // namespace tlsprof::collector
