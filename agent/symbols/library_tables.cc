#include "agent/symbols/library_tables.h"

#include <elf.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>

#include "agent/common/eh_frame.h"
#include "agent/symbols/x86_elf.h"

namespace tlsprof::symbols {
namespace {

// Largest loadable image read into memory. libcrypto.so.3 is 4.7 MB; a
// "library" of gigabytes is not one this module should decode.
constexpr uint64_t kMaxImageBytes = 256ull << 20;

// The loaded image as the dynamic loader would see it before running it:
// PT_LOAD bytes, and the pointers that dynamic relocations put into them.
class Image {
 public:
  enum Kind : uint8_t { kNone, kCode, kReadOnly, kWritable };

  struct Segment {
    uint64_t vaddr = 0;
    std::vector<uint8_t> bytes;  // p_filesz bytes; the rest of p_memsz is zero
    Kind kind = kNone;
  };

  std::vector<Segment> segments;
  std::unordered_map<uint64_t, uint64_t> pointers;  // slot vaddr -> target vaddr
  std::vector<std::pair<uint64_t, uint64_t>> fdes;  // (start, length), sorted

  Kind KindAt(uint64_t vaddr) const {
    const Segment* s = SegmentAt(vaddr);
    return s == nullptr ? kNone : s->kind;
  }

  std::optional<uint64_t> PointerAt(uint64_t slot) const {
    auto it = pointers.find(slot);
    if (it == pointers.end()) return std::nullopt;
    return it->second;
  }

  // The 4 or 8 bytes at vaddr as the file holds them (before relocation).
  std::optional<uint64_t> Read(uint64_t vaddr, size_t len) const {
    const Segment* s = SegmentAt(vaddr);
    if (s == nullptr || vaddr - s->vaddr > s->bytes.size() || s->bytes.size() - (vaddr - s->vaddr) < len) {
      return std::nullopt;
    }
    uint64_t v = 0;
    std::memcpy(&v, s->bytes.data() + (vaddr - s->vaddr), len);
    return v;
  }

  // A NUL-terminated string of printable ASCII in a segment that is not
  // writable (.rodata shares the code's segment when linked with -z
  // noseparate-code, as older binutils did by default).
  std::optional<std::string_view> String(uint64_t vaddr) const {
    const Segment* s = SegmentAt(vaddr);
    if (s == nullptr || s->kind == kWritable || vaddr - s->vaddr >= s->bytes.size()) return std::nullopt;
    const auto* begin = reinterpret_cast<const char*>(s->bytes.data() + (vaddr - s->vaddr));
    const size_t room = std::min<size_t>(s->bytes.size() - (vaddr - s->vaddr), 1024);
    size_t n = 0;
    while (n < room && begin[n] != '\0') {
      if (begin[n] < 0x20 || begin[n] > 0x7e) return std::nullopt;
      ++n;
    }
    if (n == 0 || n == room) return std::nullopt;
    return std::string_view(begin, n);
  }

  // The FDE that starts exactly at vaddr: its length.
  std::optional<uint64_t> FunctionSize(uint64_t vaddr) const {
    auto it = std::lower_bound(fdes.begin(), fdes.end(), std::make_pair(vaddr, uint64_t{0}));
    if (it == fdes.end() || it->first != vaddr || it->second == 0) return std::nullopt;
    return it->second;
  }

 private:
  const Segment* SegmentAt(uint64_t vaddr) const {
    for (const Segment& s : segments) {
      if (vaddr >= s.vaddr && vaddr - s.vaddr < s.bytes.size()) return &s;
    }
    return nullptr;
  }
};

Result<Image> LoadImage(int fd, std::string_view path) {
  auto opened = OpenX86Elf(fd, path);
  if (!opened) return opened.error();
  const ElfPtr& elf = opened->elf;
  const uint64_t file_size = opened->file_size;
  Image image;
  auto segments = ReadLoadSegments(fd, *opened, path, /*code_only=*/false, kMaxImageBytes);
  if (!segments) return segments.error();
  for (LoadedSegment& seg : *segments) {
    const Image::Kind kind = (seg.flags & PF_X)   ? Image::kCode
                             : (seg.flags & PF_W) ? Image::kWritable
                                                  : Image::kReadOnly;
    image.segments.push_back({seg.vaddr, std::move(seg.bytes), kind});
  }

  // Sections: .dynsym (for R_X86_64_64 targets), the dynamic relocations
  // against it, and .eh_frame (function extents).
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf.get(), &shstrndx) != 0) return MakeError("{}: no section name table", path);
  struct Rela {
    Elf_Scn* scn;
    GElf_Shdr sh;
  };
  std::vector<Rela> relas;
  std::vector<uint64_t> dynsym_values;  // st_value of defined symbols, 0 for undefined
  size_t dynsym_index = 0;
  for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn != nullptr; scn = elf_nextscn(elf.get(), scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) return MakeError("{}: unreadable section header", path);
    if (sh.sh_type == SHT_NOBITS || sh.sh_size == 0) continue;
    if (sh.sh_offset > file_size || file_size - sh.sh_offset < sh.sh_size) {
      return MakeError("{}: section {} extends past the end of the file", path, elf_ndxscn(scn));
    }
    const char* name = elf_strptr(elf.get(), shstrndx, sh.sh_name);
    if (sh.sh_type == SHT_DYNSYM) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d == nullptr) continue;
      dynsym_index = elf_ndxscn(scn);
      const size_t n = d->d_size / sizeof(Elf64_Sym);
      dynsym_values.assign(n, 0);
      for (size_t k = 1; k < n; ++k) {
        GElf_Sym sym;
        if (gelf_getsym(d, static_cast<int>(k), &sym) == nullptr) break;
        if (sym.st_shndx != SHN_UNDEF) dynsym_values[k] = sym.st_value;
      }
    } else if (sh.sh_type == SHT_RELA) {
      relas.push_back({scn, sh});
    } else if (sh.sh_type == SHT_PROGBITS && name != nullptr && std::strcmp(name, ".eh_frame") == 0) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      uint64_t errors = 0;  // an undecodable FDE just gives no extent
      if (d != nullptr) {
        eh::ForEachFde(elf.get(), d, /*eh_frame=*/true, sh.sh_addr, &errors,
                       [&image](uint64_t start, uint64_t len) { image.fdes.emplace_back(start, len); });
      }
    }
  }
  std::sort(image.fdes.begin(), image.fdes.end());
  for (const Rela& r : relas) {
    // Only the dynamic relocations (.rela.dyn, linked to .dynsym, or with no
    // symbols at all); .rela.plt holds JUMP_SLOTs, which are not data.
    if (r.sh.sh_link != dynsym_index && r.sh.sh_link != 0) continue;
    Elf_Data* d = elf_getdata(r.scn, nullptr);
    if (d == nullptr) continue;
    const size_t n = d->d_size / sizeof(Elf64_Rela);
    for (size_t k = 0; k < n; ++k) {
      GElf_Rela rel;
      if (gelf_getrela(d, static_cast<int>(k), &rel) == nullptr) break;
      const uint32_t type = GELF_R_TYPE(rel.r_info);
      const uint64_t sym = GELF_R_SYM(rel.r_info);
      if (type == R_X86_64_RELATIVE) {
        image.pointers[rel.r_offset] = static_cast<uint64_t>(rel.r_addend);
      } else if ((type == R_X86_64_64 || type == R_X86_64_GLOB_DAT) && sym < dynsym_values.size() &&
                 dynsym_values[sym] != 0) {
        image.pointers[rel.r_offset] = dynsym_values[sym] + static_cast<uint64_t>(rel.r_addend);
      }
    }
  }
  return image;
}

// ---------------------------------------------------------------------------
// OpenSSL 3 provider tables

enum class Op : uint8_t {
  kUnknown,
  kDigest,
  kCipher,
  kMac,
  kKdf,
  kRand,
  kKeymgmt,
  kKeyexch,
  kSignature,
  kAsymCipher,
  kKem,
  kEncoder,
  kDecoder,
  kStore
};

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kDigest:
      return "digest";
    case Op::kCipher:
      return "cipher";
    case Op::kMac:
      return "mac";
    case Op::kKdf:
      return "kdf";
    case Op::kRand:
      return "rand";
    case Op::kKeymgmt:
      return "keymgmt";
    case Op::kKeyexch:
      return "keyexch";
    case Op::kSignature:
      return "signature";
    case Op::kAsymCipher:
      return "asym_cipher";
    case Op::kKem:
      return "kem";
    case Op::kEncoder:
      return "encoder";
    case Op::kDecoder:
      return "decoder";
    case Op::kStore:
      return "store";
    case Op::kUnknown:
      break;
  }
  return "*";
}

// Dispatch function ids by operation (openssl/core_dispatch.h; stable ABI:
// ids are only ever added).
std::string RoleName(Op op, uint32_t id) {
  static const std::map<std::pair<Op, uint32_t>, std::string_view> kRoles = [] {
    std::map<std::pair<Op, uint32_t>, std::string_view> m;
    auto add = [&m](Op op, std::initializer_list<std::string_view> names) {
      uint32_t id = 1;
      for (std::string_view n : names) {
        if (!n.empty()) m[{op, id}] = n;
        ++id;
      }
    };
    add(Op::kDigest,
        {"newctx", "init", "update", "final", "digest", "freectx", "dupctx", "get_params", "set_ctx_params",
         "get_ctx_params", "gettable_params", "settable_ctx_params", "gettable_ctx_params"});
    add(Op::kCipher,
        {"newctx", "encrypt_init", "decrypt_init", "update", "final", "cipher", "freectx", "dupctx", "get_params",
         "get_ctx_params", "set_ctx_params", "gettable_params", "gettable_ctx_params", "settable_ctx_params"});
    add(Op::kMac, {"newctx", "dupctx", "freectx", "init", "update", "final", "get_params", "get_ctx_params",
                   "set_ctx_params", "gettable_params", "gettable_ctx_params", "settable_ctx_params"});
    add(Op::kKdf, {"newctx", "dupctx", "freectx", "reset", "derive", "gettable_params", "gettable_ctx_params",
                   "settable_ctx_params", "get_params", "get_ctx_params", "set_ctx_params"});
    add(Op::kRand, {"newctx", "freectx", "instantiate", "uninstantiate", "generate", "reseed", "nonce",
                    "enable_locking", "lock", "unlock", "gettable_params", "gettable_ctx_params", "settable_ctx_params",
                    "get_params", "get_ctx_params", "set_ctx_params", "verify_zeroization", "get_seed", "clear_seed"});
    add(Op::kKeymgmt,
        {"new", "gen_init", "gen_set_template", "gen_set_params", "gen_settable_params", "gen", "gen_cleanup", "load",
         "", "free", "get_params", "gettable_params", "set_params", "settable_params"});
    m[{Op::kKeymgmt, 20}] = "query_operation_name";
    m[{Op::kKeymgmt, 21}] = "has";
    m[{Op::kKeymgmt, 22}] = "validate";
    m[{Op::kKeymgmt, 23}] = "match";
    m[{Op::kKeymgmt, 40}] = "import";
    m[{Op::kKeymgmt, 41}] = "import_types";
    m[{Op::kKeymgmt, 42}] = "export";
    m[{Op::kKeymgmt, 43}] = "export_types";
    m[{Op::kKeymgmt, 44}] = "dup";
    add(Op::kKeyexch, {"newctx", "init", "derive", "set_peer", "freectx", "dupctx", "set_ctx_params",
                       "settable_ctx_params", "get_ctx_params", "gettable_ctx_params"});
    add(Op::kSignature, {"newctx",
                         "sign_init",
                         "sign",
                         "verify_init",
                         "verify",
                         "verify_recover_init",
                         "verify_recover",
                         "digest_sign_init",
                         "digest_sign_update",
                         "digest_sign_final",
                         "digest_sign",
                         "digest_verify_init",
                         "digest_verify_update",
                         "digest_verify_final",
                         "digest_verify",
                         "freectx",
                         "dupctx",
                         "get_ctx_params",
                         "gettable_ctx_params",
                         "set_ctx_params",
                         "settable_ctx_params",
                         "get_ctx_md_params",
                         "gettable_ctx_md_params",
                         "set_ctx_md_params",
                         "settable_ctx_md_params"});
    add(Op::kAsymCipher, {"newctx", "encrypt_init", "encrypt", "decrypt_init", "decrypt", "freectx", "dupctx",
                          "get_ctx_params", "gettable_ctx_params", "set_ctx_params", "settable_ctx_params"});
    add(Op::kKem, {"newctx", "encapsulate_init", "encapsulate", "decapsulate_init", "decapsulate", "freectx", "dupctx",
                   "get_ctx_params", "gettable_ctx_params", "set_ctx_params", "settable_ctx_params"});
    return m;
  }();
  auto it = kRoles.find({op, id});
  if (it != kRoles.end()) return std::string(it->second);
  return "fn" + std::to_string(id);
}

struct Dispatch {
  uint32_t id = 0;
  uint64_t function = 0;
};

struct Algorithm {
  uint64_t slot = 0;  // vaddr of the OSSL_ALGORITHM
  std::string_view names;
  std::string_view properties;
  std::vector<Dispatch> dispatch;
};

// An OSSL_DISPATCH array: { id, pointer to code } ... { 0, NULL }.
std::optional<std::vector<Dispatch>> ReadDispatch(const Image& image, uint64_t at) {
  constexpr size_t kMaxEntries = 128;  // the largest (keymgmt) has ~30
  std::vector<Dispatch> out;
  for (size_t i = 0; i < kMaxEntries; ++i, at += 16) {
    auto word = image.Read(at, 8);
    if (!word) return std::nullopt;
    const auto id = static_cast<uint32_t>(*word);
    if ((*word >> 32) != 0) return std::nullopt;  // padding after the int
    auto fn = image.PointerAt(at + 8);
    if (id == 0) {
      if (fn || out.empty()) return std::nullopt;
      return out;
    }
    if (id > 4096 || !fn || image.KindAt(*fn) != Image::kCode) return std::nullopt;
    out.push_back({id, *fn});
  }
  return std::nullopt;
}

// An OSSL_ALGORITHM at `slot`: names, properties (or NULL), dispatch, and a
// description (or NULL).
std::optional<Algorithm> ReadAlgorithm(const Image& image, uint64_t slot) {
  auto names_ptr = image.PointerAt(slot);
  auto dispatch_ptr = image.PointerAt(slot + 16);
  if (!names_ptr || !dispatch_ptr) return std::nullopt;
  auto names = image.String(*names_ptr);
  if (!names) return std::nullopt;
  Algorithm a;
  a.slot = slot;
  a.names = *names;
  for (uint64_t field : {slot + 8, slot + 24}) {
    if (auto p = image.PointerAt(field)) {
      auto s = image.String(*p);
      if (!s) return std::nullopt;
      if (field == slot + 8) a.properties = *s;
    } else if (image.Read(field, 8).value_or(1) != 0) {
      return std::nullopt;
    }
  }
  auto dispatch = ReadDispatch(image, *dispatch_ptr);
  if (!dispatch) return std::nullopt;
  a.dispatch = std::move(*dispatch);
  return a;
}

std::string_view FirstName(std::string_view names) { return names.substr(0, names.find(':')); }

// What an array of algorithms implements. The array itself does not say (the
// provider's query function returns it for an operation id), but its names
// and dispatch ids do.
Op ClassifyTable(std::span<const Algorithm> table) {
  std::set<std::string_view> names;
  bool has_import_export = false, has_output = false, has_input = false;
  for (const Algorithm& a : table) {
    names.insert(FirstName(a.names));
    if (a.properties.find("output=") != std::string_view::npos) has_output = true;
    if (a.properties.find("input=") != std::string_view::npos) has_input = true;
    for (const Dispatch& d : a.dispatch) has_import_export |= d.id == 40 || d.id == 42;
  }
  auto has = [&names](std::string_view n) { return names.count(n) != 0; };
  auto any_contains = [&names](std::string_view part) {
    return std::any_of(names.begin(), names.end(),
                       [part](std::string_view n) { return n.find(part) != std::string_view::npos; });
  };
  if (has_output) return Op::kEncoder;
  if (has_input) return Op::kDecoder;
  if (has_import_export) return Op::kKeymgmt;
  if (has("ECDSA")) return Op::kSignature;
  if (any_contains("ML-KEM")) return Op::kKem;
  if (has("ECDH")) return Op::kKeyexch;
  if (has("TLS13-KDF")) return Op::kKdf;
  if (has("GMAC") || has("KMAC-128")) return Op::kMac;
  if (has("CTR-DRBG")) return Op::kRand;
  if (has("SHA1") || has("SHA2-256") || has("SHA3-256")) return Op::kDigest;
  if (any_contains("-GCM") || any_contains("-CBC") || has("ChaCha20-Poly1305")) return Op::kCipher;
  if (has("file")) return Op::kStore;
  if (has("SM2")) return Op::kAsymCipher;
  if (has("RSA")) return Op::kKem;  // OpenSSL 3.0's RSASVE is its only RSA KEM
  return Op::kUnknown;
}

// A function shared by more algorithms than this, or filling more slots of
// its tables, is named with "*" there.
constexpr size_t kMaxListed = 8;
constexpr size_t kMaxRoles = 3;

void AddDistinct(std::vector<std::string>& items, std::string item) {
  if (std::find(items.begin(), items.end(), item) == items.end()) items.push_back(std::move(item));
}

// `items` joined by `sep`, or "*" when there are more than `max`.
std::string JoinOrStar(const std::vector<std::string>& items, std::string_view sep, size_t max) {
  if (items.size() > max) return "*";
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out.append(sep);
    out.append(item);
  }
  return out;
}

// The algorithm as named here: a cipher's key size is dropped, so the
// functions AES-128-GCM and AES-256-GCM share are one algorithm's.
std::string AlgorithmName(Op op, std::string_view names) {
  std::string n(FirstName(names));
  if (op != Op::kCipher) return n;
  for (std::string_view size : {"-128", "-192", "-256"}) {
    size_t at = n.find(size);
    if (at != std::string::npos && (at + size.size() == n.size() || n[at + size.size()] == '-')) {
      n.erase(at, size.size());
      break;
    }
  }
  return n;
}

}  // namespace

Result<LibraryTables> ReadLibraryTables(int fd, std::string_view path) {
  auto loaded = LoadImage(fd, path);
  if (!loaded) return loaded.error();
  const Image& image = *loaded;
  LibraryTables out;

  // Candidates: every relocated slot in a writable segment (.data.rel.ro is
  // writable until RELRO) that points into a read-only one, where strings
  // are; most are not algorithms.
  std::vector<uint64_t> slots;
  for (const auto& [slot, target] : image.pointers) {
    const Image::Kind to = image.KindAt(target);
    if (image.KindAt(slot) == Image::kWritable && (to == Image::kReadOnly || to == Image::kCode)) slots.push_back(slot);
  }
  std::sort(slots.begin(), slots.end());
  std::vector<Algorithm> algorithms;
  for (uint64_t slot : slots) {
    if (!algorithms.empty() && slot < algorithms.back().slot + 32) continue;
    if (auto a = ReadAlgorithm(image, slot)) algorithms.push_back(std::move(*a));
  }
  out.stats.algorithms = algorithms.size();

  // Arrays: runs at a constant stride (32 for OSSL_ALGORITHM, 40 for the
  // OSSL_ALGORITHM_CAPABLE of the default provider's ciphers).
  struct Use {
    Op op;
    std::string algorithm;
    std::string role;
  };
  std::map<uint64_t, std::vector<Use>> uses;
  for (size_t begin = 0; begin < algorithms.size();) {
    size_t end = begin + 1;
    if (end < algorithms.size()) {
      const uint64_t stride = algorithms[end].slot - algorithms[begin].slot;
      if (stride == 32 || stride == 40) {
        while (end < algorithms.size() && algorithms[end].slot - algorithms[end - 1].slot == stride) ++end;
      }
    }
    std::span<const Algorithm> table(algorithms.data() + begin, end - begin);
    const Op op = ClassifyTable(table);
    ++out.stats.tables;
    for (const Algorithm& a : table) {
      std::string alg = AlgorithmName(op, a.names);
      for (const Dispatch& d : a.dispatch) {
        ++out.stats.dispatch_slots;
        uses[d.function].push_back({op, alg, RoleName(op, d.id)});
      }
    }
    begin = end;
  }

  for (const auto& [addr, list] : uses) {
    auto size = image.FunctionSize(addr);
    if (!size) {
      ++out.stats.no_extent;
      continue;
    }
    // Several operations: "*". Several algorithms: all of them, sorted (AES-GCM|ARIA-GCM).
    // Several slots of one table (ChaCha20-Poly1305's update and cipher): update+cipher.
    std::vector<std::string> ops, algs, roles;
    for (const Use& u : list) {
      AddDistinct(ops, std::string(OpName(u.op)));
      AddDistinct(algs, u.algorithm);
      AddDistinct(roles, u.role);
    }
    std::sort(algs.begin(), algs.end());
    const std::string op = JoinOrStar(ops, ":", 1);
    const std::string alg = JoinOrStar(algs, "|", kMaxListed);
    const std::string role = JoinOrStar(roles, "+", kMaxRoles);
    out.functions.push_back({addr, *size, "provider:" + op + ":" + alg + ":" + role});
  }
  out.stats.functions = out.functions.size();
  return out;
}

}  // namespace tlsprof::symbols
