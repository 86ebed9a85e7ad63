#include "agent/symbols/import_calls.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace tlsprof::symbols {
namespace {

template <typename T>
T Load(std::span<const uint8_t> bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

bool IsPltSection(std::string_view name) { return name == ".plt" || name == ".plt.sec" || name == ".plt.got"; }

// GOT slot vaddr → index into names, from the JUMP_SLOT and GLOB_DAT
// relocations against .dynsym.
std::unordered_map<uint64_t, uint32_t> ImportSlots(std::span<const SectionView> sections,
                                                   const std::function<bool(std::string_view)>& keep,
                                                   std::vector<std::string>& names) {
  std::unordered_map<uint64_t, uint32_t> slots;
  std::unordered_map<uint32_t, uint32_t> by_symbol;  // dynsym index → names index
  for (const SectionView& rela : sections) {
    if (rela.type != SHT_RELA || rela.link >= sections.size()) continue;
    const SectionView& dynsym = sections[rela.link];
    if (dynsym.type != SHT_DYNSYM || dynsym.link >= sections.size()) continue;
    const SectionView& strtab = sections[dynsym.link];
    by_symbol.clear();
    for (size_t off = 0; off + sizeof(Elf64_Rela) <= rela.bytes.size(); off += sizeof(Elf64_Rela)) {
      const auto r = Load<Elf64_Rela>(rela.bytes, off);
      const uint32_t type = ELF64_R_TYPE(r.r_info);
      if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
      const uint32_t sym_index = ELF64_R_SYM(r.r_info);
      if (sym_index == 0) continue;
      auto known = by_symbol.find(sym_index);
      if (known == by_symbol.end()) {
        const size_t sym_off = size_t{sym_index} * sizeof(Elf64_Sym);
        if (sym_off + sizeof(Elf64_Sym) > dynsym.bytes.size()) continue;
        const auto sym = Load<Elf64_Sym>(dynsym.bytes, sym_off);
        if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC && ELF64_ST_TYPE(sym.st_info) != STT_NOTYPE) continue;
        if (sym.st_name >= strtab.bytes.size()) continue;
        const char* start = reinterpret_cast<const char*>(strtab.bytes.data()) + sym.st_name;
        const size_t len = strnlen(start, strtab.bytes.size() - sym.st_name);
        if (len == 0 || sym.st_name + len == strtab.bytes.size()) continue;  // empty or unterminated
        std::string_view name(start, len);
        if (keep && !keep(name)) continue;
        names.emplace_back(name);
        known = by_symbol.emplace(sym_index, static_cast<uint32_t>(names.size() - 1)).first;
      }
      slots.emplace(r.r_offset, known->second);
    }
  }
  return slots;
}

// PLT stub start vaddr → index into names: each stub is an indirect jump
// through its GOT slot, `ff 25 disp32` (with a `f2` BND prefix and an
// `endbr64` before it when built with -fcf-protection).
std::unordered_map<uint64_t, uint32_t> PltStubs(std::span<const SectionView> sections,
                                                const std::unordered_map<uint64_t, uint32_t>& slots) {
  static constexpr uint8_t kEndbr64[] = {0xf3, 0x0f, 0x1e, 0xfa};
  std::unordered_map<uint64_t, uint32_t> stubs;
  for (const SectionView& s : sections) {
    if (!IsPltSection(s.name) || s.bytes.size() < 6) continue;
    for (size_t p = 0; p + 6 <= s.bytes.size(); ++p) {
      if (s.bytes[p] != 0xff || s.bytes[p + 1] != 0x25) continue;
      const uint64_t slot = s.addr + p + 6 + static_cast<int64_t>(Load<int32_t>(s.bytes, p + 2));
      auto it = slots.find(slot);
      if (it == slots.end()) continue;
      size_t start = p;
      if (start >= 1 && s.bytes[start - 1] == 0xf2) --start;
      if (start >= 4 && std::memcmp(s.bytes.data() + start - 4, kEndbr64, 4) == 0) start -= 4;
      stubs.emplace(s.addr + start, it->second);
    }
  }
  return stubs;
}

}  // namespace

std::optional<std::string_view> ImportCalls::CalleeAt(uint64_t return_vaddr) const {
  auto it = std::lower_bound(sites.begin(), sites.end(), std::make_pair(return_vaddr, uint32_t{0}));
  if (it == sites.end() || it->first != return_vaddr) return std::nullopt;
  return names[it->second];
}

ImportCalls FindImportCalls(std::span<const SectionView> sections, const std::function<bool(std::string_view)>& keep,
                            const std::function<std::span<const uint8_t>(size_t index)>& code) {
  ImportCalls out;
  const auto slots = ImportSlots(sections, keep, out.names);
  if (slots.empty()) return out;
  const auto stubs = PltStubs(sections, slots);
  for (size_t i = 0; i < sections.size(); ++i) {
    const SectionView& s = sections[i];
    if (!s.exec || IsPltSection(s.name)) continue;
    const std::span<const uint8_t> bytes = code ? code(i) : s.bytes;
    const size_t size = bytes.size();
    for (size_t p = 0; p + 5 <= size; ++p) {
      if (bytes[p] == 0xe8) {  // call rel32
        const uint64_t ret = s.addr + p + 5;
        auto it = stubs.find(ret + static_cast<int64_t>(Load<int32_t>(bytes, p + 1)));
        if (it != stubs.end()) out.sites.emplace_back(ret, it->second);
      } else if (bytes[p] == 0xff && p + 6 <= size && bytes[p + 1] == 0x15) {  // call *disp32(%rip)
        const uint64_t ret = s.addr + p + 6;
        auto it = slots.find(ret + static_cast<int64_t>(Load<int32_t>(bytes, p + 2)));
        if (it != slots.end()) out.sites.emplace_back(ret, it->second);
      }
    }
  }
  std::sort(out.sites.begin(), out.sites.end());
  out.sites.erase(
      std::unique(out.sites.begin(), out.sites.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
      out.sites.end());
  // Names no site calls are dropped.
  std::vector<uint32_t> remap(out.names.size(), UINT32_MAX);
  std::vector<std::string> used;
  for (auto& [ret, index] : out.sites) {
    if (remap[index] == UINT32_MAX) {
      remap[index] = static_cast<uint32_t>(used.size());
      used.push_back(std::move(out.names[index]));
    }
    index = remap[index];
  }
  out.names = std::move(used);
  return out;
}

}  // namespace tlsprof::symbols
