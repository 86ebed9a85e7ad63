#include "agent/usage/accessors.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

namespace tlsprof::usage {
namespace {

constexpr size_t kMaxLoads = 4;  // USAGE_MAX_LOADS in bpf/usage.h
constexpr int kRax = 0;
constexpr int kRdi = 7;
constexpr int kRsp = 4;
constexpr int kRbp = 5;

int32_t ReadI32(std::span<const uint8_t> code, size_t at) {
  uint32_t v = static_cast<uint32_t>(code[at]) | static_cast<uint32_t>(code[at + 1]) << 8 |
               static_cast<uint32_t>(code[at + 2]) << 16 | static_cast<uint32_t>(code[at + 3]) << 24;
  return static_cast<int32_t>(v);
}

// Whether the code at `at` only returns: xor r32,r32 (any register) then
// ret. Sets `zeroes_rax` when it clears eax on the way.
bool OnlyReturns(std::span<const uint8_t> code, size_t at, bool& zeroes_rax) {
  zeroes_rax = false;
  for (int steps = 0; steps < 4 && at < code.size(); ++steps) {
    uint8_t rex = 0;
    if ((code[at] & 0xf0) == 0x40) rex = code[at++];
    if (at >= code.size()) return false;
    if (code[at] == 0xc3) return rex == 0;
    if ((code[at] == 0x31 || code[at] == 0x33) && at + 1 < code.size()) {
      const uint8_t modrm = code[at + 1];
      const int reg = ((modrm >> 3) & 7) | (rex & 0x04 ? 8 : 0);
      const int rm = (modrm & 7) | (rex & 0x01 ? 8 : 0);
      if ((modrm >> 6) != 3 || reg != rm) return false;
      if (reg == kRax) zeroes_rax = true;
      at += 2;
      continue;
    }
    return false;
  }
  return false;
}

// Whether the code at `at` traps: ud2, after an optional `mov 0x0,%eax`
// (GCC's -fisolate-erroneous-paths-dereference turns a NULL dereference
// into that).
bool OnlyTraps(std::span<const uint8_t> code, size_t at) {
  constexpr uint8_t kLoadFromZero[] = {0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00};
  if (code.size() >= at + sizeof(kLoadFromZero) && std::equal(kLoadFromZero, std::end(kLoadFromZero), &code[at])) {
    at += sizeof(kLoadFromZero);
  }
  return code.size() >= at + 2 && code[at] == 0x0f && code[at + 1] == 0x0b;
}

}  // namespace

size_t TypeDispatchTarget(std::span<const uint8_t> code, size_t at) {
  if (code.size() < at + 6 || code[at] != 0x8b || code[at + 1] != 0x07 || code[at + 2] != 0x85 ||
      code[at + 3] != 0xc0) {
    return 0;
  }
  size_t next = 0;
  int64_t disp = 0;
  if (code[at + 4] == 0x74) {
    next = at + 6;
    disp = static_cast<int8_t>(code[at + 5]);
  } else if (code.size() >= at + 10 && code[at + 4] == 0x0f && code[at + 5] == 0x84) {
    next = at + 10;
    disp = ReadI32(code, at + 6);
  } else {
    return 0;
  }
  if (disp <= 0) return 0;  // forward only: the walk never loops
  const size_t target = next + static_cast<size_t>(disp);
  return target < code.size() ? target : 0;
}

std::optional<LoadChain> DecodeLoadChain(std::span<const uint8_t> code) {
  LoadChain chain;
  int tracked = kRdi;  // the register holding the pointer being followed
  size_t i = 0;
  // endbr64 (CET builds).
  if (code.size() >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa) i = 4;
  for (int steps = 0; steps < 16 && i < code.size(); ++steps) {
    uint8_t rex = 0;
    if ((code[i] & 0xf0) == 0x40) rex = code[i++];
    if (i >= code.size()) return std::nullopt;
    const bool w = rex & 0x08, r = rex & 0x04, x = rex & 0x02, b = rex & 0x01;
    uint8_t op = code[i];

    if (op == 0xc3 && rex == 0) {  // ret
      if (chain.offsets.empty() || tracked != kRax) return std::nullopt;
      return chain;
    }
    if (rex == 0 && chain.offsets.empty() && tracked == kRdi && !chain.type_guard) {
      if (size_t target = TypeDispatchTarget(code, i)) {
        chain.type_guard = true;
        i = target;
        continue;
      }
    }
    // A load into `tracked` from [tracked + disp]: mov r32/r64, r/m (8b);
    // movzx r32, r/m8 (0f b6) or r/m16 (0f b7).
    uint8_t width = 0;
    size_t modrm_at = 0;
    if (op == 0x8b) {
      width = w ? 8 : 4;
      modrm_at = i + 1;
    } else if (op == 0x0f && i + 1 < code.size() && (code[i + 1] == 0xb6 || code[i + 1] == 0xb7)) {
      width = code[i + 1] == 0xb6 ? 1 : 2;
      modrm_at = i + 2;
    }
    if (width != 0) {
      if (modrm_at >= code.size() || x) return std::nullopt;
      const uint8_t modrm = code[modrm_at];
      const int mod = modrm >> 6;
      const int reg = ((modrm >> 3) & 7) | (r ? 8 : 0);
      const int rm = (modrm & 7) | (b ? 8 : 0);
      if (mod == 3 || (modrm & 7) == kRsp) return std::nullopt;  // register operand or SIB
      if (mod == 0 && (modrm & 7) == kRbp) return std::nullopt;  // rip-relative
      if (rm != tracked) return std::nullopt;
      if (!chain.offsets.empty() && chain.width != 8) return std::nullopt;  // loaded through a non-pointer
      int32_t disp = 0;
      size_t next = modrm_at + 1;
      if (mod == 1) {
        if (next >= code.size()) return std::nullopt;
        disp = static_cast<int8_t>(code[next]);
        next += 1;
      } else if (mod == 2) {
        if (next + 4 > code.size()) return std::nullopt;
        disp = ReadI32(code, next);
        next += 4;
      }
      if (chain.offsets.size() == kMaxLoads) return std::nullopt;
      chain.offsets.push_back(disp);
      chain.width = width;
      tracked = reg;
      i = next;
      continue;
    }
    // test r64, r64 (48 85 /r) of the tracked register, then je rel8 to the
    // NULL return: a NULL pointer on the way makes the accessor return NULL,
    // which the BPF walk does too.
    if (op == 0x85 && i + 1 < code.size()) {
      const uint8_t modrm = code[i + 1];
      const int reg = ((modrm >> 3) & 7) | (r ? 8 : 0);
      const int rm = (modrm & 7) | (b ? 8 : 0);
      if ((modrm >> 6) != 3 || reg != rm || rm != tracked) return std::nullopt;
      if (i + 3 >= code.size() || code[i + 2] != 0x74) return std::nullopt;  // je rel8
      const size_t target = i + 4 + static_cast<int8_t>(code[i + 3]);
      bool zeroes_rax = false;
      // Backward, before the code's start (wrapped), or past its end: not a NULL return it can see.
      if (target <= i || target >= code.size()) return std::nullopt;
      // The NULL path must return NULL (rax is the tested register, or is
      // cleared), or trap: the walk gives up on a NULL pointer either way.
      if (!OnlyTraps(code, target)) {
        if (!OnlyReturns(code, target, zeroes_rax)) return std::nullopt;
        if (!zeroes_rax && tracked != kRax) return std::nullopt;
      }
      i += 4;
      continue;
    }
    // xor r32, r32 of another register than rax (Debian's builds clear
    // argument registers before returning: -fzero-call-used-regs).
    if ((op == 0x31 || op == 0x33) && i + 1 < code.size()) {
      const uint8_t modrm = code[i + 1];
      const int reg = ((modrm >> 3) & 7) | (r ? 8 : 0);
      const int rm = (modrm & 7) | (b ? 8 : 0);
      if ((modrm >> 6) != 3 || reg != rm || reg == kRax) return std::nullopt;
      i += 2;
      continue;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<LoadChain> Compose(const LoadChain& first, const LoadChain& second) {
  if (!first.plain_pointer() || first.offsets.empty() || second.offsets.empty() || second.type_guard) {
    return std::nullopt;
  }
  if (first.offsets.size() + second.offsets.size() > kMaxLoads) return std::nullopt;
  LoadChain out = first;
  out.offsets.insert(out.offsets.end(), second.offsets.begin(), second.offsets.end());
  out.width = second.width;
  out.shift = second.shift;
  out.bits = second.bits;
  out.invert = second.invert;
  return out;
}

std::string ToString(const LoadChain& chain) {
  std::string out = chain.type_guard ? "[+0x0 == 0] " : "";
  for (size_t i = 0; i < chain.offsets.size(); ++i) {
    if (i) out += " -> ";
    int32_t off = chain.offsets[i];
    out += off < 0 ? fmt::format("-{:#x}", -static_cast<int64_t>(off)) : fmt::format("+{:#x}", off);
  }
  out += fmt::format(" ({} bytes)", chain.width);
  if (chain.bits == 1) {
    out += fmt::format(" bit {}", chain.shift);
  } else if (chain.bits > 1) {
    out += fmt::format(" bits {}-{}", chain.shift, chain.shift + chain.bits - 1);
  } else if (chain.shift) {
    out += fmt::format(" >> {}", chain.shift);
  }
  if (chain.invert) out += " == 0";
  return out;
}

}  // namespace tlsprof::usage
