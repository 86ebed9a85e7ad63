// .eh_frame / .debug_frame CFI (agent/unwind): BuildUnwindTable reads an ELF
// file's FDEs with our own walker (agent/symbols/eh_frame.h) and libdw, and
// turns the CFA rules into the rows the BPF unwinder walks;
// BuildGoUnwindTable does the same from a Go binary's pclntab and code.
// Then the reference unwinder runs on each table against a fake stack made of
// the input's bytes, as the BPF program would on a sample.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

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

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::unwind;
  tlsprof::UniqueFd fd = tlsprof::fuzz::MemFile(data, size);
  if (auto table = BuildUnwindTable(fd.get(), "fuzz.elf")) Exercise(**table, data, size);
  if (auto table = BuildGoUnwindTable(fd.get(), "fuzz.elf")) Exercise(**table, data, size);
  return 0;
}
