#include "agent/symbols/x86_elf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tlsprof::symbols {

Result<X86Elf> OpenX86Elf(int fd, std::string_view path) {
  if (!InitLibelf()) return MakeError("libelf is too old (elf_version failed)");
  struct stat st {};
  if (fstat(fd, &st) != 0) return MakeError("{}: fstat failed: {}", path, std::strerror(errno));
  X86Elf out;
  out.file_size = static_cast<uint64_t>(st.st_size);
  out.elf.reset(elf_begin(fd, ELF_C_READ, nullptr));
  if (!out.elf || elf_kind(out.elf.get()) != ELF_K_ELF) return MakeError("{}: not an ELF file", path);
  if (gelf_getehdr(out.elf.get(), &out.ehdr) == nullptr) return MakeError("{}: unreadable ELF header", path);
  if (out.ehdr.e_machine != EM_X86_64 || gelf_getclass(out.elf.get()) != ELFCLASS64 ||
      out.ehdr.e_ident[EI_DATA] != ELFDATA2LSB) {
    return MakeError("{}: not an x86-64 ELF64 little-endian file", path);
  }
  return out;
}

Result<std::vector<LoadedSegment>> ReadLoadSegments(int fd, const X86Elf& file, std::string_view path, bool code_only,
                                                    uint64_t max_bytes) {
  Elf* elf = file.elf.get();
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) return MakeError("{}: bad program header count", path);
  std::vector<LoadedSegment> out;
  uint64_t total = 0;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr) {
      return MakeError("{}: unreadable program header {}", path, i);
    }
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0 || (code_only && !(ph.p_flags & PF_X))) continue;
    if (ph.p_offset > file.file_size || file.file_size - ph.p_offset < ph.p_filesz || ph.p_filesz > ph.p_memsz) {
      return MakeError("{}: PT_LOAD program header {} lies past the end of the file", path, i);
    }
    total += ph.p_filesz;
    if (total > max_bytes) return MakeError("{}: loadable segments exceed {} bytes", path, max_bytes);
    LoadedSegment seg;
    seg.vaddr = ph.p_vaddr;
    seg.flags = ph.p_flags;
    seg.bytes.resize(ph.p_filesz);
    size_t done = 0;
    while (done < seg.bytes.size()) {
      ssize_t n = pread(fd, seg.bytes.data() + done, seg.bytes.size() - done, static_cast<off_t>(ph.p_offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return MakeError("{}: short read of PT_LOAD segment {}", path, i);
      done += static_cast<size_t>(n);
    }
    out.push_back(std::move(seg));
  }
  return out;
}

}  // namespace tlsprof::symbols
