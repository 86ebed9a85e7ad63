// The BoringSSL usage plan (agent/usage/boringssl_plan.h) as UsageProbes runs
// it on one process's BoringSSL files: per file
// FindFunctions(BoringSslWantedFunctions()) and PlanBoringSslFile; then
// PlanBoringSslLayout over all of them, which decodes each accessor with
// DecodeAccessor (accessor_paths.h), following its calls and jumps into the
// file's code: PLT stubs resolved through JumpSlots, any other address read
// with CodeAt.
//
// Promises checked: a probe site is at the file offset of the function it
// names; a field the layout sets has 1..USAGE_MAX_LOADS loads of 1, 2, 4 or
// 8 bytes and a bit field inside its width; every field has a line in
// `fields`.
//
// Input: u32 LE length N, N bytes of one file (libssl), then the other
// (libcrypto); an input whose N does not fit (an ELF file) is one file.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/usage/boringssl_plan.h"
#include "bpf/usage.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using Functions = std::map<std::string, tlsprof::usage::FunctionCode, std::less<>>;

void CheckSites(const tlsprof::usage::FilePlan& plan, const Functions& functions) {
  for (const tlsprof::usage::ProbeSite& site : plan.sites) {
    auto it = functions.find(site.function);
    if (it == functions.end() || it->second.file_offset != site.file_offset) __builtin_trap();
    if (site.insn > INSN_SINGLE_STEPPED) __builtin_trap();
  }
}

void CheckLayout(const tlsprof::usage::ProcessPlan& plan) {
  for (uint32_t f = 0; f < FIELD_NR; ++f) {
    const field_path& path = plan.layout.field[f];
    if (path.n > USAGE_MAX_LOADS) __builtin_trap();
    if (path.n == 0) continue;
    if (path.width != 1 && path.width != 2 && path.width != 4 && path.width != 8) __builtin_trap();
    if (path.shift + path.bits > 8 * path.width) __builtin_trap();
  }
  for (const auto& [name, chain] : plan.fields) {
    if (name == "?" || chain.empty()) __builtin_trap();
  }
}

// The calls into the code under test, on the open files of one process.
void Exercise(std::span<const tlsprof::guard::ElfFile> elfs) {
  using namespace tlsprof::usage;
  const std::vector<std::string_view> wanted = BoringSslWantedFunctions();
  std::vector<Functions> functions;
  std::vector<const tlsprof::guard::ElfFile*> found_in;
  for (const tlsprof::guard::ElfFile& fd : elfs) {
    auto f = FindFunctions(fd, wanted);
    if (!f.ok()) continue;
    CheckSites(PlanBoringSslFile(*f), *f);
    functions.push_back(std::move(*f));
    found_in.push_back(&fd);
  }
  std::vector<BoringSslFile> files;
  for (size_t i = 0; i < functions.size(); ++i) files.push_back({found_in[i], &functions[i]});
  CheckLayout(PlanBoringSslLayout(files));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> input(data, size), libssl, libcrypto;
  std::vector<std::span<const uint8_t>> parts;
  if (tlsprof::fuzz::SplitTwo(input, libssl, libcrypto)) {
    parts = {libssl, libcrypto};
  } else {
    parts = {input};
  }
  // Opened as the agent opens a container's libraries: guard::ElfFile.
  // An ElfFile reads through its GuardedFile, which must outlive it.
  std::deque<tlsprof::guard::GuardedFile> files;
  std::vector<tlsprof::guard::ElfFile> elfs;
  for (std::span<const uint8_t> part : parts) {
    files.push_back(tlsprof::fuzz::GuardedMemFile(part.data(), part.size()));
    auto elf = tlsprof::guard::ElfFile::Open(files.back());
    if (elf.ok()) elfs.push_back(std::move(*elf));
  }
  Exercise(elfs);
  return 0;
}
