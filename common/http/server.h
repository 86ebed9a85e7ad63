// tlsprof::http: the one HTTP/1.1 server behind the agent's and the
// collector's --metrics-listen (civetweb underneath). Each serves the routes
// it registers by exact path; "/" also answers every path no other route
// names. GET only: POST, HEAD, PUT and DELETE get Options::not_allowed (HEAD
// without its body). One response per connection (no keep-alive).
//
// Lifecycle: Start() listens and serves from its own worker threads until the
// Server is destroyed; the destructor stops accepting and waits for the
// requests in flight, so whatever the handlers use must outlive the Server.
// Thread-safety: handlers are called from the worker threads concurrently and
// must be thread-safe themselves. A Request is valid during its call only. A
// handler that throws gets Options::internal_error's response; no exception
// reaches civetweb.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

class CivetServer;
struct mg_connection;
struct mg_request_info;

namespace tlsprof::http {

class Request {
 public:
  // The path without the query string ("/metrics").
  std::string_view path() const;
  // The query string without its '?'; nullptr when the URL has none.
  const char* query() const;
  // A header's value (the name is case-insensitive); nullptr when absent.
  const char* header(const char* name) const;

 private:
  friend class Server;
  explicit Request(mg_connection* conn);
  mg_connection* conn_;
  const mg_request_info* info_;
};

struct Response {
  int status = 200;
  std::string reason = "OK";
  // Empty: no Content-Type, Content-Length or body (a 304).
  std::string content_type;
  std::string body;
  // Zero or more "Name: value\r\n" lines, written after Content-Length.
  std::string headers;
  // Sent gzip-compressed (Content-Encoding: gzip) when the request's
  // Accept-Encoding takes gzip, as Prometheus' scrapes do.
  bool compressible = false;
};

using Handler = std::function<Response(const Request&)>;

struct Options {
  // HOST:PORT: "0.0.0.0:9464" (every IPv4 address), "127.0.0.1:9464", "[::1]:9464".
  std::string listen;
  // Worker threads: connections served at once; more wait in civetweb's
  // queue. A worker holds a connection until its request is read, so a
  // client that connects and sends nothing holds one for request_timeout_ms:
  // kDefaultThreads lets 50 such connections (a port scan, a stuck client)
  // leave workers free for the probes and scrapes behind them.
  static constexpr int kDefaultThreads = 64;
  int threads = kDefaultThreads;
  // How long a connection may take to send its request (and to take the
  // reply). A scraper or probe sends its request at once.
  int request_timeout_ms = 2000;
  std::vector<std::pair<std::string, Handler>> routes;
  // The answer to a method other than GET; "Allow: GET" belongs in its headers.
  Response not_allowed{405, "Method Not Allowed", "text/plain; charset=utf-8", "only GET is served here\n",
                       "Allow: GET\r\n"};
  // The answer when a handler throws, from the exception's text. Unset: a
  // text/plain 500 with that text.
  std::function<Response(const std::string& what)> internal_error;
};

// The query string's parameter `name`, URL-decoded (its first occurrence);
// nullopt when absent. `query` may be nullptr.
std::optional<std::string> QueryParam(const char* query, const char* name);

// Whether an Accept-Encoding value takes gzip (a "gzip" token without q=0).
bool AcceptsGzip(const char* accept_encoding);

class Server {
 public:
  // Listens on options.listen and serves. The error is civetweb's own text
  // (e.g. a port in use); the caller says which flag it was and what to do.
  static Result<std::unique_ptr<Server>> Start(Options options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  class Route;
  Server() = default;
  Options options_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::unique_ptr<CivetServer> server_;
};

}  // namespace tlsprof::http
