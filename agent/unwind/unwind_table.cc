// Builds the compact unwind rows of bpf/unwind.h from an ELF file's CFI.
//
// The FDE list comes from walking .eh_frame / .debug_frame with
// dwarf_next_cfi (eh::ForEachFdeEntry, which also hands us each CIE's
// factors, return-address register and initial instructions, and each FDE's
// instruction bytes). The rows inside each FDE come from our own interpreter
// of its CFA program (Interpreter below), not from libdw's: libdw has no
// incremental interpreter. dwarf_cfi_addrframe answers for one address by
// running the FDE's program from its start, so the rows of an FDE of N rows
// cost N^2 instructions, and a crafted file with one long FDE would stall the
// agent. Ours runs each CIE's initial instructions once and each FDE's
// program once, emitting a row at each location advance: the work is linear
// in the CFI's size, and the rows are capped (guard::kMaxRowsPerFde,
// guard::kMaxRowsPerImage), what is cut being counted.
//
// The rows must be exactly those of libdw's reading of the same CFI
// (reference_table.cc keeps that builder for the tests, which compare the two
// row for row on real binaries and in the eh_frame fuzz target), so where the
// standard leaves room we do what libdw does: the x86-64 default rules before
// a CIE's instructions (AbiInitialState), a location that moves backwards
// (only the part past the highest location so far opens a row), the 61 bits
// an offset rule keeps, an empty expression reading as "undefined". Where
// the CFI is malformed (an operand running past its program, a
// remember_state stack deeper than kMaxRememberDepth, a register x86-64 does
// not have, an unknown opcode) we stop the FDE there and count it in
// cfi_errors; libdw may read on.
//
// Sections are read through libelf from an ELF handle opened with ELF_C_READ
// (pread into libelf's own buffers: a file truncated under us gives a read
// error, never SIGBUS), after their size is checked against
// guard::kMaxSectionBytes and the file's size; a compressed .debug_frame is
// refused before it is inflated when its header claims more than the cap.
#include "agent/unwind/unwind_table.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "agent/guard/limits.h"
#include "agent/symbols/eh_frame.h"
#include "agent/symbols/x86_elf.h"
#include "agent/unwind/row_builder.h"

namespace tlsprof::unwind {
namespace {

static_assert(sizeof(unwind_row) == 16, "the BPF side reads 16-byte rows");

constexpr int kRegRbp = 6;
constexpr int kRegRsp = 7;
constexpr int kRegRip = 16;
// x86-64's DWARF register numbers end below 130. A program that gives a rule
// to a register from here on is malformed: unsupported from there. (libdw
// takes numbers up to 2^28 and allocates a rule for every register below the
// highest named, 2 GiB at most, per row.)
constexpr uint64_t kMaxRegister = 1024;
// DW_CFA_remember_state nesting; compilers nest one or two deep (a state
// around each epilogue). A deeper program is unsupported from there on.
constexpr size_t kMaxRememberDepth = 64;
// Operations decoded per DWARF expression. The longest form a row can hold
// (GNU ld's PLT CFA) has 9; a longer expression maps to no row either way.
constexpr size_t kMaxExprOps = 16;

// ---- DWARF expressions, decoded as far as the row forms need.

// One DWARF operation with its operands, as libdw's Dwarf_Op holds them
// (signed operands as their 64-bit two's complement).
struct Op {
  uint8_t atom = 0;
  uint64_t number = 0;
  uint64_t number2 = 0;
};

struct Expr {
  std::array<Op, kMaxExprOps + 2> ops;  // + the CFA pushed first, + DW_OP_stack_value
  size_t n = 0;
};

enum class Decoded {
  kOk,
  kOther,      // an operation no row form uses, or too many: maps to no row form
  kMalformed,  // an operand runs past the expression
};

// Decodes `bytes`. A register rule's expression starts from the CFA pushed
// (cfa_first); a val_expression's value is the result, not a location
// (stack_value, appended), which is how libdw lists both.
Decoded DecodeExpr(std::span<const uint8_t> bytes, bool cfa_first, bool value, Expr* out) {
  out->n = 0;
  if (cfa_first) out->ops[out->n++] = Op{DW_OP_call_frame_cfa};
  const uint8_t* p = bytes.data();
  const uint8_t* end = p + bytes.size();
  while (p < end) {
    if (out->n == kMaxExprOps) return Decoded::kOther;
    Op op{*p++};
    switch (op.atom) {
      case DW_OP_deref:
      case DW_OP_mul:
      case DW_OP_plus:
      case DW_OP_and:
      case DW_OP_ge:
      case DW_OP_shl:
      case DW_OP_call_frame_cfa:
      case DW_OP_stack_value:
      case DW_OP_lit0 ... DW_OP_lit31:
        break;
      case DW_OP_plus_uconst:
        if (!eh::ReadUleb(p, end, &op.number)) return Decoded::kMalformed;
        break;
      case DW_OP_consts:
      case DW_OP_breg0 ... DW_OP_breg31: {
        int64_t v;
        if (!eh::ReadSleb(p, end, &v)) return Decoded::kMalformed;
        op.number = uint64_t(v);
        break;
      }
      case DW_OP_bregx: {
        int64_t v;
        if (!eh::ReadUleb(p, end, &op.number) || !eh::ReadSleb(p, end, &v)) return Decoded::kMalformed;
        op.number2 = uint64_t(v);
        break;
      }
      default:
        return Decoded::kOther;
    }
    out->ops[out->n++] = op;
  }
  if (value) out->ops[out->n++] = Op{DW_OP_stack_value};
  return Decoded::kOk;
}

int64_t Signed(uint64_t w) { return static_cast<int64_t>(w); }
bool Fits32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }
bool Fits16(int64_t v) { return v >= INT16_MIN && v <= INT16_MAX; }

// "reg + off": DW_CFA_def_cfa is DW_OP_bregx reg, off; CFA expressions keep
// the DW_OP_bregN their producer wrote.
bool IsBreg(const Op& op, int reg, int64_t* off = nullptr) {
  if (op.atom == DW_OP_breg0 + reg) {
    if (off) *off = Signed(op.number);
    return true;
  }
  if (op.atom == DW_OP_bregx && op.number == uint64_t(reg)) {
    if (off) *off = Signed(op.number2);
    return true;
  }
  return false;
}

// Maps a CFA expression to a row kind; false if we do not model it.
bool MapCfa(const Op* ops, size_t nops, unwind_row* row) {
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

// "Saved at CFA + off": DW_OP_call_frame_cfa, then an optional
// DW_OP_plus_uconst off (or DW_OP_consts off; DW_OP_plus).
std::optional<int64_t> CfaOffsetRule(const Op* ops, size_t nops) {
  if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa) return std::nullopt;
  if (nops == 1) return 0;
  if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) return Signed(ops[1].number);
  if (nops == 3 && ops[1].atom == DW_OP_consts && ops[2].atom == DW_OP_plus) return Signed(ops[1].number);
  return std::nullopt;
}

// ---- The interpreter's state: only what a row holds.

// The rule of a register the rows describe (RBP, the return address), as far
// as a row can use it.
struct RegRule {
  enum Kind : uint8_t {
    kUndefined,  // undefined, never mentioned, or an empty expression
    kSame,       // same value
    kCfaOffset,  // saved at CFA + off
    kOther,      // anything else (another register, a value, another expression)
  } kind = kUndefined;
  int64_t off = 0;
};

struct CfaRule {
  enum Kind : uint8_t {
    kUndefined,  // no CFA rule yet
    kOffset,     // register + offset
    kExpr,       // an expression, mapped when it was defined
    kInvalid,    // an offset or register changed while the rule was not register + offset
  } kind = kUndefined;
  uint64_t reg = 0;
  uint64_t off = 0;
  bool mapped = false;  // kExpr: the expression has a row form (cfa_kind, reg, cfa_off, deref_add in `row`)
  unwind_row row{};
};

struct State {
  CfaRule cfa;
  RegRule rbp;
  RegRule ra;
};

enum class RowResult { kOk, kUnsupported, kEnd };

// The row for one state: the mapping the BPF unwinder's kinds allow.
RowResult MakeRow(const State& s, unwind_row* row) {
  *row = {};
  row->rbp_kind = RBP_SAME;
  // Return address first: "undefined" marks the outermost frame (_start,
  // clone), which ends the stack whatever the CFA says.
  if (s.ra.kind == RegRule::kUndefined) {
    row->cfa_kind = CFA_END;
    return RowResult::kEnd;
  }
  // The format assumes RA at CFA - 8 (every normal x86-64 frame). Signal
  // trampolines (__restore_rt) describe RA with an expression: unsupported.
  if (s.ra.kind != RegRule::kCfaOffset || s.ra.off != -8) return RowResult::kUnsupported;

  if (s.cfa.kind == CfaRule::kOffset) {
    const Op op{DW_OP_bregx, s.cfa.reg, s.cfa.off};
    if (!MapCfa(&op, 1, row)) return RowResult::kUnsupported;
  } else if (s.cfa.kind == CfaRule::kExpr && s.cfa.mapped) {
    row->cfa_kind = s.cfa.row.cfa_kind;
    row->reg = s.cfa.row.reg;
    row->cfa_off = s.cfa.row.cfa_off;
    row->deref_add = s.cfa.row.deref_add;
  } else {
    return RowResult::kUnsupported;
  }

  switch (s.rbp.kind) {
    case RegRule::kUndefined:  // unmentioned: at function entry RBP is still the caller's
    case RegRule::kSame:
      row->rbp_kind = RBP_SAME;
      break;
    case RegRule::kCfaOffset:
      if (Fits16(s.rbp.off)) {
        row->rbp_kind = RBP_AT_CFA;
        row->rbp_off = int16_t(s.rbp.off);
      } else {
        row->rbp_kind = RBP_LOST;
      }
      break;
    case RegRule::kOther:
      row->rbp_kind = RBP_LOST;
      break;
  }
  return RowResult::kOk;
}

// ---- The interpreter.

// What a CIE gives the FDEs that use it.
struct Cie {
  bool ok = false;  // false: its initial instructions do not run; its FDEs have no rows
  uint64_t code_align = 0;
  uint64_t data_align = 0;  // signed, as two's complement: offsets are multiplied modulo 2^64
  uint64_t ra_reg = kRegRip;
  uint8_t fde_encoding = DW_EH_PE_absptr;  // DW_CFA_set_loc's operand
  State initial;
};

// The rules before a CIE's initial instructions: those of the x86-64 psABI
// as libdw states them (its x86_64_abi_cfi), which registers the CIE leaves
// unmentioned keep: the callee-saved registers (libdw names DWARF registers
// 0, 6 and 12-16) are "same value", the others undefined, and no CFA.
State AbiInitialState(uint64_t ra_reg) {
  State s;
  s.rbp.kind = RegRule::kSame;
  const bool same = ra_reg == 0 || ra_reg == 6 || (ra_reg >= 12 && ra_reg <= 16);
  s.ra.kind = same ? RegRule::kSame : ra_reg == kRegRsp ? RegRule::kOther : RegRule::kUndefined;
  return s;
}

// An offset rule keeps 61 bits of its offset, sign-extended (libdw's
// register rule is a 3-bit kind and a 61-bit value in one word).
int64_t Offset61(uint64_t v) { return int64_t(v << 3) >> 3; }

// Runs one CFA program over a State. Reads nothing outside [p, end).
class Interpreter {
 public:
  enum class Stop {
    kEnd,     // the program ran to its end
    kCaller,  // the advance callback asked to stop
    kError,   // malformed, unknown opcode, or nesting too deep
  };

  // `section`: the whole CFI section (DW_CFA_set_loc's pc-relative operands
  // are relative to its address `vaddr`). `instructions` counts every
  // instruction run.
  Interpreter(std::span<const uint8_t> section, uint64_t vaddr, uint64_t* instructions)
      : section_(section), vaddr_(vaddr), instructions_(instructions) {}

  // Runs [p, end) on `state` for `cie`. `initial` is the CIE's initial state
  // for DW_CFA_restore, null while running the CIE's own instructions (where
  // advances and restores are errors). advance(new_loc, state) is called at
  // each location advance with the state of the row that ends there; it
  // returns false to stop.
  template <typename Advance>
  Stop Run(const Cie& cie, const State* initial, const uint8_t* p, const uint8_t* end, uint64_t loc, State& state,
           Advance&& advance) {
    stack_.clear();
    while (p < end) {
      ++*instructions_;
      switch (Execute(*p++, cie, initial, p, end, loc, state)) {
        case Step::kNext:
          continue;
        case Step::kError:
          return Stop::kError;
        case Step::kMoved:  // a new row starts (never in a CIE's instructions)
          if (initial == nullptr) return Stop::kError;
          if (!advance(loc, static_cast<const State&>(state))) return Stop::kCaller;
      }
    }
    return Stop::kEnd;
  }

  // Malformed expressions met (their rules became unsupported), and
  // programs stopped for nesting remember_state too deep.
  uint64_t malformed() const { return malformed_; }
  uint64_t too_deep() const { return too_deep_; }

 private:
  enum class Step { kNext, kMoved, kError };

  // One instruction whose opcode was just read; its operands from [p, end).
  Step Execute(uint8_t opcode, const Cie& cie, const State* initial, const uint8_t*& p, const uint8_t* end,
               uint64_t& loc, State& state) {
    uint64_t off = 0, delta = 0;
    switch (opcode & 0xc0) {
      case DW_CFA_advance_loc:
        loc += uint64_t(opcode & 0x3f) * cie.code_align;
        return Step::kMoved;
      case DW_CFA_offset:
        if (!Uleb(p, end, &off)) return Step::kError;
        return SetRule(cie, opcode & 0x3f, OffsetRule(off * cie.data_align), state) ? Step::kNext : Step::kError;
      case DW_CFA_restore:
        return initial != nullptr && Restore(cie, *initial, opcode & 0x3f, state) ? Step::kNext : Step::kError;
      default:
        break;
    }
    switch (opcode) {
      case DW_CFA_nop:
        return Step::kNext;
      case DW_CFA_set_loc:
        return SetLoc(cie, p, end, &loc) ? Step::kMoved : Step::kError;
      case DW_CFA_advance_loc1:
      case DW_CFA_advance_loc2:
      case DW_CFA_advance_loc4: {
        const size_t size = opcode == DW_CFA_advance_loc1 ? 1 : opcode == DW_CFA_advance_loc2 ? 2 : 4;
        if (size_t(end - p) < size) return Step::kError;
        for (size_t i = 0; i < size; ++i) delta |= uint64_t(p[i]) << (8 * i);
        p += size;
        loc += delta * cie.code_align;
        return Step::kMoved;
      }
      case DW_CFA_def_cfa:
      case DW_CFA_def_cfa_sf:
      case DW_CFA_def_cfa_register:
      case DW_CFA_def_cfa_offset:
      case DW_CFA_def_cfa_offset_sf:
      case DW_CFA_def_cfa_expression:
        return CfaInstruction(opcode, cie, p, end, state);
      default:
        return RegisterInstruction(opcode, cie, initial, p, end, state);
    }
  }

  // The instructions that change the CFA rule.
  Step CfaInstruction(uint8_t opcode, const Cie& cie, const uint8_t*& p, const uint8_t* end, State& state) {
    uint64_t reg = 0, off = 0;
    int64_t soff = 0;
    switch (opcode) {
      case DW_CFA_def_cfa:
      case DW_CFA_def_cfa_sf:
        if (!Uleb(p, end, &reg)) return Step::kError;
        if (opcode == DW_CFA_def_cfa ? !Uleb(p, end, &off) : !Sleb(p, end, &soff)) return Step::kError;
        if (opcode == DW_CFA_def_cfa_sf) off = uint64_t(soff) * cie.data_align;
        state.cfa = CfaRule{CfaRule::kOffset, reg, off};
        return Step::kNext;
      case DW_CFA_def_cfa_register:
        if (!Uleb(p, end, &reg)) return Step::kError;
        if (state.cfa.kind != CfaRule::kOffset) state.cfa.kind = CfaRule::kInvalid;
        state.cfa.reg = reg;
        return Step::kNext;
      case DW_CFA_def_cfa_offset:
      case DW_CFA_def_cfa_offset_sf:
        if (opcode == DW_CFA_def_cfa_offset ? !Uleb(p, end, &off) : !Sleb(p, end, &soff)) return Step::kError;
        if (opcode == DW_CFA_def_cfa_offset_sf) off = uint64_t(soff) * cie.data_align;
        if (state.cfa.kind != CfaRule::kOffset) state.cfa.kind = CfaRule::kInvalid;
        state.cfa.off = off;
        return Step::kNext;
      default: {  // DW_CFA_def_cfa_expression
        std::span<const uint8_t> block;
        if (!Block(p, end, &block)) return Step::kError;
        state.cfa = CfaRule{CfaRule::kExpr};
        Expr expr;
        const Decoded d = block.empty() ? Decoded::kOther : DecodeExpr(block, false, false, &expr);
        if (d == Decoded::kMalformed) ++malformed_;
        state.cfa.mapped = d == Decoded::kOk && MapCfa(expr.ops.data(), expr.n, &state.cfa.row);
        return Step::kNext;
      }
    }
  }

  // The instructions that change a register's rule or the state stack;
  // anything else is an error.
  Step RegisterInstruction(uint8_t opcode, const Cie& cie, const State* initial, const uint8_t*& p, const uint8_t* end,
                           State& state) {
    uint64_t reg = 0, off = 0;
    int64_t soff = 0;
    switch (opcode) {
      case DW_CFA_undefined:
      case DW_CFA_same_value:
        if (!Uleb(p, end, &reg)) return Step::kError;
        return SetRule(cie, reg, RegRule{opcode == DW_CFA_undefined ? RegRule::kUndefined : RegRule::kSame}, state)
                   ? Step::kNext
                   : Step::kError;
      case DW_CFA_offset_extended:
      case DW_CFA_offset_extended_sf:
      case DW_CFA_GNU_negative_offset_extended:
        if (!Uleb(p, end, &reg)) return Step::kError;
        if (opcode == DW_CFA_offset_extended_sf) {
          if (!Sleb(p, end, &soff)) return Step::kError;
          off = uint64_t(soff);
        } else {
          if (!Uleb(p, end, &off)) return Step::kError;
          if (opcode == DW_CFA_GNU_negative_offset_extended) off = 0 - off;
        }
        return SetRule(cie, reg, OffsetRule(off * cie.data_align), state) ? Step::kNext : Step::kError;
      case DW_CFA_val_offset:
      case DW_CFA_val_offset_sf:
      case DW_CFA_register:
        if (!Uleb(p, end, &reg)) return Step::kError;
        if (opcode == DW_CFA_val_offset_sf ? !Sleb(p, end, &soff) : !Uleb(p, end, &off)) return Step::kError;
        return SetRule(cie, reg, RegRule{RegRule::kOther}, state) ? Step::kNext : Step::kError;
      case DW_CFA_expression:
      case DW_CFA_val_expression: {
        std::span<const uint8_t> block;
        if (!Uleb(p, end, &reg) || !Block(p, end, &block)) return Step::kError;
        // Only the rules of RBP and the return address reach a row.
        const RegRule rule = reg == kRegRbp || reg == cie.ra_reg
                                 ? ExpressionRule(block, opcode == DW_CFA_val_expression)
                                 : RegRule{RegRule::kOther};
        return SetRule(cie, reg, rule, state) ? Step::kNext : Step::kError;
      }
      case DW_CFA_restore_extended:
        if (!Uleb(p, end, &reg)) return Step::kError;
        return initial != nullptr && Restore(cie, *initial, reg, state) ? Step::kNext : Step::kError;
      case DW_CFA_remember_state:
        if (stack_.size() == kMaxRememberDepth) {
          ++too_deep_;
          return Step::kError;
        }
        stack_.push_back(state);
        return Step::kNext;
      case DW_CFA_restore_state:
        if (stack_.empty()) return Step::kError;
        state = stack_.back();
        stack_.pop_back();
        return Step::kNext;
      case DW_CFA_GNU_args_size:
        return Uleb(p, end, &off) ? Step::kNext : Step::kError;
      default:  // DW_CFA_MIPS_advance_loc8, DW_CFA_GNU_window_save and unknown opcodes: not x86-64 CFI
        return Step::kError;
    }
  }

  static bool Uleb(const uint8_t*& p, const uint8_t* end, uint64_t* v) { return eh::ReadUleb(p, end, v); }
  static bool Sleb(const uint8_t*& p, const uint8_t* end, int64_t* v) { return eh::ReadSleb(p, end, v); }
  static bool Block(const uint8_t*& p, const uint8_t* end, std::span<const uint8_t>* out) {
    uint64_t len = 0;
    if (!Uleb(p, end, &len) || len > uint64_t(end - p)) return false;
    *out = {p, size_t(len)};
    p += len;
    return true;
  }

  static RegRule OffsetRule(uint64_t off) { return RegRule{RegRule::kCfaOffset, Offset61(off)}; }

  // The rule of DW_CFA_expression (the register is saved at the address the
  // expression computes from the CFA) or DW_CFA_val_expression (the value is
  // the result): only "CFA + n" has a row form.
  RegRule ExpressionRule(std::span<const uint8_t> block, bool value) {
    if (block.empty()) return RegRule{RegRule::kUndefined};
    if (value) return RegRule{RegRule::kOther};
    Expr expr;
    const Decoded d = DecodeExpr(block, true, false, &expr);
    if (d == Decoded::kMalformed) ++malformed_;
    if (d != Decoded::kOk) return RegRule{RegRule::kOther};
    const std::optional<int64_t> off = CfaOffsetRule(expr.ops.data(), expr.n);
    return off ? RegRule{RegRule::kCfaOffset, *off} : RegRule{RegRule::kOther};
  }

  static bool SetRule(const Cie& cie, uint64_t reg, RegRule rule, State& state) {
    if (reg >= kMaxRegister) return false;
    if (reg == kRegRbp) state.rbp = rule;
    if (reg == cie.ra_reg) state.ra = rule;
    return true;
  }
  static bool Restore(const Cie& cie, const State& initial, uint64_t reg, State& state) {
    if (reg >= kMaxRegister) return false;
    if (reg == kRegRbp) state.rbp = initial.rbp;
    if (reg == cie.ra_reg) state.ra = initial.ra;
    return true;
  }

  // DW_CFA_set_loc: an address in the CIE's FDE pointer encoding.
  bool SetLoc(const Cie& cie, const uint8_t*& p, const uint8_t* end, uint64_t* loc) const {
    const uint8_t enc = cie.fde_encoding;
    uint64_t base = 0;
    switch (enc & 0x70) {
      case DW_EH_PE_absptr:
      case DW_EH_PE_textrel:  // no base for these in an ELF file's CFI
      case DW_EH_PE_datarel:
      case DW_EH_PE_funcrel:
        break;
      case DW_EH_PE_pcrel:
        base = vaddr_ + uint64_t(p - section_.data());
        break;
      default:
        return false;
    }
    if (enc & DW_EH_PE_indirect) return false;
    uint64_t value = 0;
    if (!eh::ReadEncoded(p, end, enc, &value)) return false;
    *loc = base + value;
    return true;
  }

  std::span<const uint8_t> section_;
  uint64_t vaddr_;
  uint64_t* instructions_;
  std::vector<State> stack_;
  uint64_t malformed_ = 0;
  uint64_t too_deep_ = 0;
};

// ---- Sections and FDEs.

struct CfiSection {
  Elf_Data* data = nullptr;
  uint64_t vaddr = 0;
  bool eh_frame = false;
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(data->d_buf), data->d_size}; }
};

// Reads one CFI section into memory through the guarded ELF opener, once
// its size is sane: not over guard::kMaxSectionBytes (inflated, for a
// compressed one: the header's claim is checked before anything is
// inflated) and inside the file. A section that does not read counts as a
// CFI error; one over the cap is refused (guard::ElfFile counts it) and the
// table marked cut (cut_at_image_cap): CFI left out at a cap, not a file
// without it.
std::optional<CfiSection> ReadCfiSection(const guard::ElfFile& elf, const char* name, bool eh_frame,
                                         UnwindTable& table) {
  const guard::ElfSection* s = elf.Find(name);
  if (s == nullptr || s->shdr.sh_type == SHT_NOBITS || s->shdr.sh_size == 0) return std::nullopt;
  const auto refused = [] { return guard::RefusalCounts()[static_cast<size_t>(guard::Reason::kSectionSize)]; };
  const uint64_t refused_before = refused();
  auto bytes = elf.SectionBytes(*s);
  if (!bytes) {
    if (refused() == refused_before) {
      ++table.cfi_errors;  // malformed, not over a cap
    } else {
      table.cut_at_image_cap = true;
    }
    return std::nullopt;
  }
  Elf_Data* data = elf.data(*s);
  if (!data || !data->d_buf || data->d_size == 0) return std::nullopt;
  return CfiSection{data, s->shdr.sh_addr, eh_frame};
}

// True when the section name table is one guard::ElfFile refused at
// guard::kMaxSectionBytes (its size, or for a compressed one the size its
// header claims): then every section is unnamed, and .eh_frame and
// .debug_frame cannot be found although they may be there. (Open read the
// names through SectionBytes, which counted the refusal; a table it read is
// loaded, and one it could not read for another reason is malformed, which
// libdw cannot read either.)
bool SectionNamesRefused(const guard::ElfFile& elf) {
  if (elf.names_read()) return false;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf.elf(), &shstrndx) != 0 || shstrndx >= elf.sections().size()) return false;
  const guard::ElfSection& names = elf.sections()[shstrndx];  // a STRTAB, not empty, left unread
  if (names.shdr.sh_size > guard::kMaxSectionBytes) return true;
  if (!(names.shdr.sh_flags & SHF_COMPRESSED)) return false;
  // x86-64 only (BuildUnwindTable checks): an Elf64_Chdr, little-endian.
  auto chdr = elf.Read(names.shdr.sh_offset, sizeof(Elf64_Chdr), sizeof(Elf64_Chdr), "section name table header");
  if (!chdr || chdr->size() != sizeof(Elf64_Chdr)) return false;
  Elf64_Chdr c;
  std::memcpy(&c, chdr->data(), sizeof c);
  return c.ch_type == ELFCOMPRESS_ZLIB && c.ch_size > guard::kMaxSectionBytes;
}

struct Interval {
  uint64_t start = 0, end = 0;
  int source = 0;  // index into the sections: 0 = .eh_frame, 1 = .debug_frame
  eh::FdeEntry fde;
};

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

// FDEs whose range overlaps an earlier one of the same section (only the
// part no earlier FDE covers gets rows). Sorts `fdes` by section and start.
uint64_t CountOverlaps(std::vector<Interval>& fdes) {
  std::sort(fdes.begin(), fdes.end(), [](const Interval& a, const Interval& b) {
    return a.source != b.source ? a.source < b.source : a.start < b.start;
  });
  uint64_t overlaps = 0, end = 0;
  for (size_t i = 0; i < fdes.size(); ++i) {
    if (i > 0 && fdes[i].source == fdes[i - 1].source && fdes[i].start < end) {
      ++overlaps;
    } else if (i > 0 && fdes[i].source != fdes[i - 1].source) {
      end = 0;
    }
    end = std::max(end, fdes[i].end);
  }
  return overlaps;
}

// Keeps the FDEs inside executable segments, sorted by start, .eh_frame's
// first at one start.
void KeepUsableFdes(std::vector<Interval>& fdes, const ExecRanges& exec) {
  auto in_exec = [&](const Interval& iv) {
    for (auto [s, e] : exec) {
      if (iv.start >= s && iv.end <= e) return true;
    }
    return false;
  };
  std::erase_if(fdes, [&](const Interval& iv) { return !in_exec(iv); });
  std::stable_sort(fdes.begin(), fdes.end(), [](const Interval& a, const Interval& b) {
    return a.start != b.start ? a.start < b.start : a.source < b.source;
  });
}

// The rows of a file's CFI, FDE by FDE, under the row caps.
class CfiRows {
 public:
  CfiRows(Elf* elf, std::string_view display_path, UnwindTable& table)
      : ident_(reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr))),
        display_path_(display_path),
        table_(table),
        rows_(&table) {}

  // Emits the rows of [iv.start, iv.end), from the FDE iv.fde (whose own
  // range may start earlier, where an earlier FDE covers it). False once the
  // file's row cap is reached: the rest of the file has no rows.
  bool AddFde(const CfiSection& section, Interpreter& interp, const Interval& iv) {
    auto fail = [&](uint64_t pc) {  // the rest of the FDE has no rule we can use
      ++table_.cfi_errors;
      ++table_.unsupported_rows;
      table_.unsupported_bytes += iv.end - pc;
      rows_.AddNone(pc);
    };
    const Cie& cie = CieAt(section, interp, iv.source, iv.fde.cie_offset);
    if (!cie.ok || iv.fde.instructions == nullptr) {
      fail(iv.start);
      return true;
    }
    enum class Cut { kNone, kFde, kImage } cut = Cut::kNone;
    uint64_t row_start = iv.start;  // where the next row starts: past the highest location so far
    uint64_t fde_rows = 0;
    auto emit = [&](uint64_t end, const State& s) {  // the row [row_start, end)
      if (table_.cfi_rows >= guard::kMaxRowsPerImage) {
        cut = Cut::kImage;
        return false;
      }
      if (fde_rows >= guard::kMaxRowsPerFde) {
        cut = Cut::kFde;
        return false;
      }
      ++fde_rows;
      ++table_.cfi_rows;
      unwind_row row;
      if (MakeRow(s, &row) == RowResult::kUnsupported) {
        ++table_.unsupported_rows;
        table_.unsupported_bytes += end - row_start;
        row = NoneRow();
      }
      table_.covered_bytes += end - row_start;
      rows_.Add(row_start, row);
      return true;
    };
    // A location at or below the highest so far opens no row: the rule that
    // applies at an address is the one in force when the location first
    // passes it.
    auto advance = [&](uint64_t loc, const State& s) {
      if (loc <= row_start) return true;
      if (!emit(std::min(loc, iv.end), s)) return false;
      row_start = loc;
      return row_start < iv.end;  // past the range, nothing more applies to it
    };
    State state = cie.initial;
    switch (interp.Run(cie, &cie.initial, iv.fde.instructions, iv.fde.end, iv.fde.start, state, advance)) {
      case Interpreter::Stop::kEnd:
        if (row_start < iv.end) emit(iv.end, state);  // the last row reaches the FDE's end
        break;
      case Interpreter::Stop::kCaller:
        break;
      case Interpreter::Stop::kError:
        fail(row_start);
        return true;
    }
    if (cut == Cut::kFde) {
      ++table_.cut_fdes;
      ++table_.unsupported_rows;
      table_.unsupported_bytes += iv.end - row_start;
      rows_.AddNone(row_start);
      RefuseRows(fmt::format("the FDE of {:#x}-{:#x} has more than {} rows; the rest of it is left without rules",
                             iv.fde.start, iv.fde.start + iv.fde.length, guard::kMaxRowsPerFde));
    } else if (cut == Cut::kImage) {
      table_.cut_at_image_cap = true;
      rows_.AddNone(row_start);
      RefuseRows(fmt::format("the CFI has more than {} rows; code from {:#x} on is left without rules",
                             guard::kMaxRowsPerImage, row_start));
      return false;
    }
    return true;
  }

  // Nothing past `end`; counts the final rows.
  void Finish(uint64_t end, const Interpreter* const (&interps)[2]) {
    if (end != 0) rows_.AddNone(end);
    for (const Interpreter* i : interps) {
      if (i != nullptr) table_.cfi_errors += i->malformed();
    }
    rows_.Finish();
  }
  void AddNone(uint64_t pc) { rows_.AddNone(pc); }

  // Counts the file's cut rows, once per file.
  void RefuseRows(const std::string& detail) {
    if (refused_) return;  // once per file
    refused_ = true;
    guard::Refuse(guard::Reason::kCfiRows, display_path_, detail);
  }

 private:
  // The CIE at `off` of a section, its initial instructions run once.
  const Cie& CieAt(const CfiSection& section, Interpreter& interp, int source, Dwarf_Off off) {
    auto [it, inserted] = cies_.try_emplace({source, off});
    Cie& cie = it->second;
    if (!inserted) return cie;
    Dwarf_CFI_Entry e;
    Dwarf_Off next = Dwarf_Off(-1);
    if (ident_ == nullptr || dwarf_next_cfi(ident_, section.data, section.eh_frame, off, &next, &e) != 0 ||
        !dwarf_cfi_cie_p(&e)) {
      return cie;
    }
    const std::optional<uint8_t> enc = eh::CieFdeEncoding(e.cie, section.eh_frame);
    if (!enc) return cie;
    cie.code_align = e.cie.code_alignment_factor;
    cie.data_align = uint64_t(e.cie.data_alignment_factor);
    // The row's return-address register as an int (libdw's dwarf_frame_info
    // reports it so); a negative one means RIP.
    const int ra = static_cast<int>(e.cie.return_address_register);
    cie.ra_reg = ra < 0 ? kRegRip : uint64_t(ra);
    cie.fde_encoding = *enc;
    cie.initial = AbiInitialState(cie.ra_reg);
    auto no_advance = [](uint64_t, const State&) { return false; };
    cie.ok = interp.Run(cie, nullptr, e.cie.initial_instructions, e.cie.initial_instructions_end, 0, cie.initial,
                        no_advance) == Interpreter::Stop::kEnd;
    return cie;
  }

  const unsigned char* ident_;
  std::string_view display_path_;
  UnwindTable& table_;
  RowBuilder rows_;
  std::map<std::pair<int, Dwarf_Off>, Cie> cies_;
  bool refused_ = false;
};

}  // namespace

Result<std::shared_ptr<const UnwindTable>> BuildUnwindTable(int fd, std::string_view display_path) {
  auto file = guard::OpenHostFile(fmt::format("/proc/self/fd/{}", fd));
  if (!file) return MakeError("{}: {}", display_path, file.error().message);
  auto elf = guard::ElfFile::Open(*file);
  if (!elf) return MakeError("{}: {}", display_path, elf.error().message);
  return BuildUnwindTable(*elf, display_path);
}

Result<std::shared_ptr<const UnwindTable>> BuildUnwindTable(const guard::ElfFile& file, std::string_view display_path) {
  if (!file.x86_64()) {
    return MakeError("{}: not a little-endian x86-64 ELF file; only x86-64 stacks can be unwound", display_path);
  }
  Elf* const elf = file.elf();
  auto exec = ExecSegments(elf, display_path);
  if (!exec) return exec.error();
  auto table = std::make_shared<UnwindTable>();
  if (exec->empty()) return std::shared_ptr<const UnwindTable>(table);

  // .eh_frame first: it is what the runtime itself trusts. .debug_frame
  // (Go, or unstripped objects) fills what .eh_frame does not cover.
  const std::optional<CfiSection> sections[2] = {ReadCfiSection(file, ".eh_frame", true, *table),
                                                 ReadCfiSection(file, ".debug_frame", false, *table)};
  // Unnamed sections behind a refused name table: CFI that may be there is
  // left out at a cap (counted when Open refused the table), which the table
  // must say rather than read as a file without CFI.
  if (!sections[0] && !sections[1] && SectionNamesRefused(file)) table->cut_at_image_cap = true;
  // Every FDE gives at least one row: past kMaxRowsPerImage FDEs the rest
  // are left out (the list itself would otherwise grow with the section).
  std::vector<Interval> fdes;
  bool too_many_fdes = false;
  for (int source : {0, 1}) {
    const std::optional<CfiSection>& s = sections[source];
    if (!s) continue;
    eh::ForEachFdeEntry(elf, s->data, s->eh_frame, s->vaddr, &table->cfi_errors, [&](const eh::FdeEntry& f) {
      if (fdes.size() == guard::kMaxRowsPerImage) {
        too_many_fdes = true;
        return;
      }
      fdes.push_back({f.start, f.start + f.length, source, f});
    });
  }

  table->overlapping_fdes = CountOverlaps(fdes);
  KeepUsableFdes(fdes, *exec);

  std::optional<Interpreter> interps[2];
  for (int source : {0, 1}) {
    if (sections[source])
      interps[source].emplace(sections[source]->bytes(), sections[source]->vaddr, &table->cfi_instructions);
  }
  // The parts of an FDE that overlap an earlier (or .eh_frame) one are
  // dropped.
  CfiRows rows(elf, display_path, *table);
  if (too_many_fdes) {
    table->cut_at_image_cap = true;
    rows.RefuseRows(fmt::format("the CFI has more than {} FDEs; the rest are left out", guard::kMaxRowsPerImage));
  }
  uint64_t covered_end = 0;
  bool capped = false;
  for (Interval iv : fdes) {
    if (iv.end <= covered_end) continue;
    iv.start = std::max(iv.start, covered_end);
    if (iv.start > covered_end && covered_end != 0) rows.AddNone(covered_end);  // gap between FDEs
    ++table->fdes;
    if (!rows.AddFde(*sections[iv.source], *interps[iv.source], iv)) {
      capped = true;
      break;
    }
    covered_end = iv.end;
  }
  const Interpreter* const used[2] = {interps[0] ? &*interps[0] : nullptr, interps[1] ? &*interps[1] : nullptr};
  rows.Finish(capped ? 0 : covered_end, used);  // nothing past the last FDE
  return std::shared_ptr<const UnwindTable>(table);
}

const unwind_row* FindRow(const UnwindTable& table, uint64_t vaddr) {
  if (vaddr > std::numeric_limits<uint32_t>::max()) return nullptr;
  auto it = std::upper_bound(table.rows.begin(), table.rows.end(), vaddr,
                             [](uint64_t v, const unwind_row& r) { return v < r.pc; });
  if (it == table.rows.begin()) return nullptr;
  return &*(it - 1);
}

}  // namespace tlsprof::unwind
