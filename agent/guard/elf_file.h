// ElfFile: the one ELF opener. Every reader of an ELF file another process
// controls (symbols, debug files, archive members, unwind tables, usage
// plans) opens it here.
//
// It never maps the file. libelf is driven with ELF_C_READ: it reads headers
// and each section with pread into buffers it owns, so a file truncated while
// it is read yields a read error, never SIGBUS. (ELF_C_READ_MMAP would save a
// copy; a tenant could then kill the agent by truncating its own library.)
//
// libelf trusts the headers it reads: without a mapping it checks no offset
// against the file's size, allocates a descriptor per claimed section up
// front and reads whatever size a section header claims. So Open() validates
// the ELF header with its own pread first (section and program header counts
// under guard::kMaxSections / kMaxProgramHeaders, their tables inside the
// file), and a section's bytes are only ever read through SectionBytes() /
// StringAt(), which refuse a section over its cap or outside the file before
// libelf allocates anything, and refuse a compressed section whose inflated
// size is over the cap before inflating it. Readers must not call
// elf_getdata, elf_strptr, elf_rawfile, elf_compress or libdw's
// dwarf_begin_elf on the handle themselves (scripts/check-guarded-io.sh
// enforces it).
//
// Thread-safety: an ElfFile is used by one thread at a time (libelf caches
// section data in the handle). It refers to its GuardedFile, which must
// outlive it.
#pragma once

#include <gelf.h>
#include <libelf.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/guarded_file.h"
#include "agent/guard/limits.h"
#include "common/result.h"

namespace tlsprof::guard {

struct ElfDeleter {
  void operator()(Elf* elf) const { elf_end(elf); }
};
using ElfPtr = std::unique_ptr<Elf, ElfDeleter>;

struct ElfSection {
  Elf_Scn* scn = nullptr;
  GElf_Shdr shdr{};
  std::string name;  // from .shstrtab; "" when it has none
  size_t index = 0;
};

class ElfFile {
 public:
  // Opens `file` as an ELF file of any class and byte order. An Error when it
  // is not ELF, or its headers are corrupt, truncated or over the caps (the
  // latter counted as kElfHeaders). `file` must outlive the ElfFile, which
  // reads through it: a temporary is refused at compile time.
  static Result<ElfFile> Open(const GuardedFile& file);
  static Result<ElfFile> Open(GuardedFile&&) = delete;
  // An ELF image held in memory: an archive member read whole (it is small),
  // so nothing of it is read from the file again. libelf then checks every
  // offset against the buffer itself.
  static Result<ElfFile> OpenMemory(std::vector<uint8_t> bytes, std::string name);

  ElfFile(ElfFile&&) noexcept = default;
  ElfFile& operator=(ElfFile&&) noexcept = default;

  Elf* elf() const { return elf_.get(); }
  const GElf_Ehdr& ehdr() const { return ehdr_; }
  // The file, or null for an image in memory.
  const GuardedFile* file() const { return file_; }
  // The size of the file (or of the image in memory).
  uint64_t size() const { return size_; }
  const std::string& path() const { return name_; }
  bool is64() const { return ehdr_.e_ident[EI_CLASS] == ELFCLASS64; }
  bool big_endian() const { return ehdr_.e_ident[EI_DATA] == ELFDATA2MSB; }
  // x86-64 ELF64 little-endian: the only kind the unwinder, the usage probes
  // and the machine-code readers handle.
  bool x86_64() const { return ehdr_.e_machine == EM_X86_64 && is64() && !big_endian(); }

  // Every section header, read at Open() (index 0 included), with its name.
  const std::vector<ElfSection>& sections() const { return sections_; }
  // The first section called `name` / of type `type`, or null.
  const ElfSection* Find(std::string_view name) const;
  const ElfSection* FindType(uint32_t type) const;
  // The program headers, read at Open().
  const std::vector<GElf_Phdr>& program_headers() const { return phdrs_; }

  // A section's bytes, read by libelf (owned by this handle, valid while it
  // lives; empty for SHT_NOBITS or size 0). Refused over `cap` (kSectionSize)
  // or past the end of the file; a SHF_COMPRESSED section is inflated only
  // when its Chdr says it fits `cap`. The section's Elf_Data is then libelf's
  // (elf_getdata), for the gelf_get* accessors: use data() after this.
  Result<std::span<const uint8_t>> SectionBytes(const ElfSection& section, uint64_t cap = kMaxSectionBytes) const;
  // libelf's Elf_Data of a section read by SectionBytes (null before).
  Elf_Data* data(const ElfSection& section) const;
  // True when the section name table was read at Open() within the caps, or
  // there is none. libdw (dwarf_begin_elf) looks names up with elf_strptr,
  // which would read a table left unread (over kMaxSectionBytes) whole,
  // unchecked: hand elf() to libdw only when this holds.
  bool names_read() const;
  // The NUL-terminated string at `offset` of string-table section `strtab`
  // (read through SectionBytes first); nullopt when out of range or
  // unterminated.
  std::optional<std::string_view> StringAt(size_t strtab, uint64_t offset) const;
  // `length` bytes at `offset` of the file, with pread (no libelf copy): code
  // and data read by address. Refused over `cap`.
  Result<std::vector<uint8_t>> Read(uint64_t offset, uint64_t length, uint64_t cap, std::string_view what) const;
  // `length` bytes at virtual address `vaddr` of a PT_LOAD segment's file
  // range (fewer where the segment's file bytes end); executable segments only
  // when `code`. An Error where no segment holds the address.
  Result<std::vector<uint8_t>> ReadVaddr(uint64_t vaddr, uint64_t length, bool code) const;

 private:
  ElfFile() = default;
  static Result<ElfFile> Finish(ElfFile f);
  Status ReadRaw(uint64_t offset, std::span<uint8_t> out) const;
  // Refuses `s` (counted as kSectionSize): the image's sections read so far
  // and its `bytes` are over kMaxImageSectionBytes.
  Error ImageSectionsOverCap(const ElfSection& s, uint64_t bytes) const;

  const GuardedFile* file_ = nullptr;
  std::shared_ptr<std::vector<uint8_t>> memory_;  // OpenMemory's image
  ElfPtr elf_;
  GElf_Ehdr ehdr_{};
  uint64_t size_ = 0;
  std::string name_;
  std::vector<ElfSection> sections_;
  std::vector<GElf_Phdr> phdrs_;
  std::unique_ptr<std::vector<bool>> loaded_;  // sections SectionBytes checked and read
  mutable uint64_t loaded_bytes_ = 0;          // their sizes (inflated), against kMaxImageSectionBytes
};

// libelf's version handshake, once per process; false if libelf is unusable.
bool InitLibelf();
inline std::string ElfErr() { return elf_errmsg(-1); }

}  // namespace tlsprof::guard
