#include "common/http/server.h"

#include <CivetServer.h>
#include <zlib.h>

#include <cctype>
#include <cstring>
#include <exception>

namespace tlsprof::http {
namespace {

// Empty when zlib fails (the caller then sends the body as it is).
std::string Gzip(std::string_view in) {
  z_stream zs{};
  // 15 + 16: the largest window, with a gzip header and trailer.
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
  std::string out(deflateBound(&zs, static_cast<uLong>(in.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return rc == Z_STREAM_END ? out : std::string();
}

void Send(mg_connection* conn, const Response& r, bool with_body, bool gzip) {
  if (r.content_type.empty()) {
    mg_printf(conn, "HTTP/1.1 %d %s\r\n%sConnection: close\r\n\r\n", r.status, r.reason.c_str(), r.headers.c_str());
    return;
  }
  std::string compressed;
  if (gzip && with_body && r.compressible) compressed = Gzip(r.body);
  const std::string_view body = !with_body ? std::string_view() : compressed.empty() ? r.body : compressed;
  const std::string headers = compressed.empty() ? r.headers : "Content-Encoding: gzip\r\n" + r.headers;
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", r.status,
            r.reason.c_str(), r.content_type.c_str(), body.size(), headers.c_str());
  mg_write(conn, body.data(), body.size());
}

}  // namespace

Request::Request(mg_connection* conn) : conn_(conn), info_(mg_get_request_info(conn)) {}

std::string_view Request::path() const { return info_->local_uri ? info_->local_uri : ""; }

const char* Request::query() const { return info_->query_string; }

const char* Request::header(const char* name) const { return mg_get_header(conn_, name); }

std::optional<std::string> QueryParam(const char* query, const char* name) {
  if (query == nullptr) return std::nullopt;
  std::string value;
  if (!CivetServer::getParam(query, std::strlen(query), name, value, 0)) return std::nullopt;
  return value;
}

bool AcceptsGzip(const char* accept_encoding) {
  if (accept_encoding == nullptr) return false;
  std::string_view rest = accept_encoding;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto trim = [](std::string_view s) {
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
      return s;
    };
    const size_t semi = item.find(';');
    const std::string_view token = trim(item.substr(0, semi));
    if (token.size() != 4 || strncasecmp(token.data(), "gzip", 4) != 0) continue;
    if (semi == std::string_view::npos) return true;
    // "q=0", "q=0.0", "q=0.000": refused.
    std::string_view q = trim(item.substr(semi + 1));
    if (q.size() < 2 || (q[0] != 'q' && q[0] != 'Q') || q[1] != '=') return true;
    q.remove_prefix(2);
    return q.find_first_not_of("0.") != std::string_view::npos;
  }
  return false;
}

class Server::Route : public CivetHandler {
 public:
  Route(const Options* options, const Handler* handler) : options_(options), handler_(handler) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const Request request(conn);
    Response response;
    try {
      response = (*handler_)(request);
    } catch (const std::exception& e) {
      response = InternalError(e.what());
    } catch (...) {
      response = InternalError("unknown error");
    }
    Send(conn, response, /*with_body=*/true, AcceptsGzip(request.header("Accept-Encoding")));
    return true;
  }

  bool handlePost(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handleHead(CivetServer*, mg_connection* conn) override { return NotAllowed(conn, /*with_body=*/false); }
  bool handlePut(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handleDelete(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }

 private:
  bool NotAllowed(mg_connection* conn, bool with_body = true) {
    Send(conn, options_->not_allowed, with_body, /*gzip=*/false);
    return true;
  }

  Response InternalError(const std::string& what) const {
    if (options_->internal_error) {
      try {
        return options_->internal_error(what);
      } catch (...) {  // falls through to the plain answer
      }
    }
    return Response{500, "Internal Server Error", "text/plain; charset=utf-8", what + "\n", ""};
  }

  const Options* options_;
  const Handler* handler_;
};

Result<std::unique_ptr<Server>> Server::Start(Options options) {
  std::unique_ptr<Server> server(new Server());
  server->options_ = std::move(options);
  // civetweb takes "PORT" for every IPv4 address and "HOST:PORT" otherwise.
  std::string port = server->options_.listen;
  if (port.rfind("0.0.0.0:", 0) == 0) port = port.substr(8);
  if (!port.empty() && port[0] == ':') port = port.substr(1);
  const std::vector<std::string> civet = {"listening_ports",    port,
                                          "num_threads",        std::to_string(server->options_.threads),
                                          "request_timeout_ms", std::to_string(server->options_.request_timeout_ms),
                                          "enable_keep_alive",  "no"};
  try {
    server->server_ = std::make_unique<CivetServer>(civet);
  } catch (const CivetException& e) {
    return MakeError("{}", e.what());
  }
  // civetweb tries exact matches first, then prefixes: "/" catches the rest.
  for (const auto& [path, handler] : server->options_.routes) {
    server->routes_.push_back(std::make_unique<Route>(&server->options_, &handler));
    server->server_->addHandler(path, server->routes_.back().get());
  }
  return server;
}

Server::~Server() {
  if (server_) server_->close();
}

}  // namespace tlsprof::http
