#include "agent/usage/elf_functions.h"

#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

namespace tlsprof::usage {
namespace {

using guard::ElfFile;
using guard::ElfSection;

// The code at `vaddr` of the executable segment `ph` (up to kPrefixBytes of
// it, as far as the file goes); nullopt where the file ends first.
std::optional<FunctionCode> CodeIn(const ElfFile& elf, const GElf_Phdr& ph, uint64_t vaddr) {
  FunctionCode code;
  code.vaddr = vaddr;
  code.file_offset = vaddr - ph.p_vaddr + ph.p_offset;
  const uint64_t segment_end = std::min<uint64_t>(ph.p_offset + ph.p_filesz, elf.size());
  if (code.file_offset >= segment_end) return std::nullopt;
  const uint64_t n = std::min<uint64_t>(kPrefixBytes, segment_end - code.file_offset);
  auto bytes = elf.Read(code.file_offset, n, kPrefixBytes, "a function's code");
  if (!bytes) return std::nullopt;
  code.prefix = std::move(*bytes);
  return code;
}

// Calls visit(section, data, i) for entry i of each section that
// wanted(header) accepts, over as many `entry_size`-byte entries as both
// the header and the data hold; visit returns false to leave the section
// (an entry that does not read). Sections over the guard's caps are left out.
template <typename Wanted, typename Visit>
void ForEachEntry(const ElfFile& elf, size_t entry_size, Wanted wanted, Visit visit) {
  for (const ElfSection& s : elf.sections()) {
    if (s.index == 0 || !wanted(s.shdr) || s.shdr.sh_entsize == 0) continue;
    if (s.shdr.sh_size / s.shdr.sh_entsize > guard::kMaxSymbols) {
      guard::Refuse(guard::Reason::kSymbols, elf.path(),
                    fmt::format("{} has {} entries, over the cap of {}", s.name, s.shdr.sh_size / s.shdr.sh_entsize,
                                guard::kMaxSymbols));
      continue;
    }
    auto bytes = elf.SectionBytes(s);
    Elf_Data* data = bytes ? elf.data(s) : nullptr;
    if (!data) continue;
    const size_t count = std::min<size_t>(s.shdr.sh_size / s.shdr.sh_entsize, data->d_size / entry_size);
    for (size_t i = 0; i < count; ++i) {
      if (!visit(s, data, i)) break;
    }
  }
}

// visit(section, symbol) for each symbol of .symtab and .dynsym.
template <typename Visit>
void ForEachSymbol(const ElfFile& elf, Visit visit) {
  auto symbols = [](const GElf_Shdr& sh) { return sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM; };
  ForEachEntry(elf, sizeof(Elf64_Sym), symbols, [&](const ElfSection& s, Elf_Data* data, size_t i) {
    GElf_Sym sym;
    if (!gelf_getsym(data, static_cast<int>(i), &sym)) return false;
    visit(s, sym);
    return true;
  });
}

// visit(section, relocation) for each relocation of each SHT_RELA section.
template <typename Visit>
void ForEachRela(const ElfFile& elf, Visit visit) {
  auto relas = [](const GElf_Shdr& sh) { return sh.sh_type == SHT_RELA; };
  ForEachEntry(elf, sizeof(Elf64_Rela), relas, [&](const ElfSection& s, Elf_Data* data, size_t i) {
    GElf_Rela rela;
    if (!gelf_getrela(data, static_cast<int>(i), &rela)) return false;
    visit(s, rela);
    return true;
  });
}

}  // namespace

Result<std::map<std::string, FunctionCode, std::less<>>> FindFunctions(const ElfFile& elf,
                                                                       std::span<const std::string_view> names) {
  if (elf.ehdr().e_machine != EM_X86_64) {
    return MakeError("not an x86-64 ELF file (e_machine {})", elf.ehdr().e_machine);
  }
  std::vector<GElf_Phdr> loads;
  for (const GElf_Phdr& ph : elf.program_headers()) {
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) loads.push_back(ph);
  }
  std::map<std::string, FunctionCode, std::less<>> found;
  ForEachSymbol(elf, [&](const ElfSection& s, const GElf_Sym& sym) {
    if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_value == 0) return;
    auto full = elf.StringAt(s.shdr.sh_link, sym.st_name);
    if (!full) return;
    std::string_view name = *full;
    if (auto at = name.find('@'); at != std::string_view::npos) name = name.substr(0, at);
    if (std::find(names.begin(), names.end(), name) == names.end() || found.count(name)) return;
    for (const GElf_Phdr& ph : loads) {
      if (sym.st_value < ph.p_vaddr || sym.st_value >= ph.p_vaddr + ph.p_filesz) continue;
      if (auto code = CodeIn(elf, ph, sym.st_value)) found.emplace(std::string(name), std::move(*code));
      break;
    }
  });
  return found;
}

Result<FunctionCode> CodeAt(const ElfFile& elf, uint64_t vaddr) {
  for (const GElf_Phdr& ph : elf.program_headers()) {
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    if (vaddr < ph.p_vaddr || vaddr >= ph.p_vaddr + ph.p_filesz) continue;
    if (auto code = CodeIn(elf, ph, vaddr)) return std::move(*code);
    break;
  }
  return MakeError("no executable segment holds {:#x}", vaddr);
}

Result<std::map<uint64_t, uint64_t>> PointerWords(const ElfFile& elf, uint64_t begin, uint64_t end) {
  std::map<uint64_t, uint64_t> out;
  if (end < begin) return out;
  if (elf.ehdr().e_type == ET_EXEC) {
    for (const GElf_Phdr& ph : elf.program_headers()) {
      if (ph.p_type != PT_LOAD) continue;
      // [begin, end) inside the segment, and the segment inside the file, with no sum that can wrap.
      if (begin < ph.p_vaddr || end - ph.p_vaddr > ph.p_filesz || ph.p_offset > elf.size() ||
          ph.p_filesz > elf.size() - ph.p_offset) {
        continue;
      }
      auto bytes = elf.Read(begin - ph.p_vaddr + ph.p_offset, end - begin, guard::kMaxSectionBytes, "pointer words");
      if (!bytes) return bytes.error();
      for (uint64_t at = 0; at + 8 <= bytes->size(); at += 8) {
        uint64_t word = 0;
        std::memcpy(&word, bytes->data() + at, sizeof(word));
        if (word != 0) out[begin + at] = word;
      }
      return out;
    }
    return out;
  }
  ForEachRela(elf, [&](const ElfSection&, const GElf_Rela& rela) {
    if (GELF_R_TYPE(rela.r_info) != R_X86_64_RELATIVE) return;
    // A word that is zero points at nothing, in either kind of file.
    if (rela.r_offset < begin || rela.r_offset >= end || rela.r_addend == 0) return;
    out[rela.r_offset] = static_cast<uint64_t>(rela.r_addend);
  });
  return out;
}

Result<std::map<uint64_t, std::string>> JumpSlots(const ElfFile& elf) {
  std::map<uint64_t, std::string> out;
  ForEachRela(elf, [&](const ElfSection& s, const GElf_Rela& rela) {
    if (GELF_R_TYPE(rela.r_info) != R_X86_64_JUMP_SLOT) return;
    if (s.shdr.sh_link >= elf.sections().size()) return;
    const ElfSection& symtab = elf.sections()[s.shdr.sh_link];
    if (symtab.shdr.sh_type != SHT_DYNSYM || !elf.SectionBytes(symtab)) return;
    Elf_Data* syms = elf.data(symtab);
    GElf_Sym sym;
    if (!syms || !gelf_getsym(syms, static_cast<int>(GELF_R_SYM(rela.r_info)), &sym)) return;
    auto name = elf.StringAt(symtab.shdr.sh_link, sym.st_name);
    if (name && !name->empty()) out[rela.r_offset] = std::string(*name);
  });
  return out;
}

}  // namespace tlsprof::usage
