// The unwind table builder as it was before agent/unwind had its own CFI
// interpreter: the rows inside each FDE come from libdw's interpreter
// (dwarf_cfi_addrframe + dwarf_frame_info), one call per row. Kept for tests
// and benchmarks only, as the reference the production builder
// (unwind_table.cc) is compared with row for row: it is never linked into the
// agent, because libdw re-runs an FDE's program from its start at every row,
// reads every .debug_* section and maps the file.
#include "agent/unwind/reference_table.h"

#include "agent/symbols/eh_frame.h"
#include "agent/symbols/x86_elf.h"
#include "agent/unwind/row_builder.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

namespace tlsprof::unwind {
namespace {

constexpr int kRegRbp = 6;
constexpr int kRegRsp = 7;
constexpr int kRegRip = 16;

// Owners for the libdw handles (the libelf one is symbols::ElfPtr).
using symbols::ElfPtr;
using DwarfPtr = std::unique_ptr<Dwarf, decltype([](Dwarf* d) { dwarf_end(d); })>;
using CfiPtr = std::unique_ptr<Dwarf_CFI, decltype([](Dwarf_CFI* c) { dwarf_cfi_end(c); })>;

struct Interval {
  uint64_t start = 0, end = 0;
  int source = 0;  // index into the CFI list: 0 = .eh_frame, 1 = .debug_frame
};

Elf_Scn* FindSection(Elf* elf, const char* name, GElf_Shdr* shdr_out) {
  size_t shstrndx;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return nullptr;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (!gelf_getshdr(scn, &shdr)) continue;
    const char* n = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (n && std::strcmp(n, name) == 0 && shdr.sh_type != SHT_NOBITS) {
      *shdr_out = shdr;
      return scn;
    }
  }
  return nullptr;
}

// Appends the [start, end) of every FDE in a CFI section.
void CollectFdes(Elf* elf, const char* section, bool eh_frame, int source, std::vector<Interval>* out,
                 uint64_t* errors) {
  GElf_Shdr shdr;
  Elf_Scn* scn = FindSection(elf, section, &shdr);
  if (!scn) return;
  // Go and some toolchains compress .debug_frame (SHF_COMPRESSED); libelf
  // inflates it in place for us.
  if ((shdr.sh_flags & SHF_COMPRESSED) && elf_compress(scn, 0, 0) < 0) {
    ++*errors;
    return;
  }
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data || !data->d_buf || data->d_size == 0) return;
  eh::ForEachFde(elf, data, eh_frame, shdr.sh_addr, errors, [&](uint64_t start, uint64_t len) {
    out->push_back({start, start + len, source});
  });
}

int64_t Signed(Dwarf_Word w) { return static_cast<int64_t>(w); }
// "reg + off": libdw reports DW_CFA_def_cfa as DW_OP_bregx reg, off, while
// CFA expressions keep the DW_OP_bregN their producer wrote.
bool IsBreg(const Dwarf_Op& op, int reg, int64_t* off = nullptr) {
  if (op.atom == DW_OP_breg0 + reg) {
    if (off) *off = Signed(op.number);
    return true;
  }
  if (op.atom == DW_OP_bregx && op.number == Dwarf_Word(reg)) {
    if (off) *off = Signed(op.number2);
    return true;
  }
  return false;
}
bool Fits32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }
bool Fits16(int64_t v) { return v >= INT16_MIN && v <= INT16_MAX; }

// Maps libdw's CFA expression to a row kind; false if we do not model it.
bool MapCfa(const Dwarf_Op* ops, size_t nops, unwind_row* row) {
  int64_t off = 0;
  if (nops == 1 && (IsBreg(ops[0], kRegRsp, &off) || IsBreg(ops[0], kRegRbp, &off)) && Fits32(off)) {
    row->cfa_kind = IsBreg(ops[0], kRegRsp) ? CFA_RSP : CFA_RBP;
    row->cfa_off = int32_t(off);
    return true;
  }
  // "Any other GPR + off" (OpenSSL perlasm: rax, r9, rsi, r11 hold the
  // caller's RSP): only the sample's own registers give its value, so the
  // unwinders use it at the first frames only (see CFA_REG in unwind.h).
  if (nops == 1 && Fits32(Signed(ops[0].atom == DW_OP_bregx ? ops[0].number2 : ops[0].number))) {
    int reg = -1;
    if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg15) reg = ops[0].atom - DW_OP_breg0;
    if (ops[0].atom == DW_OP_bregx && ops[0].number < 16) reg = int(ops[0].number);
    if (reg >= 0 && reg != kRegRbp && reg != kRegRsp) {
      row->cfa_kind = CFA_REG;
      row->reg = uint8_t(reg);
      row->cfa_off = int32_t(Signed(ops[0].atom == DW_OP_bregx ? ops[0].number2 : ops[0].number));
      return true;
    }
  }
  // OpenSSL perlasm, `.cfi_cfa_expression %rsp+N,deref,+M`: the function
  // realigned its stack and keeps the caller's RSP in a stack slot.
  if ((nops == 2 || nops == 3) && IsBreg(ops[0], kRegRsp, &off) && ops[1].atom == DW_OP_deref && Fits32(off)) {
    int64_t add = 0;
    if (nops == 3) {
      if (ops[2].atom != DW_OP_plus_uconst) return false;
      add = Signed(ops[2].number);
    }
    if (!Fits16(add)) return false;
    row->cfa_kind = CFA_RSP_DEREF;
    row->cfa_off = int32_t(off);
    row->deref_add = int16_t(add);
    return true;
  }
  // perlasm's bn_mul_mont family, `.cfi_cfa_expression
  // %rsp+8,%r9,8,mul,plus,deref,+8`: the caller's RSP sits in a slot indexed
  // by the limb count.
  if ((nops == 6 || nops == 7) && IsBreg(ops[0], kRegRsp, &off) && Fits32(off) && ops[1].atom >= DW_OP_breg0 &&
      ops[1].atom <= DW_OP_breg15 && ops[1].number == 0 && ops[2].atom == DW_OP_lit8 && ops[3].atom == DW_OP_mul &&
      ops[4].atom == DW_OP_plus && ops[5].atom == DW_OP_deref) {
    const int reg = ops[1].atom - DW_OP_breg0;
    int64_t add = 0;
    if (nops == 7) {
      if (ops[6].atom != DW_OP_plus_uconst) return false;
      add = Signed(ops[6].number);
    }
    if (reg == kRegRsp || reg == kRegRbp || !Fits16(add)) return false;
    row->cfa_kind = CFA_RSP_REG_DEREF;
    row->reg = uint8_t(reg);
    row->cfa_off = int32_t(off);
    row->deref_add = int16_t(add);
    return true;
  }
  // The GNU ld PLT expression: CFA = RSP + 8 + ((RIP & 15) >= 11 ? 8 : 0).
  static constexpr uint8_t kPlt[] = {DW_OP_breg7, DW_OP_breg16, DW_OP_lit15, DW_OP_and, DW_OP_lit11,
                                     DW_OP_ge,    DW_OP_lit3,   DW_OP_shl,   DW_OP_plus};
  if (nops == std::size(kPlt) && ops[0].number == 8 && ops[1].number == 0) {
    bool same = true;
    for (size_t i = 0; i < nops; ++i) same = same && ops[i].atom == kPlt[i];
    if (same) {
      row->cfa_kind = CFA_PLT;
      row->cfa_off = 8;
      return true;
    }
  }
  return false;
}

// "Saved at CFA + off" as libdw spells it: DW_OP_call_frame_cfa, then an
// optional DW_OP_plus_uconst off (or DW_OP_consts off; DW_OP_plus).
std::optional<int64_t> CfaOffsetRule(const Dwarf_Op* ops, size_t nops) {
  if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa) return std::nullopt;
  if (nops == 1) return 0;
  if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) return Signed(ops[1].number);
  if (nops == 3 && ops[1].atom == DW_OP_consts && ops[2].atom == DW_OP_plus) return Signed(ops[1].number);
  return std::nullopt;
}

enum class RowResult { kOk, kUnsupported, kEnd };

RowResult MakeRow(Dwarf_Frame* frame, int ra_reg, unwind_row* row) {
  *row = {};
  row->rbp_kind = RBP_SAME;
  Dwarf_Op ops_mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  // Return address first: "undefined" marks the outermost frame (_start,
  // clone), which ends the stack whatever the CFA says.
  if (dwarf_frame_register(frame, ra_reg, ops_mem, &ops, &nops) != 0) return RowResult::kUnsupported;
  if (nops == 0 && ops == ops_mem) {
    row->cfa_kind = CFA_END;
    return RowResult::kEnd;
  }
  // The format assumes RA at CFA - 8 (every normal x86-64 frame). Signal
  // trampolines (__restore_rt) describe RA with an expression: unsupported.
  std::optional<int64_t> ra_off = CfaOffsetRule(ops, nops);
  if (!ra_off || *ra_off != -8) return RowResult::kUnsupported;

  if (dwarf_frame_cfa(frame, &ops, &nops) != 0 || nops == 0 || !MapCfa(ops, nops, row)) {
    return RowResult::kUnsupported;
  }

  if (dwarf_frame_register(frame, kRegRbp, ops_mem, &ops, &nops) != 0) {
    row->rbp_kind = RBP_LOST;
  } else if (nops == 0) {
    // same_value (ops null) or undefined (ops == ops_mem, libdw's default
    // for an unmentioned register at function entry): RBP is still the
    // caller's.
    row->rbp_kind = RBP_SAME;
  } else if (std::optional<int64_t> off = CfaOffsetRule(ops, nops); off && Fits16(*off)) {
    row->rbp_kind = RBP_AT_CFA;
    row->rbp_off = int16_t(*off);
  } else {
    row->rbp_kind = RBP_LOST;
  }
  return RowResult::kOk;
}

using ExecRanges = std::vector<std::pair<uint64_t, uint64_t>>;

// Executable segments, [start, end): the only code the unwinder can be in.
// An Error where one reaches past 4 GiB.
Result<ExecRanges> ExecSegments(Elf* elf, std::string_view display_path) {
  ExecRanges exec;
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) {
    return MakeError("{}: unreadable program headers ({})", display_path, elf_errmsg(-1));
  }
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, int(i), &ph)) continue;
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X) || ph.p_memsz == 0) continue;
    if (ph.p_vaddr + ph.p_memsz > (uint64_t{1} << 32) || ph.p_vaddr + ph.p_memsz < ph.p_vaddr) {
      return MakeError(
          "{}: code at ELF address {:#x} is beyond 4 GiB, which the 32-bit unwind rows cannot describe; "
          "stacks through it fall back to frame pointers",
          display_path, ph.p_vaddr);
    }
    exec.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_memsz);
  }
  return exec;
}

// Keeps the FDEs inside executable segments whose CFI is open, sorted by
// start, .eh_frame's first at one start.
void KeepUsableFdes(std::vector<Interval>& fdes, const ExecRanges& exec, Dwarf_CFI* const (&cfis)[2]) {
  auto in_exec = [&](const Interval& iv) {
    for (auto [s, e] : exec) {
      if (iv.start >= s && iv.end <= e) return true;
    }
    return false;
  };
  std::erase_if(fdes, [&](const Interval& iv) { return !in_exec(iv) || !cfis[iv.source]; });
  std::sort(fdes.begin(), fdes.end(), [](const Interval& a, const Interval& b) {
    return a.start != b.start ? a.start < b.start : a.source < b.source;
  });
}

// The rows of one FDE's range [iv.start, iv.end), one per row libdw reports.
void AddFdeRows(Dwarf_CFI* cfi, const Interval& iv, UnwindTable& table, RowBuilder& builder) {
  for (uint64_t pc = iv.start; pc < iv.end;) {
    Dwarf_Frame* frame = nullptr;
    unwind_row row{};
    uint64_t next = iv.end;
    if (dwarf_cfi_addrframe(cfi, pc, &frame) != 0 || frame == nullptr) {
      // Bad CFI program: give up on the rest of this FDE.
      ++table.cfi_errors;
      ++table.unsupported_rows;
      table.unsupported_bytes += iv.end - pc;
      builder.AddNone(pc);
      return;
    }
    Dwarf_Addr start = 0, end = 0;
    bool signal = false;
    int ra = dwarf_frame_info(frame, &start, &end, &signal);
    if (ra < 0) ra = kRegRip;
    if (end > pc) next = std::min<uint64_t>(end, iv.end);
    ++table.cfi_rows;
    RowResult r = MakeRow(frame, ra, &row);
    std::free(frame);
    if (r == RowResult::kUnsupported) {
      ++table.unsupported_rows;
      table.unsupported_bytes += next - pc;
      row = NoneRow();
    }
    table.covered_bytes += next - pc;
    builder.Add(pc, row);
    if (next <= pc) next = iv.end;  // libdw gave an empty range: never loop
    pc = next;
  }
}

}  // namespace

Result<std::shared_ptr<const UnwindTable>> BuildReferenceUnwindTable(int fd, std::string_view display_path) {
  static const bool elf_ok = elf_version(EV_CURRENT) != EV_NONE;
  if (!elf_ok) return MakeError("{}: libelf is unusable (elf_version failed)", display_path);
  ElfPtr elf(elf_begin(fd, ELF_C_READ_MMAP, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) {
    return MakeError("{}: not an ELF file ({})", display_path, elf_errmsg(-1));
  }
  GElf_Ehdr ehdr;
  if (!gelf_getehdr(elf.get(), &ehdr)) {
    return MakeError("{}: unreadable ELF header ({})", display_path, elf_errmsg(-1));
  }
  if (ehdr.e_ident[EI_CLASS] != ELFCLASS64 || ehdr.e_machine != EM_X86_64) {
    return MakeError("{}: not an x86-64 ELF file; only x86-64 stacks can be unwound", display_path);
  }
  auto exec = ExecSegments(elf.get(), display_path);
  if (!exec) return exec.error();
  auto table = std::make_shared<UnwindTable>();
  if (exec->empty()) return std::shared_ptr<const UnwindTable>(table);

  // .eh_frame first: it is what the runtime itself trusts. .debug_frame
  // (Go, or unstripped objects) fills what .eh_frame does not cover.
  CfiPtr eh_cfi(dwarf_getcfi_elf(elf.get()));
  DwarfPtr dwarf(dwarf_begin_elf(elf.get(), DWARF_C_READ, nullptr));
  Dwarf_CFI* debug_cfi = nullptr;
  std::vector<Interval> fdes;
  if (eh_cfi) CollectFdes(elf.get(), ".eh_frame", true, 0, &fdes, &table->cfi_errors);
  GElf_Shdr eh_shdr;
  if (!eh_cfi && FindSection(elf.get(), ".eh_frame", &eh_shdr)) ++table->cfi_errors;  // (reference only, as below)
  CollectFdes(elf.get(), ".debug_frame", false, 1, &fdes, &table->cfi_errors);
  if (std::any_of(fdes.begin(), fdes.end(), [](const Interval& iv) { return iv.source == 1; })) {
    debug_cfi = dwarf ? dwarf_getcfi(dwarf.get()) : nullptr;  // owned by `dwarf`
    // (Reference only.) libdw could not open the DWARF around a
    // .debug_frame that has FDEs (dwarf_begin_elf reads every .debug_*
    // section): its FDEs are dropped. Counted, so that comparisons with the
    // agent's builder, which reads .debug_frame alone, can tell.
    if (debug_cfi == nullptr) ++table->cfi_errors;
  }
  Dwarf_CFI* const cfis[2] = {eh_cfi.get(), debug_cfi};
  KeepUsableFdes(fdes, *exec, cfis);

  // The parts of an FDE that overlap an earlier (or .eh_frame) one are
  // dropped.
  RowBuilder builder(table.get());
  uint64_t covered_end = 0;
  for (Interval iv : fdes) {
    if (iv.end <= covered_end) continue;
    iv.start = std::max(iv.start, covered_end);
    if (iv.start > covered_end && covered_end != 0) builder.AddNone(covered_end);  // gap between FDEs
    ++table->fdes;
    AddFdeRows(cfis[iv.source], iv, *table, builder);
    covered_end = iv.end;
  }
  if (covered_end != 0) builder.AddNone(covered_end);  // nothing past the last FDE
  builder.Finish();
  return std::shared_ptr<const UnwindTable>(table);
}

}  // namespace tlsprof::unwind
