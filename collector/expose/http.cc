#include "collector/expose/http.h"

#include <CivetServer.h>
#include <prometheus/text_serializer.h>

#include <charconv>
#include <cstring>

namespace tlsprof::collector {
namespace {

void Reply(mg_connection* conn, int code, const char* reason, const char* content_type, const std::string& body) {
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
            reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

}  // namespace

Result<int> ParseSummaryMinutes(const char* query_string) {
  if (query_string == nullptr) return kDefaultSummaryMinutes;
  std::string value;
  if (!CivetServer::getParam(query_string, std::strlen(query_string), "minutes", value, 0)) {
    return kDefaultSummaryMinutes;
  }
  int minutes = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), minutes);
  if (ec != std::errc() || end != value.data() + value.size() || minutes < 1 || minutes > kMaxSummaryMinutes) {
    return MakeError("minutes: must be an integer 1-{}, got '{}'", kMaxSummaryMinutes, value);
  }
  return minutes;
}

class HttpServer::Handler : public CivetHandler {
 public:
  Handler(const HttpCallbacks* callbacks, bool summary) : callbacks_(callbacks), summary_(summary) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (!summary_) {
      const std::string body = prometheus::TextSerializer().Serialize(callbacks_->collect());
      Reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body);
      return true;
    }
    Result<int> minutes = ParseSummaryMinutes(mg_get_request_info(conn)->query_string);
    if (!minutes.ok()) {
      Reply(conn, 400, "Bad Request", "application/json", nlohmann::json{{"error", minutes.error().message}}.dump());
      return true;
    }
    Reply(conn, 200, "OK", "application/json", callbacks_->summary(*minutes).dump());
    return true;
  }

 private:
  const HttpCallbacks* callbacks_;
  bool summary_;
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
  server->metrics_ = std::make_unique<Handler>(&server->callbacks_, false);
  server->summary_ = std::make_unique<Handler>(&server->callbacks_, true);
  server->server_->addHandler("/metrics", server->metrics_.get());
  server->server_->addHandler("/api/v1/summary", server->summary_.get());
  return server;
}

HttpServer::~HttpServer() {
  if (server_) server_->close();
}

}  // namespace tlsprof::collector
