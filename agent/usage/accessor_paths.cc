#include "agent/usage/accessor_paths.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

#include <capstone/capstone.h>

#include "agent/symbols/x86_interpreter.h"
#include "bpf/usage.h"

namespace tlsprof::usage {
namespace {

constexpr size_t kMaxLoads = USAGE_MAX_LOADS;
constexpr size_t kMaxPaths = 64;  // paths explored, forks included
constexpr int kMaxSteps = 256;    // instructions per path, callees included
constexpr size_t kMaxFrames = 4;  // nested calls

constexpr int kRax = 0;
constexpr int kRsp = 4;
constexpr int kRdi = 7;

// A register's value on one path.
struct Sym {
  enum class Kind : uint8_t { kUnknown, kConst, kValue };
  Kind kind = Kind::kUnknown;
  uint64_t constant = 0;  // kConst
  LoadChain chain;        // kValue: what the chain reads from the argument (no offsets: the argument)
  int32_t add = 0;        // kValue plain pointers: a constant added (an address inside the object)

  static Sym Const(uint64_t c) {
    Sym s;
    s.kind = Kind::kConst;
    s.constant = c;
    return s;
  }
  static Sym Value(LoadChain c) {
    Sym s;
    s.kind = Kind::kValue;
    s.chain = std::move(c);
    return s;
  }
  bool value() const { return kind == Kind::kValue; }
  bool pointer() const { return value() && chain.plain_pointer(); }
};

// How many low bits of a read value can be nonzero.
int ValueBits(const LoadChain& c) {
  if (c.invert) return 1;
  if (c.bits) return c.bits;
  return c.width * 8 - c.shift;
}

// `s` as an n-bit register write leaves it (zero-extended): unknown if it
// could have more bits.
Sym Narrow(const Sym& s, int n) {
  if (s.kind == Sym::Kind::kConst) return Sym::Const(n >= 64 ? s.constant : s.constant & ((1ull << n) - 1));
  if (s.value() && s.add == 0 && ValueBits(s.chain) <= n) return s;
  return Sym{};
}

// What the last test compared with zero.
struct Flags {
  enum class Kind : uint8_t { kNone, kConst, kValue };
  Kind kind = Kind::kNone;
  bool zero = false;  // kConst
  LoadChain tested;   // kValue
};

Flags FlagsOf(const Sym& s, int n) {
  Flags f;
  const Sym v = Narrow(s, n);
  if (v.kind == Sym::Kind::kConst) {
    f.kind = Flags::Kind::kConst;
    f.zero = v.constant == 0;
  } else if (v.value()) {
    f.kind = Flags::Kind::kValue;
    f.tested = v.chain;
  }
  return f;
}

// A value a path's branch tested, and the side it took.
struct Cond {
  LoadChain value;
  bool zero;
};

struct Frame {
  const FunctionCode* code = nullptr;
  size_t pc = 0;
};

struct StackSlot {
  bool is_return = false;  // a call's return address (`frame`), else a pushed register
  Sym value;
  Frame frame;
};

struct Path {
  Frame at;
  std::array<Sym, 16> regs{};
  std::vector<StackSlot> stack;
  Flags flags;
  std::vector<Cond> conds;
  int steps = 0;
  // It loads through a pointer the facts say is NULL when the field is read
  // (AccessorContext::null_pointers): the accessor would fault there, so it
  // never takes this path then (BoringSSL
  // 14's SSL_get_session() reads the handshake object only when there is no
  // established session). Dropped, not a failure.
  mutable bool impossible = false;
};

struct Outcome {
  std::vector<Cond> conds;
  Sym result;
};

// A general-purpose register as capstone names it: its number (rax 0 ..
// r15 15) and the bytes it names (8, 4, 2, 1); nullopt for the others
// (ah..bh, rip, segment and vector registers).
struct Reg {
  int index;
  int width;
};

std::optional<Reg> RegOf(x86_reg r) {
  const symbols::X86Gpr g = symbols::X86GprOf(r);
  if (g.index < 0) return std::nullopt;
  return Reg{g.index, g.width};
}

// A register operand of 4 or 8 bytes (the widths modelled; a 16-bit
// operation is not an accessor's).
std::optional<Reg> Reg32Or64(const cs_x86_op& op) {
  if (op.type != X86_OP_REG) return std::nullopt;
  auto r = RegOf(op.reg);
  if (!r || r->width < 4) return std::nullopt;
  return r;
}

// [base + disp]: no index, segment or rip.
struct PlainMem {
  int base;
  int32_t disp;
};

std::optional<PlainMem> PlainMemOf(const cs_x86_op& op) {
  if (op.type != X86_OP_MEM || op.mem.segment != X86_REG_INVALID || op.mem.index != X86_REG_INVALID) {
    return std::nullopt;
  }
  auto base = RegOf(op.mem.base);
  if (!base || base->width != 8 || op.mem.disp < INT32_MIN || op.mem.disp > INT32_MAX) return std::nullopt;
  return PlainMem{base->index, static_cast<int32_t>(op.mem.disp)};
}

// A contiguous mask `imm` applied to a read value, for a test (`shifted`:
// where it lies does not matter) or as an and (the mask must start at bit
// 0, or the result would not be the bit field's value).
std::optional<LoadChain> Masked(LoadChain c, uint64_t imm, bool shifted) {
  if (imm == 0) return std::nullopt;
  const int low = std::countr_zero(imm);
  const uint64_t run = imm >> low;
  if ((run & (run + 1)) != 0) return std::nullopt;  // not one run of ones
  const int n = std::popcount(run);
  if (!shifted && low != 0) return std::nullopt;
  if (c.invert) {
    // Already 0 or 1: masking keeps it only if the mask keeps bit 0.
    if (low != 0) return std::nullopt;
    return c;
  }
  const int available = ValueBits(c);
  if (low >= available) return std::nullopt;  // always 0
  c.shift = static_cast<uint8_t>(c.shift + low);
  c.bits = static_cast<uint8_t>(std::min(n, available - low));
  return c;
}

class Runner {
 public:
  explicit Runner(const AccessorContext& context) : context_(context) {
    if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs_) != CS_ERR_OK) return;
    cs_option(cs_, CS_OPT_DETAIL, CS_OPT_ON);
    insn_ = cs_malloc(cs_);
  }
  ~Runner() {
    if (insn_) cs_free(insn_, 1);
    if (cs_) cs_close(&cs_);
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  std::optional<LoadChain> Run(const FunctionCode& code) {
    if (!insn_) return std::nullopt;
    Path start;
    start.at = {&code, 0};
    start.regs[kRdi] = Sym::Value(LoadChain{{}, 8});
    work_.push_back(std::move(start));
    while (!work_.empty()) {
      Path p = std::move(work_.back());
      work_.pop_back();
      if (!RunPath(p) && !p.impossible) return std::nullopt;
    }
    return Combine();
  }

 private:
  bool NullByFact(const LoadChain& c) const {
    for (const LoadChain& n : context_.null_pointers) {
      if (n == c) return true;
    }
    return false;
  }

  bool KnownNull(const Path& p, const LoadChain& c) const {
    if (NullByFact(c)) return true;
    for (const Cond& k : p.conds) {
      if (k.zero && k.value == c) return true;
    }
    return false;
  }

  // Whether `c` is zero on this path: from the facts and the path's own
  // earlier branches; nullopt when it is open.
  std::optional<bool> Decide(const Path& p, const LoadChain& c) const {
    if (c.plain_pointer() && KnownNull(p, c)) return true;
    for (const Cond& k : p.conds) {
      if (k.value == c) return k.zero;
    }
    return std::nullopt;
  }

  // A load of `width` bytes from [base + disp]; nullopt: the path fails.
  std::optional<Sym> Load(const Path& p, const Sym& base, int32_t disp, uint8_t width) const {
    // Through a pointer the facts say is NULL: a path the accessor never
    // takes then. Through one the path's own branch found NULL: code that
    // faults on it, not an accessor's; the decode fails.
    if (base.pointer() && NullByFact(base.chain)) {
      p.impossible = true;
      return std::nullopt;
    }
    if (!base.pointer() || KnownNull(p, base.chain)) return std::nullopt;
    if (base.chain.offsets.size() >= kMaxLoads) return Sym{};
    const int64_t off = static_cast<int64_t>(disp) + base.add;
    if (off < INT32_MIN || off > INT32_MAX) return Sym{};
    LoadChain c = base.chain;
    c.offsets.push_back(static_cast<int32_t>(off));
    c.width = width;
    return Sym::Value(std::move(c));
  }

  // Continues at `target`: in the same bytes, or in the code resolve()
  // gives for it (a call pushes the return first).
  bool Goto(Path& p, uint64_t target) const {
    const FunctionCode& code = *p.at.code;
    if (target >= code.vaddr && target < code.vaddr + code.prefix.size()) {
      p.at.pc = target - code.vaddr;
      return true;
    }
    // The code that runs from `target` (for a PLT stub: its callee's).
    const FunctionCode* next = context_.resolve ? context_.resolve(target) : nullptr;
    if (!next || next->prefix.empty()) return false;
    p.at = {next, 0};
    return true;
  }

  bool SetReg(Path& p, int r, Sym value) const {
    if (r == kRsp) return false;  // the stack is modelled by push and pop only
    p.regs[r] = std::move(value);
    return true;
  }

  // A value read from an operand: a register (`width` bytes of it, ah..bh
  // refused) or plain memory; nullopt: the path fails.
  std::optional<Sym> Read(const Path& p, const cs_x86_op& op, int width) const {
    if (op.type == X86_OP_REG) {
      auto r = RegOf(op.reg);
      if (!r) return std::nullopt;
      return Narrow(p.regs[r->index], width * 8);
    }
    auto mem = PlainMemOf(op);
    if (!mem) return std::nullopt;
    return Load(p, p.regs[mem->base], mem->disp, static_cast<uint8_t>(width));
  }

  // What one instruction did to its path.
  enum class Step : uint8_t {
    kFail,   // not modelled: the path fails
    kNext,   // on at the next instruction
    kMoved,  // p.at already moved: a jump, a call, a return to the caller, a decided branch
    kEnded,  // the path returned (an outcome recorded) or forked (both halves queued)
  };

  // Runs one path until it returns (an outcome), forks (both halves queued)
  // or fails (false). The instructions come decoded from capstone; what
  // each does to the symbolic registers and flags is in Execute(), and any
  // other instruction, operand form or width fails the path.
  bool RunPath(Path& p) {
    for (;;) {
      if (++p.steps > kMaxSteps) return false;
      const std::vector<uint8_t>& b = p.at.code->prefix;
      const size_t i = p.at.pc;
      if (i >= b.size()) return false;
      // endbr64 (capstone 4 reads it as a nop of another form).
      if (i + 4 <= b.size() && b[i] == 0xf3 && b[i + 1] == 0x0f && b[i + 2] == 0x1e && b[i + 3] == 0xfa) {
        p.at.pc += 4;
        continue;
      }
      const uint8_t* bytes = b.data() + i;
      size_t size = b.size() - i;
      uint64_t address = p.at.code->vaddr + i;
      if (!cs_disasm_iter(cs_, &bytes, &size, &address, insn_)) return false;
      const size_t next = i + insn_->size;
      switch (Execute(p, next)) {
        case Step::kFail:
          return false;
        case Step::kNext:
          p.at.pc = next;
          break;
        case Step::kMoved:
          break;
        case Step::kEnded:
          return true;
      }
    }
  }

  // The instruction in insn_, on path `p`; `next` is the offset after it.
  Step Execute(Path& p, size_t next) {
    const cs_x86& x = insn_->detail->x86;
    switch (insn_->id) {
      case X86_INS_NOP:
        return Step::kNext;
      case X86_INS_XCHG:  // xchg %ax,%ax (66 90): a nop of padding
        return IsAxNop(x) ? Step::kNext : Step::kFail;
      case X86_INS_RET:
        return Ret(p, x);
      case X86_INS_PUSH:
      case X86_INS_POP:
        return PushPop(p, x, insn_->id == X86_INS_PUSH);
      case X86_INS_MOV:
      case X86_INS_MOVABS:
        return Mov(p, x);
      case X86_INS_MOVZX:
        return Movzx(p, x);
      case X86_INS_LEA:
        return Lea(p, x);
      case X86_INS_XOR:
        return Xor(p, x);
      case X86_INS_TEST:
        return Test(p, x);
      case X86_INS_CMP:
        return Cmp(p, x);
      case X86_INS_AND:
      case X86_INS_ADD:
      case X86_INS_SHR:
        return Arith(p, x, insn_->id);
      case X86_INS_SETE:
      case X86_INS_SETNE:
        return SetCcInsn(p, x, insn_->id == X86_INS_SETE);
      case X86_INS_JE:
      case X86_INS_JNE:
        return Jcc(p, x, insn_->id == X86_INS_JE, next);
      case X86_INS_JMP:
      case X86_INS_CALL:
        return JmpOrCall(p, x, insn_->id == X86_INS_CALL, next);
      default:
        return Step::kFail;
    }
  }

  // On at the next instruction if the step held, else the path fails.
  static Step NextIf(bool held) { return held ? Step::kNext : Step::kFail; }

  // The one operand, a register of `width` bytes (ah..bh refused); nullopt
  // for any other operand form.
  static std::optional<Reg> SoleReg(const cs_x86& x, int width) {
    if (x.op_count != 1 || x.operands[0].type != X86_OP_REG) return std::nullopt;
    auto r = RegOf(x.operands[0].reg);
    if (!r || r->width != width) return std::nullopt;
    return r;
  }

  static bool IsAxNop(const cs_x86& x) {
    const cs_x86_op* ops = x.operands;
    return x.op_count == 2 && ops[0].type == X86_OP_REG && ops[0].reg == X86_REG_AX && ops[1].type == X86_OP_REG &&
           ops[1].reg == X86_REG_AX;
  }

  // Out of the accessor (an outcome) or back to a caller of the path's own.
  Step Ret(Path& p, const cs_x86& x) {
    if (x.op_count != 0) return Step::kFail;
    if (p.stack.empty()) {
      // A pointer the path knows to be NULL is the constant 0.
      Sym result = p.regs[kRax];
      if (result.pointer() && result.add == 0 && Decide(p, result.chain) == true) result = Sym::Const(0);
      outcomes_.push_back({std::move(p.conds), std::move(result)});
      return Step::kEnded;
    }
    if (!p.stack.back().is_return) return Step::kFail;  // unbalanced pushes
    p.at = p.stack.back().frame;
    p.stack.pop_back();
    p.flags = {};
    return Step::kMoved;
  }

  // A 64-bit register saved to or restored from the modelled stack.
  Step PushPop(Path& p, const cs_x86& x, bool push) const {
    auto r = SoleReg(x, 8);
    if (!r) return Step::kFail;
    if (push) {
      p.stack.push_back({false, p.regs[r->index], {}});
      return Step::kNext;
    }
    if (p.stack.empty() || p.stack.back().is_return) return Step::kFail;
    if (!SetReg(p, r->index, p.stack.back().value)) return Step::kFail;
    p.stack.pop_back();
    return Step::kNext;
  }

  // Into a register only (no stores): an immediate, a register, or a load
  // of 4 or 8 bytes.
  Step Mov(Path& p, const cs_x86& x) const {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2) return Step::kFail;
    auto dst = Reg32Or64(ops[0]);
    if (!dst) return Step::kFail;
    Sym v;
    if (ops[1].type == X86_OP_IMM) {
      const uint64_t imm = static_cast<uint64_t>(ops[1].imm);
      v = Sym::Const(dst->width == 8 ? imm : imm & 0xffffffffu);
    } else if (ops[1].type == X86_OP_REG) {
      auto src = Reg32Or64(ops[1]);
      if (!src) return Step::kFail;
      v = dst->width == 8 ? p.regs[src->index] : Narrow(p.regs[src->index], 32);
    } else {
      auto mem = PlainMemOf(ops[1]);
      if (!mem) return Step::kFail;
      auto loaded = Load(p, p.regs[mem->base], mem->disp, static_cast<uint8_t>(dst->width));
      if (!loaded) return Step::kFail;
      v = *loaded;
    }
    return NextIf(SetReg(p, dst->index, v));
  }

  // From 1 or 2 bytes of a register or memory.
  Step Movzx(Path& p, const cs_x86& x) const {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2 || ops[1].size > 2) return Step::kFail;
    auto dst = Reg32Or64(ops[0]);
    if (!dst) return Step::kFail;
    auto v = Read(p, ops[1], ops[1].size);
    return NextIf(v && SetReg(p, dst->index, *v));
  }

  // An address inside the object a pointer points to, else unknown.
  Step Lea(Path& p, const cs_x86& x) const {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2) return Step::kFail;
    auto dst = Reg32Or64(ops[0]);
    if (!dst || ops[1].type != X86_OP_MEM) return Step::kFail;
    Sym v;
    auto mem = PlainMemOf(ops[1]);
    if (dst->width == 8 && mem && p.regs[mem->base].pointer()) {
      const int64_t add = static_cast<int64_t>(p.regs[mem->base].add) + mem->disp;
      if (add >= INT32_MIN && add <= INT32_MAX) {
        v = p.regs[mem->base];
        v.add = static_cast<int32_t>(add);
      }
    }
    return NextIf(SetReg(p, dst->index, v));
  }

  // Of registers: a register with itself clears it.
  Step Xor(Path& p, const cs_x86& x) const {
    if (x.op_count != 2) return Step::kFail;
    auto dst = Reg32Or64(x.operands[0]), src = Reg32Or64(x.operands[1]);
    if (!dst || !src) return Step::kFail;
    if (!SetReg(p, dst->index, dst->index == src->index ? Sym::Const(0) : Sym{})) return Step::kFail;
    p.flags = {};
    return Step::kNext;
  }

  // A register with itself (1, 4 or 8 bytes), or $imm8 against a byte of a
  // register or memory.
  Step Test(Path& p, const cs_x86& x) const {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2) return Step::kFail;
    if (ops[1].type == X86_OP_REG) {
      if (ops[0].type != X86_OP_REG || ops[0].reg != ops[1].reg) return Step::kFail;
      auto r = RegOf(ops[0].reg);
      if (!r || r->width == 2) return Step::kFail;
      p.flags = FlagsOf(p.regs[r->index], r->width * 8);
      return Step::kNext;
    }
    if (ops[1].type != X86_OP_IMM || ops[0].size != 1) return Step::kFail;
    const uint8_t imm = static_cast<uint8_t>(ops[1].imm);
    auto tested = Read(p, ops[0], 1);
    if (!tested) return Step::kFail;
    p.flags = {};
    if (tested->kind == Sym::Kind::kConst) {
      p.flags.kind = Flags::Kind::kConst;
      p.flags.zero = (tested->constant & imm) == 0;
    } else if (tested->value()) {
      if (auto masked = Masked(tested->chain, imm, true)) {
        p.flags.kind = Flags::Kind::kValue;
        p.flags.tested = *masked;
      }
    }
    return Step::kNext;
  }

  // With 0 it is a test; other comparisons are not modelled.
  Step Cmp(Path& p, const cs_x86& x) const {
    const cs_x86_op* ops = x.operands;
    if (x.op_count != 2 || ops[1].type != X86_OP_IMM || ops[0].size == 2) return Step::kFail;
    p.flags = {};
    if (ops[1].imm == 0) {
      auto v = Read(p, ops[0], ops[0].size);
      if (!v) return Step::kFail;
      p.flags = FlagsOf(*v, ops[0].size * 8);
    }
    return Step::kNext;
  }

  // and, add or shr of a register and an immediate (shr: or 1).
  Step Arith(Path& p, const cs_x86& x, unsigned id) const {
    const cs_x86_op* ops = x.operands;
    const int n = x.op_count;
    auto r = n >= 1 ? Reg32Or64(ops[0]) : std::nullopt;
    if (!r) return Step::kFail;
    const bool w = r->width == 8;
    const Sym& v = p.regs[r->index];
    Sym out;
    if (id == X86_INS_SHR) {
      if (n == 2 && ops[1].type != X86_OP_IMM) return Step::kFail;
      const int count = static_cast<int>((n == 2 ? ops[1].imm : 1) & (w ? 63 : 31));
      out = Shr(v, count, w);
    } else {
      if (n != 2 || ops[1].type != X86_OP_IMM) return Step::kFail;
      const uint64_t imm = static_cast<uint64_t>(ops[1].imm);
      out = id == X86_INS_AND ? And(v, w ? imm : imm & 0xffffffffu, w) : Add(v, static_cast<int64_t>(ops[1].imm), w);
    }
    if (!SetReg(p, r->index, out)) return Step::kFail;
    p.flags = {};
    return Step::kNext;
  }

  // sete / setne into a byte register (not ah..bh).
  Step SetCcInsn(Path& p, const cs_x86& x, bool if_zero) const {
    auto r = SoleReg(x, 1);
    if (!r) return Step::kFail;
    auto v = SetCc(p, if_zero, p.regs[r->index]);
    return NextIf(v && SetReg(p, r->index, *v));
  }

  // je / jne: decided by what the path knows, else a fork.
  Step Jcc(Path& p, const cs_x86& x, bool if_zero, size_t next) {
    if (x.op_count != 1 || x.operands[0].type != X86_OP_IMM) return Step::kFail;
    if (!Branch(p, if_zero, static_cast<uint64_t>(x.operands[0].imm), next)) return Step::kFail;
    return p.at.code == nullptr ? Step::kEnded : Step::kMoved;
  }

  // Relative only; a call pushes its return, up to kMaxFrames deep.
  Step JmpOrCall(Path& p, const cs_x86& x, bool call, size_t next) const {
    if (x.op_count != 1 || x.operands[0].type != X86_OP_IMM) return Step::kFail;
    if (call) {
      size_t frames = 0;
      for (const StackSlot& slot : p.stack) frames += slot.is_return;
      if (frames >= kMaxFrames) return Step::kFail;
      p.stack.push_back({true, Sym{}, {p.at.code, next}});
      p.flags = {};
    }
    return Goto(p, static_cast<uint64_t>(x.operands[0].imm)) ? Step::kMoved : Step::kFail;
  }

  // je (`if_zero`) or jne to `target`, else on at `fallthrough`. Forks when
  // the tested value is open: both halves are queued and p.at.code is
  // cleared.
  bool Branch(Path& p, bool if_zero, uint64_t target, size_t fallthrough) {
    std::optional<bool> zero;
    if (p.flags.kind == Flags::Kind::kConst) {
      zero = p.flags.zero;
    } else if (p.flags.kind == Flags::Kind::kValue) {
      zero = Decide(p, p.flags.tested);
    } else {
      return false;  // flags of something not modelled
    }
    if (zero) {
      if (*zero == if_zero) return Goto(p, target);
      p.at.pc = fallthrough;
      return true;
    }
    if (++paths_ > kMaxPaths) return false;
    Path taken = p;
    taken.conds.push_back({p.flags.tested, if_zero});
    if (!Goto(taken, target)) return false;
    p.conds.push_back({p.flags.tested, !if_zero});
    p.at.pc = fallthrough;
    work_.push_back(std::move(taken));
    work_.push_back(std::move(p));
    p.at.code = nullptr;
    return true;
  }

  // sete (`if_zero`) / setne into a register that must be 0 before (its
  // upper bits stay).
  std::optional<Sym> SetCc(const Path& p, bool if_zero, const Sym& before) const {
    if (before.kind != Sym::Kind::kConst || before.constant != 0) return std::nullopt;
    if (p.flags.kind == Flags::Kind::kConst) return Sym::Const(p.flags.zero == if_zero ? 1 : 0);
    if (p.flags.kind != Flags::Kind::kValue) return std::nullopt;
    LoadChain c = p.flags.tested;
    if (if_zero) {
      // !v; !(!v) is v only when v is one bit.
      if (c.invert) {
        c.invert = false;
        if (ValueBits(c) != 1) return std::nullopt;
      } else {
        c.invert = true;
      }
    } else if (ValueBits(c) != 1) {
      return std::nullopt;  // v != 0 is v only when v is one bit
    }
    return Sym::Value(std::move(c));
  }

  static Sym And(const Sym& s, uint64_t mask, bool w) {
    if (s.kind == Sym::Kind::kConst) return Sym::Const(s.constant & mask);
    const Sym v = w ? s : Narrow(s, 32);
    if (!v.value() || v.add != 0) return Sym{};
    auto masked = Masked(v.chain, mask, false);
    return masked ? Sym::Value(*masked) : Sym{};
  }

  static Sym Add(const Sym& s, int64_t imm, bool w) {
    if (s.kind == Sym::Kind::kConst) {
      const uint64_t sum = s.constant + static_cast<uint64_t>(imm);
      return Sym::Const(w ? sum : sum & 0xffffffffu);
    }
    if (!w || !s.pointer()) return Sym{};
    const int64_t add = static_cast<int64_t>(s.add) + imm;
    if (add < INT32_MIN || add > INT32_MAX) return Sym{};
    Sym v = s;
    v.add = static_cast<int32_t>(add);
    return v;
  }

  static Sym Shr(const Sym& s, int count, bool w) {
    if (s.kind == Sym::Kind::kConst) return Sym::Const((w ? s.constant : s.constant & 0xffffffffu) >> count);
    const Sym v = w ? s : Narrow(s, 32);
    if (!v.value() || v.add != 0 || v.chain.invert) return Sym{};
    if (count == 0) return v;
    LoadChain c = v.chain;
    if (count >= ValueBits(c)) return Sym{};  // always 0: not a field
    c.shift = static_cast<uint8_t>(c.shift + count);
    if (c.bits) c.bits = static_cast<uint8_t>(c.bits - count);
    return Sym::Value(std::move(c));
  }

  static bool IsPointerPrefix(const LoadChain& prefix, const LoadChain& of) {
    if (!prefix.plain_pointer() || prefix.offsets.size() >= of.offsets.size()) return false;
    return std::equal(prefix.offsets.begin(), prefix.offsets.end(), of.offsets.begin());
  }

  // The one field all outcomes agree on (the header's two shapes).
  std::optional<LoadChain> Combine() const {
    if (outcomes_.empty()) return std::nullopt;
    const Outcome* read = nullptr;
    for (const Outcome& o : outcomes_) {
      if (o.result.kind == Sym::Kind::kUnknown) return std::nullopt;
      if (o.result.value() && !read) read = &o;
    }
    if (read) {
      const LoadChain& f = read->result.chain;
      if (read->result.add != 0 || f.offsets.empty()) return std::nullopt;  // an address, or the argument
      for (const Outcome& o : outcomes_) {
        if (o.result.value()) {
          if (o.result.add != 0 || !(o.result.chain == f)) return std::nullopt;
          for (const Cond& k : o.conds) {
            if (k.zero || !IsPointerPrefix(k.value, f)) return std::nullopt;
          }
          continue;
        }
        // A constant: 0 where a pointer on the chain is NULL.
        bool null_on_chain = false;
        for (const Cond& k : o.conds) {
          if (!IsPointerPrefix(k.value, f)) return std::nullopt;
          null_on_chain |= k.zero;
        }
        if (o.result.constant != 0 || !null_on_chain) return std::nullopt;
      }
      return f;
    }
    // Constants only: 0 or 1 by one tested bit.
    std::optional<LoadChain> bit;
    std::optional<uint64_t> when_zero, when_set;
    for (const Outcome& o : outcomes_) {
      const Cond* tested = nullptr;
      bool null_pointer = false;
      for (const Cond& k : o.conds) {
        if (k.value.plain_pointer()) {
          null_pointer |= k.zero;
          continue;
        }
        if (tested) return std::nullopt;  // two bits
        tested = &k;
      }
      if (null_pointer) {
        if (o.result.constant != 0) return std::nullopt;
        continue;  // checked against the bit's chain below
      }
      if (!tested || ValueBits(tested->value) != 1) return std::nullopt;
      if (bit && !(*bit == tested->value)) return std::nullopt;
      bit = tested->value;
      std::optional<uint64_t>& side = tested->zero ? when_zero : when_set;
      if (side && *side != o.result.constant) return std::nullopt;
      side = o.result.constant;
    }
    if (!bit || !when_zero || !when_set || *when_zero > 1 || *when_set > 1 || *when_zero == *when_set)
      return std::nullopt;
    for (const Outcome& o : outcomes_) {
      for (const Cond& k : o.conds) {
        if (k.value.plain_pointer() && !IsPointerPrefix(k.value, *bit)) return std::nullopt;
      }
    }
    LoadChain f = *bit;
    if (*when_set == 0) f.invert = !f.invert;  // the accessor returns 1 when the bit is clear
    return f;
  }

  const AccessorContext& context_;
  csh cs_ = 0;
  cs_insn* insn_ = nullptr;  // the instruction decoded last (detail on)
  std::vector<Path> work_;
  std::vector<Outcome> outcomes_;
  size_t paths_ = 1;
};

}  // namespace

std::optional<LoadChain> DecodeAccessor(const FunctionCode& code, const AccessorContext& context) {
  return Runner(context).Run(code);
}

}  // namespace tlsprof::usage
