// The rules table's types: internal to agent/classify (classify.cc walks the
// tables, classify_test.cc checks them). The data itself is in rules.cc.
//
// Everything here is constexpr data; reading it is thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "agent/classify/classify.h"

namespace tlsprof::classify::rules {

// Which families a row applies to (a bit set of Family).
using FamilyMask = uint8_t;
inline constexpr FamilyMask kO = 1u << static_cast<int>(Family::kOpenSSL);
inline constexpr FamilyMask kB = 1u << static_cast<int>(Family::kBoringSSL);
inline constexpr FamilyMask kG = 1u << static_cast<int>(Family::kGo);
inline constexpr FamilyMask kOB = kO | kB;  // OpenSSL and BoringSSL share most asm and names
inline constexpr FamilyMask kAll = kO | kB | kG;
constexpr FamilyMask MaskOf(Family f) { return static_cast<FamilyMask>(1u << static_cast<int>(f)); }

enum class Match : uint8_t {
  kExact,     // name == pattern
  kPrefix,    // name starts with pattern
  kContains,  // name contains pattern anywhere
};

// Whether `name` matches `pattern` the way `match` says.
constexpr bool PatternMatches(Match match, std::string_view pattern, std::string_view name) {
  switch (match) {
    case Match::kExact:
      return name == pattern;
    case Match::kPrefix:
      return name.starts_with(pattern);
    case Match::kContains:
      return name.find(pattern) != std::string_view::npos;
  }
  return false;
}

// One row of the rules table. `and_contains`, when not empty, must also occur
// somewhere in the name (e.g. prefix "crypto/ecdsa." and contains "P256").
struct Rule {
  FamilyMask families;
  Match match;
  std::string_view pattern;
  std::string_view and_contains;
  Bucket bucket;
  std::string_view algorithm;
};

// A name that starts with one of these is TLS library code. If no Rule matches
// it, it is {kOther, "unknown"}. C prefixes are matched against the name as it
// is (leading underscores kept, so glibc's __tls_get_addr is not "tls_"), less
// any .clone/@version suffix.
struct LibraryPrefix {
  FamilyMask families;
  std::string_view prefix;
  bool exact = false;  // the whole name, not a prefix (e.g. "SHA256" but not libmd's "SHA256Init")
};

// The outermost namespace of a C++ symbol (mangled "_ZN4bssl..." or demangled
// "bssl::...") that makes it TLS library code. C++ names whose outermost
// namespace is not listed here (v8::, node::, std::) are never TLS.
struct CxxNamespace {
  FamilyMask families;
  std::string_view ns;
};

// One row of the operation table (operations.cc): a function that performs a
// whole crypto operation (sign, derive, seal, digest, ...). On a stack the
// outermost such frame picks the sample's bucket.
//   algorithm: what the entry point names; kUnknown for generic entry points
//     (EVP_DigestSign), or kAnyEcdsa/kAnyEcdh for ECDSA/ECDH whose curve it
//     does not name. A non-unknown value also limits which primitives inside
//     the operation may name the algorithm (a bignum kernel labelled RSA under
//     ECDSA_do_sign is not RSA).
//   container: a record-layer wrapper that does several operations (Go's
//     halfConn.encrypt runs HMAC and CBC for TLS 1.2 CBC suites); an operation
//     nested inside it takes precedence.
struct Operation {
  FamilyMask families;
  Match match;
  std::string_view pattern;
  Bucket bucket;
  std::string_view algorithm;
  bool container = false;
  // Samples that serve whichever algorithm of the bucket the process uses,
  // and rarely name it: a context's set-up or tear-down (init, new, free,
  // parameters), libssl's record protection, ephemeral key generation and
  // libssl's key-share calls. Where they name nothing they may take the
  // algorithms the process's stacks named elsewhere in the bucket
  // (aggregate::Attributor::InferFromOperations).
  bool takes_process_mix = false;
};

// Operation-table algorithms that are not report vocabulary: ECDSA or ECDH with
// the curve not named. They constrain primitives and are reported as kUnknown.
inline constexpr std::string_view kAnyEcdsa = "ECDSA (any curve)";
inline constexpr std::string_view kAnyEcdh = "ECDH (any curve)";
// AES with the mode not named: a key schedule (Go's aes.NewCipher) that GCM
// and CBC alike run.
inline constexpr std::string_view kAnyAes = "AES (any mode)";

// One row of the phase table (operations.cc): a TLS API or state-machine
// function that says whether its callees serve the handshake or the record
// layer.
struct PhaseEntry {
  FamilyMask families;
  Match match;
  std::string_view pattern;
  Phase phase;
};

// First match wins, in table order.
// An algorithm that is a building block of another: a primitive labelled
// `part` below one labelled `whole` on the same stack serves the whole, and
// ClassifyStack keeps `whole` (OpenSSL's GCM runs short records through the
// AES-CTR asm, aesni_ctr32_encrypt_blocks, under CRYPTO_gcm128_encrypt_ctr32).
struct PartOf {
  std::string_view part;
  std::string_view whole;
};

// Names a stripped OpenSSL 3 libcrypto's provider tables give its functions
// (agent/symbols/library_tables.h):
//   provider:<operation>:<algorithm>[|<algorithm>...]:<role>
// ProviderOperation says what one operation of those tables is; a function
// of it is an operation entry (ClassifyOperation) unless `entry_roles` is set
// and its role does not start with it (key management is key exchange only
// where it generates keys). Operations not listed are {other, unknown} and no
// entry (rand, encoder, decoder, store).
struct ProviderOperation {
  std::string_view operation;
  Bucket bucket;
  std::string_view entry_roles;  // "" = every role
};

// One algorithm of one kind of table entry (a provider operation, a
// BoringSSL method kind, an OpenSSL code table kind), by the name the table
// reader gives it (a cipher's key size dropped; the curve for kind "ec").
// `algorithm` may be kAnyEcdsa/kAnyEcdh (the curve is in the key, not the
// table), or kP256Ambiguous for an EC_METHOD function, which names the curve
// only (the operation above it says ECDSA or ECDH). A function shared by
// several algorithms (its name lists them) gets an algorithm only if every
// one of them maps to it here; an algorithm not listed maps to {the kind's
// bucket, unknown}.
struct TableAlgorithm {
  std::string_view kind;
  std::string_view name;
  Bucket bucket;
  std::string_view algorithm;
};

std::span<const ProviderOperation> ProviderOperations();
std::span<const TableAlgorithm> ProviderAlgorithms();

// ---- BoringSSL method tables
// Names a stripped BoringSSL libcrypto's method structs give its functions
// (agent/symbols/boringssl_tables.h):
//   boringssl:<kind>:<algorithm>[|<algorithm>...]:<role>
// Such a function is what an exported entry point (EVP_AEAD_CTX_seal,
// EVP_EncryptUpdate, ECDSA_sign, ...) dispatches to: a primitive of its
// kind's bucket, never an operation entry (the entry above it picks the
// bucket). Kinds not listed are {other, unknown}.
struct BoringTableKind {
  std::string_view kind;
  Bucket bucket;
};

std::span<const BoringTableKind> BoringTableKinds();
std::span<const TableAlgorithm> BoringTableAlgorithms();

// ---- OpenSSL 3 code tables below the providers
// Names a stripped OpenSSL 3 libcrypto's EC methods, cipher hw structs and
// X25519 primitive give its functions (agent/symbols/library_tables.h):
//   openssl:<kind>:<algorithm>[|<algorithm>...]:<role>
// Read as the BoringSSL method tables are (same row types): each is a
// primitive of its kind's bucket, never an operation entry; an "ec" function
// names the curve only, and the operation above it (ECDSA sign, ECDH derive,
// EC key generation) says ECDSA or ECDH.
std::span<const BoringTableKind> OpenSslTableKinds();
std::span<const TableAlgorithm> OpenSslTableAlgorithms();

std::span<const Rule> Rules();
std::span<const PartOf> PartsOf();
std::span<const LibraryPrefix> LibraryPrefixes();
std::span<const CxxNamespace> CxxNamespaces();
std::span<const Operation> Operations();
std::span<const PhaseEntry> PhaseEntries();

// One row of the `other` parts table (operations.cc): a TLS library function
// whose presence on a stack with no crypto operation says what part of
// `other` the time is: algo::kOtherX509, kOtherRng or kOtherLibrary. The
// handshake and record parts come from the phase entries.
struct OtherPart {
  FamilyMask families;
  Match match;
  std::string_view pattern;
  std::string_view part;
};
std::span<const OtherPart> OtherParts();

// Shorthand for writing the tables one row a line: for rules.cc and
// operations.cc only (`using namespace table;`).
namespace table {
using enum Match;
using enum Bucket;
using namespace algo;
inline constexpr Bucket kSig = Bucket::kSignature;
inline constexpr Bucket kKx = Bucket::kKeyExchange;
}  // namespace table

}  // namespace tlsprof::classify::rules
