// Unwind rows for Go binaries from the pclntab's pcsp tables.
//
// Every Go function's pclntab entry has a pcsp table: for each PC range, how
// far SP is below its value at entry. The runtime's own tracebacks and the
// garbage collector's stack scan rely on it, so it is exact at every
// instruction, also inside assembly (the assembler records its PUSHes and
// SUBs), and it is there in stripped binaries (-ldflags=-s -w), which keep
// the pclntab but drop .debug_frame. Frame pointers are not: Go's assembly
// uses RBP as a general register (crypto/internal/nistec's p256 code, SHA-1,
// SHA-256, ChaCha20-Poly1305) and frameless leaves (memmove, the p256 field
// helpers) do not push it, so a frame-pointer walk from there loses or skips
// the frames that say which operation is running.
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>

#include "agent/guard/limits.h"
#include "agent/symbols/go_pclntab.h"
#include "agent/symbols/x86_elf.h"
#include "agent/unwind/row_builder.h"
#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {
namespace {

// A section's header; its bytes are read only for the pclntab (ReadSection)
// and a few code bytes per function (CodeAt).
struct Section {
  std::string_view name;
  GElf_Shdr shdr{};
  Elf_Scn* scn = nullptr;
  size_t index = 0;  // in guard::ElfFile::sections()
};

std::vector<Section> Sections(const guard::ElfFile& elf) {
  std::vector<Section> out;
  for (const guard::ElfSection& es : elf.sections()) {
    if (es.index == 0) continue;
    Section s;
    s.scn = es.scn;
    s.shdr = es.shdr;
    s.name = es.name;
    s.index = es.index;
    out.push_back(s);
  }
  return out;
}

// The bytes of one section, read through the guarded ELF opener (which
// refuses, counted, a section over guard::kMaxSectionBytes). Empty for
// SHT_NOBITS, compressed or unreadable sections; an Error over the cap.
Result<std::span<const uint8_t>> ReadSection(const guard::ElfFile& elf, const Section& s,
                                             std::string_view display_path) {
  if (s.shdr.sh_type == SHT_NOBITS || (s.shdr.sh_flags & SHF_COMPRESSED) || s.shdr.sh_size == 0) {
    return std::span<const uint8_t>{};
  }
  if (s.shdr.sh_size > guard::kMaxSectionBytes) {
    guard::Refuse(guard::Reason::kSectionSize, display_path,
                  fmt::format("{} has {} bytes, over the cap of {}", s.name, s.shdr.sh_size, guard::kMaxSectionBytes));
    return MakeError("{}: {} has {} bytes, more than the {} a pclntab may have; stacks fall back to frame pointers",
                     display_path, s.name, s.shdr.sh_size, guard::kMaxSectionBytes);
  }
  auto bytes = elf.SectionBytes(elf.sections()[s.index]);
  if (!bytes) return std::span<const uint8_t>{};  // reaches past the end of the file, or unreadable
  return *bytes;
}

// Functions whose frame is not where pcsp says, because they switch stacks.
// systemstack, morestack and asmcgocall move SP to the thread's g0 stack and call a
// function there; RBP still holds the goroutine's frame pointer (the Go
// prologue saves it in the callee's frame), so the walk leaves the g0 stack
// through it and resumes in the goroutine stack at the caller's frame (the
// frame of systemstack's caller itself is skipped: its return address is
// only in g.sched). The others start or end a stack: nothing is above them.
enum class Special { kNone, kFramePointer, kEnd };
struct SpecialFunction {
  std::string_view name;
  Special kind;
};
constexpr SpecialFunction kSpecial[] = {
    {"runtime.systemstack", Special::kFramePointer},
    {"runtime.morestack", Special::kFramePointer},
    {"runtime.asmcgocall", Special::kFramePointer},  // cgo: C code runs on g0 too
    {"runtime.goexit", Special::kEnd},
    {"runtime.mstart", Special::kEnd},
    {"runtime.rt0_go", Special::kEnd},
    {"runtime.mcall", Special::kEnd},  // its function runs on g0 and never returns
};

Special SpecialOf(std::string_view name) {
  for (const auto& s : kSpecial) {
    if (s.name == name) return s.kind;
  }
  return Special::kNone;
}

// Where the function saved the caller's RBP: Go's amd64 prologue is
// SUBQ $n, SP; MOVQ BP, n-8(SP); LEAQ n-8(SP), BP. `code` starts at the
// first instruction with SP lowered by `delta` (== n). Returns the length of
// the MOVQ (so the slot holds RBP from the next instruction on), or 0.
unsigned SavesFramePointer(std::span<const uint8_t> code, int64_t delta) {
  const int64_t disp = delta - 8;
  if (code.size() >= 5 && code[0] == 0x48 && code[1] == 0x89 && code[2] == 0x6c && code[3] == 0x24 && disp >= 0 &&
      disp < 128 && code[4] == disp) {
    return 5;  // MOVQ BP, disp8(SP)
  }
  if (code.size() >= 8 && code[0] == 0x48 && code[1] == 0x89 && code[2] == 0xac && code[3] == 0x24) {
    uint32_t d;
    std::memcpy(&d, &code[4], 4);
    if (disp >= 0 && d == disp) return 8;  // MOVQ BP, disp32(SP)
  }
  return 0;
}

// The pclntab: its own section, else (externally linked and stripped)
// merged into .data.rel.ro. Empty: none.
Result<std::span<const uint8_t>> FindPclntab(const guard::ElfFile& elf, const std::vector<Section>& sections,
                                             std::string_view display_path) {
  std::span<const uint8_t> pclntab;
  for (const Section& s : sections) {
    if (s.name != ".gopclntab" && s.name != ".data.rel.ro.gopclntab") continue;
    auto bytes = ReadSection(elf, s, display_path);
    if (!bytes) return bytes.error();
    pclntab = *bytes;
  }
  if (!pclntab.empty()) return pclntab;
  for (const Section& s : sections) {
    if (s.name != ".data.rel.ro") continue;
    auto bytes = ReadSection(elf, s, display_path);
    if (!bytes) return bytes.error();
    if (auto off = symbols::FindGoPclntab(*bytes)) pclntab = bytes->subspan(*off);
  }
  return pclntab;
}

// The rows of a Go binary, function by function in address order
// (symbols::ForEachGoFrame), with the gaps between functions and around
// them filled.
class GoRows {
 public:
  GoRows(const guard::ElfFile& elf, std::string_view display_path, const std::vector<Section>& sections,
         const Section* text, UnwindTable& table)
      : elf_(elf), display_path_(display_path), sections_(sections), text_(text), table_(table), rows_(&table) {}

  // One Go function [entry, end) and its pcsp ranges; the gap before it
  // first.
  void AddFunction(uint64_t entry, uint64_t end, std::string_view name, std::span<const symbols::GoSpRange> sp) {
    if (over_cap_ || table_.cfi_rows >= guard::kMaxRowsPerImage) {
      over_cap_ = true;  // the table will be refused: nothing more is worth adding
      return;
    }
    if (last_end_ == 0 && text_ != nullptr && entry > text_->shdr.sh_addr) FillGap(text_->shdr.sh_addr, entry);
    if (last_end_ != 0 && entry > last_end_) FillGap(last_end_, entry);
    last_end_ = std::max(last_end_, end);
    ++table_.fdes;
    const Special special = SpecialOf(name);
    if (special != Special::kNone) {
      rows_.Add(entry, special == Special::kEnd ? EndRow() : FramePointerRow());
      ++table_.cfi_rows;
      table_.covered_bytes += end - entry;
      return;
    }
    if (sp.empty()) {
      rows_.AddNone(entry);
      ++table_.unsupported_rows;
      table_.unsupported_bytes += end - entry;
      return;
    }
    AddPcsp(sp);
    if (sp.back().end < end) {  // the table stopped early
      rows_.AddNone(sp.back().end);
      table_.unsupported_bytes += end - sp.back().end;
    }
  }

  // The rest of .text after the last function, and the row that ends the
  // table.
  void Finish() {
    if (last_end_ != 0 && text_ != nullptr && text_->shdr.sh_addr + text_->shdr.sh_size > last_end_) {
      FillGap(last_end_, text_->shdr.sh_addr + text_->shdr.sh_size);
      last_end_ = text_->shdr.sh_addr + text_->shdr.sh_size;
    }
    if (last_end_ != 0) rows_.AddNone(last_end_);
    rows_.Finish();
  }

  // More rows than guard::kMaxRowsPerImage were described.
  bool over_cap() const { return over_cap_; }

 private:
  static unwind_row EndRow() {
    unwind_row r{};
    r.cfa_kind = CFA_END;
    return r;
  }

  // Up to 8 bytes of code at `vaddr` (fewer at the end of its executable
  // section, none outside one), read from the file: enough for the prologue
  // instruction SavesFramePointer looks for.
  struct Code {
    std::array<uint8_t, 8> bytes{};
    size_t size = 0;
    std::span<const uint8_t> span() const { return {bytes.data(), size}; }
  };
  Code CodeAt(uint64_t vaddr) const {
    Code code;
    for (const Section& s : sections_) {
      const GElf_Shdr& h = s.shdr;
      if (!(h.sh_flags & SHF_EXECINSTR) || h.sh_type == SHT_NOBITS || vaddr < h.sh_addr ||
          vaddr - h.sh_addr >= h.sh_size) {
        continue;
      }
      const size_t want = std::min<uint64_t>(code.bytes.size(), h.sh_size - (vaddr - h.sh_addr));
      auto got = elf_.Read(h.sh_offset + (vaddr - h.sh_addr), want, code.bytes.size(), "a prologue");
      code.size = got ? got->size() : 0;
      if (got) std::copy(got->begin(), got->end(), code.bytes.begin());
      break;
    }
    return code;
  }

  // CFA = RSP + delta + 8 over each pcsp range; the caller's RBP from the
  // slot the prologue saves it in, once it is there (a second row at that
  // PC).
  void AddPcsp(std::span<const symbols::GoSpRange> sp) {
    uint64_t bp_saved_from = UINT64_MAX;  // RBP is in the frame's slot from this PC on
    for (const auto& range : sp) {
      if (bp_saved_from == UINT64_MAX && range.sp_delta > 0) {
        if (unsigned len = SavesFramePointer(CodeAt(range.start).span(), range.sp_delta)) {
          bp_saved_from = range.start + len;
        }
      }
      for (uint64_t pc : {range.start, bp_saved_from}) {
        if (pc < range.start || pc >= range.end) continue;
        unwind_row r{};
        if (range.sp_delta < 0 || range.sp_delta > INT32_MAX - 8) {
          r = NoneRow();
          ++table_.unsupported_rows;
          table_.unsupported_bytes += range.end - pc;
        } else {
          r.cfa_kind = CFA_RSP;
          r.cfa_off = static_cast<int32_t>(range.sp_delta + 8);
          const bool saved = pc >= bp_saved_from && range.sp_delta > 0;
          r.rbp_kind = saved ? RBP_AT_CFA : RBP_SAME;
          r.rbp_off = saved ? -16 : 0;
        }
        rows_.Add(pc, r);
        ++table_.cfi_rows;
      }
      table_.covered_bytes += range.end - range.start;
    }
  }

  // Code outside every Go function: C linked in (cgo, boringcrypto's
  // BoringSSL) and the padding between functions. Its rows come from the
  // file's CFI where there is some, else the frame-pointer rule, never from
  // pcsp. The CFI table is built at the first gap wider than padding.
  void FillGap(uint64_t start, uint64_t end) {
    constexpr uint64_t kPadding = 64;  // Go pads functions to 32 bytes
    if (end - start >= kPadding && !cfi_tried_) {
      cfi_tried_ = true;
      if (auto built = BuildUnwindTable(elf_, display_path_); built.ok()) cfi_ = *built;
    }
    const unwind_row fp = FramePointerRow();
    const unwind_row* r = cfi_ && end - start >= kPadding ? FindRow(*cfi_, start) : nullptr;
    rows_.Add(start, r != nullptr && r->cfa_kind != CFA_NONE ? *r : fp);
    if (r == nullptr) return;
    for (++r; r < cfi_->rows.data() + cfi_->rows.size() && r->pc < end; ++r) {
      rows_.Add(r->pc, r->cfa_kind != CFA_NONE ? *r : fp);
      ++table_.gap_cfi_rows;
    }
  }

  const guard::ElfFile& elf_;
  std::string_view display_path_;
  const std::vector<Section>& sections_;
  const Section* text_;
  UnwindTable& table_;
  RowBuilder rows_;
  uint64_t last_end_ = 0;
  std::shared_ptr<const UnwindTable> cfi_;
  bool cfi_tried_ = false;
  bool over_cap_ = false;
};

}  // namespace

Result<std::shared_ptr<const UnwindTable>> BuildGoUnwindTable(int fd, std::string_view display_path) {
  auto file = guard::OpenHostFile(fmt::format("/proc/self/fd/{}", fd));
  if (!file) return MakeError("{}: {}", display_path, file.error().message);
  auto elf = guard::ElfFile::Open(*file);
  if (!elf) return MakeError("{}: {}", display_path, elf.error().message);
  return BuildGoUnwindTable(*elf, display_path);
}

Result<std::shared_ptr<const UnwindTable>> BuildGoUnwindTable(const guard::ElfFile& elf,
                                                              std::string_view display_path) {
  if (!elf.is64() || elf.ehdr().e_machine != EM_X86_64) {
    return MakeError("{}: not an x86-64 ELF file; only x86-64 stacks can be unwound", display_path);
  }
  const std::vector<Section> sections = Sections(elf);
  auto found = FindPclntab(elf, sections, display_path);
  if (!found) return found.error();
  const std::span<const uint8_t> pclntab = *found;
  if (pclntab.empty()) return MakeError("{}: no Go pclntab", display_path);
  auto header = symbols::ParseGoPclntabHeader(pclntab);
  if (!header) return MakeError("{}: {}", display_path, header.error().message);
  uint64_t text_start = header->text_start;
  const Section* text = nullptr;
  for (const Section& s : sections) {
    if (s.name == ".text") text = &s;
  }
  // A position-independent binary stores 0 there; runtime.text starts .text
  // when Go links internally (an external link's PIE is not handled).
  if (text_start == 0 && text != nullptr) text_start = text->shdr.sh_addr;
  // Rows hold 32-bit PCs: a .text reaching past 4 GiB would give the rows of
  // its tail truncated, unsorted PCs (the gap after the last function is
  // filled up to the end of .text).
  if (text != nullptr && (text->shdr.sh_addr > UINT32_MAX || text->shdr.sh_size > UINT32_MAX - text->shdr.sh_addr)) {
    return MakeError("{}: .text reaches beyond 4 GiB, which the 32-bit unwind rows cannot describe", display_path);
  }

  auto table = std::make_shared<UnwindTable>();
  GoRows rows(elf, display_path, sections, text, *table);
  bool too_high = false;
  // The pcsp decoding is bounded by each function's size (every step moves
  // the pc forward) and, over the whole walk, by the row cap: a table whose
  // functions all share one long pcsp table would otherwise describe as many
  // rows as the text has bytes.
  bool over_cap = false;
  auto visited = symbols::ForEachGoFrame(
      pclntab, text_start,
      [&](uint64_t entry, uint64_t end, std::string_view name, std::span<const symbols::GoSpRange> sp) {
        if (end > UINT32_MAX) {
          too_high = true;
          return;
        }
        rows.AddFunction(entry, end, name, sp);
      },
      guard::kMaxRowsPerImage, &over_cap);
  if (over_cap || rows.over_cap()) {
    guard::Refuse(guard::Reason::kPclntabRows, display_path,
                  fmt::format("the pclntab's pcsp tables describe more than {} rows; its stacks are walked by frame "
                              "pointers",
                              guard::kMaxRowsPerImage));
    return MakeError(
        "{}: the Go pclntab describes more than {} unwind rows (refused); stacks fall back to frame pointers",
        display_path, guard::kMaxRowsPerImage);
  }
  if (!visited) return MakeError("{}: {}", display_path, visited.error().message);
  if (too_high) {
    return MakeError("{}: Go code beyond 4 GiB, which the 32-bit unwind rows cannot describe", display_path);
  }
  rows.Finish();
  return std::shared_ptr<const UnwindTable>(table);
}

}  // namespace tlsprof::unwind
