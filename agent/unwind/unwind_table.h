// Unwind tables: DWARF CFI (.eh_frame, .debug_frame) of one ELF file turned
// into the compact rows of bpf/unwind.h, which the BPF unwinder walks.
//
// Built once per file (per build-id): libdw walks the CIE and FDE entries
// (dwarf_next_cfi), our own interpreter runs each CFA program once
// (unwind_table.cc says why), so the cost is linear in the size of the CFI,
// and the rows are capped per FDE and per file (guard::kMaxRowsPerFde,
// guard::kMaxRowsPerImage). Immutable after Build(); thread-safe to read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "bpf/unwind.h"
#include "common/result.h"

namespace tlsprof::unwind {

struct UnwindTable {
  std::vector<unwind_row> rows;  // sorted by pc; ranges without CFI are CFA_NONE rows
  // Statistics for the report and the tests.
  uint64_t fdes = 0;
  uint64_t unsupported_rows = 0;                 // CFA rules we do not model (became CFA_NONE)
  uint64_t cfi_rows = 0;                         // rows the CFI describes, before merging identical neighbours
  uint64_t covered_bytes = 0;                    // code bytes inside some FDE
  uint64_t unsupported_bytes = 0;                // of those, bytes whose rule became CFA_NONE
  uint64_t cfi_errors = 0;                       // FDEs/CIEs/expressions we could not decode (skipped)
  uint64_t overlapping_fdes = 0;                 // FDEs overlapping an earlier one of their section
  uint64_t kind_rows[UNWIND_CFA_NR_KINDS] = {};  // final rows per enum unwind_cfa_kind
  uint64_t gap_cfi_rows = 0;                     // Go tables: CFI rows taken for code outside Go functions (cgo)
  uint64_t cfi_instructions = 0;                 // CFA instructions interpreted (CIEs once, FDEs once)
  uint64_t cut_fdes = 0;                         // FDEs cut at guard::kMaxRowsPerFde (their rest is CFA_NONE)
  // CFI left out at a per-file cap: rows (or FDEs) past guard::kMaxRowsPerImage
  // (CFA_NONE), or a CFI section, or the section name table that finds them,
  // over guard::kMaxSectionBytes (not read; refused, reason section_size).
  bool cut_at_image_cap = false;
};

// Reads the CFI of the ELF file `elf` (opened by guard::ElfFile;
// executable segments only).
// Rows come from .eh_frame, and from .debug_frame where .eh_frame has no FDE.
// CFA = other GPR + off becomes a CFA_REG row. Rules we cannot express
// (other CFA expressions, return address not at CFA-8, e.g. signal
// trampolines) become CFA_NONE rows and
// are counted in unsupported_rows. Code above 4 GiB (ELF vaddr) gives an
// Error. Thread-safe (each call has its own libelf handle).
// A file without CFI gives an empty table, not an error; a file that is not
// x86-64 ELF gives an Error; CFI entries that do not decode are skipped and
// counted in cfi_errors. Never crashes on bad input, also when the file is
// truncated while it is read (it is read with pread, never mapped). Caps,
// each refusal counted (guard::Refuse): an FDE's rows past kMaxRowsPerFde and
// the file's past kMaxRowsPerImage become CFA_NONE (reason cfi_rows); a CFI
// section over kMaxSectionBytes, or a compressed one that claims to inflate
// past it, is left out (section_size) without being read or inflated, as are
// the CFI sections of a file whose section name table is over it (they
// cannot be found); either sets cut_at_image_cap.
Result<std::shared_ptr<const UnwindTable>> BuildUnwindTable(const guard::ElfFile& elf, std::string_view display_path);
// The same for a file open at `fd` (tests and tools), opened again through
// the guard (guard::OpenHostFile of /proc/self/fd/N).
Result<std::shared_ptr<const UnwindTable>> BuildUnwindTable(int fd, std::string_view display_path);

// Rows for a Go binary from its pclntab (agent/unwind/go_table.cc): CFA =
// RSP + pcsp delta + 8 at every PC, the caller's RBP from the slot Go's
// prologue saves it in (CFA - 16) once it is there; runtime.systemstack,
// runtime.morestack and runtime.asmcgocall, which switch to the g0 stack,
// are crossed by frame pointer (CFA_RBP), and runtime.goexit/mstart/rt0_go/mcall end the stack
// (CFA_END). Code outside every Go function (C linked in by cgo) gets the
// file's CFI rows, else the frame-pointer rule (CFA_RBP + 16). Works on
// stripped binaries (no .symtab, no .debug_frame); an Error when the file
// has no pclntab, or when its pcsp tables describe more than
// guard::kMaxRowsPerImage rows (refused, reason pclntab_rows: the caller
// falls back to frame pointers, which Go keeps). Thread-safe.
Result<std::shared_ptr<const UnwindTable>> BuildGoUnwindTable(const guard::ElfFile& elf, std::string_view display_path);
Result<std::shared_ptr<const UnwindTable>> BuildGoUnwindTable(int fd, std::string_view display_path);

// Finds the row that applies at `vaddr`; nullptr if before the first row.
const unwind_row* FindRow(const UnwindTable& table, uint64_t vaddr);

// The reference unwinder: the same algorithm as the BPF program, in C++, so
// tests can check tables against real stacks and the BPF code against it.
struct Registers {
  uint64_t ip = 0;
  uint64_t sp = 0;
  uint64_t bp = 0;
  // All 16 GPRs of the sample, by x86-64 DWARF number (0 rax, 1 rdx, 2 rcx,
  // 3 rbx, 4 rsi, 5 rdi, 6 rbp, 7 rsp, 8-15 r8-r15); only CFA_REG rows read
  // them, and only at the first frames. gpr[6]/gpr[7] are unused (bp, sp).
  uint64_t gpr[16] = {};
};
// Reads 8 bytes of the unwound process's memory at addr; false if unreadable.
using ReadWord = bool (*)(void* ctx, uint64_t addr, uint64_t* out);
struct MappedTable {
  uint64_t start = 0, end = 0, bias = 0;
  const UnwindTable* table = nullptr;  // null: frame pointers only
};
// Returns the return addresses, leaf first (the leaf ip itself first).
//
// The algorithm the BPF unwinder must match, per frame:
//  - stop if ip == 0; record ip; stop when max_frames are recorded;
//  - look up ip for frame 0, ip - 1 for later frames (a return address points
//    after the call, possibly into the next function or FDE); stop if no
//    mapping holds it;
//  - mapping without table (null or 0 rows, i.e. table_len 0): frame
//    pointers: ra = *(bp + 8), sp' = bp + 16, bp' = *bp (stop if bp unknown);
//  - else the row at (lookup ip - bias): CFA_RSP: cfa = sp + off; CFA_RBP:
//    cfa = bp + off (stop if bp unknown); CFA_RSP_DEREF: cfa = *(sp + off) +
//    deref_add; CFA_PLT: cfa = sp + 8 + ((ip & 15) >= 11 ? 8 : 0);
//    CFA_REG: cfa = sample's gpr[reg] + off, only at frame 0, or frame 1 when
//    frame 0 was in the same mapping; stop (kRegUnknown) elsewhere or unless
//    sp < cfa <= sp + UNWIND_CFA_REG_MAX_DIST and cfa is 8-aligned;
//    CFA_RSP_REG_DEREF: cfa = *(sp + off + gpr[reg] * 8) + deref_add, with
//    CFA_REG's frame and plausibility rules;
//    CFA_END, CFA_NONE, no row: stop;
//    ra = *(cfa - 8); RBP_AT_CFA: bp' = *(cfa + rbp_off); RBP_LOST: bp
//    unknown from here on; sp' = cfa;
//  - stop on any unreadable word, and unless sp' > sp (the stack must grow).
std::vector<uint64_t> Unwind(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                             size_t max_frames = TLSPROF_UNWIND_MAX_FRAMES);

// Why a walk ended; the BPF side keeps the same reasons as counters.
enum class UnwindStop {
  kZeroIp,      // return address 0 (some runtimes end their stacks this way)
  kMaxFrames,   // max_frames recorded
  kNoMapping,   // ip in no known mapping (JIT code, vdso, unknown file)
  kNoRow,       // before the first row of the table
  kEnd,         // CFA_END: the outermost frame, a complete stack
  kNoCfi,       // CFA_NONE: a gap between FDEs or a rule we do not model
  kBpUnknown,   // CFA_RBP or frame-pointer walk after RBP was lost
  kUnreadable,  // a word could not be read
  kNotGrowing,  // the new SP is not above the old one
  kRegUnknown,  // CFA_REG beyond the frames where the register is known, or an implausible CFA
};
struct UnwindResult {
  std::vector<uint64_t> frames;  // as Unwind() returns them
  UnwindStop stop = UnwindStop::kZeroIp;
};
UnwindResult UnwindWithReason(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                              size_t max_frames = TLSPROF_UNWIND_MAX_FRAMES);

}  // namespace tlsprof::unwind
