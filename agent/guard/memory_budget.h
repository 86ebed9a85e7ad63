// MemoryBudget: the agent's memory cap (`tlsprof-agent run --memory-limit`,
// docs/fleet.md, "Memory").
//
// The agent's memory is a fixed base (code, libraries, BPF skeleton,
// threads), the window machinery (bounded by the BPF maps' sizes,
// sample::WindowMemoryBound) and what it loads per file: symbol tables
// (discovery::ProcessRegistry) and unwind tables while they are built
// (stacks::UnwindRegistrar). Only the last grows with the host, so that is
// what the budget admits: before reading a file's data, the loader asks
// Admit() with what the load reads and keeps at its peak, computed from the
// file's own headers (the sizes of the sections it will read; see
// symbols::LoadBinaryImage and unwind::BuildUnwindTable), for every file,
// TLS libraries too: a file's name proves nothing. Admit() says yes while the
// resident memory now, plus that estimate, plus the window reserve stays
// under the limit. A refused load is skipped (that file then gets no names or
// no unwind table: less precise attribution, never a crash), counted per
// kind and as a refusal (guard::Reason::kMemory), and the first refusal of
// each kind is logged as a warning.
// Thread-safe: loads may run on a guard::DeadlineWorker's thread.
#pragma once

#include <malloc.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string_view>

#include "agent/guard/limits.h"

namespace tlsprof::guard {

class MemoryBudget {
 public:
  enum Kind { kImage = 0, kUnwindTable = 1, kNrKinds };

  // limit_bytes 0: no limit (Admit() always says yes, nothing is measured).
  explicit MemoryBudget(uint64_t limit_bytes = 0, uint64_t reserve_bytes = 0)
      : limit_(limit_bytes), reserve_(reserve_bytes) {}

  uint64_t limit_bytes() const { return limit_; }
  uint64_t reserve_bytes() const { return reserve_; }
  bool limited() const { return limit_ != 0; }

  // Whether a load that needs about `cost` bytes at its peak fits now. When it
  // does not, freed heap is first handed back to the kernel (malloc_trim) and
  // the resident size read again. Over the cap, under exec churn, every new
  // process asks again: the trim (it walks the whole heap) runs at most once
  // per kTrimInterval, the other refusals only read /proc/self/statm.
  static constexpr std::chrono::seconds kTrimInterval{10};
  bool Admit(uint64_t cost) {
    if (!limited()) return true;
    if (Fits(ResidentBytes(), cost)) return true;
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (trimmed_ != std::chrono::steady_clock::time_point{} && now - trimmed_ < kTrimInterval) return false;
    trimmed_ = now;
    malloc_trim(0);
    return Fits(ResidentBytes(), cost);
  }

  // Counts a load that Admit() refused; the first of each kind is logged.
  void Skipped(Kind kind, std::string_view what, uint64_t cost) {
    Refuse(Reason::kMemory, what,
           fmt::format("{} needs ~{} MiB, over the memory limit of {} MiB", kind == kImage ? "symbols" : "unwind table",
                       cost >> 20, limit_ >> 20));
    if (skipped_[kind].fetch_add(1) == 0) {
      spdlog::warn(
          "memory limit: {} MiB resident, limit {} MiB ({} MiB kept for the window): not loading the {} of {} "
          "(~{} MiB); {} are counted in tlsprof_agent_memory_limited_total and logged once",
          ResidentBytes() >> 20, limit_ >> 20, reserve_ >> 20, kind == kImage ? "symbols" : "unwind table", what,
          cost >> 20, kind == kImage ? "files left unnamed" : "unwind tables left out");
    }
  }
  uint64_t skipped(Kind kind) const { return skipped_[kind].load(); }

  // After a load of a file of `file_bytes`, when limited: a large load (at
  // least kTrimAfterBytes) hands freed heap back to the kernel, so that the
  // resident size follows what is kept, not the load's peak. Small loads do
  // not pay for a trim (it walks the whole heap); what they free is reused.
  static constexpr uint64_t kTrimAfterBytes = 4ull << 20;
  void AfterLoad(uint64_t file_bytes) const {
    if (limited() && file_bytes >= kTrimAfterBytes) malloc_trim(0);
  }

  // This process's resident memory now (/proc/self/statm), in bytes.
  static uint64_t ResidentBytes() {
    std::ifstream statm("/proc/self/statm");  // guarded-io: the agent's own
    uint64_t size = 0, resident = 0;
    statm >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }

 private:
  bool Fits(uint64_t resident, uint64_t cost) const { return resident + cost + reserve_ <= limit_; }

  uint64_t limit_;
  uint64_t reserve_;
  std::mutex mu_;                                    // guards trimmed_
  std::chrono::steady_clock::time_point trimmed_{};  // the last trim Admit() made
  std::array<std::atomic<uint64_t>, kNrKinds> skipped_{};
};

}  // namespace tlsprof::guard
