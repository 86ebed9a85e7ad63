#include "agent/usage/elf_functions.h"

#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace tlsprof::usage {
namespace {

struct ElfDeleter {
  void operator()(Elf* elf) const { elf_end(elf); }
};

}  // namespace

Result<std::map<std::string, FunctionCode, std::less<>>> FindFunctions(int fd,
                                                                       std::span<const std::string_view> names) {
  elf_version(EV_CURRENT);
  std::unique_ptr<Elf, ElfDeleter> elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return MakeError("not an ELF file: {}", elf_errmsg(-1));
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
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf.get(), scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM)) continue;
    if (sh.sh_entsize == 0) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data) continue;
    const size_t count = std::min<size_t>(sh.sh_size / sh.sh_entsize, data->d_size / sizeof(Elf64_Sym));
    for (size_t i = 0; i < count; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) break;
      if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_value == 0) continue;
      const char* cname = elf_strptr(elf.get(), sh.sh_link, sym.st_name);
      if (!cname) continue;
      std::string_view name(cname);
      if (auto at = name.find('@'); at != std::string_view::npos) name = name.substr(0, at);
      if (std::find(names.begin(), names.end(), name) == names.end() || found.count(name)) continue;
      for (const GElf_Phdr& ph : loads) {
        if (sym.st_value < ph.p_vaddr || sym.st_value >= ph.p_vaddr + ph.p_filesz) continue;
        FunctionCode code;
        code.vaddr = sym.st_value;
        code.file_offset = sym.st_value - ph.p_vaddr + ph.p_offset;
        const uint64_t segment_end = std::min<uint64_t>(ph.p_offset + ph.p_filesz, file_size);
        if (code.file_offset >= segment_end) break;
        const size_t n = std::min<uint64_t>(kPrefixBytes, segment_end - code.file_offset);
        code.prefix.assign(raw + code.file_offset, raw + code.file_offset + n);
        found.emplace(std::string(name), std::move(code));
        break;
      }
    }
  }
  return found;
}

Result<FunctionCode> CodeAt(int fd, uint64_t vaddr) {
  elf_version(EV_CURRENT);
  std::unique_ptr<Elf, ElfDeleter> elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return MakeError("not an ELF file: {}", elf_errmsg(-1));
  size_t phnum = 0;
  if (elf_getphdrnum(elf.get(), &phnum) != 0) return MakeError("bad program headers: {}", elf_errmsg(-1));
  size_t file_size = 0;
  const char* raw = elf_rawfile(elf.get(), &file_size);
  if (!raw) return MakeError("cannot read the file: {}", elf_errmsg(-1));
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf.get(), static_cast<int>(i), &ph) || ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    if (vaddr < ph.p_vaddr || vaddr >= ph.p_vaddr + ph.p_filesz) continue;
    FunctionCode code;
    code.vaddr = vaddr;
    code.file_offset = vaddr - ph.p_vaddr + ph.p_offset;
    const uint64_t segment_end = std::min<uint64_t>(ph.p_offset + ph.p_filesz, file_size);
    if (code.file_offset >= segment_end) break;
    const size_t n = std::min<uint64_t>(kPrefixBytes, segment_end - code.file_offset);
    code.prefix.assign(raw + code.file_offset, raw + code.file_offset + n);
    return code;
  }
  return MakeError("no executable segment holds {:#x}", vaddr);
}

Result<std::map<uint64_t, uint64_t>> PointerWords(int fd, uint64_t begin, uint64_t end) {
  elf_version(EV_CURRENT);
  std::unique_ptr<Elf, ElfDeleter> elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return MakeError("not an ELF file: {}", elf_errmsg(-1));
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
      if (begin < ph.p_vaddr || end > ph.p_vaddr + ph.p_filesz || ph.p_offset + ph.p_filesz > file_size) continue;
      for (uint64_t at = begin; at + 8 <= end; at += 8) {
        uint64_t word = 0;
        std::memcpy(&word, raw + (at - ph.p_vaddr + ph.p_offset), sizeof(word));
        if (word != 0) out[at] = word;
      }
      return out;
    }
    return out;
  }
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf.get(), scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_RELA || sh.sh_entsize == 0) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data) continue;
    const size_t count = std::min<size_t>(sh.sh_size / sh.sh_entsize, data->d_size / sizeof(Elf64_Rela));
    for (size_t i = 0; i < count; ++i) {
      GElf_Rela rela;
      if (!gelf_getrela(data, static_cast<int>(i), &rela)) break;
      if (GELF_R_TYPE(rela.r_info) != R_X86_64_RELATIVE) continue;
      if (rela.r_offset < begin || rela.r_offset >= end) continue;
      out[rela.r_offset] = static_cast<uint64_t>(rela.r_addend);
    }
  }
  return out;
}

Result<std::map<uint64_t, std::string>> JumpSlots(int fd) {
  elf_version(EV_CURRENT);
  std::unique_ptr<Elf, ElfDeleter> elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return MakeError("not an ELF file: {}", elf_errmsg(-1));
  std::map<uint64_t, std::string> out;
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf.get(), scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_RELA || sh.sh_entsize == 0) continue;
    Elf_Scn* symtab = elf_getscn(elf.get(), sh.sh_link);
    GElf_Shdr sym_sh;
    if (!symtab || !gelf_getshdr(symtab, &sym_sh) || sym_sh.sh_type != SHT_DYNSYM) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    Elf_Data* syms = elf_getdata(symtab, nullptr);
    if (!data || !syms) continue;
    const size_t count = std::min<size_t>(sh.sh_size / sh.sh_entsize, data->d_size / sizeof(Elf64_Rela));
    for (size_t i = 0; i < count; ++i) {
      GElf_Rela rela;
      if (!gelf_getrela(data, static_cast<int>(i), &rela)) break;
      if (GELF_R_TYPE(rela.r_info) != R_X86_64_JUMP_SLOT) continue;
      GElf_Sym sym;
      if (!gelf_getsym(syms, static_cast<int>(GELF_R_SYM(rela.r_info)), &sym)) continue;
      const char* name = elf_strptr(elf.get(), sym_sh.sh_link, sym.st_name);
      if (name && *name) out[rela.r_offset] = name;
    }
  }
  return out;
}

}  // namespace tlsprof::usage
