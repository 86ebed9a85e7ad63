// The Go usage plan (agent/usage/go_plan.h) on a binary a container runs:
// PlanGoFile (LoadBinaryImage's .symtab or .gopclntab names, each probed
// function's code read and disassembled for its RETs and its entry probe,
// .go.buildinfo's version, tls.Conn's layout from DWARF or the table), and
// GoConnLayoutFromDwarf alone (libdw on the file, for any input, not only
// one with a probed function); GoBuildInfoVersion on the raw input.
//
// Promises checked: every site belongs to a probed function and lies in the
// file; each probed function has its entry site; a field the layout sets is
// one load of 1 or 2 bytes at a non-negative offset, and the three fields
// have a line in `fields`.
//
// Input: an ELF file (a memfd; sparse and 6 GiB in go_plan_large).
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "agent/guard/elf_file.h"
#include "agent/usage/go_plan.h"
#include "bpf/usage.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void CheckPlan(const tlsprof::usage::GoFilePlan& plan, uint64_t file_size) {
  using namespace tlsprof::usage;
  if (plan.functions.empty() || plan.fields.size() != 3) __builtin_trap();
  for (const GoProbeSite& site : plan.sites) {
    if (std::find(plan.functions.begin(), plan.functions.end(), site.function) == plan.functions.end()) {
      __builtin_trap();
    }
    if (site.file_offset >= file_size) __builtin_trap();
  }
  for (const std::string& f : plan.functions) {
    if (std::none_of(plan.sites.begin(), plan.sites.end(),
                     [&](const GoProbeSite& s) { return s.function == f && !s.ret; })) {
      __builtin_trap();
    }
  }
  for (uint32_t f = 0; f < FIELD_NR; ++f) {
    const field_path& path = plan.layout.field[f];
    if (path.n > 1 || (path.n == 1 && (path.off[0] < 0 || path.width == 0 || path.width > 2))) __builtin_trap();
  }
}

// The calls into the code under test, on one open file.
void Exercise(const tlsprof::guard::GuardedFile& file) {
  auto plan = tlsprof::usage::PlanGoFile(file, "fuzz-go");
  if (plan.ok()) CheckPlan(*plan, file.size());
  if (auto elf = tlsprof::guard::ElfFile::Open(file); elf.ok()) (void)tlsprof::usage::GoConnLayoutFromDwarf(*elf);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (auto v = tlsprof::usage::GoBuildInfoVersion(std::span<const uint8_t>(data, size)); v && v->empty()) {
    __builtin_trap();
  }
  Exercise(tlsprof::fuzz::GuardedMemFile(data, size));
  return 0;
}
