// Shipping sealed windows to collectors: the on-disk spool and the gRPC
// client (docs/fleet.md, "Agent daemon" and "Several collectors").
//
// Seal() numbers a report (agent_instance, sequence) and makes it durable in
// the spool (write, fsync, rename) before anything touches the network; a
// sender thread then ships the spool oldest first and deletes a batch once a
// collector answered ACCEPTED or DUPLICATE. So a batch is lost only when the
// spool bound drops it (counted), and counted twice never: a collector
// remembers (identity, instance, sequence), and a batch goes to one collector
// only. With several collectors the agent ships to the first of its order of
// preference (rendezvous hashing of its identity) that is up, fails over down
// the order while one is down, and returns when it answers again. Before a
// batch is first sent, it is pinned to that collector (durably, in the
// spool): an attempt whose outcome is unknown is only ever retried there.
// A batch is placed elsewhere only when it never left: the connection to its
// collector could not be made.
//
// Thread-safe: Seal(), Flush() and stats() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/ship/collectors.h"
#include "common/result.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::ship {

struct TlsFiles {
  std::string ca;    // PEM: the CA that signed the collector's certificate
  std::string cert;  // PEM: this agent's certificate (its identity = subject CN)
  std::string key;   // PEM: its private key
};

struct ShipperOptions {
  // HOST:PORT each (collectors.h: a name with several addresses is one
  // collector per address).
  std::vector<std::string> collectors;
  // Resolves the collectors' host names (tests pass their own; empty: getaddrinfo).
  Resolver resolver;
  // The key of the agent's place among the collectors. Empty: the TLS
  // certificate's subject CN (the identity the collector knows it by), or
  // with `insecure` the agent instance.
  std::string identity;
  std::string state_dir;  // holds the instance id, the next sequence and spool/
  uint64_t spool_max_bytes = 64ull << 20;
  bool insecure = false;  // plaintext; otherwise all of `tls` is required
  TlsFiles tls;
  // How often the TLS files are read again: a replaced certificate, key or
  // CA is used for the connections made after it (rotation without a restart).
  unsigned tls_reload_seconds = 10;
  std::chrono::milliseconds rpc_timeout{10000};
  // How long a connection to a collector may take before the collector is
  // passed over for this attempt (the batch never left: not pinned).
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds backoff_min{500};
  std::chrono::milliseconds backoff_max{30000};
  // At most this many files are kept in spool/corrupt/ (oldest removed first).
  uint32_t max_quarantined = 32;
};

struct ShipperStats {
  uint64_t sealed = 0;           // batches sealed since start
  uint64_t accepted = 0;         // answered ACCEPTED
  uint64_t duplicates = 0;       // answered DUPLICATE
  uint64_t rejected = 0;         // INVALID_ARGUMENT or over the collector's size limit: dropped, logged
  uint64_t spool_dropped = 0;    // dropped: the spool over its bound, or its disk full (oldest first)
  uint64_t unpersisted = 0;      // windows Seal() could not write even with the spool emptied: lost
  uint64_t send_errors = 0;      // failed attempts that will be retried
  uint64_t spooled_batches = 0;  // waiting now
  uint64_t spooled_bytes = 0;
  uint64_t quarantined = 0;     // spool files that did not parse, moved to spool/corrupt/
  uint64_t next_sequence = 0;   // the sequence the next Seal() assigns
  uint64_t pinned_batches = 0;  // waiting now for the collector they were sent to (of spooled_batches)
  uint64_t failovers = 0;       // times the collector taking new batches changed (away, and back)
  std::string collector = {};   // the collector that took the last new batch (empty: none yet)
  double last_success_unix_seconds = 0;
};

class Shipper {
 public:
  // Loads or creates the state directory (instance id, next sequence, spool),
  // checks the TLS files, and starts the sender thread. Batches left in the
  // spool by an earlier run are shipped first.
  static Result<std::unique_ptr<Shipper>> Start(const ShipperOptions& options);
  virtual ~Shipper() = default;  // stops the sender thread; the spool stays

  // Assigns agent_instance and the next sequence to `report`, fills
  // agent.spooled_batches and agent.spool_dropped_batches, and writes it to
  // the spool. Touches only the disk, never the network. Returns the sequence.
  // A full disk (ENOSPC, EDQUOT) drops the oldest spooled batches, one at a
  // time, until the write fits (counted in spool_dropped): the newest data is
  // worth most. If it does not fit with nothing left to drop, the window is
  // lost and counted in `unpersisted`; Seal() never blocks on the disk.
  virtual Result<uint64_t> Seal(v1::AgentReport report) = 0;
  // Waits until the spool is empty or `timeout` passed; true when empty. Cuts
  // a retry backoff short once (one immediate attempt), e.g. at shutdown.
  virtual bool Flush(std::chrono::milliseconds timeout) = 0;
  virtual ShipperStats stats() const = 0;
};

}  // namespace tlsprof::ship
