#include "agent/symbols/library_tables.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <span>

#include "agent/symbols/loader_image.h"
#include "agent/symbols/x86_interpreter.h"

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

// The operations' names (openssl/core_dispatch.h), in Op's order.
constexpr std::string_view kOpNames[] = {"*",       "digest",    "cipher",      "mac", "kdf",     "rand",    "keymgmt",
                                         "keyexch", "signature", "asym_cipher", "kem", "encoder", "decoder", "store"};
static_assert(std::size(kOpNames) == static_cast<size_t>(Op::kStore) + 1);

std::string_view OpName(Op op) { return kOpNames[static_cast<size_t>(op)]; }

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

void AddDistinctAddr(std::vector<uint64_t>& items, uint64_t item) {
  if (std::find(items.begin(), items.end(), item) == items.end()) items.push_back(item);
}

// ---------------------------------------------------------------------------
// What the provider functions reach: the code tables below them
// (library_tables.h, "openssl:" names).

struct CodeUse {
  std::string_view kind;  // the name's: "ec", "cipher-hw", "ecx" or "ml-kem"
  std::string algorithm;
  std::string role;
};

// EC_METHOD of OpenSSL 3.0-3.5 (crypto/ec/ec_local.h): int flags, int
// field_type, then these function pointers, 8 bytes each from offset 8.
constexpr std::string_view kEcMethodFields[] = {
    "group_init",
    "group_finish",
    "group_clear_finish",
    "group_copy",
    "group_set_curve",
    "group_get_curve",
    "group_get_degree",
    "group_order_bits",
    "group_check_discriminant",
    "point_init",
    "point_finish",
    "point_clear_finish",
    "point_copy",
    "point_set_to_infinity",
    "point_set_affine_coordinates",
    "point_get_affine_coordinates",
    "point_set_compressed_coordinates",
    "point2oct",
    "oct2point",
    "add",
    "dbl",
    "invert",
    "is_at_infinity",
    "is_on_curve",
    "point_cmp",
    "make_affine",
    "points_make_affine",
    "mul",
    "precompute_mult",
    "have_precompute_mult",
    "field_mul",
    "field_sqr",
    "field_div",
    "field_inv",
    "field_encode",
    "field_decode",
    "field_set_to_one",
    "priv2oct",
    "oct2priv",
    "set_private",
    "keygen",
    "keycheck",
    "keygenpub",
    "keycopy",
    "keyfinish",
    "ecdh_compute_key",
    "ecdsa_sign_setup",
    "ecdsa_sign_sig",
    "ecdsa_verify_sig",
    "field_inverse_mod_ord",
    "blind_coordinates",
    "ladder_pre",
    "ladder_step",
    "ladder_post",
};

// NIDs (openssl/obj_mac.h; they never change).
constexpr uint32_t kNidPrimeField = 406;  // NID_X9_62_prime_field: an EC_METHOD's field_type
constexpr uint32_t kNidChar2Field = 407;  // NID_X9_62_characteristic_two_field
constexpr uint32_t kNidX25519 = 1034;     // EVP_PKEY_X25519: a legacy EVP_PKEY_METHOD's pkey_id
constexpr uint32_t kNidX448 = 1035;       // EVP_PKEY_X448
struct CurveName {
  uint32_t nid;
  std::string_view name;
};
constexpr CurveName kCurveNames[] = {{415, "P-256"}, {715, "P-384"}, {716, "P-521"}, {713, "P-224"}};

std::string CurveLabel(uint32_t nid) {
  for (const CurveName& c : kCurveNames) {
    if (c.nid == nid) return std::string(c.name);
  }
  return "nid" + std::to_string(nid);
}

// An entry of the built-in curve table (crypto/ec/ec_curve.c curve_list):
// { int nid; const EC_CURVE_DATA *data; const EC_METHOD *(*meth)(void);
//   const char *comment; }, 32 bytes, meth NULL for a curve built on the
// generic method of its field; EC_CURVE_DATA starts with the field type.
struct CurveEntry {
  uint64_t at = 0;
  uint32_t nid = 0;
  uint32_t field_type = 0;
  uint64_t getter = 0;  // 0: none
};

std::optional<CurveEntry> ReadCurveEntry(const Image& image, uint64_t at) {
  auto nid = image.Read(at, 8);
  if (!nid || *nid == 0 || *nid >= 0x10000) return std::nullopt;  // an int NID, zero padding
  auto data = image.PointerAt(at + 8);
  auto comment = image.PointerAt(at + 24);
  // The comment is text, but not always printable ASCII (the IPSec curves' have tabs and newlines).
  if (!data || !comment || image.KindAt(*data) != Image::kReadOnly || image.KindAt(*comment) != Image::kReadOnly) {
    return std::nullopt;
  }
  auto field = image.Read(*data, 4);
  if (!field || (*field != kNidPrimeField && *field != kNidChar2Field)) return std::nullopt;
  CurveEntry e{at, static_cast<uint32_t>(*nid), static_cast<uint32_t>(*field), 0};
  if (auto meth = image.PointerAt(at + 16)) {
    if (image.KindAt(*meth) != Image::kCode) return std::nullopt;
    e.getter = *meth;
  } else if (image.Read(at + 16, 8).value_or(1) != 0) {
    return std::nullopt;
  }
  return e;
}

// The curve table: the longest run of entries 32 bytes apart that holds
// P-256. Found from the comment pointers, one per entry.
std::vector<CurveEntry> FindCurveTable(const Image& image) {
  std::vector<CurveEntry> entries;
  for (const auto& [slot, target] : image.pointers) {
    if (slot < 24 || image.KindAt(slot) != Image::kWritable || image.KindAt(target) != Image::kReadOnly) continue;
    if (auto e = ReadCurveEntry(image, slot - 24)) entries.push_back(*e);
  }
  std::sort(entries.begin(), entries.end(), [](const CurveEntry& a, const CurveEntry& b) { return a.at < b.at; });
  std::vector<CurveEntry> best;
  for (size_t begin = 0; begin < entries.size();) {
    size_t end = begin + 1;
    while (end < entries.size() && entries[end].at - entries[end - 1].at == 32) ++end;
    const bool has_p256 =
        std::any_of(entries.begin() + static_cast<ptrdiff_t>(begin), entries.begin() + static_cast<ptrdiff_t>(end),
                    [](const CurveEntry& e) { return e.nid == kCurveNames[0].nid; });
    if (has_p256 && end - begin > best.size()) {
      best.assign(entries.begin() + static_cast<ptrdiff_t>(begin), entries.begin() + static_cast<ptrdiff_t>(end));
    }
    begin = end;
  }
  return best;
}

// The structs a provider's cipher newctx gets from its hw getter
// (ossl_prov_cipher_hw_aes_cbc(keybits) -> &aesni_cbc or &aes_cbc, picked by
// cpuid): PROV_CIPHER_HW { init, cipher, copyctx }, or a mode's own
// (providers/implementations/include/prov/ciphercommon_{gcm,ccm}.h). At most
// this many pointers are read from one; the scan also stops at the first
// that is not code, and at the next struct found.
struct HwLayout {
  std::string_view mode;  // algorithm name suffix; "" for the rest
  std::span<const std::string_view> fields;
};
constexpr std::string_view kCipherHwFields[] = {"init", "cipher", "copyctx"};
constexpr std::string_view kGcmHwFields[] = {"setkey", "setiv", "aadupdate", "cipherupdate", "cipherfinal", "oneshot"};
constexpr std::string_view kCcmHwFields[] = {"setkey", "setiv", "setaad", "auth_encrypt", "auth_decrypt", "gettag"};
// PROV_CIPHER_HW_CHACHA20_POLY1305: PROV_CIPHER_HW, then its AEAD's own.
constexpr std::string_view kChaChaPolyHwFields[] = {"init",   "cipher",   "copyctx",         "aead_cipher",
                                                    "initiv", "tls_init", "tls_iv_set_fixed"};
constexpr HwLayout kHwLayouts[] = {
    {"ChaCha20-Poly1305", kChaChaPolyHwFields}, {"-GCM", kGcmHwFields}, {"-CCM", kCcmHwFields}, {"", kCipherHwFields}};
// The most slots a struct above has: how far a struct is looked at for a
// second function.
constexpr uint64_t kMaxHwSlots = std::size(kChaChaPolyHwFields);

std::span<const std::string_view> HwFields(std::string_view algorithm) {
  for (const HwLayout& l : kHwLayouts) {
    if (algorithm.ends_with(l.mode)) return l.fields;
  }
  return kCipherHwFields;
}

// A hw getter is a few instructions; a callee of newctx longer than this is
// not one (ossl_cipher_generic_initkey and the like are not scanned).
constexpr uint64_t kMaxHwGetterBytes = 256;

// A provider function's place in the provider tables: an operation's
// dispatch slot for one algorithm.
struct ProviderUse {
  Op op;
  std::string algorithm;
  std::string role;
};
using ProviderUses = std::map<uint64_t, std::vector<ProviderUse>>;
using CodeUses = std::map<uint64_t, std::vector<CodeUse>>;

// The code tables below the provider functions, one kind of table at a
// time. Each Read*() adds to the uses; their order is the order of a
// function's uses, which its name keeps (library_tables.h).
class CodeTableReader {
 public:
  CodeTableReader(const Image& image, const ProviderUses& provider, LibraryTablesStats& stats)
      : image_(image), provider_(provider), stats_(stats), cpu_(image) {
    for (const auto& [name, addr] : image.exports) exported_.insert(addr);
  }

  bool ok() const { return cpu_.ok(); }
  CodeUses Take() { return std::move(uses_); }

  // EC: the curve table's methods, and the generic method of each field for
  // the curves that name none (EC_GROUP_new_curve_GFp/GF2m pick it; on
  // x86-64 the Montgomery one). A curve's method is where its arithmetic
  // is: ECDSA and ECDH reach it through EC_POINT_mul and the group's
  // inverse.
  void ReadEcMethods() {
    for (const auto& [method, curve_list] : CurvesByMethod()) {
      ++stats_.ec_methods;
      for (size_t i = 0; i < std::size(kEcMethodFields); ++i) {
        auto fn = image_.PointerAt(method + 8 + 8 * i);
        if (!fn || !IsFunction(*fn)) continue;
        for (const std::string& curve : curve_list) {
          uses_[*fn].push_back({"ec", curve, std::string(kEcMethodFields[i])});
        }
      }
    }
  }

  // Cipher hw structs, from each cipher's newctx through its hw getter: a
  // callee of newctx, or of the helper newctx tail-calls (aes128gcm_newctx
  // -> aes_gcm_newctx -> ossl_prov_aes_hw_gcm), that takes the address of a
  // struct whose first slot is a function. Every algorithm whose newctx
  // reaches a struct is its (AES-CBC and AES-CBC-CTS share newctx).
  void ReadCipherHw() {
    const std::map<uint64_t, std::vector<std::string>> hw_structs = AlgorithmsByHwStruct();
    for (auto it = hw_structs.begin(); it != hw_structs.end(); ++it) {
      ++stats_.hw_structs;
      // The next struct bounds this one's slots.
      const auto next = std::next(it);
      AddHwStruct(it->first, next == hw_structs.end() ? std::nullopt : std::optional(next->first), it->second);
    }
  }

  // X25519: the provider's derive is shared with X448 (ecx_derive picks
  // ossl_x25519 or ossl_x448 by key length). The function it calls that the
  // legacy X25519 EVP_PKEY_METHOD's derive calls too, and X448's does not,
  // is X25519's.
  void ReadX25519() {
    const std::optional<uint64_t> shared_derive = SharedEcxDerive();
    if (!shared_derive) return;
    std::set<uint64_t> legacy25519, legacy448;
    LegacyEcxDerives(legacy25519, legacy448);
    std::set<uint64_t> x25519_callees, x448_callees;
    for (uint64_t fn : legacy25519) x25519_callees.merge(Callees(fn));
    for (uint64_t fn : legacy448) x448_callees.merge(Callees(fn));
    // OpenSSL 3.2 and later put ossl_ecx_compute_key between the provider's
    // derive and ossl_x25519: look two calls deep.
    std::set<uint64_t> reached = Callees(*shared_derive);
    for (uint64_t fn : std::set<uint64_t>(reached)) reached.merge(Callees(fn));
    for (uint64_t fn : reached) {
      if (x25519_callees.count(fn) && !x448_callees.count(fn)) {
        uses_[fn].push_back({"ecx", "X25519", "derive"});
      }
    }
  }

  // ML-KEM (OpenSSL 3.5): the provider's encapsulate and decapsulate, which
  // all ML-KEM parameter sets share, tail-call the ML-KEM code
  // (ossl_ml_kem_encap_rand, ossl_ml_kem_decap): their internal callees are
  // ML-KEM's.
  void ReadMlKem() {
    for (const auto& [fn, list] : provider_) {
      bool mlkem = !list.empty();
      std::string role;
      for (const ProviderUse& u : list) {
        mlkem = mlkem && u.op == Op::kKem && u.algorithm.starts_with("ML-KEM-") &&
                (u.role == "encapsulate" || u.role == "decapsulate");
        role = u.role;
      }
      if (!mlkem) continue;
      for (uint64_t callee : Callees(fn)) uses_[callee].push_back({"ml-kem", "ML-KEM", role});
    }
  }

 private:
  bool IsFunction(uint64_t addr) const { return image_.KindAt(addr) == Image::kCode && image_.FunctionSize(addr); }

  std::optional<uint64_t> ExportAt(std::string_view name) const {
    auto it = image_.exports.find(std::string(name));
    if (it == image_.exports.end()) return std::nullopt;
    return it->second;
  }

  // Direct callees of `fn` that are functions of this file, not exports
  // (those have their own names) and not PLT stubs (no FDE starts there).
  std::set<uint64_t> Callees(uint64_t fn) {
    std::set<uint64_t> out;
    auto size = image_.FunctionSize(fn);
    if (!size) return out;
    for (uint64_t t : cpu_.Scan(fn, *size).calls) {
      if (!exported_.count(t) && IsFunction(t)) out.insert(t);
    }
    return out;
  }

  const std::set<uint64_t>& CachedCallees(uint64_t fn) {
    auto it = callee_cache_.find(fn);
    if (it == callee_cache_.end()) it = callee_cache_.emplace(fn, Callees(fn)).first;
    return it->second;
  }

  // The EC_METHOD a getter returns: writable, with a field type after its
  // flags.
  std::optional<uint64_t> MethodOf(uint64_t getter) {
    const X86Run run = cpu_.Execute(getter);
    if (!run.returned || !run.rax || image_.KindAt(*run.rax) != Image::kWritable) return std::nullopt;
    auto field = image_.Read(*run.rax + 4, 4);
    if (!field || (*field != kNidPrimeField && *field != kNidChar2Field)) return std::nullopt;
    return *run.rax;
  }

  // The methods of the generic getters `constructor` calls (through the PLT).
  std::vector<uint64_t> GenericMethods(std::string_view constructor, std::initializer_list<std::string_view> getters) {
    std::vector<uint64_t> out;
    auto fn = ExportAt(constructor);
    if (!fn || !image_.FunctionSize(*fn)) return out;
    for (uint64_t t : cpu_.Scan(*fn, *image_.FunctionSize(*fn)).calls) {
      for (std::string_view g : getters) {
        auto addr = ExportAt(g);
        if (addr && cpu_.CallsExport(t, g)) {
          if (auto m = MethodOf(*addr)) AddDistinctAddr(out, *m);
        }
      }
    }
    return out;
  }

  // EC_METHOD -> the curves built on it.
  std::map<uint64_t, std::vector<std::string>> CurvesByMethod() {
    std::map<uint64_t, std::vector<std::string>> method_curves;
    const std::vector<CurveEntry> curves = FindCurveTable(image_);
    if (curves.empty()) return method_curves;
    const std::vector<uint64_t> prime =
        GenericMethods("EC_GROUP_new_curve_GFp", {"EC_GFp_mont_method", "EC_GFp_nist_method", "EC_GFp_simple_method"});
    const std::vector<uint64_t> char2 = GenericMethods("EC_GROUP_new_curve_GF2m", {"EC_GF2m_simple_method"});
    for (const CurveEntry& c : curves) {
      ++stats_.curves;
      std::vector<uint64_t> methods;
      if (c.getter != 0) {
        if (auto m = MethodOf(c.getter)) methods.push_back(*m);
      } else {
        methods = c.field_type == kNidPrimeField ? prime : char2;
      }
      for (uint64_t m : methods) method_curves[m].push_back(CurveLabel(c.nid));
    }
    return method_curves;
  }

  // The hw structs a (short) function takes the address of: writable, a
  // function in the first slot and in one more of the first kMaxHwSlots.
  const std::vector<uint64_t>& StructsOf(uint64_t fn) {
    auto it = getter_structs_.find(fn);
    if (it != getter_structs_.end()) return it->second;
    std::vector<uint64_t> found;
    if (auto size = image_.FunctionSize(fn); size && *size <= kMaxHwGetterBytes) {
      for (uint64_t x : cpu_.Scan(fn, *size).leas) {
        if (image_.KindAt(x) != Image::kWritable) continue;
        auto first = image_.PointerAt(x);
        if (!first || !IsFunction(*first)) continue;
        // PROV_CIPHER_HW's cipher and copyctx may be NULL in a mode's own
        // struct (ChaCha20-Poly1305's), whose functions follow it.
        bool more = false;
        for (uint64_t i = 1; i < kMaxHwSlots && !more; ++i) {
          auto p = image_.PointerAt(x + 8 * i);
          more = p && IsFunction(*p);
        }
        if (more) AddDistinctAddr(found, x);
      }
    }
    return getter_structs_.emplace(fn, std::move(found)).first->second;
  }

  // hw struct -> the algorithms whose newctx reaches it (two calls deep).
  std::map<uint64_t, std::vector<std::string>> AlgorithmsByHwStruct() {
    std::map<uint64_t, std::vector<std::string>> hw_structs;
    for (const auto& [fn, list] : provider_) {
      std::vector<std::string> algs;
      bool newctx = false, cipher = !list.empty();
      for (const ProviderUse& u : list) {
        cipher = cipher && u.op == Op::kCipher;
        newctx = newctx || u.role == "newctx";
        AddDistinct(algs, u.algorithm);
      }
      if (!cipher || !newctx || algs.size() > kMaxListed) continue;
      std::set<uint64_t> reached;
      for (uint64_t callee : CachedCallees(fn)) {
        reached.insert(callee);
        for (uint64_t c2 : CachedCallees(callee)) reached.insert(c2);
      }
      for (uint64_t f : reached) {
        for (uint64_t st : StructsOf(f)) {
          for (const std::string& a : algs) AddDistinct(hw_structs[st], a);
        }
      }
    }
    return hw_structs;
  }

  // The functions in the slots of the hw struct at `at` (up to `bound`, the
  // next struct), named by the layout of its algorithms' mode; PROV_CIPHER_HW's
  // three fields if they differ (ChaCha20's struct, reached from
  // ChaCha20-Poly1305 too).
  void AddHwStruct(uint64_t at, std::optional<uint64_t> bound, const std::vector<std::string>& algorithms) {
    std::span<const std::string_view> fields = HwFields(algorithms.front());
    for (const std::string& alg : algorithms) {
      if (HwFields(alg).data() != fields.data()) fields = kCipherHwFields;
    }
    for (const std::string& alg : algorithms) {
      for (size_t i = 0; i < fields.size(); ++i) {
        const uint64_t slot = at + 8 * i;
        if (bound && slot >= *bound) break;
        auto fn = image_.PointerAt(slot);
        if (!fn) {
          if (image_.Read(slot, 8).value_or(1) != 0) break;
          continue;  // a NULL slot
        }
        if (!IsFunction(*fn)) break;
        uses_[*fn].push_back({"cipher-hw", alg, std::string(fields[i])});
      }
    }
  }

  // The provider function that is the derive of both X25519 and X448.
  std::optional<uint64_t> SharedEcxDerive() const {
    std::optional<uint64_t> shared_derive;
    for (const auto& [fn, list] : provider_) {
      std::vector<std::string> algs;
      bool derive = !list.empty();
      for (const ProviderUse& u : list) {
        derive = derive && u.op == Op::kKeyexch && u.role == "derive";
        AddDistinct(algs, u.algorithm);
      }
      std::sort(algs.begin(), algs.end());
      if (derive && algs == std::vector<std::string>{"X25519", "X448"}) shared_derive = fn;
    }
    return shared_derive;
  }

  // The derives of the legacy X25519 and X448 EVP_PKEY_METHODs
  // (crypto/evp/evp_local.h): int pkey_id, int flags, then function
  // pointers with derive at offset 184, ctrl at 192.
  void LegacyEcxDerives(std::set<uint64_t>& x25519, std::set<uint64_t>& x448) const {
    for (const auto& [slot, target] : image_.pointers) {
      if (slot < 184 || image_.KindAt(slot) != Image::kWritable || !IsFunction(target)) continue;
      const uint64_t base = slot - 184;
      auto id = image_.Read(base, 8);  // pkey_id, and flags 0
      auto ctrl = image_.PointerAt(base + 192);
      if (!id || !ctrl || !IsFunction(*ctrl)) continue;
      if (*id == kNidX25519) x25519.insert(target);
      if (*id == kNidX448) x448.insert(target);
    }
  }

  const Image& image_;
  const ProviderUses& provider_;
  LibraryTablesStats& stats_;
  X86Interpreter cpu_;
  std::set<uint64_t> exported_;
  std::map<uint64_t, std::set<uint64_t>> callee_cache_;
  std::map<uint64_t, std::vector<uint64_t>> getter_structs_;  // function -> structs its leas take
  CodeUses uses_;
};

// The code tables below the provider functions. `provider` maps each
// provider function to its table uses.
CodeUses ReadCodeTables(const Image& image, const ProviderUses& provider, LibraryTablesStats& stats) {
  CodeTableReader reader(image, provider, stats);
  if (!reader.ok()) return {};
  reader.ReadEcMethods();
  reader.ReadCipherHw();
  reader.ReadX25519();
  reader.ReadMlKem();
  return reader.Take();
}

// Candidates: every relocated slot in a writable segment (.data.rel.ro is
// writable until RELRO) that points into a read-only one, where strings
// are; most are not algorithms. The OSSL_ALGORITHMs among them, by address.
std::vector<Algorithm> FindAlgorithms(const Image& image) {
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
  return algorithms;
}

// Arrays: runs at a constant stride (32 for OSSL_ALGORITHM, 40 for the
// OSSL_ALGORITHM_CAPABLE of the default provider's ciphers). Each array's
// operation comes from ClassifyTable; each dispatch slot is a use of its
// function.
ProviderUses ReadProviderTables(std::span<const Algorithm> algorithms, LibraryTablesStats& stats) {
  ProviderUses uses;
  for (size_t begin = 0; begin < algorithms.size();) {
    size_t end = begin + 1;
    if (end < algorithms.size()) {
      const uint64_t stride = algorithms[end].slot - algorithms[begin].slot;
      if (stride == 32 || stride == 40) {
        while (end < algorithms.size() && algorithms[end].slot - algorithms[end - 1].slot == stride) ++end;
      }
    }
    std::span<const Algorithm> table = algorithms.subspan(begin, end - begin);
    const Op op = ClassifyTable(table);
    ++stats.tables;
    for (const Algorithm& a : table) {
      std::string alg = AlgorithmName(op, a.names);
      for (const Dispatch& d : a.dispatch) {
        ++stats.dispatch_slots;
        uses[d.function].push_back({op, alg, RoleName(op, d.id)});
      }
    }
    begin = end;
  }
  return uses;
}

}  // namespace

Result<LibraryTables> ReadLibraryTables(const guard::ElfFile& elf) {
  auto loaded = LoadLoaderImage(elf, {.symbol_names = true});
  if (!loaded) return loaded.error();
  const Image& image = *loaded;
  LibraryTables out;

  const std::vector<Algorithm> algorithms = FindAlgorithms(image);
  out.stats.algorithms = algorithms.size();
  const ProviderUses uses = ReadProviderTables(algorithms, out.stats);
  NameTableFunctions(
      image, "provider", uses, [](const ProviderUse& u) { return OpName(u.op); }, out.functions, out.stats.no_extent);
  out.stats.functions = out.functions.size();

  // Only a library with provider tables has the code tables below them.
  if (out.functions.empty()) return out;
  for (const auto& [addr, list] : ReadCodeTables(image, uses, out.stats)) {
    // A provider function keeps its provider name.
    if (uses.count(addr)) continue;
    auto size = image.FunctionSize(addr);
    if (!size) continue;  // ReadCodeTables takes only functions with an FDE
    out.functions.push_back({addr, *size, TableFunctionName("openssl", list, [](const CodeUse& u) { return u.kind; })});
    ++out.stats.code_functions;
  }
  out.stats.functions = out.functions.size();
  std::sort(out.functions.begin(), out.functions.end(),
            [](const TableFunction& a, const TableFunction& b) { return a.addr < b.addr; });
  return out;
}

}  // namespace tlsprof::symbols
