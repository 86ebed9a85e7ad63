// ElfFunctions: where named functions are in an ELF file, and their first
// bytes, for placing uprobes (by file offset) and decoding accessors
// (accessors.h). Reads .symtab and .dynsym (of a file opened by guard::ElfFile,
// within its caps), so exported API functions of a
// stripped shared library are found as well as the internal ones of a static
// link. Malformed files give an Error, never a crash. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "common/result.h"

namespace tlsprof::usage {

struct FunctionCode {
  uint64_t vaddr = 0;
  uint64_t file_offset = 0;     // what a uprobe is attached at
  std::vector<uint8_t> prefix;  // the first bytes (up to kPrefixBytes), fewer at the end of the segment
};

// Enough for OpenSSL 3.5's accessors, whose TLS-connection path starts after
// the QUIC one (SSL_get_privatekey's NULL return is at +0x70).
inline constexpr size_t kPrefixBytes = 192;

// The functions of `names` that `elf` defines (STT_FUNC or STT_GNU_IFUNC is not
// taken: an IFUNC symbol is a resolver, not the function), by name. Versioned
// .dynsym names match without their version. A name the file lacks is absent.
Result<std::map<std::string, FunctionCode, std::less<>>> FindFunctions(const guard::ElfFile& elf,
                                                                       std::span<const std::string_view> names);

// The code at one virtual address of an executable segment (a function with
// no symbol, found otherwise). Error if no executable PT_LOAD holds it.
Result<FunctionCode> CodeAt(const guard::ElfFile& elf, uint64_t vaddr);

// The pointers stored in [begin, end) as the loaded image holds them: place
// -> value (a target's virtual address), zeros left out. In a
// position-independent file (a shared library, a PIE) they are the addends
// of the R_X86_64_RELATIVE relocations placed there; in a fixed-address
// executable (ET_EXEC, e.g. node with OpenSSL linked in) the file's own
// 8-byte words, which hold absolute addresses. How pointer tables (OpenSSL's
// SSL_METHOD structs) read once loaded.
Result<std::map<uint64_t, uint64_t>> PointerWords(const guard::ElfFile& elf, uint64_t begin, uint64_t end);

// The GOT slots of the file's PLT: slot vaddr -> the name of the function
// its R_X86_64_JUMP_SLOT relocation binds (a PLT stub `jmp *slot(%rip)`
// calls it). How a call from one exported accessor to another reads in a
// shared library (accessor_paths.h).
Result<std::map<uint64_t, std::string>> JumpSlots(const guard::ElfFile& elf);

}  // namespace tlsprof::usage
