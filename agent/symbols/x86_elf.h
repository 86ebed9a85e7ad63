// The loadable bytes of an x86-64 ELF64 little-endian file, for the readers
// that decode a library's machine code and data themselves (archive_match.cc,
// loader_image.cc). The file is opened by guard::ElfFile. Thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "common/result.h"

namespace tlsprof::symbols {

using guard::ElfErr;
using guard::ElfPtr;
using guard::InitLibelf;

// An Error unless `elf` is x86-64 ELF64 little-endian.
Status CheckX86(const guard::ElfFile& elf);

struct LoadedSegment {
  uint64_t vaddr = 0;
  uint32_t flags = 0;          // p_flags (PF_X, PF_W, PF_R)
  uint64_t memsz = 0;          // p_memsz (.bss lies past the file bytes)
  std::vector<uint8_t> bytes;  // p_filesz bytes; the rest of p_memsz is zero
};

// The file bytes of the PT_LOAD segments with a file size (only the
// executable ones if `code_only`), read with pread (guard::ElfFile::Read).
// Errors: a segment lies past the end of the file or is larger than its
// memory size, the segments add up to more than `max_bytes` (counted as a
// refusal: guard::Reason::kSectionSize), a read fails.
Result<std::vector<LoadedSegment>> ReadLoadSegments(const guard::ElfFile& elf, bool code_only, uint64_t max_bytes);

}  // namespace tlsprof::symbols
