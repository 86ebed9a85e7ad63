// Sampler: the perf_event CPU sampler (bpf/sampler.bpf.c) wrapped in an RAII
// class. One software cpu-clock event per online CPU, aggregated in the kernel.
//
// Lifecycle: Start() opens the skeleton, sets rodata, loads, opens the per-CPU
// events and attaches; the destructor detaches and destroys everything.
// Not thread-safe: one thread owns a Sampler.
//
// Stack unwinding (bpf/unwind.h): user samples of the processes registered
// with SetProcess() are unwound in the kernel from the rows uploaded with
// UploadRows() (or frame pointers) and counted per stack (ForEachStack) when
// the stack touches a TLS mapping. Rows live in one global array. Its
// allocator is append-only: AllocateRows() hands out the next free range and
// never reuses or moves one, so user space uploads each table once per
// build-id and lets every process mapping that file point at the same range.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "bpf/sampler.h"
#include "bpf/unwind.h"
#include "common/result.h"

namespace tlsprof::sample {

struct SamplerOptions {
  uint32_t frequency_hz = 999;
  // Empty: the whole host. Otherwise only these processes (tgids) get
  // samples_by_ip / samples_by_pid entries; totals still count every sample.
  std::vector<pid_t> target_pids;
  // Sizes of the in-kernel aggregates (bpf_map__set_max_entries before load);
  // 0 keeps the defaults of bpf/sampler.h and bpf/unwind.h. Past them new keys
  // are counted as dropped (Totals::dropped_*), never fatal. Smaller maps bound
  // the agent's memory per window (docs/fleet.md, "Memory").
  uint32_t max_sample_keys = 0;  // samples_by_ip (TLSPROF_MAX_SAMPLE_KEYS)
  uint32_t max_stack_keys = 0;   // samples_by_stack (TLSPROF_MAX_STACK_KEYS)
  uint32_t max_pids = 0;         // samples_by_pid (TLSPROF_MAX_PIDS)
};

// The most user-space memory one ReadWindow() may hold for maps of these
// sizes: the values read and the baselines (sample/map_window.h) of every
// key, with the hash tables' overhead. The agent's memory budget keeps this
// much aside (profiler::Profiler).
uint64_t WindowMemoryBound(uint32_t max_pids, uint32_t max_sample_keys, uint32_t max_stack_keys);

// The program's totals (the TOTAL_* slots of bpf/sampler.h).
struct Totals {
  uint64_t samples = 0;
  uint64_t idle = 0;         // the idle task (pid 0) was on CPU
  uint64_t kernel = 0;       // a task was in kernel mode
  uint64_t user = 0;         // a task was in user mode
  uint64_t dropped_ip = 0;   // samples_by_ip was full: the sample is in the pid counts only
  uint64_t dropped_pid = 0;  // samples_by_pid was full
  // Stack unwinding (see the TOTAL_* slots in bpf/sampler.h).
  uint64_t unwound = 0;         // samples counted in samples_by_stack
  uint64_t dropped_stack = 0;   // samples_by_stack was full
  uint64_t unwind_not_tls = 0;  // registered process, but no TLS frame in the first walk
  struct UnwindStops {
    uint64_t zero_ip = 0;  // complete stacks
    uint64_t end = 0;      // complete stacks (CFA_END)
    uint64_t max_frames = 0;
    uint64_t no_mapping = 0;
    uint64_t no_row = 0;
    uint64_t cfa_none = 0;
    uint64_t bp_unknown = 0;
    uint64_t unreadable = 0;
    uint64_t not_growing = 0;
    uint64_t reg_unknown = 0;  // CFA_REG row where the register is not known
  } unwind_stop;               // why each unwound stack ended (sum == unwound)
  // The unwinder's own cost: walks started (TLS or not), frames they visited,
  // and their time in the kernel (ns, by bpf_ktime_get_ns).
  uint64_t unwind_walks = 0;
  uint64_t unwind_frames = 0;
  uint64_t unwind_ns = 0;
  uint64_t unwind_row_searches = 0;  // row lookups the per-CPU row cache did not answer
};

// One window of samples: what the in-kernel aggregates gained since the
// previous Sampler::ReadWindow() (or ClearCounts()). Consecutive windows add
// up to one long read: no sample is lost between two windows or counted in
// both (agent/sample/map_window.h says how).
struct WindowCounts {
  std::vector<std::pair<uint32_t, pid_counts>> pids;
  std::vector<std::pair<sample_key, uint64_t>> ips;
  std::vector<std::pair<stack_key, uint64_t>> stacks;
  Totals totals;
  // tgids whose samples_by_pid entry went because they had no sample for a
  // whole window (exited, or idle): the caller may forget them too.
  std::vector<uint32_t> idle_pids;
};

// Field by field.
Totals& operator+=(Totals& a, const Totals& b);

struct BpfRunStats {
  uint64_t run_time_ns = 0;  // from the kernel's BPF stats (BPF_STATS_RUN_TIME)
  uint64_t run_count = 0;
  bool enabled = false;  // false if the kernel refused to enable stats
};

class Sampler {
 public:
  static Result<std::unique_ptr<Sampler>> Start(const SamplerOptions& options);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  uint64_t period_ns() const { return period_ns_; }  // CPU time one sample stands for
  int cpu_count() const;

  // Walk the in-kernel aggregates without clearing them. While sampling runs
  // the walk is not a snapshot: entries added meanwhile may or may not be seen.
  void ForEachPid(const std::function<void(uint32_t tgid, const pid_counts&)>& fn) const;
  void ForEachIp(const std::function<void(const sample_key&, uint64_t count)>& fn) const;
  // Each tgid that got a samples_by_pid entry since the previous call, at
  // least once (also a tgid whose idle entry ReadWindow evicted, when it is
  // sampled again). Reads the BPF ring of new tgids: no system call while no
  // process is new. When the ring overflowed, walks the pid map instead
  // (new_pid_walks() counts those walks).
  void ForEachNewPid(const std::function<void(uint32_t tgid)>& fn);
  uint64_t new_pid_walks() const { return new_pid_walks_; }
  Totals ReadTotals() const;
  // The same, per CPU (indexed by CPU number, over the possible CPUs).
  std::vector<Totals> ReadTotalsPerCpu() const;
  BpfRunStats ReadBpfStats() const;
  // One read of a map through its fd, as every steady-state step does (map
  // reads, updates and deletes): an error (with errno's text) if the kernel
  // refuses it, e.g. without CAP_BPF on a kernel before 6.5 with
  // kernel.unprivileged_bpf_disabled set. The agent probes this before it
  // drops CAP_BPF (agent/profiler/steady_state.h).
  Status CheckMapAccess() const;

  // --- Stack unwinding ---
  // Rows in the kernel's row array (TLSPROF_UNWIND_MAX_ROWS).
  uint32_t max_rows() const;
  // The aggregates' sizes as loaded (SamplerOptions, or the defaults).
  uint32_t max_pids() const;
  uint32_t max_sample_keys() const;
  uint32_t max_stack_keys() const;
  // Rows handed out so far by AllocateRows().
  uint32_t allocated_rows() const { return next_row_; }
  // Reserves `count` consecutive rows and returns the first; an error when
  // the array is full (the caller then unwinds that file with frame pointers
  // or not at all). Append-only: ranges are never freed or moved.
  Result<uint32_t> AllocateRows(uint32_t count);
  // Writes rows [first_row, first_row + rows.size()) of the array (batched),
  // and the row index entries of the buckets that start among them.
  // The range must lie inside the array; it need not come from AllocateRows.
  Status UploadRows(uint32_t first_row, std::span<const unwind_row> rows);
  // Registers (or replaces) the mappings of a process; from the next sample
  // on its user stacks are unwound. Checks that nr_mappings fits, mappings
  // are sorted and disjoint and tables lie inside the row array.
  Status SetProcess(uint32_t tgid, const unwind_proc& proc);
  // Stops unwinding a process (e.g. it exited); absent tgids are ignored.
  void RemoveProcess(uint32_t tgid);
  // Walks samples_by_stack like ForEachIp (not a snapshot while sampling).
  void ForEachStack(const std::function<void(const stack_key&, uint64_t count)>& fn) const;

  // The samples since the previous ReadWindow() or ClearCounts(), while
  // sampling goes on. The per-instruction and per-stack maps of the window
  // are drained whole (the next window's samples go to the other set, see
  // bpf/sampler.bpf.c); pid keys idle for a whole window are deleted. So the
  // maps hold what a window or two touch, not everything ever seen. Blocks
  // for an RCU grace period (a few ms, no CPU).
  WindowCounts ReadWindow();

  // Stops sampling (detaches the per-CPU events) but keeps the maps readable.
  void Stop();
  // Forgets every count so far (totals, per-pid, per-IP and per-stack
  // aggregates) while sampling goes on: a profile window starts here, after
  // the agent's own set-up (symbol loading, unwind tables), whose samples
  // would otherwise count without being part of the window's duration.
  // Samples taken while it runs may be kept or dropped. ReadWindow() starts
  // over from here.
  void ClearCounts();

 private:
  struct Impl;
  explicit Sampler(std::unique_ptr<Impl> impl, uint64_t period_ns);
  // After every upload: row lookups the BPF program cached before it are stale.
  void BumpRowsGeneration();
  // ring_buffer's callback: hands a record to ForEachNewPid's function.
  static int OnNewTgid(void* ctx, void* data, size_t size);
  struct WindowState;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<WindowState> window_;
  uint64_t period_ns_;
  uint32_t next_row_ = 0;
  uint64_t new_pid_walks_ = 0;
};

}  // namespace tlsprof::sample
