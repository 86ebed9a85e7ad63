// .eh_frame / .debug_frame CFI (agent/unwind): BuildUnwindTable reads an ELF
// file's FDEs with our own walker (agent/symbols/eh_frame.h) and interprets
// their CFA programs with its own interpreter, turning the rules into the
// rows the BPF unwinder walks; BuildGoUnwindTable does the same from a Go
// binary's pclntab and code. Then the reference unwinder runs on each table
// against a fake stack made of the input's bytes, as the BPF program would on
// a sample.
//
// Differential: where both decode the CFI without error, the table must be
// the reference builder's (libdw's interpreter, reference_table.h), row for
// row. Where either reports malformed CFI (cfi_errors) they may differ: libdw
// reads on past a truncated operand, we stop the FDE. The reference is not
// bounded (an FDE of N rows costs it N^2, a register number in the hundreds
// of millions makes it allocate a rule for each register below), so a
// timeout or out-of-memory inside BuildReferenceUnwindTable is libdw's, not
// a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "agent/unwind/reference_table.h"
#include "agent/unwind/unwind_table.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Stack {
  const uint8_t* data;
  size_t size;
  uint64_t base;  // address of data[0]
};

bool ReadStack(void* ctx, uint64_t addr, uint64_t* out) {
  const Stack& s = *static_cast<const Stack*>(ctx);
  if (addr < s.base || addr - s.base > s.size || s.size - (addr - s.base) < 8) return false;
  std::memcpy(out, s.data + (addr - s.base), 8);
  return true;
}

// The rows must be what bpf/unwind.h's binary search expects: sorted by pc.
void CheckRows(const tlsprof::unwind::UnwindTable& t) {
  for (size_t i = 1; i < t.rows.size(); ++i) {
    if (t.rows[i].pc < t.rows[i - 1].pc) __builtin_trap();
  }
}

void Exercise(const tlsprof::unwind::UnwindTable& t, const uint8_t* data, size_t size) {
  using namespace tlsprof::unwind;
  CheckRows(t);
  for (const unwind_row& row : t.rows) {
    if (FindRow(t, row.pc) == nullptr) __builtin_trap();
  }
  if (t.rows.empty()) return;
  // One walk starting at each of the first rows, on a stack whose words are
  // the input's bytes (so that the fuzzer steers the return addresses too).
  const uint64_t bias = 0x10000000;
  Stack stack{data, size, 0x7ff000000000};
  std::vector<MappedTable> maps = {{bias + t.rows.front().pc, bias + t.rows.back().pc + 1, bias, &t}};
  for (size_t i = 0; i < t.rows.size() && i < 8; ++i) {
    Registers regs;
    regs.ip = bias + t.rows[i].pc;
    regs.sp = stack.base;
    regs.bp = stack.base + 64;
    for (int r = 0; r < 16; ++r) regs.gpr[r] = stack.base + 8 * static_cast<uint64_t>(r);
    (void)UnwindWithReason(maps, regs, ReadStack, &stack, 32);
  }
}

// Traps unless the agent's table is the reference's where neither saw
// malformed CFI, no cap cut rows (the reference has none) and the FDEs of a
// section do not overlap (libdw looks the FDE up by address, so for an
// address two FDEs cover it may run the other one's program).
void CompareWithReference(const tlsprof::unwind::UnwindTable& t, int fd) {
  using namespace tlsprof::unwind;
  if (t.cfi_errors != 0 || t.cut_fdes != 0 || t.cut_at_image_cap || t.overlapping_fdes != 0) return;
  auto built = BuildReferenceUnwindTable(fd, "fuzz.elf");
  if (!built.ok() || (*built)->cfi_errors != 0) return;
  const UnwindTable& r = **built;
  if (r.fdes != t.fdes || r.cfi_rows != t.cfi_rows || r.unsupported_rows != t.unsupported_rows ||
      r.covered_bytes != t.covered_bytes || r.unsupported_bytes != t.unsupported_bytes ||
      r.rows.size() != t.rows.size()) {
    __builtin_trap();
  }
  for (size_t i = 0; i < t.rows.size(); ++i) {
    if (std::memcmp(&r.rows[i], &t.rows[i], sizeof(unwind_row)) != 0) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::unwind;
  tlsprof::UniqueFd fd = tlsprof::fuzz::MemFile(data, size);
  if (auto table = BuildUnwindTable(fd.get(), "fuzz.elf")) {
    Exercise(**table, data, size);
    CompareWithReference(**table, fd.get());
  }
  if (auto table = BuildGoUnwindTable(fd.get(), "fuzz.elf")) Exercise(**table, data, size);
  return 0;
}
