// Names for what the usage probes count (bpf/usage.h): protocol versions,
// cipher suites (IANA), key-exchange groups and key types. The BPF side only
// reads numbers: EVP_PKEY ids and output lengths; this is where they become
// the report's vocabulary. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace tlsprof::usage {

// "TLSv1.3", "TLSv1.2", ...; "unknown" for 0xffff, else "0x..".
std::string VersionName(uint16_t version);
// The IANA name, e.g. "TLS_AES_128_GCM_SHA256",
// "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"; "unknown" for 0xffff, else "0x....".
std::string CipherSuiteName(uint16_t id);
// The key exchange's group from the deriving key's type and the shared
// secret's length: "X25519", "P-256", "ffdhe2048", ...; "none" when the
// handshake derived nothing (resumed without (EC)DHE). A key type with
// USAGE_KX_TLS_GROUP holds the group's IANA id instead (the library's own
// answer, BoringSSL's SSL_get_curve_id()). For USAGE_KEY_KEM the length
// is the KEM ciphertext's: "X25519MLKEM768", "MLKEM768", ...
std::string GroupName(uint32_t key_type, uint32_t secret_len);
// A certificate key's family: "RSA", "ECDSA", "Ed25519", ...; "none" for 0,
// "unknown" for USAGE_UNKNOWN.
std::string CertKeyTypeName(uint32_t key_type);
// An operation's algorithm from its key type and output length:
// "RSA-2048", "ECDSA-P256", "Ed25519" (sign, verify), "X25519",
// "ECDHE-P256" (derive), "ML-KEM-768", "X25519MLKEM768" (a KEM, by its
// ciphertext's length).
std::string SignatureAlgorithm(uint32_t key_type, uint32_t sig_len);
std::string KeyExchangeAlgorithm(uint32_t key_type, uint32_t secret_len);

}  // namespace tlsprof::usage
