// GoPlan: where the usage probes go in a Go binary that links crypto/tls
// (bpf/usage.bpf.c, usage_go), and where a tls.Conn keeps the negotiated
// parameters.
//
// Go is probed without uretprobes: the runtime moves goroutine stacks, and a
// return address a uretprobe swapped for its trampoline would be copied
// with the stack (and found by the runtime's own unwinder). Instead each
// function gets a uprobe at its entry and one at every RET instruction
// (found by disassembling it with capstone); the BPF side matches the two by
// goroutine (R14 holds the g in Go's ABIInternal). The functions are found
// by name in .symtab or, for a stripped binary (-ldflags=-s -w), in the
// .gopclntab the runtime itself needs.
//
// Fields: the offsets of tls.Conn's vers, cipherSuite and didResume come
// from the binary's DWARF (crypto/tls.Conn's members) when it has it, else
// from a table by Go version (read from .go.buildinfo) whose every row a
// test checks against the DWARF of a binary of that version. A version the
// table lacks leaves the fields unknown, never guessed.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "bpf/usage.h"
#include "common/result.h"

namespace tlsprof::usage {

struct GoProbeSite {
  std::string function;
  uint64_t file_offset = 0;  // the entry, or a RET instruction
  uint64_t cookie_bits = 0;  // USAGE_GO_COOKIE without the lib (added at attach)
  bool ret = false;          // a RET site
};

struct GoConnLayout {
  int32_t vers = -1;  // offsets in crypto/tls.Conn; -1: unknown
  int32_t cipher_suite = -1;
  int32_t did_resume = -1;
  uint8_t vers_width = 2, cipher_suite_width = 2, did_resume_width = 1;
  std::string source;  // "dwarf", "table go1.19", or "unknown"
};

struct GoFilePlan {
  std::string go_version;  // "go1.19.8"; "" if the binary does not say
  std::vector<GoProbeSite> sites;
  std::vector<std::string> functions;  // probed, by name
  GoConnLayout conn;
  lib_layout layout{};                        // from `conn`, for lib_layouts
  std::map<std::string, std::string> fields;  // field name -> "+0x40 (2 bytes) [dwarf]" or "unknown"
};

// The RET instructions of x86-64 code that starts at `vaddr`: their
// addresses. Decoded linearly with capstone (Go emits no data in text).
std::vector<uint64_t> ReturnInstructions(std::span<const uint8_t> code, uint64_t vaddr);

// Where a Go function's entry probe goes: on the conditional jump of its
// stack-growth check (`cmp rsp, [r14+0x10]; jbe`, optionally after `lea
// r12, [rsp-N]`), which the kernel's uprobes emulate, where a probe on the
// `cmp` would be single-stepped, one trap more (bench/README.md has the
// cost of each). Neither changes an argument register, so the probe sees
// the arguments as at the entry; the jump's morestack branch restarts the
// function, as at the entry. `vaddr` itself for any other prologue.
uint64_t GoEntryProbeAddress(std::span<const uint8_t> code, uint64_t vaddr);

// The Go version in a .go.buildinfo section's bytes (Go 1.18+ layout:
// "\xff Go buildinf:", pointer size, flags; with flags & 2 the version is an
// inline varint-prefixed string). nullopt for other layouts or bad bytes.
std::optional<std::string> GoBuildInfoVersion(std::span<const uint8_t> section);

// tls.Conn's field offsets from the DWARF of `elf`; nullopt without DWARF,
// without the type, or with debug sections over the guard's caps (they are
// read through guard::ElfFile before libdw sees them).
std::optional<GoConnLayout> GoConnLayoutFromDwarf(const guard::ElfFile& elf);
// The table's row for `go_version` ("go1.19.8" matches "go1.19"); nullopt
// when the table has none.
std::optional<GoConnLayout> GoConnLayoutFromTable(std::string_view go_version);

// The whole plan for one Go binary. An Error for a file that is not an
// x86-64 Go ELF or has none of the probed functions.
Result<GoFilePlan> PlanGoFile(const guard::GuardedFile& file, std::string_view display_path);

}  // namespace tlsprof::usage
