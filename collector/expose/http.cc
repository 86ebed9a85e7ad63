#include "collector/expose/http.h"

#include <CivetServer.h>
#include <prometheus/text_serializer.h>

#include <charconv>
#include <cstring>
#include <map>

#include "collector/expose/web_assets.h"

namespace tlsprof::collector {
namespace {

// `extra` is zero or more "Name: value\r\n" lines.
void Reply(mg_connection* conn, int code, const char* reason, const char* content_type, std::string_view body,
           const std::string& extra = "") {
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", code,
            reason, content_type, body.size(), extra.c_str());
  mg_write(conn, body.data(), body.size());
}

void ReplyJson(mg_connection* conn, int code, const char* reason, const nlohmann::json& body) {
  // Agent identities are certificate CNs, which need not be UTF-8: replace
  // what is not rather than throw.
  Reply(conn, code, reason, "application/json",
        body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
        std::string("Cache-Control: no-store\r\n") + kSecurityHeaders);
}

void ReplyError(mg_connection* conn, int code, const char* reason, const std::string& message) {
  ReplyJson(conn, code, reason, nlohmann::json{{"error", message}});
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
  if (query_string == nullptr) return fallback;
  std::string value;
  if (!CivetServer::getParam(query_string, std::strlen(query_string), name, value, 0)) return fallback;
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

class HttpServer::Handler : public CivetHandler {
 public:
  explicit Handler(const HttpCallbacks* callbacks) : callbacks_(callbacks) {
    for (const WebAsset& asset : WebAssets()) assets_.emplace(asset.path, Asset{&asset, ETag(asset.body)});
  }

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* request = mg_get_request_info(conn);
    const std::string_view path = request->local_uri ? request->local_uri : "";
    try {
      if (path == "/metrics") {
        const std::string body = prometheus::TextSerializer().Serialize(callbacks_->collect());
        Reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body);
      } else if (path == "/api/v1/summary") {
        Api(conn, ParseSummaryMinutes(request->query_string), callbacks_->summary);
      } else if (path == "/api/v1/trend") {
        Api(conn, ParseIntParam(request->query_string, "minutes", kDefaultTrendMinutes, 1, kMaxSummaryMinutes),
            callbacks_->trend);
      } else if (path == "/api/v1/agents") {
        Api(conn, ParseIntParam(request->query_string, "limit", kMaxAgentsListed, 1, kMaxAgentsListed),
            callbacks_->agents);
      } else if (auto it = assets_.find(path == "/status" ? "/" : path); it != assets_.end()) {
        Static(conn, it->second);
      } else {
        ReplyError(conn, 404, "Not Found",
                   "no such page; try / (status page), /metrics, /api/v1/summary, /api/v1/trend, /api/v1/agents");
      }
    } catch (const std::exception& e) {
      ReplyError(conn, 500, "Internal Server Error", e.what());
    }
    return true;
  }

  // Everything here is read-only.
  bool handlePost(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handleHead(CivetServer*, mg_connection* conn) override { return NotAllowed(conn, /*body=*/false); }
  bool handlePut(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handleDelete(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }

 private:
  struct Asset {
    const WebAsset* file;
    std::string etag;
  };

  static bool NotAllowed(mg_connection* conn, bool body = true) {
    Reply(conn, 405, "Method Not Allowed", "application/json",
          body ? nlohmann::json{{"error", "only GET is served here"}}.dump() + "\n" : std::string(),
          std::string("Allow: GET\r\n") + kSecurityHeaders);
    return true;
  }

  static void Api(mg_connection* conn, const Result<int>& param, const std::function<nlohmann::json(int)>& fn) {
    if (!param.ok()) {
      ReplyError(conn, 400, "Bad Request", param.error().message);
    } else if (!fn) {
      ReplyError(conn, 404, "Not Found", "this endpoint is not served here");
    } else {
      ReplyJson(conn, 200, "OK", fn(*param));
    }
  }

  static void Static(mg_connection* conn, const Asset& asset) {
    // no-cache: revalidate every load (the names carry no version, and a new
    // binary may serve new files); the ETag makes that a 304.
    const std::string headers = "Cache-Control: no-cache\r\nETag: " + asset.etag + "\r\n" + kSecurityHeaders;
    const char* if_none_match = mg_get_header(conn, "If-None-Match");
    if (if_none_match != nullptr && asset.etag == if_none_match) {
      mg_printf(conn, "HTTP/1.1 304 Not Modified\r\n%sConnection: close\r\n\r\n", headers.c_str());
      return;
    }
    Reply(conn, 200, "OK", std::string(asset.file->content_type).c_str(), asset.file->body, headers);
  }

  const HttpCallbacks* callbacks_;
  std::map<std::string_view, Asset, std::less<>> assets_;
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen, HttpCallbacks callbacks) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->callbacks_ = std::move(callbacks);
  // civetweb takes "PORT" for every IPv4 address and "HOST:PORT" otherwise.
  std::string port = listen;
  if (port.rfind("0.0.0.0:", 0) == 0) port = port.substr(8);
  if (!port.empty() && port[0] == ':') port = port.substr(1);
  const std::vector<std::string> options = {"listening_ports", port, "num_threads", "4", "enable_keep_alive", "no"};
  try {
    server->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return MakeError("--metrics-listen {}: cannot listen ({}); is the address valid and the port free?", listen,
                     e.what());
  }
  // One handler routes by exact path. civetweb tries exact matches first,
  // then prefixes: "/" catches the rest (a 404 unless it is a page file).
  server->handler_ = std::make_unique<Handler>(&server->callbacks_);
  for (const char* path : {"/metrics", "/api/v1/summary", "/api/v1/trend", "/api/v1/agents", "/"}) {
    server->server_->addHandler(path, server->handler_.get());
  }
  return server;
}

HttpServer::~HttpServer() {
  if (server_) server_->close();
}

}  // namespace tlsprof::collector
