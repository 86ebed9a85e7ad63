#include "agent/usage/accessor_paths.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

#include "bpf/usage.h"

namespace tlsprof::usage {
namespace {

constexpr size_t kMaxLoads = USAGE_MAX_LOADS;
constexpr size_t kMaxPaths = 64;  // paths explored, forks included
constexpr int kMaxSteps = 256;    // instructions per path, callees included
constexpr size_t kMaxFrames = 4;  // nested calls

constexpr int kRax = 0;
constexpr int kRsp = 4;
constexpr int kRbp = 5;
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
};

struct Outcome {
  std::vector<Cond> conds;
  Sym result;
};

// A ModRM operand (and its SIB and displacement).
struct Operand {
  bool is_reg = false;
  bool plain = false;  // memory: [base + disp], no SIB, not rip-relative
  int reg = 0;         // the ModRM reg field (REX.R applied)
  int rm = 0;          // the register operand or the memory base (REX.B applied)
  int32_t disp = 0;
  size_t length = 0;  // ModRM, SIB and displacement bytes
};

int32_t ReadI32(const std::vector<uint8_t>& b, size_t at) {
  return static_cast<int32_t>(static_cast<uint32_t>(b[at]) | static_cast<uint32_t>(b[at + 1]) << 8 |
                              static_cast<uint32_t>(b[at + 2]) << 16 | static_cast<uint32_t>(b[at + 3]) << 24);
}

std::optional<Operand> ModRm(const std::vector<uint8_t>& b, size_t at, uint8_t rex) {
  if (at >= b.size()) return std::nullopt;
  const uint8_t modrm = b[at];
  Operand op;
  const int mod = modrm >> 6;
  op.reg = ((modrm >> 3) & 7) | (rex & 0x04 ? 8 : 0);
  op.rm = (modrm & 7) | (rex & 0x01 ? 8 : 0);
  op.length = 1;
  if (mod == 3) {
    op.is_reg = true;
    return op;
  }
  bool sib = (modrm & 7) == kRsp;
  bool rip = mod == 0 && (modrm & 7) == kRbp;
  if (sib) {
    if (at + 1 >= b.size()) return std::nullopt;
    if (mod == 0 && (b[at + 1] & 7) == kRbp) op.length += 4;  // no base, disp32
    op.length += 1;
  }
  if (mod == 1) op.length += 1;
  if (mod == 2 || rip) op.length += 4;
  if (at + op.length > b.size()) return std::nullopt;
  if (mod == 1) op.disp = static_cast<int8_t>(b[at + op.length - 1]);
  if (mod == 2) op.disp = ReadI32(b, at + op.length - 4);
  op.plain = !sib && !rip && !(rex & 0x02);
  return op;
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
  explicit Runner(const AccessorContext& context) : context_(context) {}

  std::optional<LoadChain> Run(const FunctionCode& code) {
    Path start;
    start.at = {&code, 0};
    start.regs[kRdi] = Sym::Value(LoadChain{{}, 8});
    work_.push_back(std::move(start));
    while (!work_.empty()) {
      Path p = std::move(work_.back());
      work_.pop_back();
      if (!RunPath(p)) return std::nullopt;
    }
    return Combine();
  }

 private:
  bool KnownNull(const Path& p, const LoadChain& c) const {
    for (const LoadChain& n : context_.null_pointers) {
      if (n == c) return true;
    }
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
    if (!base.pointer() || KnownNull(p, base.chain)) return std::nullopt;  // through NULL: not an accessor's path
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

  // Runs one path until it returns (an outcome), forks (both halves queued)
  // or fails (false).
  bool RunPath(Path& p) {
    for (;;) {
      if (++p.steps > kMaxSteps) return false;
      const std::vector<uint8_t>& b = p.at.code->prefix;
      size_t i = p.at.pc;
      auto have = [&](size_t n) { return i + n <= b.size(); };
      if (!have(1)) return false;
      // endbr64, and the nops compilers pad with.
      if (have(4) && b[i] == 0xf3 && b[i + 1] == 0x0f && b[i + 2] == 0x1e && b[i + 3] == 0xfa) {
        p.at.pc += 4;
        continue;
      }
      if (b[i] == 0x90) {
        p.at.pc += 1;
        continue;
      }
      if (b[i] == 0xf3 && have(2) && b[i + 1] == 0xc3) ++i;  // repz ret
      uint8_t rex = 0;
      if ((b[i] & 0xf0) == 0x40) rex = b[i++];
      if (!have(1)) return false;
      const bool w = rex & 0x08;
      const uint8_t op = b[i];
      const uint64_t here = p.at.code->vaddr;

      // ret
      if (op == 0xc3 && !w) {
        if (p.stack.empty()) {
          // A pointer the path knows to be NULL is the constant 0.
          Sym result = p.regs[kRax];
          if (result.pointer() && result.add == 0 && Decide(p, result.chain) == true) result = Sym::Const(0);
          outcomes_.push_back({std::move(p.conds), std::move(result)});
          return true;
        }
        if (!p.stack.back().is_return) return false;  // unbalanced pushes
        p.at = p.stack.back().frame;
        p.stack.pop_back();
        p.flags = {};
        continue;
      }
      // push / pop reg
      if (op >= 0x50 && op <= 0x57) {
        p.stack.push_back({false, p.regs[(op - 0x50) | (rex & 1 ? 8 : 0)], {}});
        p.at.pc = i + 1;
        continue;
      }
      if (op >= 0x58 && op <= 0x5f) {
        if (p.stack.empty() || p.stack.back().is_return) return false;
        if (!SetReg(p, (op - 0x58) | (rex & 1 ? 8 : 0), p.stack.back().value)) return false;
        p.stack.pop_back();
        p.at.pc = i + 1;
        continue;
      }
      // mov $imm32, r32 / movabs $imm64, r64
      if (op >= 0xb8 && op <= 0xbf) {
        const int r = (op - 0xb8) | (rex & 1 ? 8 : 0);
        if (!have(w ? 9 : 5)) return false;
        uint64_t imm = static_cast<uint32_t>(ReadI32(b, i + 1));
        if (w) imm |= static_cast<uint64_t>(static_cast<uint32_t>(ReadI32(b, i + 5))) << 32;
        if (!SetReg(p, r, Sym::Const(imm))) return false;
        p.at.pc = i + (w ? 9 : 5);
        continue;
      }
      // and $imm32, %eax / %rax
      if (op == 0x25) {
        if (!have(5)) return false;
        const uint64_t imm = static_cast<uint64_t>(static_cast<int64_t>(ReadI32(b, i + 1)));
        if (!SetReg(p, kRax, And(p.regs[kRax], w ? imm : imm & 0xffffffffu, w))) return false;
        p.flags = {};
        p.at.pc = i + 5;
        continue;
      }
      // je / jne rel8, jmp rel8, jmp rel32, call rel32
      if (op == 0x74 || op == 0x75 || op == 0xeb) {
        if (!have(2)) return false;
        const uint64_t next = here + i + 2;
        const uint64_t target = next + static_cast<int8_t>(b[i + 1]);
        if (op == 0xeb) {
          if (!Goto(p, target)) return false;
          continue;
        }
        if (!Branch(p, op == 0x74, target, i + 2)) return false;
        if (p.at.code == nullptr) return true;  // forked: both halves queued
        continue;
      }
      if (op == 0xe9 || op == 0xe8) {
        if (!have(5)) return false;
        const uint64_t target = here + i + 5 + static_cast<int64_t>(ReadI32(b, i + 1));
        if (op == 0xe8) {
          size_t frames = 0;
          for (const StackSlot& s : p.stack) frames += s.is_return;
          if (frames >= kMaxFrames) return false;
          p.stack.push_back({true, Sym{}, {p.at.code, i + 5}});
          p.flags = {};
        }
        if (!Goto(p, target)) return false;
        continue;
      }
      if (op == 0x0f) {
        if (!have(2)) return false;
        const uint8_t op2 = b[i + 1];
        if (op2 == 0x84 || op2 == 0x85) {  // je / jne rel32
          if (!have(6)) return false;
          const uint64_t target = here + i + 6 + static_cast<int64_t>(ReadI32(b, i + 2));
          if (!Branch(p, op2 == 0x84, target, i + 6)) return false;
          if (p.at.code == nullptr) return true;
          continue;
        }
        auto operand = ModRm(b, i + 2, rex);
        if (!operand) return false;
        const size_t next = i + 2 + operand->length;
        if (op2 == 0x1f) {  // nop r/m
          p.at.pc = next;
          continue;
        }
        if (op2 == 0xb6 || op2 == 0xb7) {  // movzx r32, r/m8 or r/m16
          const uint8_t width = op2 == 0xb6 ? 1 : 2;
          Sym v;
          if (operand->is_reg) {
            if (width == 1 && !rex && operand->rm >= 4) return false;  // ah..bh
            v = Narrow(p.regs[operand->rm], width * 8);
          } else {
            if (!operand->plain) return false;
            auto loaded = Load(p, p.regs[operand->rm], operand->disp, width);
            if (!loaded) return false;
            v = *loaded;
          }
          if (!SetReg(p, operand->reg, v)) return false;
          p.at.pc = next;
          continue;
        }
        if ((op2 == 0x94 || op2 == 0x95) && operand->is_reg) {  // sete / setne r8
          if (!rex && operand->rm >= 4) return false;           // ah..bh
          auto v = SetCc(p, op2 == 0x94, p.regs[operand->rm]);
          if (!v || !SetReg(p, operand->rm, *v)) return false;
          p.at.pc = next;
          continue;
        }
        return false;
      }
      if (op == 0x66) {
        // Only the nops of padding (xchg %ax,%ax; nopw; cs nopw).
        size_t j = i + 1;
        while (j < b.size() && (b[j] == 0x66 || b[j] == 0x2e)) ++j;
        if (j < b.size() && b[j] == 0x90) {
          p.at.pc = j + 1;
          continue;
        }
        if (j + 1 < b.size() && b[j] == 0x0f && b[j + 1] == 0x1f) {
          auto operand = ModRm(b, j + 2, 0);
          if (!operand) return false;
          p.at.pc = j + 2 + operand->length;
          continue;
        }
        return false;
      }

      auto operand = ModRm(b, i + 1, rex);
      if (!operand) return false;
      const size_t next = i + 1 + operand->length;
      switch (op) {
        case 0x89:  // mov r/m, r: register to register only (no stores)
        case 0x8b:  // mov r, r/m
          if (operand->is_reg) {
            const int dst = op == 0x89 ? operand->rm : operand->reg;
            const int src = op == 0x89 ? operand->reg : operand->rm;
            if (!SetReg(p, dst, w ? p.regs[src] : Narrow(p.regs[src], 32))) return false;
          } else {
            if (op == 0x89 || !operand->plain) return false;
            auto loaded = Load(p, p.regs[operand->rm], operand->disp, w ? 8 : 4);
            if (!loaded || !SetReg(p, operand->reg, *loaded)) return false;
          }
          p.at.pc = next;
          continue;
        case 0x8d: {  // lea
          if (operand->is_reg) return false;
          Sym v;
          const Sym& base = p.regs[operand->rm];
          if (w && operand->plain && base.pointer()) {
            const int64_t add = static_cast<int64_t>(base.add) + operand->disp;
            if (add >= INT32_MIN && add <= INT32_MAX) {
              v = base;
              v.add = static_cast<int32_t>(add);
            }
          }
          if (!SetReg(p, operand->reg, v)) return false;
          p.at.pc = next;
          continue;
        }
        case 0x31:  // xor r/m, r
        case 0x33:  // xor r, r/m
          if (!operand->is_reg) return false;
          if (!SetReg(p, op == 0x31 ? operand->rm : operand->reg, operand->reg == operand->rm ? Sym::Const(0) : Sym{}))
            return false;
          p.flags = {};
          p.at.pc = next;
          continue;
        case 0x84:  // test r8, r8
        case 0x85:  // test r, r
          if (!operand->is_reg || operand->reg != operand->rm) return false;
          if (op == 0x84 && !rex && operand->rm >= 4) return false;
          p.flags = FlagsOf(p.regs[operand->rm], op == 0x84 ? 8 : (w ? 64 : 32));
          p.at.pc = next;
          continue;
        case 0x80:    // group 1 r/m8, imm8
        case 0x83:    // group 1 r/m, imm8
        case 0x81: {  // group 1 r/m, imm32
          const size_t imm_bytes = op == 0x81 ? 4 : 1;
          if (next + imm_bytes > b.size()) return false;
          const int64_t imm = op == 0x81 ? ReadI32(b, next) : static_cast<int8_t>(b[next]);
          const int kind = operand->reg & 7;  // /0 add, /4 and, /7 cmp
          const uint8_t width = op == 0x80 ? 1 : (w ? 8 : 4);
          p.at.pc = next + imm_bytes;
          if (kind == 7) {  // cmp with 0 is a test; other comparisons are not modelled
            p.flags = {};
            if (imm != 0) continue;
            if (operand->is_reg) {
              p.flags = FlagsOf(p.regs[operand->rm], width * 8);
            } else {
              if (!operand->plain) return false;
              auto loaded = Load(p, p.regs[operand->rm], operand->disp, width);
              if (!loaded) return false;
              p.flags = FlagsOf(*loaded, width * 8);
            }
            continue;
          }
          if (!operand->is_reg || op == 0x80) return false;
          const int r = operand->rm;
          p.flags = {};
          if (kind == 4) {
            const uint64_t mask = w ? static_cast<uint64_t>(imm) : static_cast<uint64_t>(imm) & 0xffffffffu;
            if (!SetReg(p, r, And(p.regs[r], mask, w))) return false;
            continue;
          }
          if (kind == 0) {
            if (!SetReg(p, r, Add(p.regs[r], imm, w))) return false;
            continue;
          }
          return false;
        }
        case 0xc1:                                                        // shift r/m, imm8
        case 0xd1: {                                                      // shift r/m, 1
          if (!operand->is_reg || (operand->reg & 7) != 5) return false;  // shr only
          int count = 1;
          if (op == 0xc1) {
            if (next >= b.size()) return false;
            count = b[next] & (w ? 63 : 31);
          }
          if (!SetReg(p, operand->rm, Shr(p.regs[operand->rm], count, w))) return false;
          p.flags = {};
          p.at.pc = next + (op == 0xc1 ? 1 : 0);
          continue;
        }
        case 0xc7:  // mov $imm32, r/m: registers only
          if (!operand->is_reg || (operand->reg & 7) != 0 || next + 4 > b.size()) return false;
          if (!SetReg(p, operand->rm,
                      Sym::Const(w ? static_cast<uint64_t>(static_cast<int64_t>(ReadI32(b, next)))
                                   : static_cast<uint32_t>(ReadI32(b, next)))))
            return false;
          p.at.pc = next + 4;
          continue;
        case 0xf6: {  // test $imm8, r/m8
          if ((operand->reg & 7) != 0 || next >= b.size()) return false;
          const uint8_t imm = b[next];
          p.at.pc = next + 1;
          p.flags = {};
          std::optional<Sym> tested;
          if (operand->is_reg) {
            if (!rex && operand->rm >= 4) return false;
            tested = Narrow(p.regs[operand->rm], 8);
          } else {
            if (!operand->plain) return false;
            tested = Load(p, p.regs[operand->rm], operand->disp, 1);
            if (!tested) return false;
          }
          if (tested->kind == Sym::Kind::kConst) {
            p.flags.kind = Flags::Kind::kConst;
            p.flags.zero = (tested->constant & imm) == 0;
          } else if (tested->value()) {
            if (auto masked = Masked(tested->chain, imm, true)) {
              p.flags.kind = Flags::Kind::kValue;
              p.flags.tested = *masked;
            }
          }
          continue;
        }
        default:
          return false;
      }
    }
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
  std::vector<Path> work_;
  std::vector<Outcome> outcomes_;
  size_t paths_ = 1;
};

}  // namespace

std::optional<LoadChain> DecodeAccessor(const FunctionCode& code, const AccessorContext& context) {
  return Runner(context).Run(code);
}

}  // namespace tlsprof::usage
