#include "agent/usage/probe_plan.h"

#include <algorithm>
#include <array>
#include <optional>
#include <span>

namespace tlsprof::usage {
namespace {

struct ProbedFunction {
  std::string_view name;
  uint32_t probe;
};

constexpr std::array kProbed = {
    ProbedFunction{"SSL_do_handshake", PROBE_HANDSHAKE},
    ProbedFunction{"EVP_DigestSign", PROBE_DIGEST_SIGN},
    ProbedFunction{"EVP_PKEY_sign", PROBE_PKEY_SIGN},
    ProbedFunction{"EVP_DigestVerify", PROBE_DIGEST_VERIFY},
    ProbedFunction{"EVP_PKEY_verify", PROBE_PKEY_VERIFY},
    ProbedFunction{"EVP_PKEY_derive", PROBE_DERIVE},
    ProbedFunction{"EVP_PKEY_encapsulate", PROBE_ENCAPSULATE},
    ProbedFunction{"EVP_PKEY_decapsulate", PROBE_DECAPSULATE},
    ProbedFunction{"SSL_free", PROBE_CLOSE},
};

// Each field is one accessor, or accessors composed (the first returns the
// pointer the next starts from).
struct FieldAccessors {
  uint32_t field;
  std::array<std::string_view, 3> chain;  // "" ends it
};

constexpr std::array kFields = {
    FieldAccessors{FIELD_SSL_VERSION, {"SSL_version", "", ""}},
    FieldAccessors{FIELD_SSL_STATE, {"SSL_get_state", "", ""}},
    FieldAccessors{FIELD_SSL_RESUMED, {"SSL_session_reused", "", ""}},
    FieldAccessors{FIELD_SSL_IS_SERVER, {"SSL_is_server", "", ""}},
    FieldAccessors{FIELD_SSL_CIPHER, {"SSL_get_current_cipher", "SSL_CIPHER_get_protocol_id", ""}},
    FieldAccessors{FIELD_SSL_KEY_TYPE, {"SSL_get_privatekey", "EVP_PKEY_get_id", ""}},
    FieldAccessors{FIELD_MDCTX_KEY_TYPE, {"EVP_MD_CTX_get_pkey_ctx", "EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_get_id"}},
    FieldAccessors{FIELD_PKEYCTX_KEY_TYPE, {"EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_get_id", ""}},
};

// Accessors OpenSSL 3.0 renamed. OpenSSL 1.1 exports them under their old
// names, which 3.0 keeps only as macros (Debian's libcrypto.so.3 has no
// EVP_PKEY_id symbol, libcrypto.so.1.1 no EVP_PKEY_get_id), so a name of
// kFields is looked up as 3.x spells it, then as 1.1 did. The code behind
// either is decoded all the same: 1.1.1w's EVP_PKEY_id is `mov (%rdi),%eax;
// ret`, its EVP_MD_CTX_pkey_ctx `mov 0x20(%rdi),%rax; ret`.
struct RenamedAccessor {
  std::string_view name;      // OpenSSL 3.x
  std::string_view name_1_1;  // OpenSSL 1.1
};

constexpr std::array kRenamed = {
    RenamedAccessor{"EVP_PKEY_get_id", "EVP_PKEY_id"},
    RenamedAccessor{"EVP_MD_CTX_get_pkey_ctx", "EVP_MD_CTX_pkey_ctx"},
};

}  // namespace

uint32_t FirstInstructionClass(std::span<const uint8_t> code) {
  if (!code.empty() && code[0] >= 0x50 && code[0] <= 0x57) return INSN_EMULATED_PUSH;  // push rax..rdi
  if (code.size() >= 2 && code[0] == 0x41 && code[1] >= 0x50 && code[1] <= 0x57) return INSN_EMULATED_PUSH;  // r8..r15
  if (code.size() >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa) return INSN_ENDBR64;
  return INSN_SINGLE_STEPPED;
}

namespace {

constexpr std::array<std::string_view, 3> kMethods = {"TLS_method", "TLS_server_method", "TLS_client_method"};
// The SSL_METHOD slots compared: its first 16 (ssl_accept and ssl_connect are
// the 7th and 8th; the struct has more than 25 in every OpenSSL since 1.1),
// never past its end into the next table.
constexpr uint64_t kMethodTableBytes = 0x80;

// `lea disp32(%rip),%rax; ret`, or in a fixed-address executable `mov
// $imm32,%eax; ret` (after an optional endbr64): the address it loads.
std::optional<uint64_t> ReturnedAddress(const FunctionCode& code) {
  std::span<const uint8_t> c(code.prefix);
  size_t i = 0;
  if (c.size() >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) i = 4;
  if (c.size() >= i + 6 && c[i] == 0xb8 && c[i + 5] == 0xc3) {
    return static_cast<uint64_t>(c[i + 1]) | static_cast<uint64_t>(c[i + 2]) << 8 |
           static_cast<uint64_t>(c[i + 3]) << 16 | static_cast<uint64_t>(c[i + 4]) << 24;
  }
  if (c.size() < i + 8 || c[i] != 0x48 || c[i + 1] != 0x8d || c[i + 2] != 0x05 || c[i + 7] != 0xc3) return std::nullopt;
  const int32_t disp =
      static_cast<int32_t>(static_cast<uint32_t>(c[i + 3]) | static_cast<uint32_t>(c[i + 4]) << 8 |
                           static_cast<uint32_t>(c[i + 5]) << 16 | static_cast<uint32_t>(c[i + 6]) << 24);
  return code.vaddr + i + 7 + static_cast<int64_t>(disp);
}

// `cmpl $imm8,disp8(%rdi); je L` at `i`, where L is `mov $-1,%eax; ret`: a
// test that returns -1 at once, before anything else. OpenSSL 1.1.1 as
// Debian 11's GCC built it inlines state_machine()'s first line, `if
// (st->state == MSG_FLOW_ERROR) return -1;`, into ossl_statem_accept and
// ossl_statem_connect, which then jump to the rest of state_machine. A
// handshake step that ends there never began: the probe may skip it.
size_t FailFastGuard(std::span<const uint8_t> c, size_t i) {
  if (c.size() < i + 6 || c[i] != 0x83 || c[i + 1] != 0x7f || c[i + 4] != 0x74) return 0;
  const size_t target = i + 6 + static_cast<int8_t>(c[i + 5]);
  constexpr std::array<uint8_t, 6> kReturnMinusOne = {0xb8, 0xff, 0xff, 0xff, 0xff, 0xc3};
  // Forward only; a jump before the code's start wraps to a huge target, which the size check must see
  // without adding to it.
  if (target <= i + 6 || target >= c.size() || c.size() - target < kReturnMinusOne.size()) return 0;
  if (!std::equal(kReturnMinusOne.begin(), kReturnMinusOne.end(), c.begin() + static_cast<ptrdiff_t>(target))) {
    return 0;
  }
  return 6;
}

// `mov $imm32,%esi` or `xor %esi,%esi`, then `jmp rel32`: the jump's target.
// A FailFastGuard, or a NULL test and the type dispatch, may come first.
std::optional<uint64_t> TailCallTarget(const FunctionCode& code) {
  std::span<const uint8_t> c(code.prefix);
  size_t i = 0;
  if (c.size() >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) i = 4;
  i += FailFastGuard(c, i);
  // OpenSSL 3.2+: a NULL test (test %rdi,%rdi; je), then the type dispatch
  // (accessors.h); a TLS connection goes on at its target. The QUIC path
  // tail-calls the same function with the connection it holds.
  if (c.size() >= i + 5 && c[i] == 0x48 && c[i + 1] == 0x85 && c[i + 2] == 0xff && c[i + 3] == 0x74) {
    if (size_t target = TypeDispatchTarget(c, i + 5)) i = target;
  }
  if (c.size() >= i + 5 && c[i] == 0xbe) {
    i += 5;
  } else if (c.size() >= i + 2 && c[i] == 0x31 && c[i + 1] == 0xf6) {
    i += 2;
  } else {
    return std::nullopt;
  }
  if (c.size() < i + 5 || c[i] != 0xe9) return std::nullopt;
  const int32_t disp =
      static_cast<int32_t>(static_cast<uint32_t>(c[i + 1]) | static_cast<uint32_t>(c[i + 2]) << 8 |
                           static_cast<uint32_t>(c[i + 3]) << 16 | static_cast<uint32_t>(c[i + 4]) << 24);
  return code.vaddr + i + 5 + static_cast<int64_t>(disp);
}

// The one slot where two method tables differ: (offset, value in `a`).
std::optional<std::pair<uint64_t, uint64_t>> OnlyDifference(const std::map<uint64_t, uint64_t>& a, uint64_t a_base,
                                                            const std::map<uint64_t, uint64_t>& b, uint64_t b_base) {
  std::optional<std::pair<uint64_t, uint64_t>> found;
  for (uint64_t off = 0; off < kMethodTableBytes; off += 8) {
    auto ia = a.find(a_base + off), ib = b.find(b_base + off);
    const uint64_t va = ia == a.end() ? 0 : ia->second, vb = ib == b.end() ? 0 : ib->second;
    if (va == vb) continue;
    if (found || va == 0) return std::nullopt;
    found = std::make_pair(off, va);
  }
  return found;
}

}  // namespace

std::vector<FoundFunction> FindHandshakeStateMachine(
    const guard::ElfFile& elf, const std::map<std::string, FunctionCode, std::less<>>& functions) {
  std::array<uint64_t, 3> tables{};
  for (size_t i = 0; i < kMethods.size(); ++i) {
    auto it = functions.find(kMethods[i]);
    if (it == functions.end()) return {};
    auto address = ReturnedAddress(it->second);
    if (!address) return {};
    tables[i] = *address;
  }
  std::array<std::map<uint64_t, uint64_t>, 3> slots;
  for (size_t i = 0; i < tables.size(); ++i) {
    auto relocs = PointerWords(elf, tables[i], tables[i] + kMethodTableBytes);
    if (!relocs.ok()) return {};
    slots[i] = std::move(*relocs);
  }
  // TLS vs client: ssl_accept; TLS vs server: ssl_connect.
  auto accept = OnlyDifference(slots[0], tables[0], slots[2], tables[2]);
  auto connect = OnlyDifference(slots[0], tables[0], slots[1], tables[1]);
  if (!accept || !connect || accept->first == connect->first) return {};
  auto accept_code = CodeAt(elf, accept->second);
  auto connect_code = CodeAt(elf, connect->second);
  if (!accept_code.ok() || !connect_code.ok()) return {};
  auto accept_target = TailCallTarget(*accept_code), connect_target = TailCallTarget(*connect_code);
  if (accept_target && connect_target && *accept_target == *connect_target) {
    auto shared = CodeAt(elf, *accept_target);
    if (shared.ok()) return {FoundFunction{"state_machine", std::move(*shared)}};
  }
  return {FoundFunction{"ssl_accept", std::move(*accept_code)}, FoundFunction{"ssl_connect", std::move(*connect_code)}};
}

std::vector<std::string_view> WantedFunctions() {
  std::vector<std::string_view> names(kMethods.begin(), kMethods.end());
  for (const auto& p : kProbed) names.push_back(p.name);
  for (const auto& f : kFields) {
    for (std::string_view name : f.chain) {
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  for (const auto& r : kRenamed) names.push_back(r.name_1_1);
  return names;
}

FilePlan PlanFile(const std::map<std::string, FunctionCode, std::less<>>& functions,
                  const std::vector<FoundFunction>& state_machine) {
  FilePlan plan;
  for (const FoundFunction& f : state_machine) {
    plan.sites.push_back({f.name, f.code.file_offset, PROBE_HANDSHAKE, FirstInstructionClass(f.code.prefix)});
  }
  for (const auto& p : kProbed) {
    if (p.probe == PROBE_HANDSHAKE && !state_machine.empty()) continue;
    auto it = functions.find(p.name);
    if (it == functions.end()) continue;
    plan.sites.push_back(
        {std::string(p.name), it->second.file_offset, p.probe, FirstInstructionClass(it->second.prefix)});
  }
  return plan;
}

ProcessPlan PlanLayout(const std::vector<const std::map<std::string, FunctionCode, std::less<>>*>& files) {
  auto find = [&](std::string_view name) -> const FunctionCode* {
    for (const auto* functions : files) {
      auto it = functions->find(name);
      if (it != functions->end()) return &it->second;
    }
    return nullptr;
  };
  auto decode = [&](std::string_view name) -> std::optional<LoadChain> {
    const FunctionCode* code = find(name);
    for (const auto& r : kRenamed) {
      if (!code && r.name == name) code = find(r.name_1_1);
    }
    if (!code) return std::nullopt;
    return DecodeLoadChain(code->prefix);
  };
  ProcessPlan plan;
  for (const auto& f : kFields) SetField(plan, f.field, ComposeAccessors(f.chain, decode));
  return plan;
}

std::optional<LoadChain> ComposeAccessors(std::span<const std::string_view> names,
                                          const std::function<std::optional<LoadChain>(std::string_view)>& decode) {
  std::optional<LoadChain> chain;
  for (std::string_view name : names) {
    if (name.empty()) break;
    std::optional<LoadChain> next = decode(name);
    if (!next) return std::nullopt;
    chain = chain ? Compose(*chain, *next) : next;
    if (!chain) return std::nullopt;
  }
  return chain;
}

void SetField(ProcessPlan& plan, uint32_t field, const std::optional<LoadChain>& chain) {
  const std::string name(FieldName(field));
  if (!chain || chain->offsets.empty() || chain->offsets.size() > USAGE_MAX_LOADS) {
    plan.fields[name] = "unknown";
    return;
  }
  field_path& path = plan.layout.field[field];
  path.n = static_cast<uint8_t>(chain->offsets.size());
  path.width = chain->width;
  path.shift = chain->shift;
  path.bits = chain->bits;
  path.invert = chain->invert ? 1 : 0;
  path.type_guard = chain->type_guard ? 1 : 0;
  for (size_t i = 0; i < chain->offsets.size(); ++i) path.off[i] = chain->offsets[i];
  plan.fields[name] = ToString(*chain);
}

std::string_view FieldName(uint32_t field) {
  // In FIELD_* order (bpf/usage.h).
  static constexpr std::string_view kNames[] = {"ssl.version", "ssl.state",    "ssl.resumed",     "ssl.is_server",
                                                "ssl.cipher",  "ssl.key_type", "md_ctx.key_type", "pkey_ctx.key_type",
                                                "ssl.group",   "ssl.in_init"};
  static_assert(std::size(kNames) == FIELD_NR);
  return field < FIELD_NR ? kNames[field] : "?";
}

std::string_view ProbeName(uint32_t probe) {
  for (const auto& p : kProbed) {
    if (p.probe == probe) return p.name;
  }
  return "?";
}

}  // namespace tlsprof::usage
