#include "agent/usage/boringssl_plan.h"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>

#include "agent/usage/accessor_paths.h"

namespace tlsprof::usage {
namespace {

using Functions = std::map<std::string, FunctionCode, std::less<>>;

struct ProbedFunction {
  std::string_view name;
  uint32_t probe;
};

constexpr std::array kProbed = {
    ProbedFunction{"SSL_do_handshake", PROBE_HANDSHAKE},
    ProbedFunction{"EVP_PKEY_sign", PROBE_PKEY_SIGN},
    ProbedFunction{"EVP_PKEY_verify", PROBE_PKEY_VERIFY},
    ProbedFunction{"EVP_PKEY_derive", PROBE_DERIVE},
    ProbedFunction{"X25519", PROBE_X25519},
    // Android's BoringSSL 14: the Kyber768 half of its X25519Kyber and
    // P256Kyber groups (libssl calls them through the PLT).
    ProbedFunction{"KYBER_encap", PROBE_KYBER},
    ProbedFunction{"KYBER_decap", PROBE_KYBER},
    ProbedFunction{"SSL_free", PROBE_CLOSE},
};

// A field: one accessor, or two composed (the first returns the pointer the
// second starts from). `at_completion`: read only once a handshake is
// complete, when the handshake object is freed.
struct FieldAccessors {
  uint32_t field;
  std::array<std::string_view, 2> chain;  // "" ends it
  bool at_completion;
};

constexpr std::array kFields = {
    FieldAccessors{FIELD_SSL_VERSION, {"SSL_version", ""}, true},
    FieldAccessors{FIELD_SSL_IN_INIT, {"SSL_in_init", ""}, false},
    FieldAccessors{FIELD_SSL_RESUMED, {"SSL_session_reused", ""}, true},
    FieldAccessors{FIELD_SSL_IS_SERVER, {"SSL_is_server", ""}, false},
    FieldAccessors{FIELD_SSL_CIPHER, {"SSL_get_current_cipher", "SSL_CIPHER_get_protocol_id"}, true},
    FieldAccessors{FIELD_SSL_GROUP, {"SSL_get_curve_id", ""}, true},
    FieldAccessors{FIELD_SSL_KEY_TYPE, {"SSL_get_privatekey", "EVP_PKEY_id"}, false},
    FieldAccessors{FIELD_PKEYCTX_KEY_TYPE, {"EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_id"}, false},
};

// What the accessors call (through the PLT), so their code is at hand.
constexpr std::array<std::string_view, 3> kCallees = {"SSL_in_early_data", "SSL_get_session", "SSL_in_init"};

// The code of one file as an accessor runs through it: its exported
// functions, its PLT stubs (resolved to the functions they call, when the
// file defines them) and any other address (read on demand).
class FileCode {
 public:
  FileCode(const guard::ElfFile& elf, const Functions& functions) : elf_(elf), functions_(functions) {}

  const FunctionCode* At(uint64_t vaddr) {
    for (const auto& [name, code] : functions_) {
      if (code.vaddr == vaddr) return &code;
    }
    const FunctionCode* code = Read(vaddr);
    if (!code) return nullptr;
    auto slot = PltSlot(*code);
    if (!slot) return code;
    // A PLT stub: the function its slot binds, when the file defines it
    // (an accessor's call to another of the library's own exports).
    if (!slots_) {
      auto slots = JumpSlots(elf_);
      slots_ = slots.ok() ? std::move(*slots) : std::map<uint64_t, std::string>{};
    }
    auto name = slots_->find(*slot);
    if (name == slots_->end()) return nullptr;
    auto callee = functions_.find(name->second);
    return callee == functions_.end() ? nullptr : &callee->second;
  }

 private:
  const FunctionCode* Read(uint64_t vaddr) {
    auto it = read_.find(vaddr);
    if (it != read_.end()) return it->second.get();
    auto code = CodeAt(elf_, vaddr);
    auto& slot = read_[vaddr];
    if (code.ok()) slot = std::make_unique<FunctionCode>(std::move(*code));
    return slot.get();
  }

  // The GOT slot of a PLT stub: `jmp *disp32(%rip)`, after `endbr64; bnd`
  // in -fcf-protection's .plt.sec.
  static std::optional<uint64_t> PltSlot(const FunctionCode& code) {
    const std::vector<uint8_t>& c = code.prefix;
    size_t i = 0;
    if (c.size() >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) i = 4;
    if (i < c.size() && c[i] == 0xf2) ++i;
    if (c.size() < i + 6 || c[i] != 0xff || c[i + 1] != 0x25) return std::nullopt;
    const int32_t disp =
        static_cast<int32_t>(static_cast<uint32_t>(c[i + 2]) | static_cast<uint32_t>(c[i + 3]) << 8 |
                             static_cast<uint32_t>(c[i + 4]) << 16 | static_cast<uint32_t>(c[i + 5]) << 24);
    return code.vaddr + i + 6 + static_cast<int64_t>(disp);
  }

  const guard::ElfFile& elf_;
  const Functions& functions_;
  std::optional<std::map<uint64_t, std::string>> slots_;
  std::map<uint64_t, std::unique_ptr<FunctionCode>> read_;
};

}  // namespace

std::vector<std::string_view> BoringSslWantedFunctions() {
  std::vector<std::string_view> names;
  auto add = [&](std::string_view name) {
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const auto& p : kProbed) add(p.name);
  for (const auto& f : kFields) {
    for (std::string_view name : f.chain) add(name);
  }
  for (std::string_view name : kCallees) add(name);
  return names;
}

FilePlan PlanBoringSslFile(const Functions& functions) {
  FilePlan plan;
  for (const auto& p : kProbed) {
    auto it = functions.find(p.name);
    if (it == functions.end()) continue;
    plan.sites.push_back(
        {std::string(p.name), it->second.file_offset, p.probe, FirstInstructionClass(it->second.prefix)});
  }
  return plan;
}

ProcessPlan PlanBoringSslLayout(const std::vector<BoringSslFile>& files) {
  std::vector<std::unique_ptr<FileCode>> code;
  for (const BoringSslFile& f : files) code.push_back(std::make_unique<FileCode>(*f.elf, *f.functions));
  // One accessor, decoded in the file that defines it (its calls are to
  // that file's own functions).
  auto decode = [&](std::string_view name, const std::vector<LoadChain>& null_pointers) -> std::optional<LoadChain> {
    for (size_t i = 0; i < files.size(); ++i) {
      auto it = files[i].functions->find(name);
      if (it == files[i].functions->end()) continue;
      AccessorContext context;
      context.null_pointers = null_pointers;
      FileCode* file = code[i].get();
      context.resolve = [file](uint64_t vaddr) { return file->At(vaddr); };
      return DecodeAccessor(it->second, context);
    }
    return std::nullopt;
  };
  // The handshake object: what SSL_in_init() (`hs != NULL &&
  // !hs->handshake_finalized`, a bit of it read as == 0) tests for NULL.
  std::vector<LoadChain> completed;
  if (auto in_init = decode("SSL_in_init", {});
      in_init && in_init->invert && in_init->bits == 1 && in_init->offsets.size() >= 2) {
    LoadChain handshake{{in_init->offsets.begin(), in_init->offsets.end() - 1}, 8};
    completed.push_back(std::move(handshake));
  }

  ProcessPlan plan;
  const std::vector<LoadChain> none;
  for (const auto& f : kFields) {
    // Without the handshake object found, a field read at completion is
    // decoded without that fact (and most likely stays unknown).
    const std::vector<LoadChain>& facts = f.at_completion ? completed : none;
    SetField(plan, f.field, ComposeAccessors(f.chain, [&](std::string_view name) { return decode(name, facts); }));
  }
  return plan;
}

}  // namespace tlsprof::usage
