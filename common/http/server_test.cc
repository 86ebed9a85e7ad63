#include "common/http/server.h"

#include "common/http/test_client.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <stdexcept>
#include <vector>

namespace tlsprof::http {
namespace {

using testing::Connect;
using testing::FreePort;
using testing::Reply;
using testing::Send;

std::string Gunzip(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(inflateInit2(&zs, 15 + 32), Z_OK);
  std::string out(1 << 20, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  inflateEnd(&zs);
  return out;
}

// A text long enough to be worth compressing.
std::string LongText() {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "tlsprof_example_total{n=\"" + std::to_string(i) + "\"} 1\n";
  return text;
}

// One server for the suite (civetweb takes ~2 s to stop).
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Options options;
    port_ = FreePort();
    options.listen = "127.0.0.1:" + std::to_string(port_);
    options.routes.emplace_back("/text", [](const Request& r) {
      const auto who = QueryParam(r.query(), "who");
      return Response{200, "OK", "text/plain", "path " + std::string(r.path()) + " who " + who.value_or("-"), ""};
    });
    options.routes.emplace_back("/big", [](const Request&) {
      Response r{200, "OK", "text/plain", LongText(), "X-Route: big\r\n"};
      r.compressible = true;
      return r;
    });
    options.routes.emplace_back("/plain-big", [](const Request&) {
      return Response{200, "OK", "text/plain", LongText(), ""};
    });
    options.routes.emplace_back("/unchanged", [](const Request& r) {
      const char* tag = r.header("if-none-match");
      return Response{304, "Not Modified", "", "", std::string("ETag: ") + (tag ? tag : "none") + "\r\n"};
    });
    options.routes.emplace_back("/throws", [](const Request&) -> Response { throw std::runtime_error("boom"); });
    options.routes.emplace_back("/", [](const Request& r) {
      return Response{404, "Not Found", "text/plain", "nothing at " + std::string(r.path()), ""};
    });
    options.internal_error = [](const std::string& what) {
      return Response{500, "Internal Server Error", "application/json", "{\"error\":\"" + what + "\"}", ""};
    };
    auto server = Server::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = server->release();
  }
  static void TearDownTestSuite() { delete server_; }

  static int port_;
  static Server* server_;
};
int ServerTest::port_ = 0;
Server* ServerTest::server_ = nullptr;

TEST_F(ServerTest, RoutesByExactPathAndTheRootCatchesTheRest) {
  Reply r = Send(port_, "GET", "/text?who=a%20b&x=1");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "path /text who a b");
  EXPECT_EQ(r.headers["content-type"], "text/plain");
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_EQ(r.headers["connection"], "close");
  r = Send(port_, "GET", "/elsewhere/deep");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "nothing at /elsewhere/deep");
}

// 50 connections that send nothing (a port scan, a stuck client) hold
// workers, but not all of them: a request behind them is answered at once,
// and they are closed after request_timeout_ms, not held for ever.
TEST_F(ServerTest, IdleConnectionsDoNotHoldUpARequest) {
  std::vector<int> idle;
  for (int i = 0; i < 50; ++i) {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  Reply r = Send(port_, "GET", "/text");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(took, std::chrono::milliseconds(1000));
  // Each idle connection is closed by the server (read returns 0) once its
  // request timeout has passed.
  for (int fd : idle) {
    timeval wait{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    char c;
    EXPECT_LE(read(fd, &c, 1), 0);
    close(fd);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(Options{}.request_timeout_ms + 5000));
}

TEST_F(ServerTest, OnlyGetIsServed) {
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    Reply r = Send(port_, method, "/text");
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["allow"], "GET") << method;
    EXPECT_EQ(r.body, "only GET is served here\n") << method;
  }
  // HEAD: the same answer without its body.
  Reply head = Send(port_, "HEAD", "/text");
  EXPECT_EQ(head.status, 405);
  EXPECT_EQ(head.headers["allow"], "GET");
  EXPECT_EQ(head.headers["content-length"], "0");
  EXPECT_EQ(head.body, "");
}

TEST_F(ServerTest, AThrowingHandlerGetsTheInternalErrorAnswer) {
  Reply r = Send(port_, "GET", "/throws");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(r.body, "{\"error\":\"boom\"}");
}

TEST_F(ServerTest, CompressibleBodiesAreGzippedOnlyWhenAccepted) {
  const std::string text = LongText();
  Reply r = Send(port_, "GET", "/big", "Accept-Encoding: gzip\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-encoding"], "gzip");
  EXPECT_EQ(r.headers["x-route"], "big");
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_LT(r.body.size(), text.size() / 4);
  EXPECT_EQ(Gunzip(r.body), text);
  for (const std::string& extra :
       {std::string(), std::string("Accept-Encoding: gzip;q=0\r\n"), std::string("Accept-Encoding: identity\r\n")}) {
    r = Send(port_, "GET", "/big", extra);
    EXPECT_EQ(r.headers.count("content-encoding"), 0u) << extra;
    EXPECT_EQ(r.body, text) << extra;
  }
  r = Send(port_, "GET", "/plain-big", "Accept-Encoding: gzip\r\n");
  EXPECT_EQ(r.headers.count("content-encoding"), 0u);
  EXPECT_EQ(r.body, text);
}

TEST_F(ServerTest, AnEmptyContentTypeSendsNoContentHeaders) {
  Reply r = Send(port_, "GET", "/unchanged", "If-None-Match: \"abc\"\r\n");
  EXPECT_EQ(r.status, 304);
  EXPECT_EQ(r.head, "HTTP/1.1 304 Not Modified\r\nETag: \"abc\"\r\nConnection: close\r\n");
  EXPECT_EQ(r.body, "");
}

TEST_F(ServerTest, APortInUseIsAnError) {
  Options options;
  options.listen = "127.0.0.1:" + std::to_string(port_);
  auto second = Server::Start(std::move(options));
  ASSERT_FALSE(second.ok());
  EXPECT_FALSE(second.error().message.empty());
}

TEST(AcceptsGzip, ReadsTokensAndQValues) {
  for (const char* yes : {"gzip", "gzip, deflate", "deflate, GZIP", "br;q=1, gzip;q=0.5", " gzip ;q=1"}) {
    EXPECT_TRUE(AcceptsGzip(yes)) << yes;
  }
  for (const char* no : {"", "identity", "deflate, br", "gzip;q=0", "gzip; q=0.000", "x-gzip", "gzipped"}) {
    EXPECT_FALSE(AcceptsGzip(no)) << no;
  }
  EXPECT_FALSE(AcceptsGzip(nullptr));
}

TEST(QueryParam, DecodesTheFirstOccurrence) {
  EXPECT_EQ(QueryParam("a=1&b=x%2Fy&a=2", "a"), "1");
  EXPECT_EQ(QueryParam("a=1&b=x%2Fy", "b"), "x/y");
  EXPECT_EQ(QueryParam("a=", "a"), "");
  EXPECT_EQ(QueryParam("a=1", "b"), std::nullopt);
  EXPECT_EQ(QueryParam(nullptr, "a"), std::nullopt);
}

}  // namespace
}  // namespace tlsprof::http
