#include "agent/symbols/x86_interpreter.h"

#include <capstone/capstone.h>

#include <algorithm>
#include <array>
#include <string>

namespace tlsprof::symbols {
namespace {

// Longest run decoded; a getter is a handful of instructions, a curve table's
// init about a hundred.
constexpr size_t kMaxInstructions = 512;

// Longest extent Scan sweeps; the functions it reads (a provider's newctx, a
// hw getter, a derive) are a few hundred bytes.
constexpr uint64_t kMaxScanBytes = 64 * 1024;

using Gpr = X86Gpr;
Gpr GprOf(unsigned reg) { return X86GprOf(reg); }

constexpr int kRax = 0, kRsi = 6, kRdi = 7;

uint64_t Truncate(uint64_t v, int width) { return width >= 8 ? v : v & ((uint64_t{1} << (width * 8)) - 1); }

}  // namespace

X86Gpr X86GprOf(unsigned reg) {
  static constexpr std::array<std::array<x86_reg, 4>, 16> kNames = {{
      {X86_REG_RAX, X86_REG_EAX, X86_REG_AX, X86_REG_AL},
      {X86_REG_RCX, X86_REG_ECX, X86_REG_CX, X86_REG_CL},
      {X86_REG_RDX, X86_REG_EDX, X86_REG_DX, X86_REG_DL},
      {X86_REG_RBX, X86_REG_EBX, X86_REG_BX, X86_REG_BL},
      {X86_REG_RSP, X86_REG_ESP, X86_REG_SP, X86_REG_SPL},
      {X86_REG_RBP, X86_REG_EBP, X86_REG_BP, X86_REG_BPL},
      {X86_REG_RSI, X86_REG_ESI, X86_REG_SI, X86_REG_SIL},
      {X86_REG_RDI, X86_REG_EDI, X86_REG_DI, X86_REG_DIL},
      {X86_REG_R8, X86_REG_R8D, X86_REG_R8W, X86_REG_R8B},
      {X86_REG_R9, X86_REG_R9D, X86_REG_R9W, X86_REG_R9B},
      {X86_REG_R10, X86_REG_R10D, X86_REG_R10W, X86_REG_R10B},
      {X86_REG_R11, X86_REG_R11D, X86_REG_R11W, X86_REG_R11B},
      {X86_REG_R12, X86_REG_R12D, X86_REG_R12W, X86_REG_R12B},
      {X86_REG_R13, X86_REG_R13D, X86_REG_R13W, X86_REG_R13B},
      {X86_REG_R14, X86_REG_R14D, X86_REG_R14W, X86_REG_R14B},
      {X86_REG_R15, X86_REG_R15D, X86_REG_R15W, X86_REG_R15B},
  }};
  static constexpr std::array<int, 4> kWidths = {8, 4, 2, 1};
  for (int i = 0; i < 16; ++i) {
    for (int w = 0; w < 4; ++w) {
      if (kNames[i][w] == reg) return {i, kWidths[w]};
    }
  }
  return {};
}

struct X86Interpreter::Impl {
  explicit Impl(const LoaderImage& image) : image_(image) {
    if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs_) != CS_ERR_OK) return;
    cs_option(cs_, CS_OPT_DETAIL, CS_OPT_ON);
    insn_ = cs_malloc(cs_);
  }
  ~Impl() {
    if (insn_ != nullptr) cs_free(insn_, 1);
    if (cs_ != 0) cs_close(&cs_);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  bool ok() const { return insn_ != nullptr; }

  // Runs the code at `fn` (in a code segment) from its first instruction.
  X86Run Execute(uint64_t fn) {
    X86Run run;
    if (!ok() || image_.KindAt(fn) != LoaderImage::kCode) return run;
    Regs regs{};
    auto [bytes, size] = image_.Bytes(fn, kMaxInstructions * 16);
    const uint8_t* code = bytes;
    size_t left = size;
    uint64_t address = fn;
    for (size_t n = 0; n < kMaxInstructions; ++n) {
      if (!cs_disasm_iter(cs_, &code, &left, &address, insn_)) return run;
      const cs_x86& x = insn_->detail->x86;
      const uint64_t next = insn_->address + insn_->size;
      const cs_x86_op* ops = x.operands;
      switch (insn_->id) {
        case X86_INS_RET:
          run.returned = true;
          run.rax = regs[kRax];
          return run;
        case X86_INS_NOP:
        case X86_INS_ENDBR64:
        case X86_INS_PUSH:
          continue;
        case X86_INS_CALL: {
          if (x.op_count != 1 || ops[0].type != X86_OP_IMM) return run;
          run.calls.push_back({static_cast<uint64_t>(ops[0].imm), regs[kRdi], regs[kRsi]});
          // The System V ABI's caller-saved registers hold nothing known after a call.
          for (int r : {0, 1, 2, 6, 7, 8, 9, 10, 11}) regs[r].reset();
          continue;
        }
        case X86_INS_LEA: {
          if (x.op_count != 2 || ops[0].type != X86_OP_REG) return run;
          Set(regs, GprOf(ops[0].reg), RipAddress(ops[1], next));
          continue;
        }
        case X86_INS_XOR: {
          if (x.op_count == 2 && ops[0].type == X86_OP_REG && ops[1].type == X86_OP_REG && ops[0].reg == ops[1].reg) {
            Set(regs, GprOf(ops[0].reg), 0);
            continue;
          }
          break;
        }
        case X86_INS_MOV:
        case X86_INS_MOVABS:
          if (!Move(x, next, regs, run)) return run;
          continue;
        default:
          break;
      }
      if (!Other(x, next, regs, run)) return run;
    }
    return run;
  }

  X86Refs Scan(uint64_t fn, uint64_t len) {
    X86Refs refs;
    if (!ok() || image_.KindAt(fn) != LoaderImage::kCode) return refs;
    auto [bytes, size] = image_.Bytes(fn, std::min(len, kMaxScanBytes));
    const uint8_t* code = bytes;
    size_t left = size;
    uint64_t address = fn;
    while (left > 0) {
      if (!cs_disasm_iter(cs_, &code, &left, &address, insn_)) return refs;
      const cs_x86& x = insn_->detail->x86;
      const uint64_t next = insn_->address + insn_->size;
      if ((insn_->id == X86_INS_CALL || insn_->id == X86_INS_JMP) && x.op_count == 1 &&
          x.operands[0].type == X86_OP_IMM) {
        const auto target = static_cast<uint64_t>(x.operands[0].imm);
        if (target < fn || target - fn >= len) refs.calls.push_back(target);
      } else if (insn_->id == X86_INS_LEA && x.op_count == 2 && x.operands[1].type == X86_OP_MEM &&
                 x.operands[1].mem.base == X86_REG_RIP && x.operands[1].mem.index == X86_REG_INVALID) {
        refs.leas.push_back(next + static_cast<uint64_t>(x.operands[1].mem.disp));
      }
    }
    refs.complete = size == std::min(len, kMaxScanBytes);
    return refs;
  }

  bool CallsExport(uint64_t target, std::string_view name) {
    if (auto it = image_.exports.find(std::string(name)); it != image_.exports.end() && it->second == target) {
      return true;
    }
    if (!ok()) return false;
    auto [bytes, size] = image_.Bytes(target, 32);
    const uint8_t* code = bytes;
    size_t left = size;
    uint64_t address = target;
    for (int n = 0; n < 2 && cs_disasm_iter(cs_, &code, &left, &address, insn_); ++n) {
      if (insn_->id == X86_INS_ENDBR64) continue;
      const cs_x86& x = insn_->detail->x86;
      if (insn_->id != X86_INS_JMP || x.op_count != 1 || x.operands[0].type != X86_OP_MEM ||
          x.operands[0].mem.base != X86_REG_RIP || x.operands[0].mem.index != X86_REG_INVALID) {
        return false;
      }
      const uint64_t slot = insn_->address + insn_->size + static_cast<uint64_t>(x.operands[0].mem.disp);
      auto it = image_.plt_slots.find(slot);
      return it != image_.plt_slots.end() && it->second == name;
    }
    return false;
  }

  // The registers' values where known (rax 0 .. r15 15).
  using Regs = std::array<std::optional<uint64_t>, 16>;

  // rip-relative [rip+disp] with no index: its address (`next`: the
  // instruction's end).
  static std::optional<uint64_t> RipAddress(const cs_x86_op& op, uint64_t next) {
    if (op.type != X86_OP_MEM || op.mem.base != X86_REG_RIP || op.mem.index != X86_REG_INVALID ||
        op.mem.segment != X86_REG_INVALID) {
      return std::nullopt;
    }
    return next + static_cast<uint64_t>(op.mem.disp);
  }

  static void Set(Regs& regs, Gpr r, std::optional<uint64_t> v) {
    if (r.index < 0) return;
    // A 32-bit write zero-extends; an 8- or 16-bit one keeps the rest, unknown here.
    regs[r.index] = (v && r.width >= 4) ? std::optional<uint64_t>(Truncate(*v, r.width)) : std::nullopt;
  }

  // mov/movabs into a register (an immediate, a register of its width, else
  // unknown) or a store: to rip-relative memory recorded, to other memory
  // (the stack) ignored. False: a form the run does not follow.
  static bool Move(const cs_x86& x, uint64_t next, Regs& regs, X86Run& run) {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2) return false;
    if (ops[0].type == X86_OP_REG) {
      const Gpr dst = GprOf(ops[0].reg);
      if (ops[1].type == X86_OP_IMM) {
        Set(regs, dst, static_cast<uint64_t>(ops[1].imm));
      } else if (ops[1].type == X86_OP_REG) {
        const Gpr src = GprOf(ops[1].reg);
        Set(regs, dst, src.index >= 0 && src.width == dst.width ? regs[src.index] : std::nullopt);
      } else {
        Set(regs, dst, std::nullopt);
      }
      return true;
    }
    if (ops[0].type != X86_OP_MEM) return false;
    if (auto at = RipAddress(ops[0], next)) {
      std::optional<uint64_t> v;
      if (ops[1].type == X86_OP_IMM) {
        v = Truncate(static_cast<uint64_t>(ops[1].imm), ops[0].size);
      } else if (ops[1].type == X86_OP_REG) {
        const Gpr src = GprOf(ops[1].reg);
        if (src.index >= 0) v = regs[src.index] ? std::optional(Truncate(*regs[src.index], src.width)) : v;
      }
      run.stores.push_back({*at, ops[0].size, v});
    }
    return true;  // a store elsewhere (the stack) changes no register
  }

  // Any other instruction in insn_. Control flow the run does not follow
  // stops it (false). Otherwise its stores to rip-relative memory have no
  // known value (vector stores of zeroes or of a constant from .rodata), and
  // the registers it writes are forgotten.
  bool Other(const cs_x86& x, uint64_t next, Regs& regs, X86Run& run) {
    if (cs_insn_group(cs_, insn_, CS_GRP_JUMP) || cs_insn_group(cs_, insn_, CS_GRP_CALL) ||
        cs_insn_group(cs_, insn_, CS_GRP_RET) || cs_insn_group(cs_, insn_, CS_GRP_INT) ||
        cs_insn_group(cs_, insn_, CS_GRP_IRET)) {
      return false;
    }
    const cs_x86_op* ops = x.operands;
    if (x.op_count >= 1) {
      if (auto at = RipAddress(ops[0], next); at && (ops[0].access & CS_AC_WRITE)) {
        run.stores.push_back({*at, ops[0].size, std::nullopt});
      }
    }
    cs_regs read{}, written{};
    uint8_t nread = 0, nwritten = 0;
    if (cs_regs_access(cs_, insn_, read, &nread, written, &nwritten) != CS_ERR_OK) return false;
    for (uint8_t i = 0; i < nwritten; ++i) {
      const Gpr r = GprOf(written[i]);
      if (r.index >= 0) regs[r.index].reset();
    }
    return true;
  }

  const LoaderImage& image_;
  csh cs_ = 0;
  cs_insn* insn_ = nullptr;
};

X86Interpreter::X86Interpreter(const LoaderImage& image) : impl_(std::make_unique<Impl>(image)) {}
X86Interpreter::~X86Interpreter() = default;
bool X86Interpreter::ok() const { return impl_->ok(); }
X86Run X86Interpreter::Execute(uint64_t fn) { return impl_->Execute(fn); }
X86Refs X86Interpreter::Scan(uint64_t fn, uint64_t len) { return impl_->Scan(fn, len); }
bool X86Interpreter::CallsExport(uint64_t target, std::string_view name) { return impl_->CallsExport(target, name); }

}  // namespace tlsprof::symbols
