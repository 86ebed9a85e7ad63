// The gRPC Collector service (proto/tlsprof/v1/report.proto) and the Submit
// checks in docs/fleet.md's order: size, identity, rate limit, request
// memory, then (decoded) the host's binding to the identity, validation,
// duplicate, cardinality. Nothing is copied or decoded before the size,
// identity and rate checks, except with --insecure, whose identity is in the
// message.
//
// Submit is registered as a raw (ByteBuffer) method of the same path as the
// generated service, so that the collector, not gRPC's deserializer, decides
// what malformed or oversized bytes are: each is answered with its status and
// counted in tlsprof_collector_reports_total. It is registered as
// client-streaming, which on the wire is the same as unary (the client sends
// one message and half-closes): gRPC then reads a unary method's message
// before the handler runs, even for calls still queued for a thread, but a
// streaming one's only when the handler asks. So a message is read only once
// its identity, rate and memory checks have passed, and a call waiting holds
// no more than its stream's flow-control window.
//
// Thread-safe: gRPC calls Submit from many threads at once.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/method_handler.h>

#include <google/protobuf/arena.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collector/expose/health.h"
#include "collector/ingest/ingestor.h"
#include "collector/server/memory_budget.h"
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

// The default of --max-request-memory: gRPC's resource quota (the transport's
// buffers, messages being received) and Submit's own copies each stay below
// it, so requests hold at most twice this. Sized for the packaged limits
// (systemd's MemoryMax=2G, the StatefulSet's 2Gi): the fleet's state and the
// journal's buffers keep the other half.
inline constexpr size_t kDefaultMaxRequestMemory = size_t{512} << 20;
// What one Submit holds per byte received: the bytes copied out of gRPC's
// buffer, the decoded message (its strings and rows on the arena are about
// the wire size) and the journal record that carries the bytes again.
inline constexpr size_t kRequestMemoryPerByte = 3;

struct ServiceOptions {
  bool insecure = false;
  size_t max_message_bytes = 4194304;
  // Bytes all Submits in progress may hold (kRequestMemoryPerByte per byte
  // received); past it a request is answered RESOURCE_EXHAUSTED (result
  // "overloaded") before it is copied or decoded, and the agent retries.
  size_t max_request_memory = kDefaultMaxRequestMemory;
  std::vector<std::string> relay_identities;
  std::shared_ptr<const AllowList> allowed;  // null: every certificate the CA signed
};

class CollectorService : public grpc::Service {
 public:
  // `store` may be null (no --state-dir).
  CollectorService(ServiceOptions options, Ingestor* ingestor, StateStore* store, HealthMetrics* health);

  // Reads one message from `reader` (one Submit), after the checks that need
  // none.
  grpc::Status Submit(grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
                      grpc::ByteBuffer* response);

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
  grpc::Status Handle(grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
                      grpc::ByteBuffer* response);
  // The identity of a TLS peer: its certificate's subject CN (no decoding).
  grpc::Status IdentifyPeer(grpc::ServerContext* context, std::string& identity);
  // --insecure: insecure:<host.hostname>, from the decoded request.
  grpc::Status IdentifyInsecure(const Request& request, std::string& identity);
  grpc::Status CheckAllowed(const std::string& identity);
  // Reserves `bytes` of max_request_memory, waiting up to kMemoryWait
  // (nullopt: refused, and counted as overloaded).
  std::optional<MemoryBudget::Reservation> ReserveMemory(size_t bytes, grpc::Status& refusal);
  grpc::Status TakeToken(const std::string& agent_key, const std::string& identity, int64_t now_ns);
  // A non-relay TLS identity may only report for itself: host.hostname must
  // be its certificate's CN or one of its DNS names (docs/fleet.md,
  // "Identity").
  grpc::Status CheckHost(grpc::ServerContext* context, const std::string& identity, const Request& request);
  grpc::Status Validate(const Request& request, int64_t now_ns);
  // Steps 5 and 6: applied, journaled and made durable; consumes request.bytes.
  grpc::Status Ingest(const std::string& agent_key, const std::string& identity, Request& request, int64_t now_ns,
                      ApplyResult& applied);
  // Counts `result` and returns the status that answers it.
  grpc::Status Refuse(SubmitResult result, grpc::StatusCode code, std::string message);
  bool IsRelay(const std::string& identity) const;

  const ServiceOptions options_;
  MemoryBudget request_memory_;  // reserved by Submits in progress
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
  // gRPC's resource quota (grpc::ResourceQuota::Resize): the memory its
  // transports may hold for connections and messages being received; under
  // pressure gRPC shrinks flow-control windows and, over it, cancels streams.
  size_t max_request_memory = kDefaultMaxRequestMemory;
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
