#include "agent/guard/limits.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>

namespace tlsprof::guard {
namespace {

struct Counters {
  std::array<std::atomic<uint64_t>, kReasonCount> refused{};
  std::mutex log_mu;
  std::array<std::chrono::steady_clock::time_point, kReasonCount> logged{};  // last line per reason
  std::array<uint64_t, kReasonCount> unlogged{};                             // refusals since that line
};

Counters& Global() {
  static Counters* counters = new Counters;  // never destroyed: counted until exit
  return *counters;
}

}  // namespace

std::string_view ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kNotRegular:
      return "not_regular";
    case Reason::kReplaced:
      return "replaced";
    case Reason::kFileSize:
      return "file_size";
    case Reason::kElfHeaders:
      return "elf_headers";
    case Reason::kSectionSize:
      return "section_size";
    case Reason::kSymbols:
      return "symbols";
    case Reason::kCfiRows:
      return "cfi_rows";
    case Reason::kPclntabRows:
      return "pclntab_rows";
    case Reason::kMaps:
      return "maps";
    case Reason::kMemory:
      return "memory";
    case Reason::kDeadline:
      return "deadline";
    case Reason::kShortRead:
      return "short_read";
    case Reason::kCount:
      break;
  }
  return "unknown";
}

void Refuse(Reason reason, std::string_view what, std::string_view detail) {
  const auto i = static_cast<size_t>(reason);
  if (i >= kReasonCount) return;
  Counters& c = Global();
  c.refused[i].fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(c.log_mu);
  if (c.logged[i] != std::chrono::steady_clock::time_point{} && now - c.logged[i] < kLogInterval) {
    ++c.unlogged[i];
    return;
  }
  const uint64_t more = std::exchange(c.unlogged[i], 0);
  c.logged[i] = now;
  if (more == 0) {
    spdlog::warn("refused ({}): {}: {}", ReasonName(reason), what, detail);
  } else {
    spdlog::warn("refused ({}): {}: {} ({} more since the last line; tlsprof_agent_images_refused_total counts them)",
                 ReasonName(reason), what, detail, more);
  }
}

std::array<uint64_t, kReasonCount> RefusalCounts() {
  std::array<uint64_t, kReasonCount> out{};
  Counters& c = Global();
  for (size_t i = 0; i < kReasonCount; ++i) out[i] = c.refused[i].load(std::memory_order_relaxed);
  return out;
}

}  // namespace tlsprof::guard
