// Unwind tables: DWARF CFI (.eh_frame, .debug_frame) of one ELF file turned
// into the compact rows of bpf/unwind.h, which the BPF unwinder walks.
//
// Built once per file (per build-id) with elfutils libdw (dwarf_getcfi_elf,
// dwarf_cfi_addrframe, dwarf_frame_info), so the CFI interpretation is
// elfutils', not ours. Immutable after Build(); thread-safe to read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/common/result.h"
#include "bpf/unwind.h"

namespace tlsprof::unwind {

struct UnwindTable {
  std::vector<unwind_row> rows;  // sorted by pc; ranges without CFI are CFA_NONE rows
  // Statistics for the report and the tests.
  uint64_t fdes = 0;
  uint64_t unsupported_rows = 0;  // CFA rules we do not model (became CFA_NONE)
};

// Reads the CFI of the ELF file behind `fd` (executable sections only).
// A file without CFI gives an empty table, not an error; a malformed one an
// Error. Never crashes on bad input.
Result<std::shared_ptr<const UnwindTable>> BuildUnwindTable(int fd, std::string_view display_path);

// Finds the row that applies at `vaddr`; nullptr if before the first row.
const unwind_row* FindRow(const UnwindTable& table, uint64_t vaddr);

// The reference unwinder: the same algorithm as the BPF program, in C++, so
// tests can check tables against real stacks and the BPF code against it.
struct Registers {
  uint64_t ip = 0;
  uint64_t sp = 0;
  uint64_t bp = 0;
};
// Reads 8 bytes of the unwound process's memory at addr; false if unreadable.
using ReadWord = bool (*)(void* ctx, uint64_t addr, uint64_t* out);
struct MappedTable {
  uint64_t start = 0, end = 0, bias = 0;
  const UnwindTable* table = nullptr;  // null: frame pointers only
};
// Returns the return addresses, leaf first (the leaf ip itself first).
std::vector<uint64_t> Unwind(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                             size_t max_frames = TLSPROF_UNWIND_MAX_FRAMES);

}  // namespace tlsprof::unwind
