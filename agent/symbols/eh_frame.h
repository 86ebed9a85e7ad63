// Decoding helpers for DWARF call-frame information as .eh_frame stores it
// (LEB128, DW_EH_PE_* pointers, a CIE's augmentation). Shared by the unwind
// table builder (agent/unwind) and the static-archive symbol matcher
// (agent/symbols), which both walk FDEs. Pure functions; thread-safe.
#pragma once

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>

namespace tlsprof::eh {

// Reads an unsigned/signed LEB128; false if it runs past `end`.
inline bool ReadUleb(const uint8_t*& p, const uint8_t* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    uint8_t b = *p++;
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}
inline bool ReadSleb(const uint8_t*& p, const uint8_t* end, int64_t* out) {
  uint64_t v = 0;
  int shift = 0;
  for (; p < end && shift < 64;) {
    uint8_t b = *p++;
    v |= uint64_t(b & 0x7f) << shift;
    shift += 7;
    if (!(b & 0x80)) {
      if (shift < 64 && (b & 0x40)) v |= ~uint64_t{0} << shift;
      *out = int64_t(v);
      return true;
    }
  }
  return false;
}

// Reads the value part of a DW_EH_PE_* encoded pointer (no application).
inline bool ReadEncoded(const uint8_t*& p, const uint8_t* end, uint8_t enc, uint64_t* out) {
  auto fixed = [&](auto t) {
    using T = decltype(t);
    if (end - p < static_cast<ptrdiff_t>(sizeof(T))) return false;
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    *out = uint64_t(int64_t(v));  // sign-extends the signed forms
    if constexpr (std::is_unsigned_v<T>) *out = uint64_t(v);
    return true;
  };
  switch (enc & 0x0f) {
    case DW_EH_PE_absptr:
    case DW_EH_PE_udata8:
      return fixed(uint64_t{});
    case DW_EH_PE_sdata8:
      return fixed(int64_t{});
    case DW_EH_PE_udata2:
      return fixed(uint16_t{});
    case DW_EH_PE_sdata2:
      return fixed(int16_t{});
    case DW_EH_PE_udata4:
      return fixed(uint32_t{});
    case DW_EH_PE_sdata4:
      return fixed(int32_t{});
    case DW_EH_PE_uleb128:
      return ReadUleb(p, end, out);
    case DW_EH_PE_sleb128: {
      int64_t v;
      if (!ReadSleb(p, end, &v)) return false;
      *out = uint64_t(v);
      return true;
    }
    default:
      return false;
  }
}

// The FDE pointer encoding a CIE announces ('R' in a 'z' augmentation).
inline std::optional<uint8_t> CieFdeEncoding(const Dwarf_CIE& cie, bool eh_frame) {
  if (!eh_frame) return DW_EH_PE_absptr;  // .debug_frame: plain target addresses
  const char* aug = cie.augmentation;
  if (aug == nullptr || aug[0] == '\0') return DW_EH_PE_absptr;
  if (aug[0] != 'z') return std::nullopt;  // cannot find the FDE fields reliably
  const uint8_t* p = cie.augmentation_data;
  const uint8_t* end = p + cie.augmentation_data_size;
  uint8_t fde_enc = DW_EH_PE_absptr;
  for (const char* a = aug + 1; *a; ++a) {
    switch (*a) {
      case 'L':
        if (p >= end) return std::nullopt;
        ++p;
        break;
      case 'R':
        if (p >= end) return std::nullopt;
        fde_enc = *p++;
        break;
      case 'P': {
        if (p >= end) return std::nullopt;
        uint8_t enc = *p++;
        uint64_t ignored;
        if (!ReadEncoded(p, end, enc, &ignored)) return std::nullopt;
        break;
      }
      case 'S':
      case 'B':
        break;
      default:
        return std::nullopt;
    }
  }
  return fde_enc;
}

// One FDE as ForEachFdeEntry finds it.
struct FdeEntry {
  uint64_t start = 0;   // first code address it covers
  uint64_t length = 0;  // bytes of code it covers
  Dwarf_Off cie_offset = 0;
  // Its CFA program, [instructions, end), inside the section's data; null
  // when the FDE's augmentation data does not fit in it (the program cannot
  // be found).
  const uint8_t* instructions = nullptr;
  const uint8_t* end = nullptr;
};

// Calls fde(const FdeEntry&) for every FDE of a .eh_frame (eh_frame = true)
// or .debug_frame section whose data is `data` and whose address is
// `section_vaddr`. Entries that cannot be decoded (unknown CIE augmentation,
// indirect or data-relative pointers, bad bytes) are counted in *errors and
// skipped; the walk never reads outside `data`.
template <typename Fn>
void ForEachFdeEntry(Elf* elf, Elf_Data* data, bool eh_frame, uint64_t section_vaddr, uint64_t* errors, Fn&& fde) {
  const auto* ident = reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr));
  if (ident == nullptr || data == nullptr || data->d_buf == nullptr) return;
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  struct CieFacts {
    std::optional<uint8_t> encoding;  // nullopt: FDEs of this CIE cannot be read
    bool sized = false;               // 'z': FDEs carry a sized augmentation block
  };
  auto facts_of = [&](const Dwarf_CIE& cie) {
    return CieFacts{CieFdeEncoding(cie, eh_frame), cie.augmentation != nullptr && cie.augmentation[0] == 'z'};
  };
  std::map<Dwarf_Off, CieFacts> cies;
  auto cie_at = [&](Dwarf_Off cie_off) -> CieFacts {
    auto it = cies.find(cie_off);
    if (it != cies.end()) return it->second;
    Dwarf_CFI_Entry e;
    Dwarf_Off next = Dwarf_Off(-1);
    CieFacts facts;
    if (dwarf_next_cfi(ident, data, eh_frame, cie_off, &next, &e) == 0 && dwarf_cfi_cie_p(&e)) facts = facts_of(e.cie);
    cies.emplace(cie_off, facts);
    return facts;
  };
  Dwarf_Off off = 0;
  while (off < data->d_size) {
    Dwarf_CFI_Entry e;
    Dwarf_Off next = Dwarf_Off(-1);
    const int r = dwarf_next_cfi(ident, data, eh_frame, off, &next, &e);
    if (r > 0) break;
    if (r < 0) {
      ++*errors;
      if (next == Dwarf_Off(-1) || next <= off) break;
      off = next;
      continue;
    }
    if (dwarf_cfi_cie_p(&e)) {
      cies.emplace(off, facts_of(e.cie));
    } else {
      const CieFacts cie = cie_at(e.fde.CIE_pointer);
      const std::optional<uint8_t> enc = cie.encoding;
      const uint8_t* p = e.fde.start;
      uint64_t loc = 0, len = 0;
      if (!enc || *enc == DW_EH_PE_omit || (*enc & DW_EH_PE_indirect) || !ReadEncoded(p, e.fde.end, *enc, &loc) ||
          !ReadEncoded(p, e.fde.end, *enc & 0x0f, &len)) {
        ++*errors;
      } else {
        switch (*enc & 0x70) {
          case DW_EH_PE_absptr:
            break;
          case DW_EH_PE_pcrel:
            loc += section_vaddr + uint64_t(e.fde.start - base);
            break;
          default:  // datarel/textrel/funcrel: not used by x86-64 toolchains
            ++*errors;
            len = 0;
        }
        FdeEntry entry{loc, len, e.fde.CIE_pointer, p, e.fde.end};
        uint64_t aug_len = 0;
        if (cie.sized && (!ReadUleb(entry.instructions, entry.end, &aug_len) ||
                          aug_len > uint64_t(entry.end - entry.instructions))) {
          entry.instructions = entry.end = nullptr;
        } else if (cie.sized) {
          entry.instructions += aug_len;
        }
        if (len > 0 && loc + len > loc) fde(static_cast<const FdeEntry&>(entry));
      }
    }
    if (next <= off) break;
    off = next;
  }
}

// Calls fde(start, length) for every FDE, as ForEachFdeEntry finds them.
template <typename Fn>
void ForEachFde(Elf* elf, Elf_Data* data, bool eh_frame, uint64_t section_vaddr, uint64_t* errors, Fn&& fde) {
  ForEachFdeEntry(elf, data, eh_frame, section_vaddr, errors,
                  [&](const FdeEntry& entry) { fde(entry.start, entry.length); });
}

}  // namespace tlsprof::eh
