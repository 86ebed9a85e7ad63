// Opening an x86-64 ELF64 little-endian file with libelf, for the readers
// that decode a library's machine code and data themselves (archive_match.cc,
// library_tables.cc). Thread-safe.
#pragma once

#include <gelf.h>
#include <libelf.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace tlsprof::symbols {

struct ElfDeleter {
  void operator()(Elf* elf) const { elf_end(elf); }
};
using ElfPtr = std::unique_ptr<Elf, ElfDeleter>;

inline std::string ElfErr() { return elf_errmsg(-1); }

// libelf's version handshake, once per process.
inline bool InitLibelf() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

struct X86Elf {
  ElfPtr elf;
  GElf_Ehdr ehdr{};
  uint64_t file_size = 0;
};

// Errors: fstat fails, the file is not ELF, its header is unreadable, or it
// is not x86-64 ELF64 little-endian.
Result<X86Elf> OpenX86Elf(int fd, std::string_view path);

struct LoadedSegment {
  uint64_t vaddr = 0;
  uint32_t flags = 0;          // p_flags (PF_X, PF_W, PF_R)
  std::vector<uint8_t> bytes;  // p_filesz bytes; the rest of p_memsz is zero
};

// The file bytes of the PT_LOAD segments with a file size (only the
// executable ones if `code_only`), read with pread: no mapping, so a file
// truncated while it is read cannot SIGBUS the agent. Errors: a header is
// unreadable, a segment lies past the end of the file or is larger than its
// memory size, the segments add up to more than `max_bytes`, a read fails.
Result<std::vector<LoadedSegment>> ReadLoadSegments(int fd, const X86Elf& file, std::string_view path, bool code_only,
                                                    uint64_t max_bytes);

}  // namespace tlsprof::symbols
