// Test helpers for agent/ship: a real in-process tlsprof.v1.Collector gRPC
// server on 127.0.0.1 whose answers a test scripts, and small utilities.
// Test-only; not thread-safe to reconfigure while a Submit runs except
// through its own setters.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tlsprof/v1/report.grpc.pb.h"

namespace tlsprof::ship::testing {

// What the collector answers to one Submit; `call` counts from 0.
using Script = std::function<grpc::Status(size_t call, const v1::SubmitRequest&, v1::SubmitResponse*)>;

class TestCollector final : public v1::Collector::Service {
 public:
  // Default script: a real collector's idempotency, ACCEPTED the first time
  // a (instance, sequence) arrives and DUPLICATE after.
  TestCollector() = default;

  void set_script(Script script) {
    std::lock_guard lock(mu_);
    script_ = std::move(script);
  }
  // Handlers block (until cancelled or released) without answering.
  void set_hang(bool hang) { hang_ = hang; }

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override {
    size_t call;
    Script script;
    {
      std::lock_guard lock(mu_);
      call = calls_++;
      script = script_;
      for (const auto& cn : context->auth_context()->FindPropertyValues("x509_common_name")) {
        peer_common_names_.emplace_back(cn.data(), cn.size());
      }
    }
    while (hang_) {
      if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (script) {
      grpc::Status status = script(call, *request, response);
      if (status.ok() && response->result() == v1::SubmitResponse::ACCEPTED) Record(*request);
      return status;
    }
    std::lock_guard lock(mu_);
    auto key = std::make_pair(request->report().agent_instance(), request->report().sequence());
    if (!seen_.insert(key).second) {
      response->set_result(v1::SubmitResponse::DUPLICATE);
      return grpc::Status::OK;
    }
    accepted_.push_back(request->report());
    response->set_result(v1::SubmitResponse::ACCEPTED);
    return grpc::Status::OK;
  }

  size_t calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  std::vector<v1::AgentReport> accepted() const {
    std::lock_guard lock(mu_);
    return accepted_;
  }
  // The client certificates' subject CNs, one per call made over TLS.
  std::vector<std::string> peer_common_names() const {
    std::lock_guard lock(mu_);
    return peer_common_names_;
  }
  std::vector<uint64_t> accepted_sequences() const {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& r : accepted_) out.push_back(r.sequence());
    return out;
  }

 private:
  void Record(const v1::SubmitRequest& request) {
    std::lock_guard lock(mu_);
    accepted_.push_back(request.report());
  }

  mutable std::mutex mu_;
  Script script_;
  std::atomic<bool> hang_{false};
  size_t calls_ = 0;
  std::set<std::pair<std::string, uint64_t>> seen_;
  std::vector<v1::AgentReport> accepted_;
  std::vector<std::string> peer_common_names_;
};

// A gRPC server for `service` on 127.0.0.1:port (0 = any free port).
class TestServer {
 public:
  TestServer(grpc::Service* service, int port = 0,
             std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials(),
             int max_receive_message_bytes = -1) {
    grpc::ServerBuilder builder;
    if (max_receive_message_bytes > 0) builder.SetMaxReceiveMessageSize(max_receive_message_bytes);
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), credentials, &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() { Stop(); }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void Stop() {
    if (!server_) return;
    // A deadline in the past cancels handlers still running (a hanging one).
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
inline int UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// A fresh directory under the test's temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tlsprof-ship-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Captures log messages (just the text, no time or level) while it lives.
// Sender threads log at any time, and a logger's sink vector is not safe to
// change while they do: captures attach to a dist_sink (which locks) that
// LogCaptureSink() installs as the default logger's only sink, once. Call
// it before any thread logs (e.g. from a static initializer).
inline std::shared_ptr<spdlog::sinks::dist_sink_mt> LogCaptureSink() {
  static std::shared_ptr<spdlog::sinks::dist_sink_mt> dist = [] {
    auto d = std::make_shared<spdlog::sinks::dist_sink_mt>();
    d->add_sink(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", d));
    return d;
  }();
  return dist;
}

class CapturedLog {
 public:
  CapturedLog() : ring_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1024)) {
    ring_->set_pattern("%v");
    LogCaptureSink()->add_sink(ring_);
  }
  ~CapturedLog() { LogCaptureSink()->remove_sink(ring_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::vector<std::string> lines() const {
    std::vector<std::string> out = ring_->last_formatted();
    for (std::string& line : out) {
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    }
    return out;
  }
  size_t count(std::string_view needle) const {
    size_t n = 0;
    for (const std::string& line : lines()) n += line.find(needle) != std::string::npos;
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_;
};

// The start of the tests' first window, in Unix ns; WindowStart(i) is the
// start of the i-th 10 s window after it.
inline constexpr int64_t kT0 = 1'700'000'000'000'000'000;
inline int64_t WindowStart(int64_t i) { return kT0 + i * 10'000'000'000; }

// A file's bytes; "" when it cannot be read.
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A small valid report for window [start, start + 10 s).
inline v1::AgentReport MakeReport(int64_t start_unix_ns, uint64_t busy, uint64_t tls) {
  v1::AgentReport report;
  report.mutable_host()->set_hostname("test-host");
  report.mutable_host()->set_cpus(2);
  report.mutable_window()->set_start_unix_ns(start_unix_ns);
  report.mutable_window()->set_end_unix_ns(start_unix_ns + 10'000'000'000);
  report.mutable_window()->set_frequency_hz(99);
  report.mutable_window()->set_period_ns(1'000'000'000 / 99);
  report.set_busy_samples(busy);
  auto* service = report.add_services();
  service->set_name("nginx");
  service->set_busy_samples(busy);
  service->set_tls_samples(tls);
  auto* row = service->add_tls();
  row->set_bucket(v1::BUCKET_CIPHER);
  row->set_algorithm("aes-128-gcm");
  row->set_phase(v1::PHASE_RECORD);
  row->set_library("openssl-3");
  row->set_samples(tls);
  return report;
}

// Polls `done` every 5 ms until it holds or `timeout` passed.
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

}  // namespace tlsprof::ship::testing
