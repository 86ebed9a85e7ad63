#include "agent/usage/names.h"

#include <array>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "bpf/usage.h"

namespace tlsprof::usage {
namespace {

// OpenSSL's NIDs, which are its EVP_PKEY ids (EVP_PKEY_RSA is
// NID_rsaEncryption...); kX25519 is USAGE_KEY_X25519 (1034). BoringSSL
// numbers X25519 and Ed25519 otherwise (its NID_X25519 948, NID_ED25519 949);
// in OpenSSL those are cipher NIDs, never a key's type.
enum KeyNid : uint32_t {
  kRsa = 6,
  kRsaPss = 912,
  kDsa = 116,
  kDh = 28,
  kDhx = 920,
  kEc = 408,
  kX25519 = USAGE_KEY_X25519,
  kX448 = 1035,
  kEd25519 = 1087,
  kEd448 = 1088,
  kBoringX25519 = 948,
  kBoringEd25519 = 949
};

// The prime curve of an ECDH shared secret (its x coordinate) of
// `secret_len` bytes, in bits: "256", "384" or "521"; "" for another length.
std::string_view CurveBits(uint32_t secret_len) {
  if (secret_len == 32) return "256";
  if (secret_len == 48) return "384";
  return secret_len == 66 ? "521" : "";
}

struct Suite {
  uint16_t id;
  std::string_view name;
};

// The suites OpenSSL 3.0, BoringSSL and Go offer by default, and the legacy
// ones an SRE still looks for (RFC 8446, 5246, 5289, 7905; IANA registry).
constexpr std::array kSuites = {
    Suite{0x1301, "TLS_AES_128_GCM_SHA256"},
    Suite{0x1302, "TLS_AES_256_GCM_SHA384"},
    Suite{0x1303, "TLS_CHACHA20_POLY1305_SHA256"},
    Suite{0x1304, "TLS_AES_128_CCM_SHA256"},
    Suite{0x1305, "TLS_AES_128_CCM_8_SHA256"},
    Suite{0xc02b, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"},
    Suite{0xc02c, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"},
    Suite{0xc02f, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
    Suite{0xc030, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"},
    Suite{0xcca8, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"},
    Suite{0xcca9, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"},
    Suite{0xccaa, "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256"},
    Suite{0xc009, "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"},
    Suite{0xc00a, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"},
    Suite{0xc013, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"},
    Suite{0xc014, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"},
    Suite{0xc023, "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"},
    Suite{0xc024, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384"},
    Suite{0xc027, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256"},
    Suite{0xc028, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384"},
    Suite{0x009e, "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256"},
    Suite{0x009f, "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384"},
    Suite{0x0033, "TLS_DHE_RSA_WITH_AES_128_CBC_SHA"},
    Suite{0x0039, "TLS_DHE_RSA_WITH_AES_256_CBC_SHA"},
    Suite{0x009c, "TLS_RSA_WITH_AES_128_GCM_SHA256"},
    Suite{0x009d, "TLS_RSA_WITH_AES_256_GCM_SHA384"},
    Suite{0x002f, "TLS_RSA_WITH_AES_128_CBC_SHA"},
    Suite{0x0035, "TLS_RSA_WITH_AES_256_CBC_SHA"},
    Suite{0x003c, "TLS_RSA_WITH_AES_128_CBC_SHA256"},
    Suite{0x003d, "TLS_RSA_WITH_AES_256_CBC_SHA256"},
    Suite{0x000a, "TLS_RSA_WITH_3DES_EDE_CBC_SHA"},
};

struct Group {
  uint16_t id;
  std::string_view name;
};

// TLS groups by IANA id (RFC 8446 4.2.7, RFC 7919; the hybrid post-quantum
// code points BoringSSL and Go have shipped), as the report names them.
constexpr std::array kGroups = {
    Group{23, "P-256"},
    Group{24, "P-384"},
    Group{25, "P-521"},
    Group{29, "X25519"},
    Group{30, "X448"},
    Group{0x0100, "ffdhe2048"},
    Group{0x0101, "ffdhe3072"},
    Group{0x0102, "ffdhe4096"},
    Group{0x4138, "CECPQ2"},
    Group{0x6399, "X25519Kyber768Draft00"},
    Group{0x11eb, "SecP256r1MLKEM768"},
    Group{0x11ec, "X25519MLKEM768"},
    Group{0x11ed, "SecP384r1MLKEM1024"},
};

struct Kem {
  uint32_t ciphertext_len;
  std::string_view group;      // the TLS group's name (IANA)
  std::string_view algorithm;  // the operation's
};

// KEMs by their ciphertext's length (FIPS 203 table 3; a hybrid's is its
// ML-KEM ciphertext and its ECDH share, draft-ietf-tls-ecdhe-mlkem), as
// OpenSSL 3.5's TLS groups use them.
constexpr std::array kKems = {
    Kem{768, "MLKEM512", "ML-KEM-512"},
    Kem{1088, "MLKEM768", "ML-KEM-768"},
    Kem{1568, "MLKEM1024", "ML-KEM-1024"},
    Kem{1088 + 32, "X25519MLKEM768", "X25519MLKEM768"},
    Kem{1088 + 65, "SecP256r1MLKEM768", "SecP256r1MLKEM768"},
    Kem{1568 + 97, "SecP384r1MLKEM1024", "SecP384r1MLKEM1024"},
};

// BoringSSL's draft Kyber768 (USAGE_KEY_KYBER) and its hybrids (Android's
// BoringSSL 14 calls them X25519Kyber, 0x6399, and P256Kyber).
constexpr std::array kKybers = {
    Kem{1088, "Kyber768", "Kyber768"},
    Kem{1088 + 32, "X25519Kyber768Draft00", "X25519Kyber768Draft00"},
    Kem{1088 + 65, "P256Kyber768Draft00", "P256Kyber768Draft00"},
};

const Kem* KemOf(uint32_t key_type, uint32_t ciphertext_len) {
  for (const Kem& k : key_type == USAGE_KEY_KYBER ? std::span<const Kem>(kKybers) : std::span<const Kem>(kKems)) {
    if (k.ciphertext_len == ciphertext_len) return &k;
  }
  return nullptr;
}

}  // namespace

std::string VersionName(uint16_t version) {
  switch (version) {
    case 0x0304:
      return "TLSv1.3";
    case 0x0303:
      return "TLSv1.2";
    case 0x0302:
      return "TLSv1.1";
    case 0x0301:
      return "TLSv1";
    case 0x0300:
      return "SSLv3";
    case 0xfefd:
      return "DTLSv1.2";
    case 0xfeff:
      return "DTLSv1";
    case 0xffff:
      return "unknown";
  }
  return fmt::format("{:#06x}", version);
}

std::string CipherSuiteName(uint16_t id) {
  if (id == 0xffff) return "unknown";
  for (const Suite& s : kSuites) {
    if (s.id == id) return std::string(s.name);
  }
  return fmt::format("{:#06x}", id);
}

std::string GroupName(uint32_t key_type, uint32_t secret_len) {
  if (key_type != USAGE_UNKNOWN && (key_type & USAGE_KX_TLS_GROUP)) {
    const uint16_t id = static_cast<uint16_t>(key_type & 0xffff);
    for (const Group& g : kGroups) {
      if (g.id == id) return std::string(g.name);
    }
    return fmt::format("group-{:#06x}", id);
  }
  if (key_type == USAGE_KEY_KEM || key_type == USAGE_KEY_KYBER) {
    const Kem* kem = KemOf(key_type, secret_len);
    return kem ? std::string(kem->group) : fmt::format("kem-{}", secret_len);
  }
  switch (key_type) {
    case 0:
      return "none";
    case kX25519:
    case kBoringX25519:
      return "X25519";
    case kX448:
      return "X448";
    case kEc:
      return CurveBits(secret_len).empty() ? "EC" : fmt::format("P-{}", CurveBits(secret_len));
    case kDh:
    case kDhx:
      return secret_len ? fmt::format("ffdhe{}", secret_len * 8) : "ffdhe";
    case USAGE_UNKNOWN:
      return "unknown";
  }
  return fmt::format("key-type-{}", key_type);
}

std::string CertKeyTypeName(uint32_t key_type) {
  switch (key_type) {
    case 0:
      return "none";
    case kRsa:
      return "RSA";
    case kRsaPss:
      return "RSA-PSS";
    case kEc:
      return "ECDSA";
    case kEd25519:
    case kBoringEd25519:
      return "Ed25519";
    case kEd448:
      return "Ed448";
    case kDsa:
      return "DSA";
    case USAGE_UNKNOWN:
      return "unknown";
  }
  return fmt::format("key-type-{}", key_type);
}

std::string SignatureAlgorithm(uint32_t key_type, uint32_t sig_len) {
  switch (key_type) {
    case kRsa:
    case kRsaPss:
      return sig_len ? fmt::format("RSA-{}", sig_len * 8) : "RSA";
    case kEc:
      // DER ECDSA-Sig-Value: two INTEGERs of at most the order's size + 1.
      if (sig_len == 0) return "ECDSA";
      if (sig_len <= 72) return "ECDSA-P256";
      if (sig_len <= 104) return "ECDSA-P384";
      if (sig_len <= 139) return "ECDSA-P521";
      return "ECDSA";
    default:
      return CertKeyTypeName(key_type);
  }
}

std::string KeyExchangeAlgorithm(uint32_t key_type, uint32_t secret_len) {
  if (key_type == USAGE_KEY_KEM || key_type == USAGE_KEY_KYBER) {
    const Kem* kem = KemOf(key_type, secret_len);
    return kem ? std::string(kem->algorithm) : fmt::format("KEM-{}", secret_len);
  }
  switch (key_type) {
    case kEc:
      return CurveBits(secret_len).empty() ? "ECDHE" : fmt::format("ECDHE-P{}", CurveBits(secret_len));
    case kDh:
    case kDhx:
      return secret_len ? fmt::format("FFDHE-{}", secret_len * 8) : "FFDHE";
    default:
      return GroupName(key_type, secret_len);
  }
}

}  // namespace tlsprof::usage
