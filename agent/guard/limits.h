// The bounds on what one file or process that another tenant controls may
// cost the agent, and the count of what they refused or cut.
//
// Every input that a process on the host shapes (its /proc/PID/maps, the ELF
// files it maps, the debug files and archives found next to them) has a cap
// here. Work that reaches a cap is refused (the image, table or file is left
// out: that process's samples are named less precisely) or cut (the part past
// the cap is left out), never done anyway. Each refusal is counted under its
// reason (tlsprof_agent_images_refused_total{reason}) and logged, at most one
// line per reason per kLogInterval, so a tenant that repeats an attack cannot
// flood the log. The processes around it are still profiled.
//
// Thread-safe: the counters are atomics; the log's rate limit is locked.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace tlsprof::guard {

// Caps. Each is far above what real binaries need (a comment names the
// largest seen), so that only crafted or broken input reaches it.
// A mapped, debug or archive file larger than this is not read at all. (A
// sparse file costs nothing to make at any size: the caps below are what
// bound the work, this one only rejects absurd files early.)
inline constexpr uint64_t kMaxFileBytes = 8ull << 30;
// One section (or a program header's range) read into memory; node's
// .strtab, the largest of a binary the tests use, is 7.5 MiB.
inline constexpr uint64_t kMaxSectionBytes = 128ull << 20;
// What SectionBytes reads of one image in all (its sections stay in memory
// while the image is open): a file of many sections each under
// kMaxSectionBytes, or of many sections of the name a reader wants, is
// refused past it instead of costing sections × kMaxSectionBytes.
inline constexpr uint64_t kMaxImageSectionBytes = 512ull << 20;
// Entries of one .symtab or .dynsym (node: 110k; a debug build of Chromium
// about 1.5M).
inline constexpr uint64_t kMaxSymbols = 2'000'000;
// Section and program headers of one ELF file (linked binaries have tens;
// -ffunction-sections objects in static archives a few thousand). libelf
// allocates a descriptor of about 200 bytes per claimed section up front.
inline constexpr uint64_t kMaxSections = 16'384;
inline constexpr uint64_t kMaxProgramHeaders = 1'024;
// Notes scanned for a build-id, per note segment or section.
inline constexpr uint64_t kMaxNoteBytes = 64ull << 10;
// Unwind rows of one FDE (hand-written assembly reaches a few hundred) and of
// one file (node: 372k; the BPF row array holds 2M).
inline constexpr uint64_t kMaxRowsPerFde = 65'536;
inline constexpr uint64_t kMaxRowsPerImage = 1'000'000;
// /proc/PID/maps: bytes read (65,530 mappings, the default vm.max_map_count,
// print as about 7 MiB with long paths) and executable file mappings kept.
inline constexpr uint64_t kMaxMapsBytes = 16ull << 20;
inline constexpr uint64_t kMaxExecMappings = 4'096;
// Small /proc files (comm, stat, status, cgroup).
inline constexpr uint64_t kMaxProcFileBytes = 64ull << 10;

// Why something was refused or cut. The names are the metric's label values
// (docs/fleet.md, "Hostile input").
enum class Reason : uint8_t {
  kNotRegular,   // a FIFO, device, socket or directory where a file was expected
  kReplaced,     // the path names another file than the one mapped (st_dev, st_ino)
  kFileSize,     // a file over kMaxFileBytes
  kElfHeaders,   // more section or program headers than kMaxSections/kMaxProgramHeaders
  kSectionSize,  // a section (or what a compressed one inflates to) over kMaxSectionBytes
  kSymbols,      // a symbol table over kMaxSymbols
  kCfiRows,      // an FDE over kMaxRowsPerFde or a file over kMaxRowsPerImage (cut)
  kPclntabRows,  // a Go unwind table over kMaxRowsPerImage (refused: frame pointers)
  kMaps,         // /proc/PID/maps over kMaxMapsBytes or kMaxExecMappings (cut)
  kMemory,       // the memory budget refused the load (MemoryBudget)
  kDeadline,     // work that did not finish within its deadline
  kShortRead,    // the file shrank while it was read (truncated)
  kCount
};
inline constexpr size_t kReasonCount = static_cast<size_t>(Reason::kCount);

// "not_regular", "replaced", "file_size", "elf_headers", "section_size",
// "symbols", "cfi_rows", "pclntab_rows", "maps", "memory", "deadline",
// "short_read".
std::string_view ReasonName(Reason reason);

// Counts one refusal and logs it (warning level, rate-limited per reason):
// `what` names the input (a path, "process 123"), `detail` says what was over
// which cap.
void Refuse(Reason reason, std::string_view what, std::string_view detail);

// Refusals counted since the process started, by reason.
std::array<uint64_t, kReasonCount> RefusalCounts();

inline constexpr std::chrono::seconds kLogInterval{60};

}  // namespace tlsprof::guard
