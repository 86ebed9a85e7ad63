// UnwindRegistrar: tells the BPF unwinder about the processes whose stacks
// matter — those that map a TLS library. For each it uploads (once per file)
// the unwind table of every mapping the unwinder may walk, and writes the
// process's mapping list into the unwind_procs map.
//
// What gets a table:
//   - a shared libssl/libcrypto: its whole table (every address is TLS code);
//   - a binary with a static TLS library (node, static OpenSSL): its whole
//     table too (node: 372k rows, 6 MiB), since the walk from a TLS leaf to
//     the operation entry crosses library functions the rules do not name;
//   - a Go binary: no table, frame pointers;
//   - libc, the main executable and other libraries: their whole table, so a
//     libc leaf called from libcrypto (malloc, memcpy) unwinds into it.
// Not thread-safe: one thread owns it, next to the Sampler it feeds.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/discovery/process_registry.h"
#include "agent/guard/deadline.h"
#include "agent/guard/memory_budget.h"
#include "agent/sample/sampler.h"
#include "agent/unwind/unwind_table.h"
#include "common/result.h"

namespace tlsprof::stacks {

struct RegistrarStats {
  uint64_t processes = 0;          // registered with the unwinder
  uint64_t tables = 0;             // files whose table was uploaded
  uint64_t rows = 0;               // rows uploaded
  uint64_t table_failures = 0;     // files without a usable table (no CFI, unreadable, no room)
  uint64_t mappings_left_out = 0;  // beyond TLSPROF_UNWIND_MAX_MAPPINGS
  // The BPF map unwind_procs refused the process (full: TLSPROF_UNWIND_MAX_PROCS
  // processes registered); its samples are counted leaf-only.
  uint64_t process_failures = 0;
  uint64_t tables_over_budget = 0;  // tables not built: over the memory cap (MemoryBudget)
};

class UnwindRegistrar {
 public:
  // `budget` (may be null: no cap): tables are built only while it admits
  // them (a mapping without one is walked without a table: the walk stops
  // there).
  explicit UnwindRegistrar(sample::Sampler& sampler, std::shared_ptr<guard::MemoryBudget> budget = nullptr)
      : sampler_(sampler), budget_(std::move(budget)) {}

  // Building a table reads the file (which a tenant can make block): it runs
  // on `worker`, waited for up to `wait` (guard/deadline.h). A table still
  // building leaves its mapping without one for now; TakeBuilt() then names
  // the processes to Register() again. Null (the default): built inline.
  void SetDeadlineWorker(guard::DeadlineWorker* worker, std::chrono::milliseconds wait) {
    worker_ = worker;
    wait_ = wait;
  }
  // The processes whose late tables are built since the last call.
  std::vector<pid_t> TakeBuilt();
  // Waits end by `deadline` too (guard::WaitUntil).
  void SetDeadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

  // Registers a process that maps a TLS library (no-op otherwise). A failure
  // for one file or process is logged and skipped; the process then gets
  // leaf-only attribution for what cannot be unwound.
  Status Register(pid_t pid, const discovery::ProcessSnapshot& process);
  // Stops unwinding a process (it exited). Its files' rows stay in the row
  // array, which is append-only (sample::Sampler): a file mapped again by a
  // later process reuses them, but rows of files no process maps any more
  // are not reclaimed, so a host that keeps loading new TLS binaries
  // eventually fills the array (then new files get no table; counted in
  // table_failures).
  void Unregister(pid_t pid);
  const RegistrarStats& stats() const { return stats_; }

 private:
  struct Slot {
    uint32_t first_row = 0;
    uint32_t rows = 0;  // 0: no table
  };
  // A table build, shared with the deadline worker.
  struct TableJob {
    std::shared_ptr<const discovery::ImageInfo> info;
    std::shared_ptr<guard::MemoryBudget> budget;
    std::vector<unwind_row> rows;
    std::string error;
    bool refused = false;  // by the memory budget
    std::atomic<bool> done{false};
  };
  static void BuildRows(TableJob& job);
  Slot TableFor(pid_t pid, const discovery::ProcessSnapshot::ExecMapping& m);
  Slot Upload(const symbols::BinaryImage* key, TableJob& job);

  sample::Sampler& sampler_;
  std::shared_ptr<guard::MemoryBudget> budget_;
  guard::DeadlineWorker* worker_ = nullptr;
  std::chrono::milliseconds wait_{0};
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  struct PendingTable {
    std::shared_ptr<TableJob> job;
    std::set<pid_t> pids;
  };
  std::map<const symbols::BinaryImage*, PendingTable> pending_;
  // Keyed by the image's address; the entry holds the image, so that no other
  // image can be allocated at that address while the entry exists.
  std::map<const symbols::BinaryImage*, std::pair<std::shared_ptr<const symbols::BinaryImage>, Slot>> slots_;
  RegistrarStats stats_;
};

// The rows of a static TLS binary's table, cut at its TLS symbols' bounds,
// with UNWIND_ROW_TLS on the rows inside them. Exposed for tests.
std::vector<unwind_row> FlagTlsRows(const unwind::UnwindTable& table, const symbols::SymbolTable& symbols);

}  // namespace tlsprof::stacks
