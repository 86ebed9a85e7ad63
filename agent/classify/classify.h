// Classification: maps a TLS library's symbol names to a bucket and an
// algorithm, and recognises which TLS library a binary carries.
//
// The rules themselves are data, in rules.cc: one table a reviewer can read line
// by line. All functions here are pure and thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

namespace tlsprof::classify {

// Where a sample's CPU time goes. kOther is TLS library time outside the
// crypto primitives (record layer, handshake state machine, provider lookup,
// ASN.1, memory management inside the library, ...).
enum class Bucket : uint8_t { kCipher, kSignature, kKeyExchange, kHash, kOther };
inline constexpr int kBucketCount = 5;
std::string_view BucketName(Bucket bucket);  // "cipher", "signature", "key_exchange", "hash", "other"

// Canonical algorithm names (the report's vocabulary).
namespace algo {
inline constexpr std::string_view kAesGcm = "AES-GCM";
inline constexpr std::string_view kAesCbc = "AES-CBC";
inline constexpr std::string_view kAesCtr = "AES-CTR";
inline constexpr std::string_view kChaCha20Poly1305 = "ChaCha20-Poly1305";
inline constexpr std::string_view kRsa = "RSA";
inline constexpr std::string_view kEcdsaP256 = "ECDSA-P256";
inline constexpr std::string_view kEcdsaP384 = "ECDSA-P384";
inline constexpr std::string_view kEd25519 = "Ed25519";
inline constexpr std::string_view kEcdheP256 = "ECDHE-P256";
inline constexpr std::string_view kEcdheP384 = "ECDHE-P384";
inline constexpr std::string_view kX25519 = "X25519";
inline constexpr std::string_view kMlKem = "ML-KEM";
inline constexpr std::string_view kMlDsa = "ML-DSA";
inline constexpr std::string_view kSha1 = "SHA-1";
inline constexpr std::string_view kSha256 = "SHA-256";
inline constexpr std::string_view kSha512 = "SHA-512";
inline constexpr std::string_view kMd5 = "MD5";
// P-256 field/point arithmetic that ECDSA-P256 and ECDHE-P256 share: a leaf
// there cannot say which operation it serves. ClassifyStack resolves it from
// the operation on the stack; ClassifySymbol (leaf only) keeps it.
inline constexpr std::string_view kP256Ambiguous = "P-256 (ECDSA or ECDHE)";
// The same for P-384, and for the generic prime-curve code that on x86-64
// OpenSSL 3.0 and BoringSSL serves P-384 (P-256 and X25519 have their own).
inline constexpr std::string_view kP384Ambiguous = "P-384 (ECDSA or ECDHE)";
// AES whose mode the leaf does not show (block function, key schedule) and
// ECDSA whose curve it does not show are reported as kUnknown within their
// bucket: the report's vocabulary stays the canonical list.
inline constexpr std::string_view kUnknown = "unknown";
// The parts of bucket `other`, given in its algorithm column (README.md,
// "The parts of other"): outside every crypto operation, what the time went to.
inline constexpr std::string_view kOtherX509 = "x509";        // certificates and ASN.1: parse, encode, verify, chains
inline constexpr std::string_view kOtherRng = "rng";          // the DRBG and entropy outside any operation
inline constexpr std::string_view kOtherLibrary = "library";  // provider lookup, error queue, memory, locks, params
inline constexpr std::string_view kOtherHandshake = "handshake";  // state machine, extensions, transcript
inline constexpr std::string_view kOtherRecord = "record";        // framing, copy, BIO
}  // namespace algo

// Which family of rules applies to a binary.
enum class Family : uint8_t { kOpenSSL, kBoringSSL, kGo };
std::string_view FamilyName(Family family);  // "openssl", "boringssl", "go"

struct Classification {
  Bucket bucket = Bucket::kOther;
  std::string_view algorithm = algo::kUnknown;  // one of algo::k*
};

// Classifies one symbol of a TLS library of `family`. Returns nullopt when the
// name is not TLS library code at all (e.g. a node or nginx function in a
// static executable, or libc). A name that is TLS library code but no crypto
// primitive gives {kOther, "unknown"}.
std::optional<Classification> ClassifySymbol(Family family, std::string_view name);

// True if `name` is TLS library code for any family: the filter that keeps a
// big static binary's symbol table small.
bool IsTlsSymbol(std::string_view name);

// ---- Stack-aware classification (semantics in README.md, "Stacks").

// What a sample's TLS time serves: the handshake (including handshakes that
// SSL_read/SSL_write or Go's Conn.Read run implicitly), the record layer
// (application data, alerts, close_notify), or neither (setup, teardown).
enum class Phase : uint8_t { kHandshake, kRecord, kOther };
std::string_view PhaseName(Phase phase);  // "handshake", "record", "other"

// One frame of a user stack as the caller resolved it.
struct FrameInfo {
  std::string_view name;             // may be empty (unnamed code in a stripped library)
  Family family = Family::kOpenSSL;  // rules that apply to the frame's binary
  bool tls = false;                  // the frame's address is in TLS library code (the caller knows)
};

struct StackClassification {
  Classification classification;
  Phase phase = Phase::kOther;
  bool tls = false;  // any frame is TLS library code: the sample is TLS time
};

// Classifies a whole stack, frames leaf first. Only frames with tls=true are
// looked at for operations, primitives and phase. Allocation-free; callers
// cache the result per unique stack.
//   bucket:    the outermost operation entry point's (ClassifyOperation); with
//              none, the innermost primitive's (ClassifySymbol), else other.
//   algorithm: the innermost primitive of that bucket that names one (the
//              shared P-256/P-384 code resolves to ECDSA or ECDHE by the
//              bucket), else the innermost operation that names one, else
//              unknown.
//   phase:     handshake if any handshake entry is on the stack, else record
//              if any record entry is, else other.
StackClassification ClassifyStack(std::span<const FrameInfo> frames);

// The operation a function starts, for an entry point of `family` (e.g.
// EVP_DigestSignFinal -> {signature, unknown}, X25519 -> {key_exchange,
// X25519}); nullopt if it is none. Callers pass TLS library frames only.
std::optional<Classification> ClassifyOperation(Family family, std::string_view name);

// Whether an operation entry narrows the algorithm, to one (X25519) or to a
// family whose member its name does not show (ecdsa_sign: ECDSA, some curve),
// unlike a generic entry (EVP_PKEY_sign: RSA, ECDSA, Ed25519...). False for a
// name that is no operation entry.
bool IsSpecificOperation(Family family, std::string_view name);

// Whether the samples of an operation entry that named no algorithm anywhere
// may take `algorithm` (a report algorithm, not unknown) from what the same
// process's stacks named elsewhere in the bucket: a context's set-up or
// tear-down (EVP_DigestInit_ex, EVP_PKEY_sign_init, a provider's newctx) any
// algorithm of its bucket; an ECDSA or ECDH entry whose name does not say the
// curve (ecdsa_sign, provider:keyexch:ECDH:derive) a curve of its family; a
// specific entry only its own. With a `candidate` (SoleNamedCandidate of a
// frame below the entry), that one only, whatever the entry. No other entry
// may: EVP_EncryptUpdate over stripped code that names nothing would take the
// process's cipher mix, a guess.
bool MayTakeProcessAlgorithm(Family family, std::string_view entry, std::string_view candidate,
                             std::string_view algorithm);

// For a function OpenSSL's provider tables share between algorithms of which
// one alone has a report name (provider:cipher:AES-GCM|ARIA-GCM:update,
// provider:keyexch:X25519|X448:derive): that one; else "". Its samples are
// that algorithm only where the process was seen to use it.
std::string_view SoleNamedCandidate(Family family, std::string_view name);

// Whether an operation entry's samples serve whichever algorithm of its bucket
// the process uses (rules::Operation::takes_process_mix: a context's set-up
// or tear-down, key generation, libssl's key-share and record calls).
bool TakesProcessMix(Family family, std::string_view entry);

// Whether an operation entry is a key's context (EVP_PKEY_CTX_new, _free):
// made for a signature or a derive alike, its bucket is `other` until the
// aggregation infers it.
bool IsKeyContext(Family family, std::string_view entry);

// The phase a TLS API or state-machine function stands for (SSL_do_handshake
// -> handshake, SSL_write -> record); nullopt if none. Callers pass TLS
// library frames only: some OpenSSL state-machine statics have generic names.
std::optional<Phase> ClassifyPhaseEntry(Family family, std::string_view name);

// What TLS library a binary carries.
enum class LibraryKind : uint8_t { kOpenSSL11, kOpenSSL3, kBoringSSL, kGo };
std::string_view LibraryKindName(LibraryKind kind);  // "openssl-1.1", "openssl-3", "boringssl", "go"
Family FamilyOf(LibraryKind kind);

// Detects the TLS library from the names a binary defines.
//   has_symbol(name): does the binary define this function/object symbol?
//   soname / file name: e.g. "libcrypto.so.3", "libssl.so.0" (android BoringSSL).
//   is_go: the binary has .gopclntab / .go.buildinfo.
//   has_symbol_prefix(prefix): does it define a symbol whose name starts
//     with prefix? A Go binary is kGo when it defines any function of
//     crypto/* or x/crypto, with or without crypto/tls (README.md, "Library
//     detection"); without this callback no Go binary is detected.
// nullopt means the binary carries no TLS library.
std::optional<LibraryKind> DetectLibrary(const std::function<bool(std::string_view)>& has_symbol,
                                         std::string_view soname, std::string_view file_name, bool is_go,
                                         const std::function<bool(std::string_view)>& has_symbol_prefix = {});

}  // namespace tlsprof::classify
