#include "agent/symbols/library_tables.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <span>

#include "agent/symbols/loader_image.h"

namespace tlsprof::symbols {
namespace {

// The image these tables are decoded from (loader_image.h).
using Image = LoaderImage;

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
  auto loaded = LoadLoaderImage(fd, path);
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
