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
#include <cstring>
#include <memory>
#include <string_view>

#include "agent/symbols/go_pclntab.h"
#include "agent/symbols/x86_elf.h"
#include "agent/unwind/row_builder.h"
#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {
namespace {

using symbols::ElfPtr;

struct Section {
  std::string_view name;
  GElf_Shdr shdr{};
  std::span<const uint8_t> bytes;  // empty for SHT_NOBITS or unreadable
};

std::vector<Section> Sections(Elf* elf) {
  std::vector<Section> out;
  size_t shstrndx;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return out;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    Section s;
    if (!gelf_getshdr(scn, &s.shdr)) continue;
    const char* n = elf_strptr(elf, shstrndx, s.shdr.sh_name);
    s.name = n ? n : "";
    if (s.shdr.sh_type != SHT_NOBITS && !(s.shdr.sh_flags & SHF_COMPRESSED)) {
      if (Elf_Data* d = elf_getdata(scn, nullptr); d != nullptr && d->d_buf != nullptr) {
        s.bytes = {static_cast<const uint8_t*>(d->d_buf), d->d_size};
      }
    }
    out.push_back(s);
  }
  return out;
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
std::span<const uint8_t> FindPclntab(const std::vector<Section>& sections) {
  std::span<const uint8_t> pclntab;
  for (const Section& s : sections) {
    if (s.name == ".gopclntab" || s.name == ".data.rel.ro.gopclntab") pclntab = s.bytes;
  }
  if (!pclntab.empty()) return pclntab;
  for (const Section& s : sections) {
    if (s.name != ".data.rel.ro") continue;
    if (auto off = symbols::FindGoPclntab(s.bytes)) pclntab = s.bytes.subspan(*off);
  }
  return pclntab;
}

// The rows of a Go binary, function by function in address order
// (symbols::ForEachGoFrame), with the gaps between functions and around
// them filled.
class GoRows {
 public:
  GoRows(int fd, std::string_view display_path, const std::vector<Section>& sections, const Section* text,
         UnwindTable& table)
      : fd_(fd), display_path_(display_path), sections_(sections), text_(text), table_(table), rows_(&table) {}

  // One Go function [entry, end) and its pcsp ranges; the gap before it
  // first.
  void AddFunction(uint64_t entry, uint64_t end, std::string_view name, std::span<const symbols::GoSpRange> sp) {
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

 private:
  static unwind_row EndRow() {
    unwind_row r{};
    r.cfa_kind = CFA_END;
    return r;
  }

  // The code at `vaddr` to the end of its executable section; empty if none.
  std::span<const uint8_t> CodeAt(uint64_t vaddr) const {
    for (const Section& s : sections_) {
      if (!(s.shdr.sh_flags & SHF_EXECINSTR) || vaddr < s.shdr.sh_addr || vaddr - s.shdr.sh_addr >= s.bytes.size()) {
        continue;
      }
      return s.bytes.subspan(vaddr - s.shdr.sh_addr);
    }
    return {};
  }

  // CFA = RSP + delta + 8 over each pcsp range; the caller's RBP from the
  // slot the prologue saves it in, once it is there (a second row at that
  // PC).
  void AddPcsp(std::span<const symbols::GoSpRange> sp) {
    uint64_t bp_saved_from = UINT64_MAX;  // RBP is in the frame's slot from this PC on
    for (const auto& range : sp) {
      if (bp_saved_from == UINT64_MAX && range.sp_delta > 0) {
        if (unsigned len = SavesFramePointer(CodeAt(range.start), range.sp_delta)) {
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
      if (auto built = BuildUnwindTable(fd_, display_path_); built.ok()) cfi_ = *built;
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

  int fd_;
  std::string_view display_path_;
  const std::vector<Section>& sections_;
  const Section* text_;
  UnwindTable& table_;
  RowBuilder rows_;
  uint64_t last_end_ = 0;
  std::shared_ptr<const UnwindTable> cfi_;
  bool cfi_tried_ = false;
};

}  // namespace

Result<std::shared_ptr<const UnwindTable>> BuildGoUnwindTable(int fd, std::string_view display_path) {
  static const bool elf_ok = elf_version(EV_CURRENT) != EV_NONE;
  if (!elf_ok) return MakeError("{}: libelf is unusable (elf_version failed)", display_path);
  ElfPtr elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  GElf_Ehdr ehdr;
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF || !gelf_getehdr(elf.get(), &ehdr)) {
    return MakeError("{}: not an ELF file ({})", display_path, elf_errmsg(-1));
  }
  if (ehdr.e_ident[EI_CLASS] != ELFCLASS64 || ehdr.e_machine != EM_X86_64) {
    return MakeError("{}: not an x86-64 ELF file; only x86-64 stacks can be unwound", display_path);
  }
  const std::vector<Section> sections = Sections(elf.get());
  const std::span<const uint8_t> pclntab = FindPclntab(sections);
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
  GoRows rows(fd, display_path, sections, text, *table);
  bool too_high = false;
  auto visited = symbols::ForEachGoFrame(
      pclntab, text_start,
      [&](uint64_t entry, uint64_t end, std::string_view name, std::span<const symbols::GoSpRange> sp) {
        if (end > UINT32_MAX) {
          too_high = true;
          return;
        }
        rows.AddFunction(entry, end, name, sp);
      });
  if (!visited) return MakeError("{}: {}", display_path, visited.error().message);
  if (too_high) {
    return MakeError("{}: Go code beyond 4 GiB, which the 32-bit unwind rows cannot describe", display_path);
  }
  rows.Finish();
  return std::shared_ptr<const UnwindTable>(table);
}

}  // namespace tlsprof::unwind
