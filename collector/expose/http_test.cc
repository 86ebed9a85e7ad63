#include "collector/expose/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "collector/expose/fleet_api.h"
#include "collector/expose/fleet_metrics.h"
#include "collector/expose/health.h"
#include "collector/expose/web_assets.h"
#include "collector/ingest/ingestor.h"
#include "collector/ingest/test_report.h"

namespace tlsprof::collector {
namespace {

using testing::kTestNowNs;
using testing::MakeReport;

TEST(SummaryMinutes, DefaultRangeAndErrors) {
  EXPECT_EQ(*ParseSummaryMinutes(nullptr), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes(""), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes("other=3"), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes("minutes=1"), 1);
  EXPECT_EQ(*ParseSummaryMinutes("x=1&minutes=60"), 60);
  for (const char* bad : {"minutes=0", "minutes=61", "minutes=-5", "minutes=5x", "minutes=", "minutes=1e1"}) {
    Result<int> r = ParseSummaryMinutes(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("minutes: must be an integer 1-60"), std::string::npos) << bad;
  }
}

TEST(IntParam, NamesTheParameterAndItsRange) {
  EXPECT_EQ(*ParseIntParam("limit=1000", "limit", 7, 1, 1000), 1000);
  EXPECT_EQ(*ParseIntParam("minutes=3", "limit", 7, 1, 1000), 7);
  Result<int> r = ParseIntParam("limit=1001", "limit", 7, 1, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "limit: must be an integer 1-1000, got '1001'");
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A plain HTTP/1.1 GET (the server closes the connection after the reply).
Response Get(int port, const std::string& target, const std::string& extra_headers = "",
             const std::string& method = "GET") {
  Response r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    ADD_FAILURE() << "connect to port " << port << " failed";
    return r;
  }
  const std::string request =
      method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers + "\r\n";
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string raw;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    ADD_FAILURE() << "no complete header in: " << raw.substr(0, 200);
    return r;
  }
  r.body = raw.substr(end + 4);
  std::string head = raw.substr(0, end + 2);
  r.status = std::stoi(head.substr(9, 3));
  for (size_t pos = head.find("\r\n") + 2; pos < head.size();) {
    const size_t eol = head.find("\r\n", pos);
    const std::string line = head.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    pos = eol + 2;
  }
  return r;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A collector's HTTP side over a real Ingestor fed with reports; one server
// for the suite (civetweb takes ~2 s to stop).
class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ingestor_ = new Ingestor(IngestOptions{});
    const int64_t s = 1'000'000'000;
    ingestor_->Apply("insecure:host-1", MakeReport(1, std::string(16, 'i'), kTestNowNs - 60 * s), kTestNowNs - 55 * s);
    // Received in the current minute (the ring is keyed by receive time).
    ingestor_->Apply("insecure:host-1", MakeReport(2), kTestNowNs);
    v1::AgentReport other = MakeReport(1);
    other.mutable_host()->set_hostname("host-2");
    ingestor_->Apply("insecure:host-2", other, kTestNowNs + 1);
    HttpCallbacks callbacks;
    callbacks.collect = [] { return FleetMetrics(*ingestor_); };
    callbacks.summary = [](int minutes) { return SummaryJson(*ingestor_, minutes, kTestNowNs); };
    callbacks.trend = [](int minutes) { return TrendJson(*ingestor_, minutes, kTestNowNs); };
    callbacks.agents = [](int limit) { return AgentsJson(*ingestor_, static_cast<size_t>(limit), kTestNowNs); };
    port_ = FreePort();
    Result<std::unique_ptr<HttpServer>> server =
        HttpServer::Start("127.0.0.1:" + std::to_string(port_), std::move(callbacks));
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete ingestor_;
  }

  nlohmann::json GetJson(const std::string& target) {
    Response r = Get(port_, target);
    EXPECT_EQ(r.status, 200) << target << ": " << r.body;
    EXPECT_EQ(r.headers["content-type"], "application/json") << target;
    EXPECT_EQ(r.headers["cache-control"], "no-store") << target;
    return nlohmann::json::parse(r.body);
  }

  static Ingestor* ingestor_;
  static int port_;
  static HttpServer* server_;
};
Ingestor* HttpServerTest::ingestor_ = nullptr;
int HttpServerTest::port_ = 0;
HttpServer* HttpServerTest::server_ = nullptr;

TEST_F(HttpServerTest, TrendAndAgentsServeTheIngestorsJson) {
  EXPECT_EQ(GetJson("/api/v1/trend"), TrendJson(*ingestor_, kDefaultTrendMinutes, kTestNowNs));
  EXPECT_EQ(GetJson("/api/v1/trend?minutes=1"), TrendJson(*ingestor_, 1, kTestNowNs));
  EXPECT_EQ(GetJson("/api/v1/trend?minutes=1")["points"].size(), 1u);
  EXPECT_EQ(GetJson("/api/v1/trend?minutes=2")["points"].size(), 2u);

  nlohmann::json agents = GetJson("/api/v1/agents");
  EXPECT_EQ(agents, AgentsJson(*ingestor_, kMaxAgentsListed, kTestNowNs));
  ASSERT_EQ(agents["agents"].size(), 2u);
  EXPECT_EQ(agents["agents"][0]["hostname"], "host-2");
  EXPECT_EQ(agents["agents"][1]["hostname"], "host-1");
  EXPECT_EQ(agents["agents"][1]["reports"], 2);
  nlohmann::json one = GetJson("/api/v1/agents?limit=1");
  EXPECT_EQ(one["agents"].size(), 1u);
  EXPECT_EQ(one["truncated"], true);
  // The summary is unchanged.
  EXPECT_EQ(GetJson("/api/v1/summary?minutes=60"), SummaryJson(*ingestor_, 60, kTestNowNs));
}

TEST_F(HttpServerTest, BadParametersAre400WithAMessage) {
  const std::map<std::string, std::string> cases = {
      {"/api/v1/trend?minutes=0", "minutes: must be an integer 1-60, got '0'"},
      {"/api/v1/trend?minutes=61", "minutes: must be an integer 1-60, got '61'"},
      {"/api/v1/trend?minutes=ten", "minutes: must be an integer 1-60, got 'ten'"},
      {"/api/v1/summary?minutes=", "minutes: must be an integer 1-60, got ''"},
      {"/api/v1/agents?limit=0", "limit: must be an integer 1-1000, got '0'"},
      {"/api/v1/agents?limit=1001", "limit: must be an integer 1-1000, got '1001'"},
      {"/api/v1/agents?limit=%3Cscript%3E", "limit: must be an integer 1-1000, got '<script>'"},
  };
  for (const auto& [target, message] : cases) {
    Response r = Get(port_, target);
    EXPECT_EQ(r.status, 400) << target;
    EXPECT_EQ(r.headers["content-type"], "application/json") << target;
    EXPECT_EQ(nlohmann::json::parse(r.body)["error"], message) << target;
  }
  Response missing = Get(port_, "/api/v1/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(nlohmann::json::parse(missing.body)["error"].get<std::string>().find("/api/v1/trend"), std::string::npos);
  for (const char* method : {"POST", "HEAD", "PUT", "DELETE"}) {
    Response r = Get(port_, "/api/v1/agents", "", method);
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["allow"], "GET") << method;
  }
  EXPECT_EQ(Get(port_, "/ui/missing.js").status, 404);
  EXPECT_EQ(Get(port_, "/index.html").status, 404);
}

TEST_F(HttpServerTest, MetricsStillServed) {
  Response r = Get(port_, "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("tlsprof_reports_total 3"), std::string::npos) << r.body;
}

// The headers a page showing agent-supplied strings must carry.
void ExpectStrictHeaders(const Response& r, const std::string& target) {
  const std::string& csp = r.headers.at("content-security-policy");
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << target;
  EXPECT_NE(csp.find("script-src 'self';"), std::string::npos) << target;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << target;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << target;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << target;
  EXPECT_EQ(csp.find("http"), std::string::npos) << target;  // no other host
  EXPECT_EQ(r.headers.at("x-content-type-options"), "nosniff") << target;
}

TEST_F(HttpServerTest, StatusPageIsEmbeddedWithStrictHeaders) {
  Response page = Get(port_, "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_EQ(page.headers["cache-control"], "no-cache");
  ExpectStrictHeaders(page, "/");
  EXPECT_NE(page.body.find("<title>tlsprof — TLS CPU across the fleet</title>"), std::string::npos);
  EXPECT_EQ(Get(port_, "/status").body, page.body);

  // No inline script, inline handler, inline style or foreign URL in the
  // markup (the CSP would block them: the page would break, not leak).
  const std::regex script_tag("<script([^>]*)>([^<]*)</script>");
  std::set<std::string> scripts;
  for (auto it = std::sregex_iterator(page.body.begin(), page.body.end(), script_tag); it != std::sregex_iterator();
       ++it) {
    std::smatch src;
    const std::string attributes = (*it)[1];
    ASSERT_TRUE(std::regex_search(attributes, src, std::regex("src=\"(/[^\"]+)\""))) << it->str();
    EXPECT_TRUE((*it)[2].str().empty()) << it->str();
    scripts.insert(src[1]);
  }
  EXPECT_EQ(scripts, (std::set<std::string>{"/ui/status.js", "/ui/chart.min.js"}));
  EXPECT_FALSE(std::regex_search(page.body, std::regex("\\son[a-z]+\\s*=", std::regex::icase)));
  EXPECT_FALSE(std::regex_search(page.body, std::regex("<style|style=", std::regex::icase)));
  EXPECT_FALSE(std::regex_search(page.body, std::regex("(src|href)=\"(https?:)?//", std::regex::icase)));

  const std::map<std::string, std::string> types = {{"/ui/status.js", "text/javascript; charset=utf-8"},
                                                    {"/ui/chart.min.js", "text/javascript; charset=utf-8"},
                                                    {"/ui/status.css", "text/css; charset=utf-8"}};
  for (const auto& [target, type] : types) {
    Response r = Get(port_, target);
    EXPECT_EQ(r.status, 200) << target;
    EXPECT_EQ(r.headers["content-type"], type) << target;
    EXPECT_EQ(r.headers["cache-control"], "no-cache") << target;
    ExpectStrictHeaders(r, target);
    EXPECT_GT(r.body.size(), 1000u) << target;
  }
  // Chart.js 3 as Debian packages it, byte for byte what was embedded.
  Response chart = Get(port_, "/ui/chart.min.js");
  EXPECT_EQ(chart.body.rfind("/*!\n * Chart.js v3.", 0), 0u) << chart.body.substr(0, 40);
  for (const WebAsset& asset : WebAssets()) {
    EXPECT_EQ(Get(port_, std::string(asset.path)).body, asset.body) << asset.path;
  }
  // The JS writes values with textContent only.
  const std::string js = Get(port_, "/ui/status.js").body;
  EXPECT_EQ(js.find("innerHTML"), std::string::npos);
  EXPECT_EQ(js.find("outerHTML"), std::string::npos);
  EXPECT_EQ(js.find("insertAdjacentHTML"), std::string::npos);
  EXPECT_EQ(js.find("document.write"), std::string::npos);
  EXPECT_EQ(js.find("eval("), std::string::npos);
}

TEST_F(HttpServerTest, UnchangedFilesRevalidateWith304) {
  Response first = Get(port_, "/ui/status.css");
  const std::string etag = first.headers["etag"];
  ASSERT_EQ(etag.size(), 18u) << etag;
  Response again = Get(port_, "/ui/status.css", "If-None-Match: " + etag + "\r\n");
  EXPECT_EQ(again.status, 304);
  EXPECT_TRUE(again.body.empty());
  EXPECT_EQ(again.headers["etag"], etag);
  EXPECT_EQ(Get(port_, "/ui/status.css", "If-None-Match: \"0000000000000000\"\r\n").status, 200);
  EXPECT_NE(Get(port_, "/ui/status.js").headers["etag"], etag);
}

TEST(HttpServer, IdentitiesThatAreNotUtf8AreReplacedNotFatal) {
  // A certificate CN need not be UTF-8; the JSON must still be served.
  Ingestor ingestor{IngestOptions{}};
  ingestor.Apply("cn-\xff\xfe", MakeReport(1), kTestNowNs);
  HttpCallbacks callbacks;
  callbacks.agents = [&](int limit) { return AgentsJson(ingestor, static_cast<size_t>(limit), kTestNowNs); };
  const int port = FreePort();
  Result<std::unique_ptr<HttpServer>> server = HttpServer::Start("127.0.0.1:" + std::to_string(port), callbacks);
  ASSERT_TRUE(server.ok()) << server.error().message;
  Response r = Get(port, "/api/v1/agents");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body)["agents"][0]["identity"], "cn-\xef\xbf\xbd\xef\xbf\xbd");
  // A callback the server was not given is a 404, not a crash.
  EXPECT_EQ(Get(port, "/api/v1/trend").status, 404);
}

// /healthz answers what IngestHealth says: stuck while another thread holds
// the ingest lock, a stopped journal, a failing one (healthy).
TEST(IngestHealth, StuckLockStoppedJournalAndFailingWrites) {
  Ingestor ingestor{IngestOptions{}};
  const auto wait = std::chrono::milliseconds(100);
  EXPECT_EQ(IngestHealth(ingestor, wait, "", ""), std::make_pair(true, std::string("ingesting")));
  auto failing = IngestHealth(ingestor, wait, "", "j: write: No space left on device");
  EXPECT_TRUE(failing.first);
  EXPECT_NE(failing.second.find("No space left"), std::string::npos) << failing.second;
  EXPECT_FALSE(IngestHealth(ingestor, wait, "j: cut failed", "").first);
  std::promise<void> held, release;
  std::thread holder([&] {
    ingestor.Read([&](const FleetState&) {
      held.set_value();
      release.get_future().wait();
      return 0;
    });
  });
  held.get_future().wait();
  HttpCallbacks callbacks;
  callbacks.health = [&] { return IngestHealth(ingestor, wait, "", ""); };
  const int port = FreePort();
  Result<std::unique_ptr<HttpServer>> server = HttpServer::Start("127.0.0.1:" + std::to_string(port), callbacks);
  ASSERT_TRUE(server.ok()) << server.error().message;
  Response r = Get(port, "/healthz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "ingest is stuck: its lock was not free within 100 ms\n");
  EXPECT_EQ(r.headers["cache-control"], "no-store");
  release.set_value();
  holder.join();
  r = Get(port, "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ingesting\n");
}

}  // namespace
}  // namespace tlsprof::collector
