// tlsprof-flood: a hostile client for the collector's memory bound
// (docs/fleet.md, "Bounds"): --calls Submits of --bytes each, all started at
// once over --channels connections; each answered call is started again
// until --seconds have passed (--calls stay in flight), then every answer is
// waited for. Each
// message is a SubmitRequest that decodes (its report's agent_instance is
// the filler, so validation refuses it only after decoding), sent from one
// shared buffer: the flood costs the client one copy, not one per call.
//
// Prints one JSON object: the calls answered by status code, and the time
// the last answer took. Exits 1 if the channels cannot connect, 2 on bad
// flags.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tlsprof/v1/report.pb.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A SubmitRequest of exactly `bytes` serialized bytes (or the smallest
// possible, if `bytes` is below it).
std::string MakePayload(size_t bytes, const std::string& hostname) {
  tlsprof::v1::SubmitRequest request;
  tlsprof::v1::AgentReport* report = request.mutable_report();
  report->set_sequence(1);
  report->mutable_host()->set_hostname(hostname);
  report->mutable_host()->set_cpus(2);
  const size_t base = request.ByteSizeLong();
  size_t filler = bytes > base + 8 ? bytes - base - 8 : 0;
  report->set_agent_instance(std::string(filler, 'x'));
  // The field's length prefix grows with it: correct by what is left over.
  const size_t size = request.ByteSizeLong();
  if (size != bytes && filler + bytes >= size) {
    report->set_agent_instance(std::string(filler + bytes - size, 'x'));
  }
  return request.SerializeAsString();
}

struct Call {
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tlsprof-flood: many large Submits at once, against a collector's memory bound"};
  std::string target, ca, cert, key, server_name = "localhost", hostname = "flood";
  uint32_t calls = 2000, channels = 8;
  size_t bytes = 4u << 20;
  double deadline_seconds = 120, seconds = 0;
  app.add_option("--collector", target, "HOST:PORT")->required();
  app.add_option("--tls-ca", ca, "PEM: the collector's CA")->required();
  app.add_option("--tls-cert", cert, "PEM: the client certificate")->required();
  app.add_option("--tls-key", key, "PEM: its key")->required();
  app.add_option("--tls-server-name", server_name, "name to verify the collector's certificate against")
      ->capture_default_str();
  app.add_option("--hostname", hostname, "host.hostname of the messages")->capture_default_str();
  app.add_option("--calls", calls, "Submits started at once")->capture_default_str();
  app.add_option("--bytes", bytes, "size of each message")->capture_default_str();
  app.add_option("--channels", channels, "connections the calls are spread over")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--deadline-seconds", deadline_seconds, "deadline of each call")->capture_default_str();
  app.add_option("--seconds", seconds, "start each answered call again until this long has passed")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(ca);
  ssl.pem_cert_chain = ReadFile(cert);
  ssl.pem_private_key = ReadFile(key);
  auto credentials = grpc::SslCredentials(ssl);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  const auto connect_deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
  for (uint32_t c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per channel
    args.SetInt("tlsprof.flood.channel", static_cast<int>(c));
    args.SetSslTargetNameOverride(server_name);
    auto channel = grpc::CreateCustomChannel(target, credentials, args);
    if (!channel->WaitForConnected(connect_deadline)) {
      std::fprintf(stderr, "tlsprof-flood: cannot connect to %s\n", target.c_str());
      return 1;
    }
    stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
  }

  const std::string payload = MakePayload(bytes, hostname);
  // Every call's message points at `payload`: no copy per call.
  grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> pending(calls);
  const auto start = std::chrono::steady_clock::now();
  const auto stop_starting = start + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  auto start_call = [&](uint32_t i) {
    auto& call = pending[i] = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(static_cast<int64_t>(deadline_seconds * 1000)));
    call->reader = stubs[i % channels]->PrepareUnaryCall(&call->context, "/tlsprof.v1.Collector/Submit", request, &cq);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, reinterpret_cast<void*>(static_cast<uintptr_t>(i) + 1));
  };
  for (uint32_t i = 0; i < calls; ++i) start_call(i);
  std::map<std::string, uint64_t> codes;
  std::map<std::string, std::string> examples;
  static const char* kCodeNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  uint64_t answered = 0;
  for (uint32_t in_flight = calls; in_flight > 0;) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    const auto i = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(tag) - 1);
    const int code = pending[i]->status.error_code();
    const std::string name = code >= 0 && code <= 16 ? kCodeNames[code] : std::to_string(code);
    ++codes[name];
    ++answered;
    if (!examples.count(name)) examples[name] = pending[i]->status.error_message();
    if (std::chrono::steady_clock::now() < stop_starting) {
      start_call(i);
    } else {
      pending[i].reset();
      --in_flight;
    }
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cq.Shutdown();
  nlohmann::json out = {{"concurrent_calls", calls}, {"answered", answered}, {"bytes", payload.size()},
                        {"channels", channels},      {"codes", codes},       {"examples", examples},
                        {"seconds", elapsed}};
  std::cout << out.dump() << std::endl;
  return 0;
}
