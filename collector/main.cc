// tlsprof-collector: receives AgentReports over gRPC (mTLS), keeps additive
// counters, serves them on /metrics and /api/v1/summary (docs/fleet.md).
#include <absl/synchronization/mutex.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "collector/expose/fleet_api.h"
#include "collector/expose/fleet_metrics.h"
#include "collector/expose/health.h"
#include "collector/expose/http.h"
#include "collector/expose/remote_write.h"
#include "collector/ingest/ingestor.h"
#include "collector/server/service.h"
#include "collector/store/state_store.h"
#include "common/privilege/privilege.h"

namespace {

using namespace tlsprof::collector;

constexpr int kUsageError = 2;
constexpr int64_t kAgentHorizonNs = 5LL * 60 * 1000 * 1000 * 1000;

int64_t NowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The lowest port an unprivileged process may bind (net.ipv4.ip_unprivileged_port_start, 1024 by default).
int UnprivilegedPortStart() {
  std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_unprivileged_port_start", "r");
  int start = 1024;
  if (f != nullptr) {
    if (std::fscanf(f, "%d", &start) != 1) start = 1024;
    std::fclose(f);
  }
  return start;
}

// True if HOST:PORT names a port below UnprivilegedPortStart() (binding it needs CAP_NET_BIND_SERVICE).
bool NeedsPrivilegedPort(const std::string& address, int unprivileged_start) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  int port = 0;
  if (std::sscanf(address.c_str() + colon + 1, "%d", &port) != 1) return false;
  return port > 0 && port < unprivileged_start;
}

// The collector needs no capability (docs/fleet.md, "Capabilities"): it reads its own files and binds ports >= 1024.
// Whatever it was started with (root, say) is dropped from every set before the first thread starts, since threads
// keep their creator's capabilities. Only a port below 1024 keeps CAP_NET_BIND_SERVICE, for the life of the process:
// gRPC binds from threads it starts itself.
tlsprof::Status DropCapabilities(const std::vector<std::string>& listen_addresses) {
  std::vector<cap_value_t> keep;
  const int start = UnprivilegedPortStart();
  for (const std::string& address : listen_addresses) {
    if (NeedsPrivilegedPort(address, start)) keep = {CAP_NET_BIND_SERVICE};
  }
  const std::string before = tlsprof::privilege::Describe();
  if (auto st = tlsprof::privilege::KeepOnly(keep); !st.ok()) return st;
  const std::string after = tlsprof::privilege::Describe();
  if (after != before) {
    spdlog::info("capabilities: kept {}; now {}", tlsprof::privilege::Names(keep), after);
  } else {
    spdlog::debug("capabilities: {}", after);
  }
  return tlsprof::OkStatus();
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tlsprof-collector: %s\n", message.c_str());
  return kUsageError;
}

// Everything the command line (or --config) sets.
struct Flags {
  ServerOptions server;
  std::string metrics_listen, state_dir, allowed_agents_file, log_level = "info";
  std::vector<std::string> relay_identities;
  IngestOptions ingest;
  uint64_t max_message_bytes = 4194304;
  uint64_t max_request_memory = kDefaultMaxRequestMemory;
  double idle_expiry_seconds = static_cast<double>(kDefaultIdleExpiryNs) / 1e9;
  uint64_t compact_bytes = 64ull << 20;
  RemoteWriteOptions remote_write;
  std::vector<std::string> remote_write_labels;  // NAME=VALUE
  double remote_write_interval_seconds = 15;
};

void AddFlags(CLI::App& app, Flags& f) {
  // The same options in CLI11's config format, top-level keys (packaging/config/collector.conf); a key that is
  // not an option is an error, so that a typo is not silently ignored.
  app.set_config("--config", "",
                 "Read options from FILE (CLI11 config format: `listen = \"0.0.0.0:4317\"`, one per "
                 "line); the command line wins");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--listen", f.server.listen, "gRPC address HOST:PORT")->required();
  app.add_option("--metrics-listen", f.metrics_listen,
                 "HTTP address HOST:PORT for /metrics, /api/v1/* and the status page at /")
      ->required();
  auto* ca = app.add_option("--tls-ca", f.server.tls.ca, "PEM: the CA that signs agent certificates");
  auto* cert = app.add_option("--tls-cert", f.server.tls.cert, "PEM: the collector's certificate");
  auto* key = app.add_option("--tls-key", f.server.tls.key, "PEM: the collector's private key");
  auto* insecure = app.add_flag("--insecure", f.server.insecure,
                                "plaintext gRPC; the identity is insecure:<host.hostname> (tests, trusted networks)");
  insecure->excludes(ca, cert, key);
  app.add_option("--state-dir", f.state_dir, "keep counters and accepted batches across restarts (journal + snapshot)");
  app.add_option("--allowed-agents", f.allowed_agents_file, "file: one identity per line, `*` suffix = prefix match");
  app.add_option("--relay-identity", f.relay_identities, "identity that submits for many hosts (keyed by hostname)");
  // A number whose --help shows its default.
  auto number = [&app](const std::string& name, auto& value, const std::string& help = "") {
    return app.add_option(name, value, help)->capture_default_str();
  };
  number("--max-message-bytes", f.max_message_bytes, "largest Submit message")
      ->check(CLI::Range(uint64_t{1024}, uint64_t{1} << 30));
  number("--max-request-memory", f.max_request_memory,
         "bytes Submits in progress may hold (and gRPC's buffers, again): past it, RESOURCE_EXHAUSTED")
      ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 40));
  number("--idle-expiry-seconds", f.idle_expiry_seconds,
         "an agent key (at --max-agents) or a --max-hosts slot silent this long gives its place up")
      ->check(CLI::Range(1.0, 30.0 * 86400));
  number("--max-series-per-agent", f.ingest.max_series_per_agent);
  number("--max-services-per-agent", f.ingest.max_services_per_agent);
  number("--rate-limit-per-agent", f.ingest.rate_per_agent, "reports per second per agent")->check(CLI::PositiveNumber);
  number("--rate-burst", f.ingest.rate_burst, "token bucket size")->check(CLI::Range(1.0, 1e9));
  app.add_flag("--host-labels", f.ingest.host_labels, "also count per host (tlsprof_host_*), at most --max-hosts");
  number("--max-hosts", f.ingest.max_hosts);
  number("--max-agents", f.ingest.max_agents, "agent keys held (identities; a relay's hosts count one each)")
      ->check(CLI::PositiveNumber);
  number("--max-series", f.ingest.max_series, "data series held over all agents (cpu + busy)")
      ->check(CLI::PositiveNumber);
  number("--journal-compact-bytes", f.compact_bytes, "snapshot the state when the journal grows past this");
  number("--tls-reload-seconds", f.server.tls_reload_seconds,
         "read the TLS files again this often: new connections use a replaced certificate")
      ->check(CLI::Range(1u, 86400u));
  app.add_option("--remote-write", f.remote_write.urls,
                 "also push the series to this Prometheus remote-write URL (repeatable), e.g. "
                 "http://victoria:8428/api/v1/write");
  app.add_option("--remote-write-label", f.remote_write_labels,
                 "NAME=VALUE on every pushed series (repeatable); the collectors of a tier need distinct ones "
                 "(default: collector=<hostname>)");
  number("--remote-write-interval", f.remote_write_interval_seconds, "seconds between pushes")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// The service's options from the flags; --allowed-agents is read here.
tlsprof::Result<ServiceOptions> MakeServiceOptions(const Flags& f) {
  ServiceOptions options;
  options.insecure = f.server.insecure;
  options.max_message_bytes = f.max_message_bytes;
  options.max_request_memory = f.max_request_memory;
  options.relay_identities = f.relay_identities;
  if (!f.allowed_agents_file.empty()) {
    tlsprof::Result<AllowList> allowed = AllowList::Load(f.allowed_agents_file);
    if (!allowed.ok()) return allowed.error();
    if (allowed->size() == 0)
      spdlog::warn("--allowed-agents {}: lists nobody; every Submit will be denied", f.allowed_agents_file);
    options.allowed = std::make_shared<AllowList>(std::move(*allowed));
  }
  return options;
}

// How long /healthz waits for the ingest lock before calling ingest stuck
// (its holders copy or apply one report: microseconds to milliseconds).
constexpr auto kIngestStuckAfter = std::chrono::milliseconds(2000);

// What the HTTP endpoints serve: the fleet's counters and the collector's
// health on /metrics, /healthz, and the JSON API.
HttpCallbacks MakeCallbacks(const Ingestor& ingestor, HealthMetrics& health, StateStore* store) {
  HttpCallbacks callbacks;
  callbacks.collect = [&ingestor, &health, store] {
    health.SetAgents(static_cast<double>(ActiveAgents(ingestor, NowUnixNs(), kAgentHorizonNs)));
    health.SetJournalBytes(store ? static_cast<double>(store->journal_bytes()) : 0.0);
    std::vector<prometheus::MetricFamily> families = FleetMetrics(ingestor);
    std::vector<prometheus::MetricFamily> own = health.registry()->Collect();
    families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
    return families;
  };
  callbacks.summary = [&ingestor](int minutes) { return SummaryJson(ingestor, minutes, NowUnixNs()); };
  callbacks.trend = [&ingestor](int minutes) { return TrendJson(ingestor, minutes, NowUnixNs()); };
  callbacks.agents = [&ingestor](int limit) { return AgentsJson(ingestor, static_cast<size_t>(limit), NowUnixNs()); };
  // Liveness (health.h): a stuck ingest lock, a journal stopped for good.
  callbacks.health = [&ingestor, store] {
    return IngestHealth(ingestor, kIngestStuckAfter, store ? store->stopped() : "", store ? store->write_error() : "");
  };
  return callbacks;
}

// --remote-write-label NAME=VALUE, or collector=<hostname> without one.
tlsprof::Result<tlsprof::remote_write::ExternalLabels> ExternalLabels(const std::vector<std::string>& flags) {
  tlsprof::remote_write::ExternalLabels labels;
  for (const std::string& flag : flags) {
    const size_t eq = flag.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == flag.size()) {
      return tlsprof::MakeError("--remote-write-label {}: expected NAME=VALUE", flag);
    }
    labels.push_back({flag.substr(0, eq), flag.substr(eq + 1)});
  }
  if (labels.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    labels.push_back({"collector", host});
  }
  return labels;
}

// Serves until SIGTERM or SIGINT; the exit code.
int Serve(const Flags& f, const ServiceOptions& service_options) {
  // Block the signals before any thread starts, so that only sigwait() sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Before the first thread (the state store's, gRPC's, the HTTP server's).
  if (auto st = DropCapabilities({f.server.listen, f.metrics_listen}); !st.ok()) {
    return Fail("cannot drop capabilities: " + st.error().message);
  }

  Ingestor ingestor(f.ingest);
  HealthMetrics health;
  std::unique_ptr<StateStore> store;
  if (!f.state_dir.empty()) {
    tlsprof::Result<std::unique_ptr<StateStore>> opened = StateStore::Open(f.state_dir, f.compact_bytes, ingestor);
    if (!opened.ok()) return Fail(opened.error().message);
    store = std::move(*opened);
  }

  CollectorService service(service_options, &ingestor, store.get(), &health);
  tlsprof::Result<std::unique_ptr<grpc::Server>> server = StartServer(f.server, &service);
  if (!server.ok()) return Fail(server.error().message);
  HttpCallbacks callbacks = MakeCallbacks(ingestor, health, store.get());
  std::unique_ptr<RemoteWritePusher> pusher;
  if (!f.remote_write.urls.empty()) {
    // What /metrics shows; the pusher adds its own counters.
    auto pushed = RemoteWritePusher::Start(f.remote_write, callbacks.collect);
    if (!pushed.ok()) {
      (*server)->Shutdown();
      return Fail(pushed.error().message);
    }
    pusher = std::move(pushed).value();
    callbacks.collect = [collect = callbacks.collect, &pusher] {
      std::vector<prometheus::MetricFamily> families = collect();
      std::vector<prometheus::MetricFamily> own = pusher->Families();
      families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
      return families;
    };
  }
  tlsprof::Result<std::unique_ptr<HttpServer>> http = HttpServer::Start(f.metrics_listen, callbacks);
  if (!http.ok()) {
    (*server)->Shutdown();
    return Fail(http.error().message);
  }
  spdlog::info("tlsprof-collector: gRPC on {} ({}), metrics on {}{}", f.server.listen,
               f.server.insecure ? "insecure" : "mTLS", f.metrics_listen,
               f.state_dir.empty() ? ", state in memory only" : ", state in " + f.state_dir);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("tlsprof-collector: signal {}: finishing in-flight reports", signal_number);
  // Stops accepting calls and waits for the running ones (at most 10 s).
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  spdlog::debug("tlsprof-collector: gRPC server stopped");
  if (store) {
    tlsprof::Status synced = store->Sync();
    if (!synced.ok()) spdlog::error("state: {}", synced.error().message);
  }
  http->reset();
  spdlog::debug("tlsprof-collector: HTTP server stopped");
  pusher.reset();  // a last push of the final counters
  spdlog::info("tlsprof-collector: stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tlsprof-collector: gathers tlsprof agent reports into Prometheus counters (docs/fleet.md)"};
  Flags flags;
  AddFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  // Debian's Abseil keeps mutex deadlock detection on: a graph update on every
  // lock of gRPC's mutexes, which shows in the collector's profile under load
  // (bench/README.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const tlsprof::collector::TlsFiles& tls = flags.server.tls;
  if (!flags.server.insecure && (tls.ca.empty() || tls.cert.empty() || tls.key.empty())) {
    return Fail("--tls-ca, --tls-cert and --tls-key are all required (or --insecure to accept plaintext)");
  }
  flags.server.max_message_bytes = flags.max_message_bytes;
  flags.server.max_request_memory = flags.max_request_memory;
  flags.ingest.idle_expiry_ns = static_cast<int64_t>(flags.idle_expiry_seconds * 1e9);
  auto labels = ExternalLabels(flags.remote_write_labels);
  if (!labels.ok()) return Fail(labels.error().message);
  flags.remote_write.external_labels = *labels;
  flags.remote_write.interval =
      std::chrono::milliseconds(static_cast<int64_t>(flags.remote_write_interval_seconds * 1000));
  tlsprof::Result<tlsprof::collector::ServiceOptions> service_options = MakeServiceOptions(flags);
  if (!service_options.ok()) return Fail(service_options.error().message);
  return Serve(flags, *service_options);
}
