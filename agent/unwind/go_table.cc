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
#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {
namespace {

struct ElfCloser {
  void operator()(Elf* e) const { elf_end(e); }
};
using ElfPtr = std::unique_ptr<Elf, ElfCloser>;

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
  std::span<const uint8_t> pclntab;
  for (const Section& s : sections) {
    if (s.name == ".gopclntab" || s.name == ".data.rel.ro.gopclntab") pclntab = s.bytes;
  }
  if (pclntab.empty()) {
    // Externally linked and stripped: the table is merged into .data.rel.ro.
    for (const Section& s : sections) {
      if (s.name != ".data.rel.ro") continue;
      if (auto off = symbols::FindGoPclntab(s.bytes)) pclntab = s.bytes.subspan(*off);
    }
  }
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
  // filled up to the end of .text). Found by tests/fuzz/eh_frame_fuzz.
  if (text != nullptr && (text->shdr.sh_addr > UINT32_MAX || text->shdr.sh_size > UINT32_MAX - text->shdr.sh_addr)) {
    return MakeError("{}: .text reaches beyond 4 GiB, which the 32-bit unwind rows cannot describe", display_path);
  }
  auto code_at = [&](uint64_t vaddr) -> std::span<const uint8_t> {
    for (const Section& s : sections) {
      if (!(s.shdr.sh_flags & SHF_EXECINSTR) || vaddr < s.shdr.sh_addr || vaddr - s.shdr.sh_addr >= s.bytes.size()) {
        continue;
      }
      return s.bytes.subspan(vaddr - s.shdr.sh_addr);
    }
    return {};
  };

  auto table = std::make_shared<UnwindTable>();
  std::vector<unwind_row>& rows = table->rows;
  auto add = [&](uint64_t pc, unwind_row row) {
    row.pc = static_cast<uint32_t>(pc);
    if (!rows.empty() && rows.back().pc == row.pc) rows.pop_back();
    if (!rows.empty()) {
      const unwind_row& b = rows.back();
      if (b.cfa_kind == row.cfa_kind && b.rbp_kind == row.rbp_kind && b.cfa_off == row.cfa_off &&
          b.rbp_off == row.rbp_off && b.reg == row.reg && b.flags == row.flags && b.deref_add == row.deref_add) {
        return;
      }
    }
    rows.push_back(row);
  };
  auto none = [] {
    unwind_row r{};
    r.cfa_kind = CFA_NONE;
    r.rbp_kind = RBP_LOST;
    return r;
  };
  // Code outside every Go function: C linked in (cgo, boringcrypto's
  // BoringSSL) and the padding between functions. Its rows come from the
  // file's CFI where there is some, else the frame-pointer rule (what the
  // whole mapping used before), never from pcsp.
  std::shared_ptr<const UnwindTable> cfi;
  bool cfi_tried = false;
  auto fill_gap = [&](uint64_t start, uint64_t end) {
    unwind_row fp{};
    fp.cfa_kind = CFA_RBP;
    fp.cfa_off = 16;
    fp.rbp_kind = RBP_AT_CFA;
    fp.rbp_off = -16;
    constexpr uint64_t kPadding = 64;  // Go pads functions to 32 bytes
    if (end - start >= kPadding && !cfi_tried) {
      cfi_tried = true;
      if (auto built = BuildUnwindTable(fd, display_path); built.ok()) cfi = *built;
    }
    const unwind_row* r = cfi && end - start >= kPadding ? FindRow(*cfi, start) : nullptr;
    add(start, r != nullptr && r->cfa_kind != CFA_NONE ? *r : fp);
    if (r == nullptr) return;
    for (++r; r < cfi->rows.data() + cfi->rows.size() && r->pc < end; ++r) {
      add(r->pc, r->cfa_kind != CFA_NONE ? *r : fp);
      ++table->gap_cfi_rows;
    }
  };
  bool too_high = false;
  uint64_t last_end = 0;
  auto visited = symbols::ForEachGoFrame(
      pclntab, text_start,
      [&](uint64_t entry, uint64_t end, std::string_view name, std::span<const symbols::GoSpRange> sp) {
        if (end > UINT32_MAX) {
          too_high = true;
          return;
        }
        if (last_end == 0 && text != nullptr && entry > text->shdr.sh_addr) fill_gap(text->shdr.sh_addr, entry);
        if (last_end != 0 && entry > last_end) fill_gap(last_end, entry);
        last_end = std::max(last_end, end);
        ++table->fdes;
        const Special special = SpecialOf(name);
        if (special != Special::kNone) {
          unwind_row r{};
          if (special == Special::kEnd) {
            r.cfa_kind = CFA_END;
          } else {
            r.cfa_kind = CFA_RBP;
            r.cfa_off = 16;
            r.rbp_kind = RBP_AT_CFA;
            r.rbp_off = -16;
          }
          add(entry, r);
          ++table->cfi_rows;
          table->covered_bytes += end - entry;
          return;
        }
        if (sp.empty()) {
          add(entry, none());
          ++table->unsupported_rows;
          table->unsupported_bytes += end - entry;
          return;
        }
        uint64_t bp_saved_from = UINT64_MAX;  // RBP is in the frame's slot from this PC on
        for (const auto& range : sp) {
          if (bp_saved_from == UINT64_MAX && range.sp_delta > 0) {
            if (unsigned len = SavesFramePointer(code_at(range.start), range.sp_delta)) {
              bp_saved_from = range.start + len;
            }
          }
          // One row per range, and a second where the saved RBP appears.
          for (uint64_t pc : {range.start, bp_saved_from}) {
            if (pc < range.start || pc >= range.end) continue;
            unwind_row r{};
            if (range.sp_delta < 0 || range.sp_delta > INT32_MAX - 8) {
              r = none();
              ++table->unsupported_rows;
              table->unsupported_bytes += range.end - pc;
            } else {
              r.cfa_kind = CFA_RSP;
              r.cfa_off = static_cast<int32_t>(range.sp_delta + 8);
              const bool saved = pc >= bp_saved_from && range.sp_delta > 0;
              r.rbp_kind = saved ? RBP_AT_CFA : RBP_SAME;
              r.rbp_off = saved ? -16 : 0;
            }
            add(pc, r);
            ++table->cfi_rows;
          }
          table->covered_bytes += range.end - range.start;
        }
        if (sp.back().end < end) {  // the table stopped early
          add(sp.back().end, none());
          table->unsupported_bytes += end - sp.back().end;
        }
      });
  if (!visited) return MakeError("{}: {}", display_path, visited.error().message);
  if (too_high) {
    return MakeError("{}: Go code beyond 4 GiB, which the 32-bit unwind rows cannot describe", display_path);
  }
  if (last_end != 0 && text != nullptr && text->shdr.sh_addr + text->shdr.sh_size > last_end) {
    fill_gap(last_end, text->shdr.sh_addr + text->shdr.sh_size);
    last_end = text->shdr.sh_addr + text->shdr.sh_size;
  }
  if (last_end != 0) add(last_end, none());
  for (const unwind_row& row : rows) ++table->kind_rows[row.cfa_kind];
  return std::shared_ptr<const UnwindTable>(table);
}

}  // namespace tlsprof::unwind
