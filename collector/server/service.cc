#include "collector/server/service.h"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>

#include "collector/ingest/validate.h"
#include "collector/store/state_store.h"

namespace tlsprof::collector {
namespace {

constexpr char kSubmitPath[] = "/tlsprof.v1.Collector/Submit";
// gRPC sync server threads (pollers plus calls in progress; a call waiting for
// the journal's group commit holds one) and idle pollers kept.
constexpr int kMaxServerThreads = 1024;
constexpr int kMaxServerPollers = 8;
// How long a Submit waits for --max-request-memory to have room before it is
// refused as overloaded: a burst of honest reports queues (they hold a few
// KiB each once read), a flood is refused; far below the agents' deadline.
constexpr auto kMemoryWait = std::chrono::milliseconds(2000);

int64_t NowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError("{} {}: cannot read the file ({})", flag, path, std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().empty()) return MakeError("{} {}: the file is empty; expected PEM", flag, path);
  if (s.str().find("-----BEGIN") == std::string::npos) return MakeError("{} {}: not a PEM file", flag, path);
  return s.str();
}

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM object found";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// gRPC reports a bad certificate or key only as a failure to listen; parse
// them first so that the error names the file and what is wrong with it.
Status CheckTlsFiles(const TlsFiles& files, const std::string& ca, const std::string& cert, const std::string& key) {
  auto bio = [](const std::string& pem) { return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())); };
  BIO* ca_bio = bio(ca);
  X509* ca_x509 = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr);
  BIO_free(ca_bio);
  if (!ca_x509) return MakeError("--tls-ca {}: not a PEM certificate ({})", files.ca, OpenSslError());
  X509_free(ca_x509);
  BIO* cert_bio = bio(cert);
  X509* x509 = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  if (!x509) return MakeError("--tls-cert {}: not a PEM certificate ({})", files.cert, OpenSslError());
  BIO* key_bio = bio(key);
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  if (!pkey) {
    X509_free(x509);
    return MakeError("--tls-key {}: not an unencrypted PEM private key ({})", files.key, OpenSslError());
  }
  const bool match = X509_check_private_key(x509, pkey) == 1;
  ERR_clear_error();
  EVP_PKEY_free(pkey);
  X509_free(x509);
  if (!match) return MakeError("--tls-key {} is not the key of --tls-cert {}", files.key, files.cert);
  return OkStatus();
}

}  // namespace

Result<AllowList> AllowList::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return MakeError("--allowed-agents {}: cannot read the file ({})", path, std::strerror(errno));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return FromLines(lines);
}

AllowList AllowList::FromLines(const std::vector<std::string>& lines) {
  AllowList list;
  for (std::string line : lines) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line = line.substr(start);
    if (line.back() == '*') {
      list.prefixes_.push_back(line.substr(0, line.size() - 1));
    } else {
      list.exact_.push_back(line);
    }
  }
  return list;
}

bool AllowList::Allows(const std::string& identity) const {
  for (const std::string& e : exact_) {
    if (identity == e) return true;
  }
  for (const std::string& p : prefixes_) {
    if (identity.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

CollectorService::CollectorService(ServiceOptions options, Ingestor* ingestor, StateStore* store, HealthMetrics* health)
    : options_(std::move(options)),
      request_memory_(options_.max_request_memory),
      ingestor_(ingestor),
      store_(store),
      health_(health) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kSubmitPath, grpc::internal::RpcMethod::CLIENT_STREAMING,
      new grpc::internal::ClientStreamingHandler<CollectorService, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](CollectorService* service, grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
             grpc::ByteBuffer* response) { return service->Submit(context, reader, response); },
          this)));
}

bool CollectorService::IsRelay(const std::string& identity) const {
  for (const std::string& r : options_.relay_identities) {
    if (identity == r) return true;
  }
  return false;
}

grpc::Status CollectorService::Submit(grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
                                      grpc::ByteBuffer* response) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = Handle(context, reader, response);
  health_->ObserveIngestSeconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return status;
}

grpc::Status CollectorService::Refuse(SubmitResult result, grpc::StatusCode code, std::string message) {
  health_->Count(result);
  return {code, std::move(message)};
}

grpc::Status CollectorService::IdentifyPeer(grpc::ServerContext* context, std::string& identity) {
  std::vector<grpc::string_ref> cn = context->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (cn.empty() || cn[0].empty()) {
    return Refuse(SubmitResult::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED,
                  "the client certificate has no subject CN");
  }
  identity.assign(cn[0].data(), cn[0].size());
  return CheckAllowed(identity);
}

grpc::Status CollectorService::IdentifyInsecure(const Request& request, std::string& identity) {
  const std::string& hostname = request.parsed->report().host().hostname();
  if (!request.parsed_ok || !IsValidHostname(hostname)) {
    return Refuse(SubmitResult::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED,
                  "--insecure: the identity is insecure:<host.hostname>, and the report carries no valid "
                  "host.hostname");
  }
  identity = "insecure:" + hostname;
  return CheckAllowed(identity);
}

grpc::Status CollectorService::CheckAllowed(const std::string& identity) {
  if (options_.allowed && !options_.allowed->Allows(identity)) {
    return Refuse(SubmitResult::kDenied, grpc::StatusCode::PERMISSION_DENIED,
                  fmt::format("identity '{}' is not in --allowed-agents", identity));
  }
  return grpc::Status::OK;
}

std::optional<MemoryBudget::Reservation> CollectorService::ReserveMemory(size_t bytes, grpc::Status& refusal) {
  std::optional<MemoryBudget::Reservation> reservation = request_memory_.Reserve(bytes, kMemoryWait);
  if (!reservation) {
    refusal = Refuse(SubmitResult::kOverloaded, grpc::StatusCode::RESOURCE_EXHAUSTED,
                     fmt::format("the collector holds --max-request-memory {} bytes of requests in progress; "
                                 "retry later",
                                 request_memory_.limit()));
  }
  return reservation;
}

grpc::Status CollectorService::TakeToken(const std::string& agent_key, const std::string& identity, int64_t now_ns) {
  if (ingestor_->TakeToken(agent_key, now_ns)) return grpc::Status::OK;
  return Refuse(SubmitResult::kRateLimited, grpc::StatusCode::RESOURCE_EXHAUSTED,
                fmt::format("rate limit: agent '{}' sends more than its reports/s (--rate-limit-per-agent, "
                            "--rate-burst); retry later",
                            identity));
}

namespace {

// DNS names compare without regard to case (RFC 4343).
bool SameHostname(grpc::string_ref a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

grpc::Status CollectorService::CheckHost(grpc::ServerContext* context, const std::string& identity,
                                         const Request& request) {
  const std::string& hostname = request.parsed->report().host().hostname();
  const grpc::AuthContext& auth = *context->auth_context();
  // The CN (the identity) first, then the DNS subject alternative names; IP,
  // URI and e-mail names are not host names.
  if (SameHostname(grpc::string_ref(identity), hostname)) return grpc::Status::OK;
  for (const grpc::string_ref& dns : auth.FindPropertyValues(GRPC_PEER_DNS_PROPERTY_NAME)) {
    if (SameHostname(dns, hostname)) return grpc::Status::OK;
  }
  return Refuse(SubmitResult::kDenied, grpc::StatusCode::PERMISSION_DENIED,
                fmt::format("host.hostname '{}' is not this certificate's: identity '{}' may report only as its "
                            "CN or one of its DNS subject alternative names (issue the agent a certificate for "
                            "its hostname, or list a relay with --relay-identity)",
                            hostname, identity));
}

grpc::Status CollectorService::Validate(const Request& request, int64_t now_ns) {
  if (!request.parsed_ok) {
    return Refuse(SubmitResult::kInvalid, grpc::StatusCode::INVALID_ARGUMENT,
                  "request: not a valid tlsprof.v1.SubmitRequest");
  }
  if (!request.parsed->has_report()) {
    return Refuse(SubmitResult::kInvalid, grpc::StatusCode::INVALID_ARGUMENT, "report: missing");
  }
  if (auto error = ValidateReport(request.parsed->report(), now_ns)) {
    return Refuse(SubmitResult::kInvalid, grpc::StatusCode::INVALID_ARGUMENT, *error);
  }
  return grpc::Status::OK;
}

grpc::Status CollectorService::Ingest(const std::string& agent_key, const std::string& identity, Request& request,
                                      int64_t now_ns, ApplyResult& applied) {
  if (store_ && !store_->healthy()) {
    // Counting in memory what cannot be made durable would turn the agent's
    // retry into a DUPLICATE and lose the batch at the next start.
    return {grpc::StatusCode::UNAVAILABLE, "the collector cannot write its journal now (see its log); retry later"};
  }
  // The record carries the request bytes as received: no copy of the parsed
  // report, no second serialization.
  std::string record_bytes;
  if (store_) {
    state::JournalRecord record;
    record.set_agent_key(agent_key);
    record.set_received_unix_ns(now_ns);
    record.set_submit_request(std::move(request.bytes));
    record_bytes = record.SerializeAsString();
  }
  uint64_t ticket = 0;
  const v1::AgentReport& report = request.parsed->report();
  applied = ingestor_->Apply(
      agent_key, report, now_ns,
      [&] {
        if (store_) ticket = store_->Enqueue(std::move(record_bytes));
      },
      request.parsed->sent_unix_ns());
  if (applied.refused) {
    // Retried by the agent (its batch stays spooled); docs/fleet.md, "Bounds".
    return Refuse(SubmitResult::kAgentLimit, grpc::StatusCode::RESOURCE_EXHAUSTED,
                  fmt::format("the collector holds --max-agents agents, none silent for --idle-expiry-seconds; "
                              "agent '{}' is not taken now, retry later",
                              identity));
  }
  if (applied.too_old) {
    spdlog::warn("agent '{}': sequence {} is more than {} below the highest accepted; answered DUPLICATE", identity,
                 report.sequence(), SequenceWindow::kWidth);
  }
  if (store_) {
    // DUPLICATE tells the agent it may delete its batch, so it too waits
    // until the original is durable. The original was enqueued before this
    // request was found to repeat it (both under the ingest lock): waiting
    // for everything enqueued so far covers it. A retry that comes while the
    // original's flush is stalled waits for that flush.
    Status durable = applied.duplicate ? store_->Sync() : store_->WaitDurable(ticket);
    if (!durable.ok()) {
      spdlog::error("journal: {}", durable.error().message);
      return {grpc::StatusCode::UNAVAILABLE, "the collector could not make the report durable; retry"};
    }
    if (!applied.duplicate) store_->MaybeCompact();
  }
  return grpc::Status::OK;
}

CollectorService::Request CollectorService::ReadRequest(const grpc::ByteBuffer& buffer) {
  Request request;
  google::protobuf::ArenaOptions options;
  options.start_block_size = 16 << 10;  // a 100-row report's message fits
  request.arena = std::make_unique<google::protobuf::Arena>(options);
  request.parsed = google::protobuf::Arena::CreateMessage<v1::SubmitRequest>(request.arena.get());
  std::vector<grpc::Slice> slices;
  if (buffer.Dump(&slices).ok()) {
    request.bytes.reserve(buffer.Length());
    for (const grpc::Slice& s : slices) request.bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    request.parsed_ok = request.parsed->ParseFromString(request.bytes);
  }
  return request;
}

grpc::Status CollectorService::Handle(grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
                                      grpc::ByteBuffer* response) {
  const int64_t now_ns = NowUnixNs();
  // 1 and 2. Identity from the certificate, and the rate limit of a non-relay
  // identity, before a byte is read. A relay's bucket is per host, so it
  // waits for the decoded hostname (below).
  std::string identity;
  bool relay = false;
  if (!options_.insecure) {
    if (grpc::Status st = IdentifyPeer(context, identity); !st.ok()) return st;
    relay = IsRelay(identity);
    if (!relay) {
      if (grpc::Status st = TakeToken(MakeAgentKey(identity, ""), identity, now_ns); !st.ok()) return st;
    }
  }
  // 3. Memory: the read may hold up to gRPC's own limit (StartServer: twice
  // --max-message-bytes) until its size is known; then the request holds its
  // bytes, copy and decoded message until the reply.
  grpc::Status refusal;
  std::optional<MemoryBudget::Reservation> reservation = ReserveMemory(2 * options_.max_message_bytes, refusal);
  if (!reservation) return refusal;
  grpc::ByteBuffer buffer;
  if (!reader->Read(&buffer)) {
    // gRPC cancelled the call (a message above its own limit, or the client
    // went away): gRPC answers it, and it is not counted.
    if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "the call was cancelled"};
    return Refuse(SubmitResult::kInvalid, grpc::StatusCode::INVALID_ARGUMENT, "request: no message received");
  }
  // 4. Size. gRPC's own limit sits above --max-message-bytes, so that what
  // lies between is answered and counted here.
  const size_t size = buffer.Length();
  if (size > options_.max_message_bytes) {
    return Refuse(SubmitResult::kTooLarge, grpc::StatusCode::RESOURCE_EXHAUSTED,
                  fmt::format("message of {} bytes exceeds --max-message-bytes {}", size, options_.max_message_bytes));
  }
  reservation->ShrinkTo(size * kRequestMemoryPerByte);
  Request request = ReadRequest(buffer);
  buffer.Clear();  // copied into request.bytes
  // --insecure: the identity is the reported hostname, so it needs the
  // decoded message (trusted networks only: docs/fleet.md).
  if (options_.insecure) {
    if (grpc::Status st = IdentifyInsecure(request, identity); !st.ok()) return st;
    relay = IsRelay(identity);
  }
  // A relay submits for many hosts: each (relay, hostname) is one agent. Until
  // validation, an invalid hostname keys the relay itself.
  const std::string& hostname = request.parsed->report().host().hostname();
  const std::string agent_key =
      MakeAgentKey(identity, relay && IsValidHostname(hostname) ? std::string_view(hostname) : "");
  if (options_.insecure || relay) {
    if (grpc::Status st = TakeToken(agent_key, identity, now_ns); !st.ok()) return st;
  }
  // 5. Validation.
  if (grpc::Status st = Validate(request, now_ns); !st.ok()) return st;
  // 6. The host is the certificate's, unless a relay speaks for it.
  if (!options_.insecure && !relay) {
    if (grpc::Status st = CheckHost(context, identity, request); !st.ok()) return st;
  }
  // 7 and 8. Duplicate, caps, counters; the journal record is appended under
  // the ingest lock and made durable (group commit) before the reply.
  ApplyResult applied;
  if (grpc::Status st = Ingest(agent_key, identity, request, now_ns, applied); !st.ok()) return st;
  health_->Count(applied.duplicate ? SubmitResult::kDuplicate : SubmitResult::kAccepted);
  if (applied.dropped_series) health_->AddDroppedSeries(applied.dropped_series);

  v1::SubmitResponse reply;
  reply.set_result(applied.duplicate ? v1::SubmitResponse::DUPLICATE : v1::SubmitResponse::ACCEPTED);
  reply.set_dropped_series(applied.dropped_series);
  const std::string out = reply.SerializeAsString();
  grpc::Slice slice(out);
  *response = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

Result<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options, CollectorService* service) {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (options.insecure) {
    credentials = grpc::InsecureServerCredentials();
  } else {
    Result<std::string> ca = ReadFile("--tls-ca", options.tls.ca);
    if (!ca.ok()) return ca.error();
    Result<std::string> cert = ReadFile("--tls-cert", options.tls.cert);
    if (!cert.ok()) return cert.error();
    Result<std::string> key = ReadFile("--tls-key", options.tls.key);
    if (!key.ok()) return key.error();
    Status checked = CheckTlsFiles(options.tls, *ca, *cert, *key);
    if (!checked.ok()) return checked.error();
    // The files as gRPC's watcher reads them, now and every
    // tls_reload_seconds: the checks above are the start's.
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.tls.key, options.tls.cert, options.tls.ca, std::max(1u, options.tls_reload_seconds));
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_root_certs();
    tls.watch_identity_key_cert_pairs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    credentials = grpc::experimental::TlsServerCredentials(tls);
  }
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second collector on the same port would
  // then share the traffic instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(service);
  // The sync server's thread pool: by default it keeps at most 2 idle pollers,
  // so under load every call ends a thread and starts another (thread
  // creation shows in the collector's profile: bench/README.md). Keep more
  // pollers, and bound the threads so that overload queues (or is refused with
  // RESOURCE_EXHAUSTED) instead of growing memory.
  grpc::ResourceQuota quota("tlsprof-collector");
  quota.SetMaxThreads(kMaxServerThreads);
  // And the memory of its transports (read buffers, messages being read):
  // gRPC 1.51 accounts them against this size and cancels streams past it.
  // Not a hard cap (allocations go on first): Submit's own reservation,
  // taken before it reads, is the bound (docs/fleet.md, "Ingest").
  quota.Resize(options.max_request_memory);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kMaxServerPollers);
  // A stream's flow-control window stays at HTTP/2's 64 KiB until Submit reads
  // its message: bandwidth-delay probing would raise it toward megabytes, and
  // every call queued for a thread could then hold that much unread.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Messages up to twice the limit reach Submit, which answers and counts them;
  // gRPC itself refuses anything larger (RESOURCE_EXHAUSTED, not counted).
  const size_t grpc_limit = std::min<size_t>(options.max_message_bytes * 2, (1u << 31) - 1);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::max<size_t>(grpc_limit, 1024)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return MakeError("--listen {}: cannot listen (is the address valid and the port free?)", options.listen);
  }
  return server;
}

}  // namespace tlsprof::collector
