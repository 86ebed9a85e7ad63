#include "agent/symbols/go_pclntab.h"

#include <cstring>

namespace tlsprof::symbols {
namespace {

// The table's first word, by Go version.
struct Magic {
  uint32_t value;
  GoPclntabVersion version;
};
constexpr Magic kMagics[] = {{0xfffffffb, GoPclntabVersion::kGo12},
                             {0xfffffffa, GoPclntabVersion::kGo116},
                             {0xfffffff0, GoPclntabVersion::kGo118},
                             {0xfffffff1, GoPclntabVersion::kGo120}};

// Bounds-checked reader over the table's bytes, in the table's byte order.
class Reader {
 public:
  Reader(std::span<const uint8_t> data, bool big_endian, uint8_t ptr_size)
      : data_(data), big_endian_(big_endian), ptr_size_(ptr_size) {}

  // Reads an unsigned integer of `size` (4 or 8) bytes at `off`.
  std::optional<uint64_t> Uint(uint64_t off, unsigned size) const {
    if (off > data_.size() || data_.size() - off < size) return std::nullopt;
    uint64_t v = 0;
    for (unsigned i = 0; i < size; ++i) {
      unsigned shift = big_endian_ ? (size - 1 - i) * 8 : i * 8;
      v |= static_cast<uint64_t>(data_[off + i]) << shift;
    }
    return v;
  }
  std::optional<uint64_t> U32(uint64_t off) const { return Uint(off, 4); }
  std::optional<uint64_t> Ptr(uint64_t off) const { return Uint(off, ptr_size_); }

  // NUL-terminated string at `off`, which must end inside the table.
  std::optional<std::string_view> CString(uint64_t off) const {
    if (off >= data_.size()) return std::nullopt;
    const auto* begin = reinterpret_cast<const char*>(data_.data() + off);
    const void* nul = std::memchr(begin, '\0', data_.size() - off);
    if (nul == nullptr) return std::nullopt;
    return std::string_view(begin, static_cast<const char*>(nul) - begin);
  }

 private:
  std::span<const uint8_t> data_;
  bool big_endian_;
  uint8_t ptr_size_;
};

// Size of one functab field: u32 offsets since Go 1.18, uintptr PCs before.
unsigned FieldSize(const GoPclntabHeader& h) { return h.version >= GoPclntabVersion::kGo118 ? 4 : h.ptr_size; }

// Decodes functions [0, limit) of the table; shared by the full walk and the
// cheap validation of candidates found by magic. With `check_func_entry`, each
// _func's own entry field must agree with the functab (a strong sign that a
// magic match is really a pclntab).
// Called per function with the offset of its _func in the table; returns
// false to stop the walk there.
using FuncVisitor = std::function<bool(uint64_t entry, uint64_t end, std::string_view name, uint64_t func)>;

Result<uint64_t> Walk(std::span<const uint8_t> data, const GoPclntabHeader& h, uint64_t text_start, uint64_t limit,
                      bool check_func_entry, const FuncVisitor* visit) {
  Reader r(data, h.big_endian, h.ptr_size);
  const unsigned fs = FieldSize(h);
  const bool relative = h.version >= GoPclntabVersion::kGo118;
  const uint64_t base = relative ? text_start : 0;
  // Before 1.16 names are offsets from the table start.
  const uint64_t names = h.version >= GoPclntabVersion::kGo116 ? h.funcname_offset : 0;
  const uint64_t functab = h.functab_offset;

  auto entry_at = [&](uint64_t i) -> std::optional<uint64_t> {
    auto v = r.Uint(functab + 2 * i * fs, fs);
    if (!v) return std::nullopt;
    return *v + base;
  };

  auto end_pc = entry_at(h.nfunc);  // the extra entry after the last function
  if (!end_pc) return MakeError("Go pclntab is truncated: no end PC after {} functions", h.nfunc);
  auto next = entry_at(0);
  if (!next) return MakeError("Go pclntab is truncated: functab at offset {:#x}", functab);

  uint64_t n = std::min(limit, h.nfunc);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t entry = *next;
    next = entry_at(i + 1);
    if (!next) return MakeError("Go pclntab is truncated: functab entry {}", i + 1);
    if (*next < entry) {
      return MakeError("Go pclntab is corrupt: function {} starts at {:#x}, before function {} at {:#x}", i + 1, *next,
                       i, entry);
    }
    auto funcoff = r.Uint(functab + (2 * i + 1) * fs, fs);
    if (!funcoff) return MakeError("Go pclntab is truncated: functab entry {}", i);
    uint64_t func = h.funcdata_offset + *funcoff;
    if (func < *funcoff) return MakeError("Go pclntab is corrupt: _func offset {:#x} overflows", *funcoff);
    uint64_t entry_size = relative ? 4 : h.ptr_size;
    if (check_func_entry) {
      auto own = r.Uint(func, static_cast<unsigned>(entry_size));
      if (!own || *own + base != entry) {
        return MakeError("Go pclntab is corrupt: _func {} entry does not match the functab", i);
      }
    }
    auto nameoff = r.U32(func + entry_size);
    if (!nameoff) return MakeError("Go pclntab is truncated: _func {} at offset {:#x}", i, func);
    auto name = r.CString(names + *nameoff);
    if (!name) {
      return MakeError("Go pclntab is corrupt: name of function {} at offset {:#x} is out of range", i,
                       names + *nameoff);
    }
    if (visit != nullptr && !(*visit)(entry, i + 1 == h.nfunc ? std::max(*end_pc, entry) : *next, *name, func)) {
      return i;
    }
  }
  return n;
}

}  // namespace

Result<GoPclntabHeader> ParseGoPclntabHeader(std::span<const uint8_t> data) {
  if (data.size() < 16) return MakeError("Go pclntab is too short ({} bytes)", data.size());
  GoPclntabHeader h;
  uint32_t le = static_cast<uint32_t>(data[0]) | static_cast<uint32_t>(data[1]) << 8 |
                static_cast<uint32_t>(data[2]) << 16 | static_cast<uint32_t>(data[3]) << 24;
  uint32_t be = static_cast<uint32_t>(data[3]) | static_cast<uint32_t>(data[2]) << 8 |
                static_cast<uint32_t>(data[1]) << 16 | static_cast<uint32_t>(data[0]) << 24;
  bool known = false;
  for (const Magic& m : kMagics) {
    if (le == m.value) h.version = m.version, known = true;
    if (be == m.value) h.version = m.version, known = true, h.big_endian = true;
  }
  if (!known) return MakeError("not a Go pclntab: unknown magic {:#010x}", le);
  h.quantum = data[6];
  h.ptr_size = data[7];
  if (data[4] != 0 || data[5] != 0 || (h.quantum != 1 && h.quantum != 2 && h.quantum != 4) ||
      (h.ptr_size != 4 && h.ptr_size != 8)) {
    return MakeError("not a Go pclntab: bad header (quantum {}, pointer size {})", h.quantum, h.ptr_size);
  }

  Reader r(data, h.big_endian, h.ptr_size);
  auto word = [&](unsigned i) { return r.Ptr(8 + uint64_t{i} * h.ptr_size); };
  auto offset = [&](unsigned i) -> Result<uint64_t> {
    auto v = word(i);
    if (!v) return MakeError("Go pclntab header is truncated");
    if (*v >= data.size()) {
      return MakeError("Go pclntab is corrupt: header offset {} ({:#x}) is beyond the table's {} bytes", i, *v,
                       data.size());
    }
    return *v;
  };
  auto nfunc = word(0);
  if (!nfunc) return MakeError("Go pclntab header is truncated");
  h.nfunc = *nfunc;
  if (h.version == GoPclntabVersion::kGo12) {
    h.functab_offset = 8 + uint64_t{h.ptr_size};
    h.funcdata_offset = 0;
    h.funcname_offset = 0;
  } else {
    // 1.16: nfunc, nfiles, then the offsets of funcnametab (2), cutab,
    // filetab, pctab (5) and pclntab (6). 1.18 puts textStart at word 2,
    // before them.
    unsigned shift = 0;
    if (h.version >= GoPclntabVersion::kGo118) {
      auto text = word(2);
      if (!text) return MakeError("Go pclntab header is truncated");
      h.text_start = *text;
      shift = 1;
    }
    auto names = offset(2 + shift);
    if (!names) return names.error();
    auto pctab = offset(5 + shift);
    if (!pctab) return pctab.error();
    h.pctab_offset = *pctab;
    auto pcln = offset(6 + shift);
    if (!pcln) return pcln.error();
    h.funcname_offset = *names;
    h.functab_offset = h.funcdata_offset = *pcln;
  }
  // The functab (nfunc + 1 pairs) must fit, which also caps nfunc by the
  // table's size before anything is sized from it.
  uint64_t functab = h.functab_offset;
  uint64_t pair = 2ull * FieldSize(h);
  uint64_t room = data.size() > functab ? data.size() - functab : 0;
  if (h.nfunc >= room / pair) {
    return MakeError("Go pclntab is corrupt: {} functions do not fit in {} bytes", h.nfunc, room);
  }
  return h;
}

Result<uint64_t> ForEachGoFunction(std::span<const uint8_t> data, uint64_t text_start, const GoFunctionVisitor& visit) {
  auto h = ParseGoPclntabHeader(data);
  if (!h) return h.error();
  uint64_t base = h->text_start != 0 ? h->text_start : text_start;
  FuncVisitor v = [&](uint64_t entry, uint64_t end, std::string_view name, uint64_t) {
    visit(entry, end, name);
    return true;
  };
  return Walk(data, *h, base, UINT64_MAX, /*check_func_entry=*/false, &v);
}

namespace {

// Unsigned LEB128-style varint as the runtime writes pc-value tables.
std::optional<uint32_t> ReadVarint(std::span<const uint8_t> data, uint64_t* off) {
  uint32_t v = 0;
  for (unsigned shift = 0; shift < 35; shift += 7) {
    if (*off >= data.size()) return std::nullopt;
    uint8_t b = data[(*off)++];
    v |= static_cast<uint32_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  return std::nullopt;
}

// Decodes one pc-value table starting at `off` for a function at [entry,
// end) into `out` (runtime/symtab.go step(): value starts at -1, each step
// adds a zig-zag value delta, then advances the pc by delta * quantum; a
// zero value delta after the first step ends the table). Each step moves
// the pc forward, so the work is bounded by the function's size; it stops
// after `max_ranges` ranges (false then).
bool DecodePcValue(std::span<const uint8_t> data, uint64_t off, uint64_t entry, uint64_t end, uint8_t quantum,
                   uint64_t max_ranges, std::vector<GoSpRange>* out) {
  out->clear();
  int64_t value = -1;
  uint64_t pc = entry;
  for (bool first = true; pc < end; first = false) {
    if (out->size() == max_ranges) return false;
    if (off >= data.size()) break;
    if (data[off] == 0 && !first) break;
    auto uv = ReadVarint(data, &off);
    if (!uv) break;
    value += static_cast<int32_t>(-(*uv & 1) ^ (*uv >> 1));
    auto pcdelta = ReadVarint(data, &off);
    if (!pcdelta || *pcdelta == 0) break;
    uint64_t next = std::min<uint64_t>(end, pc + uint64_t{*pcdelta} * quantum);
    out->push_back(GoSpRange{pc, next, value});
    pc = next;
  }
  return true;
}

}  // namespace

Result<uint64_t> ForEachGoFrame(std::span<const uint8_t> data, uint64_t text_start, const GoFrameVisitor& visit) {
  return ForEachGoFrame(data, text_start, visit, UINT64_MAX, nullptr);
}

Result<uint64_t> ForEachGoFrame(std::span<const uint8_t> data, uint64_t text_start, const GoFrameVisitor& visit,
                                uint64_t max_ranges, bool* over_cap) {
  if (over_cap != nullptr) *over_cap = false;
  auto h = ParseGoPclntabHeader(data);
  if (!h) return h.error();
  uint64_t base = h->text_start != 0 ? h->text_start : text_start;
  Reader r(data, h->big_endian, h->ptr_size);
  // _func.pcsp follows entry, nameoff, args and deferreturn (or frame).
  const uint64_t pcsp_field = (h->version >= GoPclntabVersion::kGo118 ? 4 : h->ptr_size) + 12;
  std::vector<GoSpRange> ranges;
  uint64_t left = max_ranges;  // ranges the rest of the walk may decode
  FuncVisitor v = [&](uint64_t entry, uint64_t end, std::string_view name, uint64_t func) {
    ranges.clear();
    auto pcsp = r.U32(func + pcsp_field);
    if (pcsp && *pcsp != 0 && !DecodePcValue(data, h->pctab_offset + *pcsp, entry, end, h->quantum, left, &ranges)) {
      if (over_cap != nullptr) *over_cap = true;
      return false;
    }
    left -= ranges.size();
    visit(entry, end, name, ranges);
    return true;
  };
  return Walk(data, *h, base, UINT64_MAX, /*check_func_entry=*/false, &v);
}

std::optional<size_t> FindGoPclntab(std::span<const uint8_t> region) {
  // pcHeader is pointer-aligned; scanning 4-byte steps also covers 32-bit Go.
  for (size_t off = 0; off + 16 <= region.size(); off += 4) {
    uint8_t b0 = region[off];
    if (b0 != 0xf0 && b0 != 0xf1 && b0 != 0xfa && b0 != 0xfb && b0 != 0xff) continue;
    auto candidate = region.subspan(off);
    auto h = ParseGoPclntabHeader(candidate);
    if (!h || h->nfunc == 0) continue;
    // textStart may be unrelocated (0); entries are then checked relative to 0,
    // which is enough to match functab against _func.
    if (Walk(candidate, *h, h->text_start, 16, /*check_func_entry=*/true, nullptr)) return off;
  }
  return std::nullopt;
}

}  // namespace tlsprof::symbols
