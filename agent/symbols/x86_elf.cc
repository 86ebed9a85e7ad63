#include "agent/symbols/x86_elf.h"

namespace tlsprof::symbols {

Status CheckX86(const guard::ElfFile& elf) {
  if (!elf.x86_64()) return MakeError("{}: not an x86-64 ELF64 little-endian file", elf.path());
  return OkStatus();
}

Result<std::vector<LoadedSegment>> ReadLoadSegments(const guard::ElfFile& elf, bool code_only, uint64_t max_bytes) {
  std::vector<LoadedSegment> out;
  uint64_t total = 0;
  for (size_t i = 0; i < elf.program_headers().size(); ++i) {
    const GElf_Phdr& ph = elf.program_headers()[i];
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0 || (code_only && !(ph.p_flags & PF_X))) continue;
    if (ph.p_offset > elf.size() || elf.size() - ph.p_offset < ph.p_filesz || ph.p_filesz > ph.p_memsz) {
      return MakeError("{}: PT_LOAD program header {} lies past the end of the file", elf.path(), i);
    }
    total += ph.p_filesz;
    if (total > max_bytes) {
      guard::Refuse(guard::Reason::kSectionSize, elf.path(),
                    fmt::format("loadable segments of over {} bytes", max_bytes));
      return MakeError("{}: loadable segments exceed {} bytes", elf.path(), max_bytes);
    }
    auto bytes = elf.Read(ph.p_offset, ph.p_filesz, max_bytes, "a loadable segment");
    if (!bytes) return bytes.error();
    out.push_back({ph.p_vaddr, ph.p_flags, ph.p_memsz, std::move(*bytes)});
  }
  return out;
}

}  // namespace tlsprof::symbols
