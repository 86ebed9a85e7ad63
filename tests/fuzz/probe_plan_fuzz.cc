// The OpenSSL usage plan (agent/usage/probe_plan.h) as UsageProbes runs it on
// one process's TLS library files: per file FindFunctions(WantedFunctions()),
// FindHandshakeStateMachine (the SSL_METHOD tables, their relocations and
// the accept/connect code they point at) and PlanFile; then PlanLayout over
// all the files (the accessors decoded into field chains).
//
// Promises checked: a probe site is at the file offset of the function it
// names; a field the layout sets has 1..USAGE_MAX_LOADS loads of 1, 2, 4 or
// 8 bytes, and every field has a line in `fields`.
//
// Input: u32 LE length N, N bytes of one file (libssl), then the other
// (libcrypto), as debuglink_fuzz splits; an input whose N does not fit (an
// ELF file: its magic reads as N > 1 GiB) is one file.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/usage/probe_plan.h"
#include "bpf/usage.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using Functions = std::map<std::string, tlsprof::usage::FunctionCode, std::less<>>;

void CheckSites(const tlsprof::usage::FilePlan& plan, const Functions& functions,
                const std::vector<tlsprof::usage::FoundFunction>& state_machine) {
  for (const tlsprof::usage::ProbeSite& site : plan.sites) {
    bool placed = false;
    for (const auto& f : state_machine) placed |= f.name == site.function && f.code.file_offset == site.file_offset;
    if (auto it = functions.find(site.function); it != functions.end()) {
      placed |= it->second.file_offset == site.file_offset;
    }
    if (!placed || site.insn > INSN_SINGLE_STEPPED) __builtin_trap();
  }
}

void CheckLayout(const tlsprof::usage::ProcessPlan& plan) {
  for (uint32_t f = 0; f < FIELD_NR; ++f) {
    const field_path& path = plan.layout.field[f];
    if (path.n > USAGE_MAX_LOADS) __builtin_trap();
    if (path.n > 0 && path.width != 1 && path.width != 2 && path.width != 4 && path.width != 8) __builtin_trap();
  }
  for (const auto& [name, chain] : plan.fields) {
    if (name == "?" || chain.empty()) __builtin_trap();
  }
}

// The calls into the code under test, on the open files of one process.
void Exercise(std::span<const tlsprof::guard::ElfFile> elfs) {
  using namespace tlsprof::usage;
  const std::vector<std::string_view> wanted = WantedFunctions();
  std::vector<Functions> files;
  for (const tlsprof::guard::ElfFile& fd : elfs) {
    auto functions = FindFunctions(fd, wanted);
    if (!functions.ok()) continue;
    const std::vector<FoundFunction> state_machine = FindHandshakeStateMachine(fd, *functions);
    CheckSites(PlanFile(*functions, state_machine), *functions, state_machine);
    files.push_back(std::move(*functions));
  }
  std::vector<const Functions*> all;
  for (const Functions& f : files) all.push_back(&f);
  CheckLayout(PlanLayout(all));
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
