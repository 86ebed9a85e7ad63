// The gRPC Collector service (proto/tlsprof/v1/report.proto) and the Submit
// checks in docs/fleet.md's order: size, identity, rate limit, validation,
// duplicate, cardinality.
//
// Submit is registered as a raw (ByteBuffer) method of the same path as the
// generated service, so that the collector, not gRPC's deserializer, decides
// what malformed or oversized bytes are: each is answered with its status and
// counted in tlsprof_collector_reports_total.
//
// Thread-safe: gRPC calls Submit from many threads at once.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/method_handler.h>

#include <google/protobuf/arena.h>

#include <memory>
#include <string>
#include <vector>

#include "collector/expose/health.h"
#include "collector/ingest/ingestor.h"
#include "common/result.h"

namespace tlsprof::collector {

class StateStore;

// --allowed-agents: one identity per line, a trailing `*` matches a prefix;
// blank lines and lines starting with # are ignored.
class AllowList {
 public:
  static Result<AllowList> Load(const std::string& path);
  static AllowList FromLines(const std::vector<std::string>& lines);
  bool Allows(const std::string& identity) const;
  size_t size() const { return exact_.size() + prefixes_.size(); }

 private:
  std::vector<std::string> exact_;
  std::vector<std::string> prefixes_;
};

struct ServiceOptions {
  bool insecure = false;
  size_t max_message_bytes = 4194304;
  std::vector<std::string> relay_identities;
  std::shared_ptr<const AllowList> allowed;  // null: every certificate the CA signed
};

class CollectorService : public grpc::Service {
 public:
  // `store` may be null (no --state-dir).
  CollectorService(ServiceOptions options, Ingestor* ingestor, StateStore* store, HealthMetrics* health);

  grpc::Status Submit(grpc::ServerContext* context, const grpc::ByteBuffer* request, grpc::ByteBuffer* response);

 private:
  // A Submit's bytes as received (journaled as they are) and as parsed.
  // The parsed message lives on an arena: its hundred-odd rows and strings
  // are one block freed at once, not a malloc and a free each (with the
  // journal on, glibc's fastbin consolidation of those frees was the
  // collector's hottest symbol at 20,000 agents, bench/README.md).
  struct Request {
    std::string bytes;
    std::unique_ptr<google::protobuf::Arena> arena;
    v1::SubmitRequest* parsed = nullptr;  // on `arena`
    bool parsed_ok = false;
  };
  static Request ReadRequest(const grpc::ByteBuffer& buffer);
  // The steps of docs/fleet.md's "Ingest"; each returns OK to go on, or the
  // status to answer (counted in tlsprof_collector_reports_total).
  grpc::Status Handle(grpc::ServerContext* context, const grpc::ByteBuffer& buffer, grpc::ByteBuffer* response);
  grpc::Status Identify(grpc::ServerContext* context, const Request& request, std::string& identity);
  grpc::Status Validate(const Request& request, int64_t now_ns);
  // Steps 5 and 6: applied, journaled and made durable; consumes request.bytes.
  grpc::Status Ingest(const std::string& agent_key, const std::string& identity, Request& request, int64_t now_ns,
                      ApplyResult& applied);
  // Counts `result` and returns the status that answers it.
  grpc::Status Refuse(SubmitResult result, grpc::StatusCode code, std::string message);
  bool IsRelay(const std::string& identity) const;

  const ServiceOptions options_;
  Ingestor* ingestor_;
  StateStore* store_;
  HealthMetrics* health_;
};

struct TlsFiles {
  std::string ca, cert, key;  // paths
};

struct ServerOptions {
  std::string listen;  // HOST:PORT
  bool insecure = false;
  TlsFiles tls;
  size_t max_message_bytes = 4194304;
  // How often the TLS files are read again: a certificate, key or CA replaced
  // on disk is used for the connections made after it (rotation without a
  // restart); connections already up keep theirs.
  unsigned tls_reload_seconds = 10;
};

// Reads the PEM files (an error names the unreadable one) and starts the gRPC
// server; `service` must outlive it. mTLS requires and verifies a client
// certificate signed by --tls-ca, so expired, wrongly signed or missing
// certificates fail the handshake and never reach Submit. The files are
// watched (ServerOptions::tls_reload_seconds); a replacement that does not
// load leaves the last good one in use.
Result<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options, CollectorService* service);

}  // namespace tlsprof::collector
