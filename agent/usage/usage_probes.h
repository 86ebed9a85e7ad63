// UsageProbes: the usage telemetry's BPF side (bpf/usage.bpf.c) behind an
// RAII class: handshake counts by negotiated parameters and the on-CPU
// latency of signatures, verifications and key exchanges.
//
// Probes are attached per library file, for every process (pid -1): a
// libcrypto mapped by 500 nginx workers is probed once, and a process that
// starts later is covered. A file is known by dev:inode, so a library
// replaced on disk (a new inode) is probed again when a process maps it.
//
// Lifecycle: Start() opens the skeleton, loads it and attaches sched_switch;
// AttachProcess() adds the uprobes of a process's TLS files; the destructor
// detaches and destroys everything. Not thread-safe: one thread owns it.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/guard/guarded_file.h"
#include "bpf/usage.h"
#include "common/result.h"

namespace tlsprof::usage {

// A TLS library file of a process.
struct FileRef {
  // The file itself, opened by the guarded opener (discovery's ImageInfo):
  // planned from and probed through this open file (/proc/self/fd), never
  // through a path that may name another file by then.
  std::shared_ptr<const guard::GuardedFile> file;
  std::string display_path;  // as the process sees it
  uint64_t dev = 0;          // makedev(major, minor) of /proc/PID/maps
  uint64_t inode = 0;
  std::string library;  // classify::LibraryKindName of its TLS library
};

struct AttachedFile {
  std::string path;  // display path
  uint64_t dev = 0;
  uint64_t inode = 0;
  uint16_t lib = 0;                           // the probes' cookie
  std::string library;                        // the family (classify::LibraryKindName): openssl-3, boringssl, go
  std::vector<std::string> functions;         // probed
  std::map<std::string, std::string> fields;  // the layout (probe_plan.h)
};

// `count` is what the probes saw; `estimated` the count over the whole
// window, scaled up for the time the probes were off (the duty cycle,
// UsageBudget): equal while the budget does not bind.
struct HandshakeCount {
  handshake_key key;
  uint64_t count = 0;
  double estimated = 0;
};

struct OperationStats {
  op_key key;
  uint64_t count = 0;
  uint64_t cpu_ns = 0;
  uint64_t wall_ns = 0;
  std::vector<uint64_t> slots;  // USAGE_HIST_SLOTS, on-CPU ns
  double estimated = 0;         // count scaled for the duty cycle (HandshakeCount)
};

// Live TLS connections of one process at the snapshot: handshaken and not
// yet freed (SSL_free) or closed (Go's Conn.Close). A gauge, not a counter.
struct ConnectionCount {
  uint32_t tgid = 0;
  uint16_t lib = 0;
  double estimated = 0;  // exact (a whole number) while the duty cycle is 1
};

// The probes' cost and the duty cycle that keeps it inside the budget, over
// a window (docs/usage.md, "Budget").
struct UsageBudget {
  double duty_cycle = 1.0;          // the share of the window counted (what the weights scale up)
  double attached = 1.0;            // the share the probes were attached (the phases and their grace)
  double relative_error = 0.0;      // of the scaled handshake count (95%), 0 at duty cycle 1
  double probe_cpu_seconds = 0.0;   // the probes' estimated CPU cost in the window
  double budget_cpu_seconds = 0.0;  // what the budget allowed in the window (0: no budget)
  uint64_t toggles = 0;             // attaches and detaches in the window
};

// The duty cycle's cumulative clock at a snapshot (UsageProbes::ReadClock):
// seconds on the monotonic clock, of them with the probes on, what the
// probes cost and what the budget allowed.
struct UsageClock {
  double at = 0;
  double on = 0;
  double counted = 0;           // of them inside the counting gate
  double variance = 0;          // of the weighted handshake count, over the cycles completed
  double pending_variance = 0;  // ... and of the cycle under way, at `at`
  double cost = 0;
  double allowed = 0;
  uint64_t toggles = 0;
  double connections_since = 0;  // the live set started over then (0: at start)
};

// The probes' own accounting (the UTOTAL_* slots of bpf/usage.h).
struct UsageTotals {
  uint64_t hits = 0;             // probe and return-probe runs
  uint64_t handshake_calls = 0;  // SSL_do_handshake calls
  uint64_t handshakes = 0;       // ... that completed a handshake
  uint64_t ops = 0;              // operations timed
  uint64_t nested = 0;           // probed calls inside a timed one (not timed)
  uint64_t dropped_keys = 0;     // a full map refused a new key
  uint64_t read_errors = 0;      // a field's chain could not be read
  uint64_t go_unmatched = 0;     // Go RETs without their entry
  uint64_t go_migrated = 0;      // Go operations that ended on another thread (on-CPU time: the first's)
  uint64_t closes = 0;           // connection-end probe hits
  uint64_t live_full = 0;        // handshaken connections live_connections had no room for
};

// Everything the probes counted up to one moment (the maps are cumulative);
// Subtract() of two gives a window.
struct UsageSnapshot {
  std::vector<HandshakeCount> handshakes;
  std::vector<OperationStats> operations;
  UsageTotals totals;
  std::vector<ConnectionCount> connections;  // at the snapshot's moment
  UsageBudget budget;                        // over the window (Subtract's result)
  UsageClock clock;                          // cumulative, at the snapshot
  bool connections_known = true;             // Subtract: false if the probes paused in the window
};
// `end` minus `start`, key by key; rows with nothing new are left out.
// Connections are `end`'s. The budget is the clocks' difference, and the
// estimates are the counts over its duty cycle.
UsageSnapshot Subtract(const UsageSnapshot& end, const UsageSnapshot& start);

// The value at quantile q (0..1) of a histogram of USAGE_HIST_SLOTS slots:
// the midpoint of the slot that holds it, in ns. 0 for an empty histogram.
double HistogramQuantile(const std::vector<uint64_t>& slots, double q);
// The bounds [lo, hi) of a slot, in ns.
std::pair<uint64_t, uint64_t> SlotBounds(uint32_t slot);

class UsageProbes {
 public:
  // The CPU sampler's stacks go through these probes' uretprobes by the
  // kernel's own record of them (bpf/sampler.bpf.c, hijacked_return).
  static Result<std::unique_ptr<UsageProbes>> Start();
  ~UsageProbes();
  UsageProbes(const UsageProbes&) = delete;
  UsageProbes& operator=(const UsageProbes&) = delete;

  // Attaches the probes of these files (the TLS library files of one
  // process); files already attached are skipped. A file that cannot be
  // read or probed gives an Error naming it; the others are still attached.
  Status AttachProcess(const std::vector<FileRef>& files);

  std::vector<HandshakeCount> ReadHandshakes() const;
  std::vector<OperationStats> ReadOperations() const;
  UsageTotals ReadTotals() const;
  UsageClock ReadClock() const;
  // Live connections by process (ConnectionCount).
  std::vector<ConnectionCount> ReadConnections() const;
  UsageSnapshot Snapshot() const {
    return {ReadHandshakes(), ReadOperations(), ReadTotals(), ReadConnections(), {}, ReadClock(), true};
  }
  // Takes the probes off files rewritten in place since they were planned
  // (same inode, other size or times): the kernel would keep them at the
  // old offsets in the new code. Such a file is planned again when a
  // process is found mapping it. Returns how many. Call it often (Poll).
  size_t CheckFiles();
  // Drops what the probes hold for a process that exited: its live
  // connections (it never freed them) and their sums.
  void ForgetProcess(uint32_t tgid);
  // Keeps the probes' cost under `cpu_seconds_per_second` (of the host's
  // CPUs: 0.5% of 2 CPUs is 0.01) by attaching them only part of the time
  // (duty_cycle.h), from a thread of its own; <= 0: always on. Call it after
  // the capability drop (a thread keeps its creator's capabilities).
  void EnableBudget(double cpu_seconds_per_second);
  double budget() const { return budget_; }  // 0: none
  // What a probed call costs the probed thread, by class (ns), calibrated.
  const std::array<double, INSN_NR>& call_cost_ns() const { return call_cost_ns_; }
  const std::vector<AttachedFile>& files() const { return files_; }
  // The probe pair's own time inside each timed call, by the class of the
  // function's first instruction (enum usage_insn_class), measured at
  // Start() on empty functions of the agent's (p50, ns; 0 if that failed).
  // The BPF programs take it off every latency they record.
  const std::array<double, INSN_NR>& probe_overhead_ns() const { return probe_overhead_ns_; }
  size_t link_count() const;

 private:
  struct Impl;
  explicit UsageProbes(std::unique_ptr<Impl> impl);
  void Calibrate();
  void CalibrateSwitches();
  // A Go binary's probes (go_plan.h): entry and RET uprobes, no uretprobe.
  Status AttachGoFile(const FileRef& ref);
  std::unique_ptr<Impl> impl_;
  std::array<double, INSN_NR> probe_overhead_ns_{};
  std::array<double, INSN_NR> call_cost_ns_{};
  double budget_ = 0;
  std::vector<AttachedFile> files_;
};

}  // namespace tlsprof::usage
