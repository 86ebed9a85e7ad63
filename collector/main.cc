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

#include "collector/expose/health.h"
#include "collector/expose/http.h"
#include "collector/ingest/ingestor.h"
#include "collector/server/service.h"
#include "collector/store/state_store.h"
#include "common/privilege/privilege.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  using namespace tlsprof::collector;
  CLI::App app{"tlsprof-collector: gathers tlsprof agent reports into Prometheus counters (docs/fleet.md)"};
  ServerOptions server_options;
  std::string metrics_listen, state_dir, allowed_agents_file, log_level = "info";
  std::vector<std::string> relay_identities;
  IngestOptions ingest;
  uint64_t max_message_bytes = 4194304;
  uint64_t compact_bytes = 64ull << 20;
  // The same options in CLI11's config format, top-level keys (packaging/config/collector.conf); a key that is
  // not an option is an error, so that a typo is not silently ignored.
  app.set_config("--config", "",
                 "Read options from FILE (CLI11 config format: `listen = \"0.0.0.0:4317\"`, one per "
                 "line); the command line wins");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--listen", server_options.listen, "gRPC address HOST:PORT")->required();
  app.add_option("--metrics-listen", metrics_listen,
                 "HTTP address HOST:PORT for /metrics, /api/v1/* and the status page at /")
      ->required();
  auto* ca = app.add_option("--tls-ca", server_options.tls.ca, "PEM: the CA that signs agent certificates");
  auto* cert = app.add_option("--tls-cert", server_options.tls.cert, "PEM: the collector's certificate");
  auto* key = app.add_option("--tls-key", server_options.tls.key, "PEM: the collector's private key");
  auto* insecure = app.add_flag("--insecure", server_options.insecure,
                                "plaintext gRPC; the identity is insecure:<host.hostname> (tests, trusted networks)");
  insecure->excludes(ca, cert, key);
  app.add_option("--state-dir", state_dir, "keep counters and accepted batches across restarts (journal + snapshot)");
  app.add_option("--allowed-agents", allowed_agents_file, "file: one identity per line, `*` suffix = prefix match");
  app.add_option("--relay-identity", relay_identities, "identity that submits for many hosts (keyed by hostname)");
  app.add_option("--max-message-bytes", max_message_bytes, "largest Submit message")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1024}, uint64_t{1} << 30));
  app.add_option("--max-series-per-agent", ingest.max_series_per_agent)->capture_default_str();
  app.add_option("--max-services-per-agent", ingest.max_services_per_agent)->capture_default_str();
  app.add_option("--rate-limit-per-agent", ingest.rate_per_agent, "reports per second per agent")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rate-burst", ingest.rate_burst, "token bucket size")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e9));
  app.add_flag("--host-labels", ingest.host_labels, "also count per host (tlsprof_host_*), at most --max-hosts");
  app.add_option("--max-hosts", ingest.max_hosts)->capture_default_str();
  app.add_option("--max-agents", ingest.max_agents, "agent keys held (identities; a relay's hosts count one each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-series", ingest.max_series, "data series held over all agents (cpu + busy)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--journal-compact-bytes", compact_bytes, "snapshot the state when the journal grows past this")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Debian's Abseil keeps mutex deadlock detection on: a graph update on every
  // lock of gRPC's mutexes (~1.5% of the collector's CPU under load).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!server_options.insecure &&
      (server_options.tls.ca.empty() || server_options.tls.cert.empty() || server_options.tls.key.empty())) {
    return Fail("--tls-ca, --tls-cert and --tls-key are all required (or --insecure to accept plaintext)");
  }
  server_options.max_message_bytes = max_message_bytes;

  ServiceOptions service_options;
  service_options.insecure = server_options.insecure;
  service_options.max_message_bytes = max_message_bytes;
  service_options.relay_identities = relay_identities;
  if (!allowed_agents_file.empty()) {
    tlsprof::Result<AllowList> allowed = AllowList::Load(allowed_agents_file);
    if (!allowed.ok()) return Fail(allowed.error().message);
    if (allowed->size() == 0)
      spdlog::warn("--allowed-agents {}: lists nobody; every Submit will be denied", allowed_agents_file);
    service_options.allowed = std::make_shared<AllowList>(std::move(*allowed));
  }

  // Block the signals before any thread starts, so that only sigwait() sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Before the first thread (the state store's, gRPC's, the HTTP server's).
  if (auto st = DropCapabilities({server_options.listen, metrics_listen}); !st.ok()) {
    return Fail("cannot drop capabilities: " + st.error().message);
  }

  Ingestor ingestor(ingest);
  HealthMetrics health;
  std::unique_ptr<StateStore> store;
  if (!state_dir.empty()) {
    tlsprof::Result<std::unique_ptr<StateStore>> opened = StateStore::Open(state_dir, compact_bytes, ingestor);
    if (!opened.ok()) return Fail(opened.error().message);
    store = std::move(*opened);
  }

  CollectorService service(service_options, &ingestor, store.get(), &health);
  tlsprof::Result<std::unique_ptr<grpc::Server>> server = StartServer(server_options, &service);
  if (!server.ok()) return Fail(server.error().message);

  HttpCallbacks callbacks;
  callbacks.collect = [&] {
    health.SetAgents(static_cast<double>(ingestor.ActiveAgents(NowUnixNs(), kAgentHorizonNs)));
    health.SetJournalBytes(store ? static_cast<double>(store->journal_bytes()) : 0.0);
    std::vector<prometheus::MetricFamily> families = ingestor.CollectData();
    std::vector<prometheus::MetricFamily> own = health.registry()->Collect();
    families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
    return families;
  };
  callbacks.summary = [&](int minutes) { return ingestor.Summary(minutes, NowUnixNs()); };
  callbacks.trend = [&](int minutes) { return ingestor.Trend(minutes, NowUnixNs()); };
  callbacks.agents = [&](int limit) { return ingestor.Agents(static_cast<size_t>(limit), NowUnixNs()); };
  tlsprof::Result<std::unique_ptr<HttpServer>> http = HttpServer::Start(metrics_listen, std::move(callbacks));
  if (!http.ok()) {
    (*server)->Shutdown();
    return Fail(http.error().message);
  }
  spdlog::info("tlsprof-collector: gRPC on {} ({}), metrics on {}{}", server_options.listen,
               server_options.insecure ? "insecure" : "mTLS", metrics_listen,
               state_dir.empty() ? ", state in memory only" : ", state in " + state_dir);

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
  spdlog::info("tlsprof-collector: stopped");
  return 0;
}
