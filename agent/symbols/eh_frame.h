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

// Calls fde(start, length) for every FDE of a .eh_frame (eh_frame = true) or
// .debug_frame section whose data is `data` and whose address is
// `section_vaddr`. Entries that cannot be decoded (unknown CIE augmentation,
// indirect or data-relative pointers, bad bytes) are counted in *errors and
// skipped; the walk never reads outside `data`.
template <typename Fn>
void ForEachFde(Elf* elf, Elf_Data* data, bool eh_frame, uint64_t section_vaddr, uint64_t* errors, Fn&& fde) {
  const auto* ident = reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr));
  if (ident == nullptr || data == nullptr || data->d_buf == nullptr) return;
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  std::map<Dwarf_Off, std::optional<uint8_t>> cie_encoding;
  auto encoding_of = [&](Dwarf_Off cie_off) -> std::optional<uint8_t> {
    auto it = cie_encoding.find(cie_off);
    if (it != cie_encoding.end()) return it->second;
    Dwarf_CFI_Entry e;
    Dwarf_Off next = Dwarf_Off(-1);
    std::optional<uint8_t> enc;
    if (dwarf_next_cfi(ident, data, eh_frame, cie_off, &next, &e) == 0 && dwarf_cfi_cie_p(&e)) {
      enc = CieFdeEncoding(e.cie, eh_frame);
    }
    cie_encoding.emplace(cie_off, enc);
    return enc;
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
      cie_encoding.emplace(off, CieFdeEncoding(e.cie, eh_frame));
    } else {
      std::optional<uint8_t> enc = encoding_of(e.fde.CIE_pointer);
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
        if (len > 0 && loc + len > loc) fde(loc, len);
      }
    }
    if (next <= off) break;
    off = next;
  }
}

}  // namespace tlsprof::eh
