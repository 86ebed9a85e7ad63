// Sends a Fleet's reports to collectors over gRPC's async API: one scheduler
// thread builds each report when it is due and starts its call on one of C
// channels (each its own TCP connection) of a collector; completion-queue
// threads take the answers, record latencies and queue retries. Not
// thread-safe: one Run() per Driver.
//
// Several collectors: each agent keeps the agent's rule (docs/fleet.md,
// "Several collectors"). Its report goes to the first collector of its
// rendezvous order (common/placement, keyed by its hostname) whose channel
// is connected, and from then on only there: retries never move a report,
// since an attempt without an answer may have been counted.
//
// Schedule: report j (j = 0, 1, ...) is agent j mod N's window j div N + 1,
// due at start + j × interval / N, so the N agents' reports are spread evenly
// over each interval and every agent's windows are contiguous and end when
// they are sent. With total_windows, each agent sends exactly that many
// windows (the last ones ending now) as fast as the collector answers, unless
// `paced`.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collector/loadgen/fleet.h"
#include "common/result.h"

namespace tlsprof::loadgen {

struct DriverOptions {
  std::vector<std::string> collectors;  // HOST:PORT each
  bool insecure = false;
  std::string tls_ca, tls_cert, tls_key;  // file paths (mTLS, the relay identity's certificate)
  std::string tls_server_name;            // overrides the name checked in the collector's certificate
  uint32_t connections = 32;
  uint32_t threads = 1;  // completion-queue threads
  double duration_seconds = 60;
  uint64_t total_windows = 0;  // > 0: exactly this many windows per agent, then exit
  bool paced = false;          // total_windows: keep the interval schedule
  uint32_t max_in_flight = 4096;
  uint32_t retries = 3;    // per report, on UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED
  bool breakdown = false;  // count the counted reports' TLS samples by bucket and algorithm (a map per answer)
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds connect_timeout{10000};
};

struct DriverResult {
  double elapsed_seconds = 0;  // first send to last answer
  uint64_t planned = 0;        // reports the schedule held
  uint64_t sent = 0;           // reports started (first attempts)
  uint64_t attempts = 0;       // calls, retries included
  uint64_t accepted = 0;
  uint64_t duplicate = 0;
  // DUPLICATE answers to a retry: an earlier attempt of this run was counted
  // and its answer lost (a collector killed, a connection cut). Their samples
  // are in accepted_totals: the collectors count them once.
  uint64_t duplicate_after_retry = 0;
  uint64_t failed = 0;  // reports never answered ACCEPTED or DUPLICATE
  uint64_t retried = 0;
  uint64_t dropped_series = 0;   // the collector's cardinality caps
  uint64_t series = 0;           // TlsCpu rows in ACCEPTED reports
  ReportTotals accepted_totals;  // samples in the reports this run got counted (ACCEPTED, duplicate_after_retry)
  // With `breakdown`: their TLS samples by the collector's labels, bucket
  // ("cipher", ...) and "bucket/algorithm".
  std::map<std::string, uint64_t> accepted_tls_by_bucket, accepted_tls_by_algorithm;
  std::vector<uint64_t> accepted_by_collector;        // counted reports per collector, in --collector order
  std::map<std::string, uint64_t> errors;             // failed calls by status code name
  std::map<std::string, std::string> error_examples;  // one message per code
  double latency_p50_ms = 0, latency_p99_ms = 0, latency_max_ms = 0;  // per call
  double lag_p99_ms = 0, lag_max_ms = 0;  // how late the loadgen started calls against the schedule
  double cpu_seconds = 0;                 // this process's CPU (all its threads) over the run
};

Result<DriverResult> RunLoad(const Fleet& fleet, const DriverOptions& options);

// Stops starting new reports; RunLoad() then waits for the calls in flight
// and returns. Async-signal-safe (for SIGINT/SIGTERM handlers).
void RequestStop();

}  // namespace tlsprof::loadgen
