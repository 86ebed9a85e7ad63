// tlsprof-loadgen: plays a fleet of agents against a collector
// (docs/fleet.md, "Load simulator").
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "collector/loadgen/driver.h"
#include "collector/loadgen/fleet.h"

namespace {

void OnSignal(int) { tlsprof::loadgen::RequestStop(); }

nlohmann::json ToJson(const tlsprof::loadgen::FleetOptions& f, const tlsprof::loadgen::DriverOptions& d,
                      const tlsprof::loadgen::DriverResult& r, double period_seconds) {
  const double elapsed = r.elapsed_seconds > 0 ? r.elapsed_seconds : 1e-9;
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [code, count] : r.errors) errors[code] = count;
  nlohmann::json examples = nlohmann::json::object();
  for (const auto& [code, message] : r.error_examples) examples[code] = message;
  return {
      {"agents", f.agents},
      {"interval_seconds", f.interval_seconds},
      {"series_per_report", f.series},
      {"services", f.services},
      {"frequency_hz", f.frequency_hz},
      {"seed", f.seed},
      {"connections", d.connections},
      {"tls", !d.insecure},
      {"total_windows", d.total_windows},
      {"elapsed_seconds", r.elapsed_seconds},
      {"planned", r.planned},
      {"sent", r.sent},
      {"attempts", r.attempts},
      {"accepted", r.accepted},
      {"duplicate", r.duplicate},
      {"duplicate_after_retry", r.duplicate_after_retry},
      {"accepted_by_collector", r.accepted_by_collector},
      {"accepted_tls_samples_by_bucket", r.accepted_tls_by_bucket},
      {"accepted_tls_samples_by_algorithm", r.accepted_tls_by_algorithm},
      {"failed", r.failed},
      {"retried", r.retried},
      {"dropped_series", r.dropped_series},
      {"reports_per_second", static_cast<double>(r.accepted + r.duplicate) / elapsed},
      {"series_per_second", static_cast<double>(r.series) / elapsed},
      {"latency_ms", {{"p50", r.latency_p50_ms}, {"p99", r.latency_p99_ms}, {"max", r.latency_max_ms}}},
      {"schedule_lag_ms", {{"p99", r.lag_p99_ms}, {"max", r.lag_max_ms}}},
      {"errors", errors},
      {"error_examples", examples},
      {"loadgen_cpu_seconds", r.cpu_seconds},
      {"loadgen_cpu_percent", 100.0 * r.cpu_seconds / elapsed},
      // What the counted reports carried (ACCEPTED, or DUPLICATE to a retry
      // after a lost answer): collectors that started empty and took only
      // these reports hold exactly these counters between them.
      {"accepted_busy_samples", r.accepted_totals.busy_samples},
      {"accepted_tls_samples", r.accepted_totals.tls_samples},
      {"accepted_busy_cpu_seconds", static_cast<double>(r.accepted_totals.busy_samples) * period_seconds},
      {"accepted_tls_cpu_seconds", static_cast<double>(r.accepted_totals.tls_samples) * period_seconds},
  };
}

void PrintText(const nlohmann::json& j) {
  fmt::print("tlsprof-loadgen: {} agents, interval {} s, {} series/report, {} connections ({}){}\n",
             j["agents"].get<uint64_t>(), j["interval_seconds"].get<double>(), j["series_per_report"].get<uint64_t>(),
             j["connections"].get<uint64_t>(), j["tls"].get<bool>() ? "mTLS" : "insecure",
             j["total_windows"].get<uint64_t>()
                 ? fmt::format(", {} windows per agent", j["total_windows"].get<uint64_t>())
                 : "");
  fmt::print("reports:  {} sent, {} accepted, {} duplicate, {} failed, {} retried in {:.2f} s\n",
             j["sent"].get<uint64_t>(), j["accepted"].get<uint64_t>(), j["duplicate"].get<uint64_t>(),
             j["failed"].get<uint64_t>(), j["retried"].get<uint64_t>(), j["elapsed_seconds"].get<double>());
  fmt::print("rate:     {:.1f} reports/s, {:.0f} series/s\n", j["reports_per_second"].get<double>(),
             j["series_per_second"].get<double>());
  const auto& l = j["latency_ms"];
  fmt::print("latency:  p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms\n", l["p50"].get<double>(), l["p99"].get<double>(),
             l["max"].get<double>());
  if (j["total_windows"].get<uint64_t>() == 0) {
    fmt::print("schedule: calls started late by p99 {:.2f} ms, max {:.2f} ms\n",
               j["schedule_lag_ms"]["p99"].get<double>(), j["schedule_lag_ms"]["max"].get<double>());
  }
  std::string errors;
  for (const auto& [code, count] : j["errors"].items()) errors += fmt::format(" {}={}", code, count.get<uint64_t>());
  fmt::print("errors:  {}\n", errors.empty() ? " none" : errors);
  for (const auto& [code, message] : j["error_examples"].items()) {
    fmt::print("  {}: {}\n", code, message.get<std::string>());
  }
  if (j["dropped_series"].get<uint64_t>()) fmt::print("dropped series: {}\n", j["dropped_series"].get<uint64_t>());
  fmt::print("loadgen:  {:.2f} CPU-seconds ({:.1f}% of one core)\n", j["loadgen_cpu_seconds"].get<double>(),
             j["loadgen_cpu_percent"].get<double>());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tlsprof-loadgen: plays N tlsprof agents against a collector (docs/fleet.md)"};
  tlsprof::loadgen::FleetOptions fleet;
  tlsprof::loadgen::DriverOptions driver;
  bool json = false;
  int64_t timeout_ms = 10000;
  app.add_option("--collector", driver.collectors,
                 "A collector's gRPC address, HOST:PORT; repeat for several (each agent takes one by rendezvous "
                 "hashing of its hostname, as agents do, and keeps a report there through its retries)")
      ->required()
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--agents", fleet.agents, "Agents to play (hostnames <prefix><i>)")
      ->required()
      ->check(CLI::Range(1u, 10'000'000u));
  app.add_option("--interval", fleet.interval_seconds, "Seconds per window")->capture_default_str();
  app.add_option("--series", fleet.series, "TlsCpu rows per report")->capture_default_str();
  app.add_option("--services", fleet.services, "Service names in the fleet's pool")->capture_default_str();
  app.add_option("--frequency", fleet.frequency_hz, "Sampling frequency the agents report, Hz")->capture_default_str();
  app.add_option("--seed", fleet.seed, "Same seed, same reports")->capture_default_str();
  app.add_option("--hostname-prefix", fleet.hostname_prefix, "Agent i's hostname is <prefix><i>")
      ->capture_default_str();
  app.add_option("--connections", driver.connections, "gRPC channels (TCP connections)")->capture_default_str();
  app.add_option("--threads", driver.threads, "Completion-queue threads")->capture_default_str();
  auto* duration = app.add_option("--duration", driver.duration_seconds, "Seconds to send for")->capture_default_str();
  auto* total = app.add_option("--total-windows", driver.total_windows,
                               "Send exactly this many windows per agent, then exit (as fast as the collector "
                               "answers, unless --paced)");
  total->excludes(duration);
  app.add_flag("--paced", driver.paced, "With --total-windows: keep the interval schedule")->needs(total);
  app.add_option("--max-in-flight", driver.max_in_flight, "Calls in flight at most")->capture_default_str();
  app.add_option("--retries", driver.retries,
                 "Retries per report on UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED (backoff from 100 ms)")
      ->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call")->capture_default_str();
  auto* insecure = app.add_flag("--insecure", driver.insecure, "Plaintext gRPC (the collector runs --insecure)");
  auto* ca = app.add_option("--tls-ca", driver.tls_ca, "CA that signed the collector's certificate (PEM)");
  auto* cert = app.add_option("--tls-cert", driver.tls_cert, "Relay identity's certificate (PEM)");
  auto* key = app.add_option("--tls-key", driver.tls_key, "Its private key (PEM)");
  app.add_option("--tls-server-name", driver.tls_server_name, "Name to expect in the collector's certificate");
  for (auto* o : {ca, cert, key}) o->excludes(insecure);
  app.add_flag("--json", json, "Print the results as one JSON object");
  app.add_flag("--breakdown", driver.breakdown,
               "Also count the counted reports' TLS samples by bucket and algorithm (JSON: accepted_tls_samples_by_*)");
  CLI11_PARSE(app, argc, argv);
  driver.timeout = std::chrono::milliseconds(timeout_ms);

  auto made = tlsprof::loadgen::Fleet::Make(fleet);
  if (!made) {
    fmt::print(stderr, "tlsprof-loadgen: {}\n", made.error().message);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  auto result = tlsprof::loadgen::RunLoad(*made, driver);
  if (!result) {
    fmt::print(stderr, "tlsprof-loadgen: {}\n", result.error().message);
    return 2;
  }
  auto j = ToJson(fleet, driver, *result, static_cast<double>(made->period_ns()) / 1e9);
  if (json) {
    std::cout << j.dump(2) << std::endl;
  } else {
    PrintText(j);
  }
  // Every report was to be counted (or already was): anything else fails.
  return result->failed == 0 && result->sent == result->planned ? 0 : 1;
}
