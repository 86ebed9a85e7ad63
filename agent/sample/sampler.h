// Sampler: the perf_event CPU sampler (bpf/profile.bpf.c) wrapped in an RAII
// class. One software cpu-clock event per online CPU, aggregated in the kernel.
//
// Lifecycle: Start() opens the skeleton, sets rodata, loads, opens the per-CPU
// events and attaches; the destructor detaches and destroys everything.
// Not thread-safe: one thread owns a Sampler.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "agent/common/result.h"
#include "bpf/profile.h"

namespace tlsprof::sample {

struct SamplerOptions {
  uint32_t frequency_hz = 999;
  // Empty: the whole host. Otherwise only these processes (tgids) get
  // samples_by_ip / samples_by_pid entries; totals still count every sample.
  std::vector<pid_t> target_pids;
};

struct Totals {
  uint64_t samples = 0;
  uint64_t idle = 0;
  uint64_t kernel = 0;
  uint64_t user = 0;
  uint64_t dropped_ip = 0;
  uint64_t dropped_pid = 0;
};

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
  Totals ReadTotals() const;
  // The same, per CPU (indexed by CPU number, over the possible CPUs).
  std::vector<Totals> ReadTotalsPerCpu() const;
  BpfRunStats ReadBpfStats() const;

  // Stops sampling (detaches the per-CPU events) but keeps the maps readable.
  void Stop();

 private:
  struct Impl;
  explicit Sampler(std::unique_ptr<Impl> impl, uint64_t period_ns);
  std::unique_ptr<Impl> impl_;
  uint64_t period_ns_;
};

}  // namespace tlsprof::sample
