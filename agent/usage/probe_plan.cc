#include "agent/usage/probe_plan.h"

#include <algorithm>
#include <array>

namespace tlsprof::usage {
namespace {

struct ProbedFunction {
  std::string_view name;
  uint32_t probe;
};

constexpr std::array kProbed = {
    ProbedFunction{"SSL_do_handshake", PROBE_HANDSHAKE},  ProbedFunction{"EVP_DigestSign", PROBE_DIGEST_SIGN},
    ProbedFunction{"EVP_PKEY_sign", PROBE_PKEY_SIGN},     ProbedFunction{"EVP_DigestVerify", PROBE_DIGEST_VERIFY},
    ProbedFunction{"EVP_PKEY_verify", PROBE_PKEY_VERIFY}, ProbedFunction{"EVP_PKEY_derive", PROBE_DERIVE},
};

// Each field is one accessor, or accessors composed (the first returns the
// pointer the next starts from).
struct FieldAccessors {
  uint32_t field;
  std::array<std::string_view, 3> chain;  // "" ends it
};

constexpr std::array kFields = {
    FieldAccessors{FIELD_SSL_VERSION, {"SSL_version", "", ""}},
    FieldAccessors{FIELD_SSL_RESUMED, {"SSL_session_reused", "", ""}},
    FieldAccessors{FIELD_SSL_IS_SERVER, {"SSL_is_server", "", ""}},
    FieldAccessors{FIELD_SSL_CIPHER, {"SSL_get_current_cipher", "SSL_CIPHER_get_protocol_id", ""}},
    FieldAccessors{FIELD_SSL_KEY_TYPE, {"SSL_get_privatekey", "EVP_PKEY_get_id", ""}},
    FieldAccessors{FIELD_MDCTX_KEY_TYPE, {"EVP_MD_CTX_get_pkey_ctx", "EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_get_id"}},
    FieldAccessors{FIELD_PKEYCTX_KEY_TYPE, {"EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_get_id", ""}},
};

}  // namespace

uint32_t FirstInstructionClass(std::span<const uint8_t> code) {
  if (!code.empty() && code[0] >= 0x50 && code[0] <= 0x57) return INSN_EMULATED_PUSH;  // push rax..rdi
  if (code.size() >= 2 && code[0] == 0x41 && code[1] >= 0x50 && code[1] <= 0x57) return INSN_EMULATED_PUSH;  // r8..r15
  if (code.size() >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa) return INSN_ENDBR64;
  return INSN_SINGLE_STEPPED;
}

std::vector<std::string_view> WantedFunctions() {
  std::vector<std::string_view> names;
  for (const auto& p : kProbed) names.push_back(p.name);
  for (const auto& f : kFields) {
    for (std::string_view name : f.chain) {
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

FilePlan PlanFile(const std::map<std::string, FunctionCode, std::less<>>& functions) {
  FilePlan plan;
  for (const auto& p : kProbed) {
    auto it = functions.find(p.name);
    if (it == functions.end()) continue;
    plan.sites.push_back(
        {std::string(p.name), it->second.file_offset, p.probe, FirstInstructionClass(it->second.prefix)});
  }
  return plan;
}

ProcessPlan PlanLayout(const std::vector<const std::map<std::string, FunctionCode, std::less<>>*>& files) {
  auto decode = [&](std::string_view name) -> std::optional<LoadChain> {
    for (const auto* functions : files) {
      auto it = functions->find(name);
      if (it != functions->end()) return DecodeLoadChain(it->second.prefix);
    }
    return std::nullopt;
  };
  ProcessPlan plan;
  for (const auto& f : kFields) {
    std::optional<LoadChain> chain;
    for (std::string_view name : f.chain) {
      if (name.empty()) break;
      std::optional<LoadChain> next = decode(name);
      if (!next) {
        chain.reset();
        break;
      }
      chain = chain ? Compose(*chain, *next) : next;
      if (!chain) break;
    }
    field_path& path = plan.layout.field[f.field];
    if (!chain) {
      plan.fields[std::string(FieldName(f.field))] = "unknown";
      continue;
    }
    path.n = static_cast<uint8_t>(chain->offsets.size());
    path.width = chain->width;
    for (size_t i = 0; i < chain->offsets.size(); ++i) path.off[i] = chain->offsets[i];
    plan.fields[std::string(FieldName(f.field))] = ToString(*chain);
  }
  return plan;
}

std::string_view FieldName(uint32_t field) {
  switch (field) {
    case FIELD_SSL_VERSION:
      return "ssl.version";
    case FIELD_SSL_RESUMED:
      return "ssl.resumed";
    case FIELD_SSL_IS_SERVER:
      return "ssl.is_server";
    case FIELD_SSL_CIPHER:
      return "ssl.cipher";
    case FIELD_SSL_KEY_TYPE:
      return "ssl.key_type";
    case FIELD_MDCTX_KEY_TYPE:
      return "md_ctx.key_type";
    case FIELD_PKEYCTX_KEY_TYPE:
      return "pkey_ctx.key_type";
  }
  return "?";
}

std::string_view ProbeName(uint32_t probe) {
  for (const auto& p : kProbed) {
    if (p.probe == probe) return p.name;
  }
  return "?";
}

}  // namespace tlsprof::usage
