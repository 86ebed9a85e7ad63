#include "agent/usage/go_plan.h"

#include <capstone/capstone.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/x86_elf.h"
#include "agent/usage/probe_plan.h"

namespace tlsprof::usage {
namespace {

// EVP_PKEY ids, OpenSSL's names for key types, so Go's rows read like
// OpenSSL's (names.h).
constexpr uint32_t kRsa = 6, kEc = 408, kX25519 = 1034, kEd25519 = 1087;

// The probed functions of Go 1.19-1.24's crypto/tls and the crypto packages
// their handshakes call, one line each (test_usage_go_versions checks
// 1.21-1.23, test_usage 1.19, test_usage_trixie 1.24). `reg`: where a verify's signature length
// is at the entry (the sig []byte's len word in ABIInternal's order RAX,
// RBX, RCX, RDI, RSI, R8, R9, R10, R11; a slice takes three, a pointer or
// crypto.Hash one).
struct GoProbed {
  std::string_view name;
  uint32_t probe;
  uint32_t key_type;
  uint32_t reg;
  uint32_t flags;
};
constexpr std::array kGoProbed = {
    GoProbed{"crypto/tls.(*Conn).serverHandshake", PROBE_GO_HANDSHAKE, 0, GO_REG_NONE, USAGE_GO_SERVER},
    GoProbed{"crypto/tls.(*Conn).clientHandshake", PROBE_GO_HANDSHAKE, 0, GO_REG_NONE, 0},
    GoProbed{"crypto/ecdsa.(*PrivateKey).Sign", PROBE_GO_SIGN, kEc, GO_REG_NONE, 0},
    GoProbed{"crypto/rsa.(*PrivateKey).Sign", PROBE_GO_SIGN, kRsa, GO_REG_NONE, 0},
    GoProbed{"crypto/ed25519.PrivateKey.Sign", PROBE_GO_SIGN, kEd25519, GO_REG_NONE, 0},
    // VerifyASN1(pub *PublicKey, hash, sig []byte): pub AX, hash BX CX DI, sig SI R8 R9.
    GoProbed{"crypto/ecdsa.VerifyASN1", PROBE_GO_VERIFY, kEc, GO_REG_R8, 0},
    // VerifyPKCS1v15 / VerifyPSS(pub, hash crypto.Hash, hashed []byte, sig []byte, ...): sig R8 R9 R10.
    GoProbed{"crypto/rsa.VerifyPKCS1v15", PROBE_GO_VERIFY, kRsa, GO_REG_R9, 0},
    GoProbed{"crypto/rsa.VerifyPSS", PROBE_GO_VERIFY, kRsa, GO_REG_R9, 0},
    // ed25519.Verify(publicKey PublicKey, message, sig []byte): sig R9 R10 R11.
    GoProbed{"crypto/ed25519.Verify", PROBE_GO_VERIFY, kEd25519, GO_REG_R10, 0},
    GoProbed{"crypto/tls.(*x25519Parameters).SharedKey", PROBE_GO_DERIVE, kX25519, GO_REG_NONE, 0},
    GoProbed{"crypto/tls.(*nistParameters).SharedKey", PROBE_GO_DERIVE, kEc, GO_REG_NONE, 0},
    // Go 1.20+: crypto/tls's ECDHE through crypto/ecdh, a curve's
    // ecdh(local, remote) ([]byte, error): 1.20-1.23's NIST curves are
    // generic, one instantiation per curve (each a wrapper of the shape's
    // code, called through the Curve interface); 1.24's are not.
    GoProbed{"crypto/ecdh.(*x25519Curve).ecdh", PROBE_GO_DERIVE, kX25519, GO_REG_NONE, 0},
    GoProbed{"crypto/ecdh.(*nistCurve[*crypto/internal/nistec.P256Point]).ecdh", PROBE_GO_DERIVE, kEc, GO_REG_NONE, 0},
    GoProbed{"crypto/ecdh.(*nistCurve[*crypto/internal/nistec.P384Point]).ecdh", PROBE_GO_DERIVE, kEc, GO_REG_NONE, 0},
    GoProbed{"crypto/ecdh.(*nistCurve[*crypto/internal/nistec.P521Point]).ecdh", PROBE_GO_DERIVE, kEc, GO_REG_NONE, 0},
    GoProbed{"crypto/ecdh.(*nistCurve).ecdh", PROBE_GO_DERIVE, kEc, GO_REG_NONE, 0},
    // Go 1.23's X25519Kyber768Draft00: crypto/internal/mlkem768's
    // encapsulate (Encapsulate is inlined) and Decapsulate (USAGE_GO_KYBER).
    GoProbed{"crypto/internal/mlkem768.encapsulate", PROBE_GO_DERIVE, 1088, GO_REG_NONE, USAGE_GO_KEM | USAGE_GO_KYBER},
    GoProbed{"crypto/internal/mlkem768.Decapsulate", PROBE_GO_DERIVE, 1088, GO_REG_NONE, USAGE_GO_KEM | USAGE_GO_KYBER},
    // Go 1.24: ML-KEM through crypto/internal/fips140/mlkem (Encapsulate is
    // inlined into its callers, its encapsulate is not): a KEM's key-type
    // bits hold its ciphertext's length (USAGE_GO_KEM).
    GoProbed{"crypto/internal/fips140/mlkem.(*EncapsulationKey768).encapsulate", PROBE_GO_DERIVE, 1088, GO_REG_NONE,
             USAGE_GO_KEM},
    GoProbed{"crypto/internal/fips140/mlkem.(*DecapsulationKey768).Decapsulate", PROBE_GO_DERIVE, 1088, GO_REG_NONE,
             USAGE_GO_KEM},
    GoProbed{"crypto/internal/fips140/mlkem.(*EncapsulationKey1024).encapsulate", PROBE_GO_DERIVE, 1568, GO_REG_NONE,
             USAGE_GO_KEM},
    GoProbed{"crypto/internal/fips140/mlkem.(*DecapsulationKey1024).Decapsulate", PROBE_GO_DERIVE, 1568, GO_REG_NONE,
             USAGE_GO_KEM},
    // The end of a connection: entry only (no RET sites).
    GoProbed{"crypto/tls.(*Conn).Close", PROBE_GO_CLOSE, 0, GO_REG_NONE, 0},
};

// tls.Conn's layout by Go version, for binaries without DWARF. Each row is
// what the DWARF of a binary built by that toolchain says (usage_test
// checks the row of the toolchain on the machine against it).
struct GoConnRow {
  std::string_view version;  // a release: "go1.19" matches go1.19.x
  int32_t vers, cipher_suite, did_resume;
};
constexpr std::array kGoConnTable = {
    GoConnRow{"go1.19", 64, 90, 88},
    // test_usage_go_versions: bookworm-backports' 1.21.13, 1.22.12, 1.23.5.
    GoConnRow{"go1.21", 0x48, 0x62, 0x61}, GoConnRow{"go1.22", 0x48, 0x62, 0x61}, GoConnRow{"go1.23", 0x48, 0x64, 0x61},
    GoConnRow{"go1.24", 0x48, 0x64, 0x61},  // test_usage_trixie: Go 1.24.4 of the trixie root
};

using DwarfPtr = std::unique_ptr<Dwarf, decltype([](Dwarf* dw) { dwarf_end(dw); })>;

// The contents of the section called `name`, up to `cap` bytes; empty if
// none or unreadable.
std::vector<uint8_t> SectionPrefix(const guard::ElfFile& elf, std::string_view name, uint64_t cap) {
  const guard::ElfSection* s = elf.Find(name);
  if (s == nullptr || s->shdr.sh_type == SHT_NOBITS) return {};
  auto bytes = elf.Read(s->shdr.sh_offset, std::min<uint64_t>(s->shdr.sh_size, cap), cap, name);
  return bytes ? std::move(*bytes) : std::vector<uint8_t>{};
}

std::string Describe(int32_t offset, uint8_t width, std::string_view source) {
  if (offset < 0) return "unknown";
  return fmt::format("+{:#x} ({} bytes) [{}]", offset, width, source);
}

// Decodes x86-64 code linearly with capstone, calling visit(insn) for each
// instruction until it returns false; an undecodable byte (padding) is
// stepped over.
template <typename Visit>
void ForEachInstruction(std::span<const uint8_t> code, uint64_t vaddr, Visit visit) {
  csh handle;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &handle) != CS_ERR_OK) return;
  cs_insn* insn = cs_malloc(handle);
  const uint8_t* bytes = code.data();
  size_t size = code.size();
  uint64_t address = vaddr;
  while (size > 0) {
    if (!cs_disasm_iter(handle, &bytes, &size, &address, insn)) {
      ++bytes;
      --size;
      ++address;
      continue;
    }
    if (!visit(*insn)) break;
  }
  cs_free(insn, 1);
  cs_close(&handle);
}

}  // namespace

std::vector<uint64_t> ReturnInstructions(std::span<const uint8_t> code, uint64_t vaddr) {
  std::vector<uint64_t> out;
  ForEachInstruction(code, vaddr, [&](const cs_insn& insn) {
    if (insn.id == X86_INS_RET) out.push_back(insn.address);
    return true;
  });
  return out;
}

uint64_t GoEntryProbeAddress(std::span<const uint8_t> code, uint64_t vaddr) {
  uint64_t found = vaddr;
  bool checked = false;
  int seen = 0;
  // Go's prologue: [lea r12, [rsp - N];] cmp rsp|r12, [r14 + 0x10]; jbe morestack.
  ForEachInstruction(code, vaddr, [&](const cs_insn& insn) {
    const std::string_view mnemonic(insn.mnemonic), operands(insn.op_str);
    if (++seen > 3) return false;
    if (mnemonic == "lea" && operands.rfind("r12,", 0) == 0) return true;
    if (mnemonic == "cmp" && operands.find("[r14 + 0x10]") != std::string_view::npos) {
      checked = true;
      return true;
    }
    if (checked && (mnemonic == "jbe" || mnemonic == "jb")) found = insn.address;
    return false;
  });
  return found;
}

std::optional<std::string> GoBuildInfoVersion(std::span<const uint8_t> s) {
  static constexpr std::string_view kMagic = "\xff Go buildinf:";
  if (s.size() < 32 || std::memcmp(s.data(), kMagic.data(), kMagic.size()) != 0) return std::nullopt;
  const uint8_t flags = s[15];
  if ((flags & 2) == 0) return std::nullopt;  // before 1.18: pointers to strings
  // A uvarint length, then the bytes.
  uint64_t len = 0;
  size_t at = 32;
  for (int shift = 0; at < s.size() && shift < 35; shift += 7) {
    const uint8_t b = s[at++];
    len |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      if (len == 0 || len > 64 || at + len > s.size()) return std::nullopt;
      std::string v(reinterpret_cast<const char*>(s.data() + at), len);
      if (v.rfind("go", 0) != 0 && v.rfind("devel", 0) != 0) return std::nullopt;
      return v;
    }
  }
  return std::nullopt;
}

std::optional<GoConnLayout> GoConnLayoutFromDwarf(const guard::ElfFile& elf) {
  // libdw reads (and inflates) every debug section of the file when it
  // starts: each is read here first, through the guard's caps, so libdw finds
  // them read. GNU-style .zdebug sections would be inflated by libdw
  // unchecked: not read at all.
  uint64_t total = 0;
  std::vector<std::span<const uint8_t>> debug;  // libdw's strings point into these
  for (const guard::ElfSection& s : elf.sections()) {
    if (s.name.starts_with(".zdebug")) return std::nullopt;
    if (!s.name.starts_with(".debug_")) continue;
    auto bytes = elf.SectionBytes(s);
    if (!bytes) return std::nullopt;
    total += bytes->size();
    if (total > guard::kMaxSectionBytes) return std::nullopt;
    debug.push_back(*bytes);
  }
  // A DIE's name as libdw gives it, but only when it ends inside the section
  // it points into: libdw checks neither an inline DW_FORM_string nor a
  // .debug_str entry for its NUL (go_plan_fuzz's finding: strlen ran past
  // the section).
  auto name_of = [&debug](Dwarf_Die* d) -> std::optional<std::string_view> {
    const char* p = dwarf_diename(d);
    if (p == nullptr) return std::nullopt;
    const auto at = reinterpret_cast<uintptr_t>(p);
    for (std::span<const uint8_t> b : debug) {
      const auto begin = reinterpret_cast<uintptr_t>(b.data());
      if (at < begin || at >= begin + b.size()) continue;
      const size_t left = begin + b.size() - at;
      const void* nul = std::memchr(p, 0, left);
      if (nul == nullptr) return std::nullopt;
      return std::string_view(p, static_cast<size_t>(static_cast<const char*>(nul) - p));
    }
    return std::nullopt;
  };
  // A name table left unread at the cap would be read whole by libdw.
  if (!elf.names_read()) return std::nullopt;
  DwarfPtr dw(dwarf_begin_elf(elf.elf(), DWARF_C_READ, nullptr));  // guarded-io: sections read above
  if (!dw) return std::nullopt;
  Dwarf_Off off = 0, next = 0;
  size_t header = 0;
  while (dwarf_nextcu(dw.get(), off, &next, &header, nullptr, nullptr, nullptr) == 0) {
    Dwarf_Die cu, die;
    const Dwarf_Off cu_die = off + header;
    off = next;
    if (!dwarf_offdie(dw.get(), cu_die, &cu) || dwarf_child(&cu, &die) != 0) continue;
    do {
      if (dwarf_tag(&die) != DW_TAG_structure_type) continue;
      if (name_of(&die) != "crypto/tls.Conn") continue;
      GoConnLayout layout;
      layout.source = "dwarf";
      Dwarf_Die member;
      if (dwarf_child(&die, &member) != 0) return layout;
      do {
        if (dwarf_tag(&member) != DW_TAG_member) continue;
        const std::optional<std::string_view> m = name_of(&member);
        Dwarf_Attribute attr, type_attr;
        Dwarf_Word at = 0;
        if (!m || !dwarf_attr(&member, DW_AT_data_member_location, &attr) || dwarf_formudata(&attr, &at) != 0) {
          continue;
        }
        Dwarf_Die type;
        int width = -1;
        if (dwarf_attr(&member, DW_AT_type, &type_attr) && dwarf_formref_die(&type_attr, &type)) {
          width = dwarf_bytesize(&type);
        }
        if (at > INT32_MAX) continue;
        const std::string_view field = *m;
        if (field == "vers" && width == 2) {
          layout.vers = static_cast<int32_t>(at);
        } else if (field == "cipherSuite" && width == 2) {
          layout.cipher_suite = static_cast<int32_t>(at);
        } else if (field == "didResume" && width == 1) {
          layout.did_resume = static_cast<int32_t>(at);
        }
      } while (dwarf_siblingof(&member, &member) == 0);
      return layout;
    } while (dwarf_siblingof(&die, &die) == 0);
  }
  return std::nullopt;
}

std::optional<GoConnLayout> GoConnLayoutFromTable(std::string_view go_version) {
  for (const GoConnRow& row : kGoConnTable) {
    // "go1.19" matches "go1.19" and "go1.19.8", not "go1.190".
    if (go_version.rfind(row.version, 0) != 0) continue;
    const std::string_view rest = go_version.substr(row.version.size());
    if (!rest.empty() && rest[0] != '.') continue;
    GoConnLayout layout;
    layout.vers = row.vers;
    layout.cipher_suite = row.cipher_suite;
    layout.did_resume = row.did_resume;
    layout.source = fmt::format("table {}", row.version);
    return layout;
  }
  return std::nullopt;
}

Result<GoFilePlan> PlanGoFile(const guard::GuardedFile& file, std::string_view display_path) {
  symbols::LoadOptions options;
  options.keep = [](std::string_view name) {
    return std::any_of(kGoProbed.begin(), kGoProbed.end(), [&](const GoProbed& p) { return p.name == name; });
  };
  options.debug.debug_roots.clear();
  options.debug.use_debuginfod = false;
  auto image = symbols::LoadBinaryImage(file, symbols::ImageOrigin{std::string(display_path), nullptr}, options);
  if (!image.ok()) return image.error();
  if (!(*image)->is_go) return MakeError("{}: not a Go binary", display_path);
  auto elf = guard::ElfFile::Open(file);
  if (!elf.ok()) return elf.error();

  GoFilePlan plan;
  // A bound on what is read: buildinfo is 32 bytes plus a short string.
  plan.go_version = GoBuildInfoVersion(SectionPrefix(*elf, ".go.buildinfo", 4096)).value_or("");
  for (const symbols::Symbol& sym : (*image)->symbols.all()) {
    auto probed =
        std::find_if(kGoProbed.begin(), kGoProbed.end(), [&](const GoProbed& p) { return p.name == sym.name; });
    if (probed == kGoProbed.end() || sym.size == 0 || sym.size > (1u << 20)) continue;
    if (std::find(plan.functions.begin(), plan.functions.end(), sym.name) != plan.functions.end()) continue;
    const symbols::LoadSegment* seg = nullptr;
    for (const auto& s : (*image)->segments) {
      if (s.executable && sym.addr >= s.vaddr && sym.addr + sym.size <= s.vaddr + s.filesz) seg = &s;
    }
    if (!seg) continue;
    const uint64_t file_offset = sym.addr - seg->vaddr + seg->offset;
    auto code = elf->Read(file_offset, sym.size, 1u << 20, "a probed function");
    if (!code) continue;
    const std::vector<uint64_t> rets = ReturnInstructions(*code, sym.addr);
    if (rets.empty()) continue;  // never returns: nothing to time or count
    const uint64_t bits = USAGE_GO_COOKIE(0, probed->probe, INSN_GO, probed->key_type, probed->reg, probed->flags);
    const uint64_t entry = GoEntryProbeAddress(*code, sym.addr);
    plan.sites.push_back({sym.name, entry - seg->vaddr + seg->offset, bits, false});
    if (probed->probe == PROBE_GO_CLOSE) {
      plan.functions.push_back(sym.name);
      continue;
    }
    for (uint64_t ret : rets) {
      plan.sites.push_back(
          {sym.name, ret - seg->vaddr + seg->offset, bits | (static_cast<uint64_t>(USAGE_GO_RETURN) << 56), true});
    }
    plan.functions.push_back(sym.name);
  }
  if (plan.functions.empty()) return MakeError("{}: no crypto/tls function to probe", display_path);

  if (auto from_dwarf = GoConnLayoutFromDwarf(*elf)) {
    plan.conn = *from_dwarf;
  } else if (auto from_table = GoConnLayoutFromTable(plan.go_version)) {
    plan.conn = *from_table;
  } else {
    plan.conn.source = "unknown";
  }
  auto set = [&](uint32_t field, int32_t offset, uint8_t width) {
    field_path& path = plan.layout.field[field];
    if (offset >= 0) {
      path.n = 1;
      path.off[0] = offset;
      path.width = width;
    }
    plan.fields[std::string(FieldName(field))] = Describe(offset, width, plan.conn.source);
  };
  set(FIELD_SSL_VERSION, plan.conn.vers, plan.conn.vers_width);
  set(FIELD_SSL_CIPHER, plan.conn.cipher_suite, plan.conn.cipher_suite_width);
  set(FIELD_SSL_RESUMED, plan.conn.did_resume, plan.conn.did_resume_width);
  return plan;
}

}  // namespace tlsprof::usage
