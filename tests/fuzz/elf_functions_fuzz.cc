// ElfFunctions (agent/usage/elf_functions.h), what the usage planners read a
// container's TLS library with to place uprobes: FindFunctions for every
// name either plan looks for, CodeAt at each function found and at the
// entry point, PointerWords over a method-table-sized range at each of them
// (as FindHandshakeStateMachine reads SSL_METHOD tables), and JumpSlots.
//
// Promises checked: FindFunctions returns only names asked for, each with
// at most kPrefixBytes of code; CodeAt at a found function's address gives
// the same offset and bytes (the probe goes where the decoded code is);
// PointerWords returns only places inside the range asked for.
//
// Input: an ELF file (a memfd opened through guard::ElfFile, as the agent
// opens a container's library; sparse and 6 GiB in elf_functions_large).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/usage/boringssl_plan.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/probe_plan.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tlsprof::usage::FunctionCode;

// The names both plans look for (probe_plan.h, boringssl_plan.h).
const std::vector<std::string_view>& Names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> n = tlsprof::usage::WantedFunctions();
    for (std::string_view b : tlsprof::usage::BoringSslWantedFunctions()) {
      if (std::find(n.begin(), n.end(), b) == n.end()) n.push_back(b);
    }
    return n;
  }();
  return names;
}

// SSL_METHOD's slots that FindHandshakeStateMachine compares.
constexpr uint64_t kTableBytes = 0x80;

void CheckPointerWords(const tlsprof::guard::ElfFile& elf, uint64_t begin) {
  auto words = tlsprof::usage::PointerWords(elf, begin, begin + kTableBytes);
  if (!words.ok()) return;
  for (const auto& [place, value] : *words) {
    if (place < begin || place >= begin + kTableBytes || value == 0) __builtin_trap();
  }
}

// The calls into the code under test, on one open file.
void Exercise(const tlsprof::guard::ElfFile& fd, uint64_t entry) {
  using namespace tlsprof::usage;
  auto functions = FindFunctions(fd, Names());
  if (functions.ok()) {
    for (const auto& [name, code] : *functions) {
      if (std::find(Names().begin(), Names().end(), name) == Names().end()) __builtin_trap();
      if (code.prefix.size() > kPrefixBytes) __builtin_trap();
      auto again = CodeAt(fd, code.vaddr);
      if (!again.ok() || again->file_offset != code.file_offset || again->prefix != code.prefix) __builtin_trap();
      CheckPointerWords(fd, code.vaddr);
      // The bytes right after the prefix, as an accessor's long path reads them.
      (void)CodeAt(fd, code.vaddr + code.prefix.size());
    }
  }
  if (auto code = CodeAt(fd, entry); code.ok() && code->prefix.size() > kPrefixBytes) __builtin_trap();
  CheckPointerWords(fd, entry);
  if (auto slots = JumpSlots(fd); slots.ok()) {
    for (const auto& [slot, name] : *slots) {
      if (name.empty()) __builtin_trap();
      (void)CodeAt(fd, slot);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // e_entry of an ELF64 header, wherever the input has one.
  uint64_t entry = 0;
  if (size >= 32) std::memcpy(&entry, data + 24, sizeof(entry));
  tlsprof::guard::GuardedFile file = tlsprof::fuzz::GuardedMemFile(data, size);
  auto elf = tlsprof::guard::ElfFile::Open(file);
  if (elf.ok()) Exercise(*elf, entry);
  return 0;
}
