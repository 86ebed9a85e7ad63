// Decoding helpers for DWARF call-frame information as .eh_frame stores it
// (LEB128, DW_EH_PE_* pointers, a CIE's augmentation). Shared by the unwind
// table builder (agent/unwind) and the static-archive symbol matcher
// (agent/symbols), which both walk FDEs. Pure functions; thread-safe.
#pragma once

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
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

}  // namespace tlsprof::eh
