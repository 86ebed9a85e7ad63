#include "agent/symbols/boringssl_tables.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "agent/symbols/loader_image.h"
#include "agent/symbols/x86_interpreter.h"

namespace tlsprof::symbols {
namespace {

// Getters and once-inits are read with the straight-line interpreter
// (x86_interpreter.h).
using Store = X86Store;
using Call = X86Call;
using Run = X86Run;
using Interpreter = X86Interpreter;

// ---------------------------------------------------------------------------
// The structs, as BoringSSL lays them out (crypto/fipsmodule/cipher/internal.h,
// include/openssl/cipher.h, crypto/fipsmodule/digest/internal.h,
// crypto/fipsmodule/ec/internal.h). EVP_AEAD, EVP_CIPHER and EVP_MD have kept
// these offsets since 2017.

enum class Kind : uint8_t { kAead, kCipher, kMd, kEc };
// The kinds' names, in Kind's order.
constexpr std::string_view kKindNames[] = {"aead", "cipher", "md", "ec"};
static_assert(std::size(kKindNames) == static_cast<size_t>(Kind::kEc) + 1);

std::string_view KindName(Kind k) { return kKindNames[static_cast<size_t>(k)]; }

struct Field {
  uint64_t offset;
  std::string_view name;
};

constexpr Field kAeadFields[] = {{8, "init"},          {16, "init_with_direction"}, {24, "cleanup"}, {32, "open"},
                                 {40, "seal_scatter"}, {48, "open_gather"},         {56, "get_iv"},  {64, "tag_len"}};
constexpr Field kCipherFields[] = {{32, "init"}, {40, "cipher"}, {48, "cleanup"}, {56, "ctrl"}};
constexpr Field kMdFields[] = {{16, "init"}, {24, "update"}, {32, "final"}};
// EC_METHOD of BoringSSL 2021-2023 (Android 13, 14): 23 function pointers.
constexpr std::string_view kEcMethodFields[] = {"group_init",
                                                "group_finish",
                                                "group_set_curve",
                                                "point_get_affine_coordinates",
                                                "jacobian_to_affine_batch",
                                                "add",
                                                "dbl",
                                                "mul",
                                                "mul_base",
                                                "mul_batch",
                                                "mul_public",
                                                "mul_public_batch",
                                                "init_precomp",
                                                "mul_precomp",
                                                "felem_mul",
                                                "felem_sqr",
                                                "felem_to_bytes",
                                                "felem_from_bytes",
                                                "felem_reduce",
                                                "felem_exp",
                                                "scalar_inv0_montgomery",
                                                "scalar_to_montgomery_inv_vartime",
                                                "cmp_x_coordinate"};
constexpr uint64_t kEcMethodBytes = std::size(kEcMethodFields) * 8;
// An EC_METHOD init that stores this far past its start is some other layout;
// its slots are then named by offset.
constexpr uint64_t kMaxEcMethodBytes = 64 * 8;

// The built-in curves by NID (include/openssl/nid.h; NIDs never change).
struct Curve {
  uint32_t nid;
  std::string_view name;
};
constexpr Curve kCurves[] = {{415, "P-256"}, {715, "P-384"}, {716, "P-521"}, {713, "P-224"}};

// Exported getters by name prefix, and the struct each returns.
struct GetterPrefix {
  std::string_view prefix;
  Kind kind;
};
constexpr GetterPrefix kGetterPrefixes[] = {
    {"EVP_aead_", Kind::kAead},  {"EVP_aes_", Kind::kCipher},  {"EVP_des_", Kind::kCipher},
    {"EVP_rc2_", Kind::kCipher}, {"EVP_rc4", Kind::kCipher},   {"EVP_enc_null", Kind::kCipher},
    {"EVP_sha", Kind::kMd},      {"EVP_md4", Kind::kMd},       {"EVP_md5", Kind::kMd},
    {"EVP_blake2b", Kind::kMd},  {"EVP_ripemd160", Kind::kMd},
};

// Algorithm names for getters (prefix and key size dropped, see AlgorithmOf)
// whose plain upper-casing would not give the usual spelling.
struct Spelling {
  Kind kind;
  std::string_view getter;
  std::string_view algorithm;
};
constexpr Spelling kSpellings[] = {
    {Kind::kAead, "chacha20_poly1305", "ChaCha20-Poly1305"},
    {Kind::kAead, "xchacha20_poly1305", "XChaCha20-Poly1305"},
    {Kind::kAead, "aes_cbc_sha1_tls", "AES-CBC-HMAC-SHA1"},
    {Kind::kAead, "des_ede3_cbc_sha1_tls", "DES-EDE3-CBC-HMAC-SHA1"},
    {Kind::kAead, "null_sha1_tls", "NULL-HMAC-SHA1"},
    {Kind::kAead, "aes_ccm_bluetooth", "AES-CCM"},
    {Kind::kCipher, "enc_null", "NULL"},
    {Kind::kMd, "sha1", "SHA-1"},
    {Kind::kMd, "sha224", "SHA-224"},
    {Kind::kMd, "sha256", "SHA-256"},
    {Kind::kMd, "sha384", "SHA-384"},
    {Kind::kMd, "sha512", "SHA-512"},
    {Kind::kMd, "sha512_256", "SHA-512-256"},
    {Kind::kMd, "md5_sha1", "MD5-SHA1"},
    {Kind::kMd, "blake2b256", "BLAKE2b-256"},
    {Kind::kMd, "ripemd160", "RIPEMD-160"},
};

bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// The algorithm a getter returns: its name less the prefix, a cipher's key
// size and an AEAD's variant (the TLS nonce handling, a random nonce, the
// implicit IV, a short tag), spelled as kSpellings says or upper-cased with
// '-' for '_' (aes_128_gcm -> AES-GCM, aes_256_cbc -> AES-CBC, md5 -> MD5).
std::string AlgorithmOf(Kind kind, std::string_view getter) {
  std::string_view rest = getter.substr(kind == Kind::kAead ? 9 : 4);  // "EVP_aead_" / "EVP_"
  std::string s(rest);
  if (kind != Kind::kMd) {
    for (std::string_view size : {"_128", "_192", "_256"}) {
      for (size_t at = s.find(size); at != std::string::npos; at = s.find(size, at)) {
        if (at + size.size() == s.size() || s[at + size.size()] == '_') {
          s.erase(at, size.size());
        } else {
          at += size.size();
        }
      }
    }
  }
  if (kind == Kind::kAead) {
    for (std::string_view variant : {"_tls12", "_tls13", "_randnonce", "_implicit_iv", "_8"}) {
      if (EndsWith(s, variant)) s.erase(s.size() - variant.size());
    }
  }
  for (const Spelling& sp : kSpellings) {
    if (sp.kind == kind && sp.getter == s) return std::string(sp.algorithm);
  }
  for (char& c : s) c = c == '_' ? '-' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A library is BoringSSL's libcrypto if it exports one of these (OpenSSL and
// LibreSSL define none of them).
constexpr std::string_view kBoringSslOnly[] = {"BORINGSSL_self_test", "CRYPTO_is_confidential_build",
                                               "EVP_AEAD_CTX_seal_scatter"};

struct Use {
  Kind kind;
  std::string algorithm;
  std::string role;
};

class Reader {
 public:
  explicit Reader(const LoaderImage& image) : image_(image), cpu_(image) {}

  bool ok() const { return cpu_.ok(); }

  // A getter: the struct it returns, and the stores of the once-inits it
  // ran first (empty for a static struct).
  struct Struct {
    uint64_t addr = 0;
    std::map<uint64_t, Store> stores;  // by address, the last store wins
  };

  std::optional<Struct> Getter(uint64_t fn) {
    const Run run = cpu_.Execute(fn);
    if (!run.returned || !run.rax) return std::nullopt;
    const LoaderImage::Kind at = image_.MemoryKindAt(*run.rax);
    if (at != LoaderImage::kWritable && at != LoaderImage::kReadOnly) return std::nullopt;
    Struct s;
    s.addr = *run.rax;
    for (const Call& c : run.calls) AddInit(c, s.stores);
    return s;
  }

  // What the once-init a call hands to CRYPTO_once stores, added to `stores`.
  // False if the call is not such a call or its init does not decode.
  bool AddInit(const Call& call, std::map<uint64_t, Store>& stores) {
    if (!call.rsi || !cpu_.CallsExport(call.target, "CRYPTO_once")) return false;
    const Run init = cpu_.Execute(*call.rsi);
    if (!init.returned) return false;
    for (const Store& st : init.stores) stores[st.addr] = st;
    return true;
  }

  // The function at a struct's field: what its init stored there, else the
  // file's relocation; only the start of a function in code.
  std::optional<uint64_t> FunctionAt(const Struct& s, uint64_t offset) const {
    std::optional<uint64_t> v;
    if (auto it = s.stores.find(s.addr + offset); it != s.stores.end()) {
      if (it->second.size == 8) v = it->second.value;
    } else {
      v = image_.PointerAt(s.addr + offset);
    }
    if (!v || *v == 0 || image_.KindAt(*v) != LoaderImage::kCode) return std::nullopt;
    return v;
  }

  // EC_GROUP_new_by_curve_name's built-in curves: its first once-init fills
  // an array of { nid, oid, ..., method } entries, calling the method
  // getters' once-inits on the way (the getters are inlined). For each curve
  // found, its method struct.
  std::vector<std::pair<std::string_view, Struct>> Curves(uint64_t fn) {
    std::vector<std::pair<std::string_view, Struct>> out;
    const Run entry = cpu_.Execute(fn);  // stops at the first branch, after the CRYPTO_once
    for (const Call& c : entry.calls) {
      if (!c.rsi || !cpu_.CallsExport(c.target, "CRYPTO_once")) continue;
      const Run table = cpu_.Execute(*c.rsi);
      if (!table.returned) continue;
      // The method structs: the memory each once-init called here fills.
      std::vector<Struct> methods;
      for (const Call& m : table.calls) {
        Struct s;
        if (!AddInit(m, s.stores) || s.stores.empty()) continue;
        s.addr = s.stores.begin()->first;
        methods.push_back(std::move(s));
      }
      // The entries: 32-bit stores of a curve's NID, at a constant stride.
      std::vector<std::pair<uint64_t, std::string_view>> nids;
      for (const Store& st : table.stores) {
        if (st.size != 4 || !st.value) continue;
        for (const Curve& cv : kCurves) {
          if (cv.nid == *st.value) nids.emplace_back(st.addr, cv.name);
        }
      }
      std::sort(nids.begin(), nids.end());
      uint64_t stride = 128;  // one entry: look this far for its method
      for (size_t i = 1; i < nids.size(); ++i) stride = std::min(stride, nids[i].first - nids[i - 1].first);
      for (const auto& [nid_at, curve] : nids) {
        for (const Store& st : table.stores) {
          if (st.size != 8 || !st.value || st.addr <= nid_at || st.addr - nid_at >= stride) continue;
          // A method filled by an init above, or a static one (relocated pointers).
          const uint64_t v = *st.value;
          auto m = std::find_if(methods.begin(), methods.end(), [v](const Struct& s) { return s.addr == v; });
          if (m != methods.end()) {
            out.emplace_back(curve, *m);
            break;
          }
          if (image_.PointerAt(v) && FunctionAt(Struct{v, {}}, 0)) {
            out.emplace_back(curve, Struct{v, {}});
            break;
          }
        }
      }
      if (!out.empty()) break;
    }
    return out;
  }

 private:
  const LoaderImage& image_;
  Interpreter cpu_;
};

}  // namespace

Result<BoringSslTables> ReadBoringSslTables(const guard::ElfFile& elf) {
  auto loaded = LoadLoaderImage(elf, {.symbol_names = true});
  if (!loaded) return loaded.error();
  const LoaderImage& image = *loaded;
  BoringSslTables out;
  if (std::none_of(std::begin(kBoringSslOnly), std::end(kBoringSslOnly),
                   [&image](std::string_view n) { return image.exports.count(std::string(n)) != 0; })) {
    return out;
  }
  Reader reader(image);
  if (!reader.ok()) return MakeError("{}: the disassembler (capstone) failed to start", elf.path());

  std::map<uint64_t, std::vector<Use>> uses;
  auto use = [&](const Reader::Struct& s, uint64_t offset, Kind kind, const std::string& algorithm, std::string role) {
    if (auto fn = reader.FunctionAt(s, offset)) {
      ++out.stats.slots;
      uses[*fn].push_back({kind, algorithm, std::move(role)});
    }
  };

  // Exported getters, in name order so the result does not depend on the
  // hash map's.
  std::map<std::string_view, uint64_t> exports;
  for (const auto& [name, addr] : image.exports) exports.emplace(name, addr);
  for (const auto& [name, addr] : exports) {
    const GetterPrefix* g = nullptr;
    for (const GetterPrefix& p : kGetterPrefixes) {
      if (name.substr(0, p.prefix.size()) == p.prefix) g = &p;
    }
    if (g == nullptr) continue;
    auto s = reader.Getter(addr);
    if (!s) continue;
    ++out.stats.getters;
    const std::string algorithm = AlgorithmOf(g->kind, name);
    std::span<const Field> fields = g->kind == Kind::kAead     ? std::span<const Field>(kAeadFields)
                                    : g->kind == Kind::kCipher ? std::span<const Field>(kCipherFields)
                                                               : std::span<const Field>(kMdFields);
    for (const Field& f : fields) use(*s, f.offset, g->kind, algorithm, std::string(f.name));
  }

  if (auto it = image.exports.find("EC_GROUP_new_by_curve_name"); it != image.exports.end()) {
    for (const auto& [curve, method] : reader.Curves(it->second)) {
      ++out.stats.curves;
      // The layout above, unless the init stores past it.
      const uint64_t extent = method.stores.empty() ? kEcMethodBytes : method.stores.rbegin()->first - method.addr + 8;
      const bool known_layout = extent <= kEcMethodBytes;
      for (uint64_t off = 0; off < (known_layout ? kEcMethodBytes : std::min(extent, kMaxEcMethodBytes)); off += 8) {
        use(method, off, Kind::kEc, std::string(curve),
            known_layout ? std::string(kEcMethodFields[off / 8]) : "slot" + std::to_string(off));
      }
    }
  }

  NameTableFunctions(
      image, "boringssl", uses, [](const Use& u) { return KindName(u.kind); }, out.functions, out.stats.no_extent);
  out.stats.functions = out.functions.size();
  return out;
}

}  // namespace tlsprof::symbols
