// Helpers of the OpenSSL plan's tests (usage_test, openssl11_plan_test,
// openssl35_plan_test): a library file's wanted functions and state machine,
// the functions a file plan probes, and the chain a planned field_path
// holds. Header-only; gtest assertions; thread-safe.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/usage/accessors.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/probe_plan.h"
#include "bpf/usage.h"

namespace tlsprof::usage {

struct PlannedLibrary {
  std::map<std::string, FunctionCode, std::less<>> functions;  // FindFunctions(WantedFunctions())
  std::vector<FoundFunction> state_machine;                    // FindHandshakeStateMachine
};

// A file opened as the agent opens it (guard::OpenHostFile, guard::ElfFile);
// `elf` is null (after a test failure) when it does not open.
struct OpenedElf {
  std::unique_ptr<guard::GuardedFile> file;
  std::unique_ptr<guard::ElfFile> elf;
};
inline OpenedElf OpenElf(const std::string& path) {
  OpenedElf out;
  auto file = guard::OpenHostFile(path);
  EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().message);
  if (!file.ok()) return out;
  out.file = std::make_unique<guard::GuardedFile>(std::move(*file));
  auto elf = guard::ElfFile::Open(*out.file);
  EXPECT_TRUE(elf.ok()) << (elf.ok() ? "" : elf.error().message);
  if (elf.ok()) out.elf = std::make_unique<guard::ElfFile>(std::move(*elf));
  return out;
}

// `path`'s functions and state machine; empty (with a test failure) when
// the file does not read.
inline PlannedLibrary PlanLibrary(const std::string& path) {
  PlannedLibrary out;
  const OpenedElf opened = OpenElf(path);
  if (!opened.elf) return out;
  auto functions = FindFunctions(*opened.elf, WantedFunctions());
  EXPECT_TRUE(functions.ok()) << (functions.ok() ? "" : functions.error().message);
  if (functions.ok()) {
    out.functions = std::move(*functions);
    out.state_machine = FindHandshakeStateMachine(*opened.elf, out.functions);
  }
  return out;
}

// libssl and libcrypto of a Debian root unpacked under `root`, with the
// soname version `so` ("1.1", "3").
struct RootLibraries {
  std::string libssl, libcrypto;

  RootLibraries(std::string_view root, std::string_view so)
      : libssl(std::string(root) + "/usr/lib/x86_64-linux-gnu/libssl.so." + std::string(so)),
        libcrypto(std::string(root) + "/usr/lib/x86_64-linux-gnu/libcrypto.so." + std::string(so)) {}
};

// Whether all `paths` are readable; a test failure (never a skip) naming
// the first that is not and `how` to get it.
inline bool FilesInstalled(std::initializer_list<std::string> paths, std::string_view how) {
  for (const std::string& path : paths) {
    if (access(path.c_str(), R_OK) != 0) {
      ADD_FAILURE() << path << " is missing: " << how;
      return false;
    }
  }
  return true;
}

// The functions a file plan probes, in its order.
inline std::vector<std::string> Probed(const FilePlan& plan) {
  std::vector<std::string> names;
  for (const ProbeSite& site : plan.sites) names.push_back(site.function);
  return names;
}

// The chain the layout's `field` holds (no bit field: OpenSSL's have none).
inline LoadChain PlannedChain(const lib_layout& layout, uint32_t field) {
  const field_path& path = layout.field[field];
  LoadChain chain;
  for (uint8_t i = 0; i < path.n; ++i) chain.offsets.push_back(path.off[i]);
  chain.width = path.width;
  chain.type_guard = path.type_guard != 0;
  return chain;
}

}  // namespace tlsprof::usage
