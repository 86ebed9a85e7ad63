#include "agent/usage/elf_functions.h"

#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "agent/symbols/x86_elf.h"

namespace tlsprof::usage {
namespace {

using symbols::ElfPtr;

// libelf's handle on `fd` (mapped); an error where it is not ELF.
Result<ElfPtr> OpenElf(int fd) {
  symbols::InitLibelf();
  ElfPtr elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return MakeError("not an ELF file: {}", elf_errmsg(-1));
  return elf;
}

// The code at `vaddr` of the executable segment `ph` (up to kPrefixBytes of
// it, as far as the file goes); nullopt where the file ends first.
std::optional<FunctionCode> CodeIn(const GElf_Phdr& ph, uint64_t vaddr, const char* raw, size_t file_size) {
  FunctionCode code;
  code.vaddr = vaddr;
  code.file_offset = vaddr - ph.p_vaddr + ph.p_offset;
  const uint64_t segment_end = std::min<uint64_t>(ph.p_offset + ph.p_filesz, file_size);
  if (code.file_offset >= segment_end) return std::nullopt;
  const size_t n = std::min<uint64_t>(kPrefixBytes, segment_end - code.file_offset);
  code.prefix.assign(raw + code.file_offset, raw + code.file_offset + n);
  return code;
}

// Calls visit(section header, data, i) for entry i of each section that
// wanted(header) accepts, over as many `entry_size`-byte entries as both
// the header and the data hold; visit returns false to leave the section
// (an entry that does not read).
template <typename Wanted, typename Visit>
void ForEachEntry(Elf* elf, size_t entry_size, Wanted wanted, Visit visit) {
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || !wanted(sh) || sh.sh_entsize == 0) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data) continue;
    const size_t count = std::min<size_t>(sh.sh_size / sh.sh_entsize, data->d_size / entry_size);
    for (size_t i = 0; i < count; ++i) {
      if (!visit(sh, data, i)) break;
    }
  }
}

// visit(section header, symbol) for each symbol of .symtab and .dynsym.
template <typename Visit>
void ForEachSymbol(Elf* elf, Visit visit) {
  auto symbols = [](const GElf_Shdr& sh) { return sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM; };
  ForEachEntry(elf, sizeof(Elf64_Sym), symbols, [&](const GElf_Shdr& sh, Elf_Data* data, size_t i) {
    GElf_Sym sym;
    if (!gelf_getsym(data, static_cast<int>(i), &sym)) return false;
    visit(sh, sym);
    return true;
  });
}

// visit(section header, relocation) for each relocation of each SHT_RELA
// section.
template <typename Visit>
void ForEachRela(Elf* elf, Visit visit) {
  auto relas = [](const GElf_Shdr& sh) { return sh.sh_type == SHT_RELA; };
  ForEachEntry(elf, sizeof(Elf64_Rela), relas, [&](const GElf_Shdr& sh, Elf_Data* data, size_t i) {
    GElf_Rela rela;
    if (!gelf_getrela(data, static_cast<int>(i), &rela)) return false;
    visit(sh, rela);
    return true;
  });
}

}  // namespace

Result<std::map<std::string, FunctionCode, std::less<>>> FindFunctions(int fd,
                                                                       std::span<const std::string_view> names) {
  auto opened = OpenElf(fd);
  if (!opened) return opened.error();
  ElfPtr elf = std::move(*opened);
  GElf_Ehdr ehdr;
  if (!gelf_getehdr(elf.get(), &ehdr)) return MakeError("bad ELF header: {}", elf_errmsg(-1));
  if (ehdr.e_machine != EM_X86_64) return MakeError("not an x86-64 ELF file (e_machine {})", ehdr.e_machine);

  size_t phnum = 0;
  if (elf_getphdrnum(elf.get(), &phnum) != 0) return MakeError("bad program headers: {}", elf_errmsg(-1));
  std::vector<GElf_Phdr> loads;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf.get(), static_cast<int>(i), &ph) && ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      loads.push_back(ph);
    }
  }
  size_t file_size = 0;
  const char* raw = elf_rawfile(elf.get(), &file_size);
  if (!raw) return MakeError("cannot read the file: {}", elf_errmsg(-1));

  std::map<std::string, FunctionCode, std::less<>> found;
  ForEachSymbol(elf.get(), [&](const GElf_Shdr& sh, const GElf_Sym& sym) {
    if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_value == 0) return;
    const char* cname = elf_strptr(elf.get(), sh.sh_link, sym.st_name);
    if (!cname) return;
    std::string_view name(cname);
    if (auto at = name.find('@'); at != std::string_view::npos) name = name.substr(0, at);
    if (std::find(names.begin(), names.end(), name) == names.end() || found.count(name)) return;
    for (const GElf_Phdr& ph : loads) {
      if (sym.st_value < ph.p_vaddr || sym.st_value >= ph.p_vaddr + ph.p_filesz) continue;
      if (auto code = CodeIn(ph, sym.st_value, raw, file_size)) found.emplace(std::string(name), std::move(*code));
      break;
    }
  });
  return found;
}

Result<FunctionCode> CodeAt(int fd, uint64_t vaddr) {
  auto opened = OpenElf(fd);
  if (!opened) return opened.error();
  ElfPtr elf = std::move(*opened);
  size_t phnum = 0;
  if (elf_getphdrnum(elf.get(), &phnum) != 0) return MakeError("bad program headers: {}", elf_errmsg(-1));
  size_t file_size = 0;
  const char* raw = elf_rawfile(elf.get(), &file_size);
  if (!raw) return MakeError("cannot read the file: {}", elf_errmsg(-1));
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf.get(), static_cast<int>(i), &ph) || ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    if (vaddr < ph.p_vaddr || vaddr >= ph.p_vaddr + ph.p_filesz) continue;
    if (auto code = CodeIn(ph, vaddr, raw, file_size)) return std::move(*code);
    break;
  }
  return MakeError("no executable segment holds {:#x}", vaddr);
}

Result<std::map<uint64_t, uint64_t>> PointerWords(int fd, uint64_t begin, uint64_t end) {
  auto opened = OpenElf(fd);
  if (!opened) return opened.error();
  ElfPtr elf = std::move(*opened);
  std::map<uint64_t, uint64_t> out;
  GElf_Ehdr ehdr;
  if (!gelf_getehdr(elf.get(), &ehdr)) return MakeError("bad ELF header: {}", elf_errmsg(-1));
  if (ehdr.e_type == ET_EXEC) {
    size_t phnum = 0, file_size = 0;
    if (elf_getphdrnum(elf.get(), &phnum) != 0) return MakeError("bad program headers: {}", elf_errmsg(-1));
    const char* raw = elf_rawfile(elf.get(), &file_size);
    if (!raw) return MakeError("cannot read the file: {}", elf_errmsg(-1));
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (!gelf_getphdr(elf.get(), static_cast<int>(i), &ph) || ph.p_type != PT_LOAD) continue;
      // [begin, end) inside the segment, and the segment inside the file, with no sum that can wrap.
      if (begin < ph.p_vaddr || end < begin || end - ph.p_vaddr > ph.p_filesz || ph.p_offset > file_size ||
          ph.p_filesz > file_size - ph.p_offset) {
        continue;
      }
      for (uint64_t at = begin; end - at >= 8; at += 8) {
        uint64_t word = 0;
        std::memcpy(&word, raw + (at - ph.p_vaddr + ph.p_offset), sizeof(word));
        if (word != 0) out[at] = word;
      }
      return out;
    }
    return out;
  }
  ForEachRela(elf.get(), [&](const GElf_Shdr&, const GElf_Rela& rela) {
    if (GELF_R_TYPE(rela.r_info) != R_X86_64_RELATIVE) return;
    if (rela.r_offset < begin || rela.r_offset >= end) return;
    out[rela.r_offset] = static_cast<uint64_t>(rela.r_addend);
  });
  return out;
}

Result<std::map<uint64_t, std::string>> JumpSlots(int fd) {
  auto opened = OpenElf(fd);
  if (!opened) return opened.error();
  ElfPtr elf = std::move(*opened);
  std::map<uint64_t, std::string> out;
  ForEachRela(elf.get(), [&](const GElf_Shdr& sh, const GElf_Rela& rela) {
    if (GELF_R_TYPE(rela.r_info) != R_X86_64_JUMP_SLOT) return;
    Elf_Scn* symtab = elf_getscn(elf.get(), sh.sh_link);
    GElf_Shdr sym_sh;
    if (!symtab || !gelf_getshdr(symtab, &sym_sh) || sym_sh.sh_type != SHT_DYNSYM) return;
    Elf_Data* syms = elf_getdata(symtab, nullptr);
    GElf_Sym sym;
    if (!syms || !gelf_getsym(syms, static_cast<int>(GELF_R_SYM(rela.r_info)), &sym)) return;
    const char* name = elf_strptr(elf.get(), sym_sh.sh_link, sym.st_name);
    if (name && *name) out[rela.r_offset] = name;
  });
  return out;
}

}  // namespace tlsprof::usage
