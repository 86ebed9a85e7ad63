// The stack tables: which functions start a crypto OPERATION (and so pick a
// stack's bucket), and which TLS functions say the PHASE (handshake or
// record). The leaf primitives stay in rules.cc. Semantics: README.md,
// "Stacks"; engine: classify.cc (ClassifyStack).
//
// How a name is matched:
//   * C names (OpenSSL, BoringSSL) as in rules.cc: leading '_' and GCC/nm
//     suffixes dropped (tls1_PRF.constprop.0 is tls1_PRF). C++ names
//     (BoringSSL's libssl) need a TLS namespace (bssl::); kExact/kPrefix rows
//     see the innermost function name, kContains rows the whole name (so
//     "X25519KeyShare" finds bssl::(anonymous namespace)::X25519KeyShare::Finish).
//   * Go names whole, less a leading "vendor/".
//   * First match wins, in table order. Rows are looked up only on frames the
//     caller marks as TLS library code.
//
// Why so many layers per operation: OpenSSL 3 tail-calls from the EVP entry
// point into the provider (EVP_PKEY_sign -> rsa_sign, EVP_PKEY_derive ->
// ecx_derive, SSL_connect -> state_machine), so with DWARF or frame-pointer
// unwinding the public entry point is often not on the stack. Each operation
// therefore lists its public API, the provider/method function, and the libssl
// caller where that caller does nothing else.
#include "agent/classify/rules.h"

namespace tlsprof::classify::rules {
namespace {

using namespace table;
constexpr Phase kHandshake = Phase::kHandshake;
constexpr Phase kRecord = Phase::kRecord;

// clang-format off
constexpr Operation kOperations[] = {
  // ===================== OpenSSL 1.1/3.x and BoringSSL =====================

  // --- Signature: sign and verify, including the digest of the message
  // (EVP_DigestSign hashes), the nonce (ECDSA's DRBG) and the padding (PSS).
  {kOB, kPrefix, "EVP_DigestSignInit",           kSig, kUnknown, false, true},
  {kOB, kPrefix, "EVP_DigestVerifyInit",         kSig, kUnknown, false, true},
  {kOB, kPrefix, "EVP_DigestSign",               kSig, kUnknown},  // Update/Final, one-shot
  {kOB, kPrefix, "EVP_DigestVerify",             kSig, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_sign_init",           kSig, kUnknown, false, true},  // _init, _init_ex, _init_ex2
  {kOB, kPrefix, "EVP_PKEY_verify_init",         kSig, kUnknown, false, true},
  {kOB, kPrefix, "EVP_PKEY_sign",                kSig, kUnknown},  // also sign_message_*
  {kO,  kExact,  "evp_pkey_signature_init",      kSig, kUnknown, false, true},  // EVP_PKEY_sign_init/verify_init tail-call it
  // Parameters only a signature takes (the padding, the digest to sign).
  {kOB, kExact,  "EVP_PKEY_CTX_set_signature_md", kSig, kUnknown, false, true},
  {kOB, kPrefix, "EVP_PKEY_CTX_set_rsa_pss_",    kSig, kRsa, false, true},
  {kOB, kPrefix, "EVP_PKEY_verify",              kSig, kUnknown},  // also verify_recover
  {kOB, kPrefix, "EVP_SignFinal",                kSig, kUnknown},
  {kOB, kPrefix, "EVP_VerifyFinal",              kSig, kUnknown},
  {kOB, kPrefix, "ASN1_item_sign",               kSig, kUnknown},  // certificate/CRL signing
  {kOB, kPrefix, "ASN1_item_verify",             kSig, kUnknown},  // certificate chain checks
  {kOB, kExact,  "X509_verify",                  kSig, kUnknown},  // not X509_verify_cert (chain building)
  {kOB, kExact,  "X509_CRL_verify",              kSig, kUnknown},
  {kOB, kExact,  "X509_REQ_verify",              kSig, kUnknown},
  // libssl: CertificateVerify is a signature and a transcript hash, nothing else.
  {kO,  kExact,  "tls_construct_cert_verify",    kSig, kUnknown},
  {kO,  kExact,  "tls_process_cert_verify",      kSig, kUnknown},
  // RSA signatures: public API, OpenSSL's RSA method and 3.x provider, 1.1 pkey.
  {kOB, kPrefix, "RSA_sign",                     kSig, kRsa},      // RSA_sign, RSA_sign_pss_mgf1, RSA_sign_raw (BoringSSL)
  {kOB, kPrefix, "RSA_verify",                   kSig, kRsa},      // RSA_verify, RSA_verify_PKCS1_PSS*, RSA_verify_raw
  {kOB, kExact,  "RSA_private_encrypt",          kSig, kRsa},
  {kOB, kExact,  "RSA_public_decrypt",           kSig, kRsa},
  {kO,  kExact,  "rsa_ossl_private_encrypt",     kSig, kRsa},
  {kO,  kExact,  "rsa_ossl_public_decrypt",      kSig, kRsa},
  {kO,  kExact,  "rsa_sign",                     kSig, kRsa},      // providers/implementations/signature/rsa_sig.c
  {kO,  kPrefix, "rsa_verify",                   kSig, kRsa},      // rsa_verify, rsa_verify_recover
  {kO,  kPrefix, "rsa_digest_sign",              kSig, kRsa},
  {kO,  kPrefix, "rsa_digest_verify",            kSig, kRsa},
  {kO,  kPrefix, "pkey_rsa_sign",                kSig, kRsa},      // 1.1 (and 3.x legacy keys)
  {kO,  kPrefix, "pkey_rsa_verify",              kSig, kRsa},      // verify, verifyrecover
  // ECDSA: the curve is not in these names; the P-256/P-384 code inside says it.
  {kOB, kPrefix, "ECDSA_sign",                   kSig, kAnyEcdsa}, // ECDSA_sign, _ex, _setup
  {kOB, kPrefix, "ECDSA_do_sign",                kSig, kAnyEcdsa},
  {kOB, kPrefix, "ECDSA_verify",                 kSig, kAnyEcdsa},
  {kOB, kPrefix, "ECDSA_do_verify",              kSig, kAnyEcdsa},
  {kOB, kPrefix, "ecdsa_sign",                   kSig, kAnyEcdsa}, // 3.x provider ecdsa_sign; BoringSSL ecdsa_sign_with_nonce*
  {kOB, kPrefix, "ecdsa_verify",                 kSig, kAnyEcdsa},
  {kO,  kPrefix, "ecdsa_digest_sign",            kSig, kAnyEcdsa},
  {kO,  kPrefix, "ecdsa_digest_verify",          kSig, kAnyEcdsa},
  {kO,  kPrefix, "ossl_ecdsa_sign",              kSig, kAnyEcdsa}, // ossl_ecdsa_sign, _sig, _setup
  {kO,  kPrefix, "ossl_ecdsa_verify",            kSig, kAnyEcdsa},
  {kO,  kPrefix, "ossl_ecdsa_simple_sign",       kSig, kAnyEcdsa},
  {kO,  kPrefix, "ossl_ecdsa_simple_verify",     kSig, kAnyEcdsa},
  {kO,  kPrefix, "pkey_ec_sign",                 kSig, kAnyEcdsa},
  {kO,  kPrefix, "pkey_ec_verify",               kSig, kAnyEcdsa},
  // The 3.x ECDSA provider's context set-up and tear-down, by their own names
  // in a static link (a stripped library names them provider:signature:ECDSA:*).
  // EVP_PKEY_CTX_set_signature_md tail-calls into ecdsa_set_ctx_params, so
  // often nothing above them says signature.
  {kO,  kExact,  "ecdsa_newctx",                 kSig, kAnyEcdsa, false, true},
  {kO,  kExact,  "ecdsa_freectx",                kSig, kAnyEcdsa, false, true},
  {kO,  kExact,  "ecdsa_dupctx",                 kSig, kAnyEcdsa, false, true},
  {kO,  kExact,  "ecdsa_set_ctx_params",         kSig, kAnyEcdsa, false, true},
  {kO,  kExact,  "ecdsa_get_ctx_params",         kSig, kAnyEcdsa, false, true},
  {kO,  kExact,  "ecdsa_signverify_init",        kSig, kAnyEcdsa, false, true},
  // ML-DSA (OpenSSL 3.5): the signature, its provider, and key generation.
  {kO,  kPrefix, "ossl_ml_dsa_sign",             kSig, kMlDsa},
  {kO,  kPrefix, "ossl_ml_dsa_verify",           kSig, kMlDsa},
  {kO,  kExact,  "ossl_ml_dsa_generate_key",     kSig, kMlDsa},
  {kO,  kPrefix, "ml_dsa_sign",                  kSig, kMlDsa},    // ml_dsa_sign, _sign_msg_init
  {kO,  kPrefix, "ml_dsa_verify",                kSig, kMlDsa},
  {kO,  kPrefix, "ml_dsa_digest_sign",           kSig, kMlDsa},    // also _signverify_init
  {kO,  kPrefix, "ml_dsa_digest_verify",         kSig, kMlDsa},
  {kO,  kExact,  "ml_dsa_gen",                   kSig, kMlDsa},
  // Ed25519 (Ed448 has no canonical name: unknown).
  {kOB, kPrefix, "ED25519_sign",                 kSig, kEd25519},  // BoringSSL
  {kOB, kPrefix, "ED25519_verify",               kSig, kEd25519},
  {kO,  kPrefix, "ossl_ed25519_sign",            kSig, kEd25519},
  {kO,  kPrefix, "ossl_ed25519_verify",          kSig, kEd25519},
  {kO,  kPrefix, "ed25519_digest_sign",          kSig, kEd25519},  // 3.x provider
  {kO,  kPrefix, "ed25519_digest_verify",        kSig, kEd25519},
  {kO,  kPrefix, "pkey_ecd_digestsign25519",     kSig, kEd25519},  // 1.1
  {kO,  kPrefix, "pkey_ecd_digestverify25519",   kSig, kEd25519},
  {kO,  kPrefix, "ossl_ed448_sign",              kSig, kUnknown},
  {kO,  kPrefix, "ossl_ed448_verify",            kSig, kUnknown},

  // --- A key's context (EVP_PKEY_CTX): made and freed for a signature or a
  // derive alike, so its bucket is not in its name. Bucket `other` here; the
  // aggregation gives its samples the signature and key-exchange algorithms
  // the process was seen to use (Attributor::InferFromOperations).
  {kOB, kPrefix, "EVP_PKEY_CTX_new",             kOther, kUnknown, false, true},  // _new, _new_id, _new_from_pkey, _new_from_name
  {kOB, kExact,  "EVP_PKEY_CTX_free",            kOther, kUnknown, false, true},
  {kOB, kExact,  "EVP_PKEY_CTX_dup",             kOther, kUnknown, false, true},
  {kO,  kExact,  "int_ctx_new",                  kOther, kUnknown, false, true},  // 3.x: EVP_PKEY_CTX_new_* tail-call it

  // --- Key exchange: derive, key generation (ephemeral keys in TLS; a
  // long-term key generated in the process counts here too), KEM
  // encapsulate/decapsulate, RSA key transport, peer-key validation.
  {kOB, kPrefix, "EVP_PKEY_derive_init",         kKx, kUnknown, false, true},  // _init, _init_ex
  {kOB, kPrefix, "EVP_PKEY_derive_set_peer",     kKx, kUnknown, false, true},  // _set_peer, _set_peer_ex
  {kOB, kPrefix, "EVP_PKEY_derive",              kKx, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_keygen",              kKx, kUnknown, false, true},
  {kOB, kExact,  "EVP_PKEY_generate",            kKx, kUnknown, false, true},
  {kOB, kExact,  "EVP_PKEY_Q_keygen",            kKx, kUnknown, false, true},
  {kOB, kPrefix, "EVP_PKEY_encapsulate",         kKx, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_decapsulate",         kKx, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_auth_encapsulate",    kKx, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_auth_decapsulate",    kKx, kUnknown},
  {kOB, kPrefix, "EVP_PKEY_encrypt",             kKx, kUnknown},   // TLS 1.2 RSA key transport
  {kOB, kPrefix, "EVP_PKEY_decrypt",             kKx, kUnknown},
  {kOB, kExact,  "RSA_private_decrypt",          kKx, kRsa},
  {kOB, kExact,  "RSA_public_encrypt",           kKx, kRsa},
  {kB,  kExact,  "RSA_decrypt",                  kKx, kRsa},
  {kB,  kExact,  "RSA_encrypt",                  kKx, kRsa},
  {kO,  kExact,  "rsa_ossl_private_decrypt",     kKx, kRsa},
  {kO,  kExact,  "rsa_ossl_public_encrypt",      kKx, kRsa},
  {kO,  kExact,  "rsa_decrypt",                  kKx, kRsa},       // 3.x provider asym cipher
  {kO,  kExact,  "rsa_encrypt",                  kKx, kRsa},
  {kO,  kPrefix, "pkey_rsa_decrypt",             kKx, kRsa},
  {kO,  kPrefix, "pkey_rsa_encrypt",             kKx, kRsa},
  // ECDH on prime curves.
  {kOB, kPrefix, "ECDH_compute_key",             kKx, kAnyEcdh},
  {kO,  kPrefix, "ossl_ecdh_",                   kKx, kAnyEcdh},   // ossl_ecdh_compute_key, ossl_ecdh_simple_compute_key
  {kO,  kPrefix, "ecdh_",                        kKx, kAnyEcdh},   // 3.x provider: ecdh_derive, ecdh_plain_derive, ecdh_set_peer
  {kOB, kExact,  "EC_KEY_generate_key",          kKx, kAnyEcdh},   // ECDHE key generation (1.1, BoringSSL)
  {kO,  kExact,  "ossl_ec_key_gen",              kKx, kAnyEcdh},
  {kO,  kExact,  "ec_gen",                       kKx, kAnyEcdh},   // 3.x provider EC keygen
  {kO,  kPrefix, "pkey_ec_derive",               kKx, kAnyEcdh},   // 1.1
  {kO,  kPrefix, "pkey_ec_kdf_derive",           kKx, kAnyEcdh},
  {kO,  kPrefix, "pkey_ec_keygen",               kKx, kAnyEcdh},
  // X25519 (X448 unknown). ecx_* serve X25519, X448 and EdDSA keys; the leaves say which.
  {kOB, kExact,  "X25519",                       kKx, kX25519},    // BoringSSL
  {kOB, kPrefix, "X25519_keypair",               kKx, kX25519},
  {kOB, kPrefix, "X25519_public_from_private",   kKx, kX25519},
  {kO,  kPrefix, "ossl_x25519",                  kKx, kX25519},    // ossl_x25519, ossl_x25519_public_from_private
  {kO,  kExact,  "x25519_gen",                   kKx, kX25519},    // 3.x provider
  {kO,  kPrefix, "pkey_ecx_derive25519",         kKx, kX25519},    // 1.1
  {kO,  kExact,  "ecx_derive",                   kKx, kUnknown},   // 3.x provider: X25519 and X448
  {kO,  kExact,  "ecx_gen",                      kKx, kUnknown},
  {kO,  kPrefix, "pkey_ecx_",                    kKx, kUnknown},   // 1.1 derive448, keygen
  {kO,  kPrefix, "ossl_x448",                    kKx, kUnknown},
  // ML-KEM and BoringSSL's Kyber draft.
  {kB,  kPrefix, "KYBER_",                       kKx, kMlKem},     // KYBER_generate_key, KYBER_encap, KYBER_decap
  {kB,  kPrefix, "MLKEM768_",                    kKx, kMlKem},
  {kB,  kPrefix, "MLKEM1024_",                   kKx, kMlKem},
  {kO,  kPrefix, "ossl_ml_kem_",                 kKx, kMlKem},     // OpenSSL 3.5
  {kO,  kPrefix, "ml_kem_encapsulate",           kKx, kMlKem},     // 3.5 provider (also _init)
  {kO,  kPrefix, "ml_kem_decapsulate",           kKx, kMlKem},
  {kO,  kExact,  "ml_kem_gen",                   kKx, kMlKem},
  // The hybrids (X25519MLKEM768, SecP256r1MLKEM768) run an ML-KEM and an
  // X25519/ECDH operation inside: each names its own half.
  {kO,  kPrefix, "mlx_kem_encapsulate",          kKx, kUnknown},
  {kO,  kPrefix, "mlx_kem_decapsulate",          kKx, kUnknown},
  {kO,  kExact,  "mlx_kem_gen",                  kKx, kUnknown},
  // Finite-field DH.
  {kOB, kPrefix, "DH_compute_key",               kKx, kUnknown},
  {kOB, kExact,  "DH_generate_key",              kKx, kUnknown},
  {kO,  kPrefix, "ossl_dh_compute_key",          kKx, kUnknown},
  {kO,  kExact,  "dh_derive",                    kKx, kUnknown},
  {kO,  kPrefix, "pkey_dh_derive",               kKx, kUnknown},
  // Ephemeral key generation and libssl's key-share calls name no group
  // (X25519's keygen tail-calls into code shared with X448): they take the
  // key-exchange algorithms the process named, as each handshake generates
  // and derives with the same group (takes_process_mix).
  // libssl functions that do key exchange and nothing else. (TLS 1.2
  // ServerKeyExchange is left out: it generates a key AND signs it.)
  {kO,  kExact,  "ssl_derive",                   kKx, kUnknown},
  {kO,  kPrefix, "ssl_generate_pkey",            kKx, kUnknown, false, true},   // ssl_generate_pkey, ssl_generate_pkey_group
  {kO,  kExact,  "ssl_gensecret",                kKx, kUnknown},
  {kO,  kExact,  "ssl_encapsulate",              kKx, kUnknown},
  {kO,  kExact,  "ssl_decapsulate",              kKx, kUnknown},
  {kO,  kExact,  "tls_construct_ctos_key_share", kKx, kUnknown, false, true},
  {kO,  kExact,  "tls_construct_stoc_key_share", kKx, kUnknown, false, true},
  {kO,  kExact,  "tls_parse_ctos_key_share",     kKx, kUnknown, false, true},
  {kO,  kExact,  "tls_parse_stoc_key_share",     kKx, kUnknown, false, true},
  {kO,  kPrefix, "tls_construct_cke_",           kKx, kUnknown},   // ClientKeyExchange: _ecdhe, _rsa, _dhe, ...
  {kO,  kPrefix, "tls_process_cke_",             kKx, kUnknown},
  {kO,  kExact,  "tls_construct_client_key_exchange", kKx, kUnknown},
  {kO,  kExact,  "tls_process_client_key_exchange",   kKx, kUnknown},
  {kB,  kPrefix, "ssl_ext_key_share_",           kKx, kUnknown},
  {kB,  kExact,  "do_send_client_key_exchange",  kKx, kUnknown},
  {kB,  kExact,  "do_read_client_key_exchange",  kKx, kUnknown},
  // BoringSSL's SSLKeyShare classes (bssl::(anonymous namespace)::X25519KeyShare::Finish, ...).
  {kB,  kContains, "X25519KeyShare",             kKx, kX25519},
  {kB,  kContains, "KeyShare",                   kKx, kUnknown},   // ECKeyShare, hybrids (both halves' leaves name themselves)

  // --- Cipher: the whole operation, context creation and init (with the
  // implicit fetch and the key schedule) to update/final, ctrl and free.
  {kOB, kPrefix, "EVP_EncryptInit",              kCipher, kUnknown, false, true},  // _ex, _ex2
  {kOB, kPrefix, "EVP_DecryptInit",              kCipher, kUnknown, false, true},
  {kOB, kPrefix, "EVP_CipherInit",               kCipher, kUnknown, false, true},
  {kO,  kExact,  "evp_cipher_init_internal",     kCipher, kUnknown, false, true},  // the _ex/_ex2 entries tail-call it
  {kOB, kPrefix, "EVP_CIPHER_CTX_",              kCipher, kUnknown, false, true},  // new, free, reset, ctrl, set_padding, params
  {kB,  kExact,  "EVP_AEAD_CTX_new",             kCipher, kUnknown, false, true},
  {kB,  kPrefix, "EVP_AEAD_CTX_init",            kCipher, kUnknown, false, true},  // _init, _init_with_direction
  {kB,  kExact,  "EVP_AEAD_CTX_free",            kCipher, kUnknown, false, true},
  {kB,  kExact,  "EVP_AEAD_CTX_cleanup",         kCipher, kUnknown, false, true},
  {kB,  kPrefix, "EVP_AEAD_CTX_seal",            kCipher, kUnknown},  // seal, seal_scatter
  {kB,  kPrefix, "EVP_AEAD_CTX_open",            kCipher, kUnknown},  // open, open_gather
  {kOB, kPrefix, "EVP_EncryptUpdate",            kCipher, kUnknown},
  {kOB, kPrefix, "EVP_DecryptUpdate",            kCipher, kUnknown},
  {kOB, kPrefix, "EVP_CipherUpdate",             kCipher, kUnknown},
  {kOB, kPrefix, "EVP_EncryptFinal",             kCipher, kUnknown},
  {kOB, kPrefix, "EVP_DecryptFinal",             kCipher, kUnknown},
  {kOB, kPrefix, "EVP_CipherFinal",              kCipher, kUnknown},
  {kOB, kExact,  "EVP_Cipher",                   kCipher, kUnknown},
  {kOB, kPrefix, "EVP_CipherPipeline",           kCipher, kUnknown},
  // libssl's record protection: the nonce, the AAD and the calls into the
  // cipher. Its own samples name nothing, but serve the connection's suite:
  // like a context's set-up, they take the cipher mix the process's stacks
  // named (takes_process_mix).
  {kO,  kExact,  "tls13_enc",                    kCipher, kUnknown, false, true},  // libssl record protection
  {kO,  kExact,  "tls1_enc",                     kCipher, kUnknown, false, true},
  {kO,  kExact,  "ssl3_enc",                     kCipher, kUnknown, false, true},
  {kB,  kContains, "SSLAEADContext",             kCipher, kUnknown},  // bssl::SSLAEADContext::Seal/Open/SealScatter

  // --- Hash: digests (the whole operation: context, init with its fetch,
  // update, final, free), HMAC, HKDF, the TLS PRF and the TLS 1.3 key schedule.
  {kOB, kExact,  "EVP_Digest",                   kHash, kUnknown},   // one-shot
  {kOB, kPrefix, "EVP_DigestInit",               kHash, kUnknown, false, true},   // _ex, _ex2
  {kO,  kExact,  "evp_md_init_internal",         kHash, kUnknown, false, true},   // the _ex/_ex2 entries tail-call it
  {kOB, kPrefix, "EVP_MD_CTX_",                  kHash, kUnknown, false, true},   // new, free, reset, copy, ctrl
  {kOB, kPrefix, "EVP_DigestUpdate",             kHash, kUnknown},
  {kOB, kPrefix, "EVP_DigestFinal",              kHash, kUnknown},   // _ex, _XOF
  {kOB, kExact,  "EVP_Q_digest",                 kHash, kUnknown},
  {kOB, kPrefix, "EVP_MAC_",                     kHash, kUnknown},
  {kOB, kExact,  "EVP_Q_mac",                    kHash, kUnknown},
  {kOB, kExact,  "HMAC",                         kHash, kUnknown},
  {kOB, kPrefix, "HMAC_",                        kHash, kUnknown},   // HMAC_Init_ex, _Update, _Final, HMAC_CTX_*
  {kOB, kPrefix, "EVP_KDF_derive",               kHash, kUnknown},
  {kOB, kPrefix, "HKDF",                         kHash, kUnknown},   // BoringSSL HKDF, HKDF_extract, HKDF_expand
  {kB,  kExact,  "CRYPTO_tls1_prf",              kHash, kUnknown},
  {kO,  kPrefix, "kdf_",                         kHash, kUnknown},   // 3.x provider KDFs: kdf_hkdf_derive, kdf_tls1_3_derive, kdf_tls1_prf_derive
  {kO,  kPrefix, "hmac_",                        kHash, kUnknown},   // 3.x provider HMAC
  {kO,  kPrefix, "mac_digest_sign",              kHash, kUnknown},   // 3.x HMAC keys used through EVP_DigestSign
  {kO,  kPrefix, "pkey_hkdf_",                   kHash, kUnknown},   // 1.1
  {kO,  kPrefix, "pkey_tls1_prf_",               kHash, kUnknown},
  {kO,  kPrefix, "pkey_hmac_",                   kHash, kUnknown},
  // libssl: record MAC (TLS 1.2 CBC suites; it runs through EVP_DigestSign
  // with an HMAC key, so it must be named here to stay hash), PRF, key
  // schedule, Finished, PSK binder, session-ticket HMAC, transcript.
  {kO,  kPrefix, "tls1_mac",                     kHash, kUnknown},   // tls1_mac, tls1_mac_old
  {kO,  kExact,  "n_ssl3_mac",                   kHash, kUnknown},
  {kO,  kExact,  "ssl3_cbc_digest_record",       kHash, kUnknown},
  {kOB, kExact,  "tls1_PRF",                     kHash, kUnknown},
  {kOB, kPrefix, "tls1_generate_",               kHash, kUnknown},   // master secret, key block
  {kO,  kExact,  "tls1_final_finish_mac",        kHash, kUnknown},
  {kO,  kExact,  "tls1_export_keying_material",  kHash, kUnknown},
  {kOB, kPrefix, "tls13_hkdf_expand",            kHash, kUnknown},
  {kO,  kPrefix, "tls13_generate_",              kHash, kUnknown},   // secret, handshake_secret, master_secret
  {kOB, kPrefix, "tls13_derive_",                kHash, kUnknown},   // key, iv, finishedkey; BoringSSL tls13_derive_*
  {kO,  kExact,  "tls13_final_finish_mac",       kHash, kUnknown},
  {kO,  kExact,  "tls13_export_keying_material", kHash, kUnknown},
  {kO,  kExact,  "tls_psk_do_binder",            kHash, kUnknown},
  {kO,  kPrefix, "ssl_hmac_",                    kHash, kUnknown},   // session-ticket HMAC
  {kO,  kExact,  "ssl3_finish_mac",              kHash, kUnknown},   // handshake transcript
  {kO,  kExact,  "ssl3_digest_cached_records",   kHash, kUnknown},
  {kO,  kExact,  "ssl_handshake_hash",           kHash, kUnknown},
  {kB,  kPrefix, "tls13_advance_key_schedule",   kHash, kUnknown},
  {kB,  kPrefix, "tls13_init_key_schedule",      kHash, kUnknown},
  {kB,  kPrefix, "tls13_finished_mac",           kHash, kUnknown},
  {kB,  kPrefix, "tls13_psk_binder",             kHash, kUnknown},
  {kB,  kPrefix, "hkdf_expand_label",            kHash, kUnknown},
  {kB,  kContains, "SSLTranscript",              kHash, kUnknown},

  // ===================== Go crypto/tls and its primitives =====================

  // --- Signature.
  {kG, kPrefix, "crypto/ecdsa.Sign",                     kSig, kAnyEcdsa},  // Sign, SignASN1, Sign.func1
  {kG, kPrefix, "crypto/ecdsa.(*PrivateKey).Sign",       kSig, kAnyEcdsa},
  {kG, kPrefix, "crypto/ecdsa.Verify",                   kSig, kAnyEcdsa},  // Verify, VerifyASN1
  {kG, kPrefix, "crypto/internal/fips140/ecdsa.Sign",    kSig, kAnyEcdsa},  // Go 1.24
  {kG, kPrefix, "crypto/internal/fips140/ecdsa.Verify",  kSig, kAnyEcdsa},
  {kG, kPrefix, "crypto/rsa.Sign",                       kSig, kRsa},       // SignPSS, SignPKCS1v15
  {kG, kPrefix, "crypto/rsa.(*PrivateKey).Sign",         kSig, kRsa},
  {kG, kPrefix, "crypto/rsa.Verify",                     kSig, kRsa},       // VerifyPSS, VerifyPKCS1v15
  {kG, kPrefix, "crypto/internal/fips140/rsa.Sign",      kSig, kRsa},
  {kG, kPrefix, "crypto/internal/fips140/rsa.Verify",    kSig, kRsa},
  {kG, kPrefix, "crypto/ed25519.Sign",                   kSig, kEd25519},
  {kG, kPrefix, "crypto/ed25519.PrivateKey.Sign",        kSig, kEd25519},
  {kG, kPrefix, "crypto/ed25519.Verify",                 kSig, kEd25519},
  {kG, kPrefix, "crypto/internal/fips140/ed25519.Sign",  kSig, kEd25519},
  {kG, kPrefix, "crypto/internal/fips140/ed25519.Verify", kSig, kEd25519},
  {kG, kPrefix, "crypto/x509.(*Certificate).CheckSignature", kSig, kUnknown},
  {kG, kPrefix, "crypto/x509.checkSignature",            kSig, kUnknown},
  {kG, kPrefix, "crypto/tls.verifyHandshakeSignature",   kSig, kUnknown},

  // --- Key exchange. Go 1.19: crypto/tls's own ecdheParameters over
  // x/crypto/curve25519 and crypto/elliptic; Go 1.20+: crypto/ecdh.
  {kG, kPrefix, "crypto/tls.(*x25519Parameters).",       kKx, kX25519},
  {kG, kPrefix, "crypto/tls.(*nistParameters).",         kKx, kAnyEcdh},
  // ECDH wherever it is entered, with or without crypto/tls above (a key
  // server, a JWT library's ECDH-ES): crypto/elliptic's point API. Inside
  // crypto/ecdsa these are parts of a signature, and the outermost
  // operation (crypto/ecdsa.Sign, .Verify, below) keeps the sample a
  // signature: ECDSA signs through ScalarBaseMult (and the P-256 Inverse),
  // verifies through CombinedMult. Outside it, ScalarMult is a shared
  // secret, ScalarBaseMult and GenerateKey an ephemeral key, Unmarshal the
  // peer's share. Caveat: Go 1.19's crypto/x509 parses an EC certificate's
  // key with elliptic.Unmarshal, which then counts as key exchange (a point
  // check, once per parse). The P-256 rows name the curve; the generic
  // ones (nistCurve's GC-shape instances, CurveParams) leave it to the
  // nistec frames below.
  {kG, kPrefix, "crypto/elliptic.(*p256Curve).",         kKx, kEcdheP256},  // ScalarMult, ScalarBaseMult, Unmarshal, ...
  {kG, kPrefix, "crypto/elliptic.(*nistCurve[*crypto/internal/nistec.P256Point]).", kKx, kEcdheP256},
  {kG, kPrefix, "crypto/elliptic.(*nistCurve[",          kKx, kAnyEcdh},    // other curves; go.shape.* instances
  {kG, kPrefix, "crypto/elliptic.(*CurveParams).Scalar", kKx, kAnyEcdh},    // ScalarMult, ScalarBaseMult
  {kG, kPrefix, "crypto/elliptic.Unmarshal",             kKx, kAnyEcdh},    // Unmarshal, UnmarshalCompressed
  {kG, kExact,  "crypto/elliptic.GenerateKey",           kKx, kAnyEcdh},
  {kG, kPrefix, "crypto/tls.generateECDHE",              kKx, kUnknown},    // generateECDHEParameters (1.19), generateECDHEKey (1.20+)
  {kG, kPrefix, "crypto/tls.(*ecdheKeyAgreement).generateClientKeyExchange", kKx, kUnknown},
  {kG, kPrefix, "crypto/tls.(*ecdheKeyAgreement).processClientKeyExchange",  kKx, kUnknown},
  {kG, kPrefix, "crypto/tls.(*rsaKeyAgreement).",        kKx, kRsa},
  {kG, kPrefix, "golang.org/x/crypto/curve25519.",       kKx, kX25519},
  {kG, kPrefix, "crypto/ecdh.",                          kKx, kUnknown},    // the leaves name the curve
  {kG, kPrefix, "crypto/internal/fips140/ecdh.",         kKx, kUnknown},
  {kG, kPrefix, "crypto/rsa.DecryptPKCS1v15",            kKx, kRsa},        // TLS 1.2 RSA key transport (and ...SessionKey)
  {kG, kPrefix, "crypto/rsa.EncryptPKCS1v15",            kKx, kRsa},
  {kG, kPrefix, "crypto/rsa.DecryptOAEP",                kKx, kRsa},
  {kG, kPrefix, "crypto/rsa.EncryptOAEP",                kKx, kRsa},
  {kG, kPrefix, "crypto/internal/mlkem768.",             kKx, kMlKem},      // Go 1.23
  {kG, kPrefix, "crypto/internal/fips140/mlkem.",        kKx, kMlKem},      // Go 1.24
  {kG, kPrefix, "crypto/mlkem.",                         kKx, kMlKem},

  // --- Cipher. halfConn.encrypt/decrypt is a container: for TLS 1.2 CBC
  // suites it also computes the record MAC, which stays hash.
  // A fresh AES context: the key schedule and its allocation, for GCM or
  // CBC alike; it takes the AES modes the process named (takes_process_mix).
  {kG, kExact,  "crypto/aes.NewCipher",                  kCipher, kAnyAes, false, true},
  {kG, kExact,  "crypto/internal/fips140/aes.New",       kCipher, kAnyAes, false, true},  // Go 1.24's, below it
  {kG, kPrefix, "crypto/cipher.(*gcm).",                 kCipher, kAesGcm},
  {kG, kPrefix, "crypto/aes.(*gcmAsm).",                 kCipher, kAesGcm},
  {kG, kPrefix, "crypto/internal/fips140/aes/gcm.",      kCipher, kAesGcm},
  {kG, kPrefix, "golang.org/x/crypto/chacha20poly1305.(*chacha20poly1305).", kCipher, kChaCha20Poly1305},
  {kG, kPrefix, "crypto/cipher.(*cbcEncrypter).",        kCipher, kAesCbc},
  {kG, kPrefix, "crypto/cipher.(*cbcDecrypter).",        kCipher, kAesCbc},
  {kG, kPrefix, "crypto/internal/fips140/aes.(*CBCEncrypter).", kCipher, kAesCbc},  // Go 1.24
  {kG, kPrefix, "crypto/internal/fips140/aes.(*CBCDecrypter).", kCipher, kAesCbc},
  {kG, kPrefix, "crypto/tls.(*xorNonceAEAD).",           kCipher, kUnknown},
  {kG, kPrefix, "crypto/tls.(*prefixNonceAEAD).",        kCipher, kUnknown},
  {kG, kPrefix, "crypto/tls.(*halfConn).encrypt",        kCipher, kUnknown, true},
  {kG, kPrefix, "crypto/tls.(*halfConn).decrypt",        kCipher, kUnknown, true},

  // --- Hash.
  {kG, kPrefix, "crypto/hmac.",                          kHash, kUnknown},
  {kG, kPrefix, "crypto/internal/fips140/hmac.",         kHash, kUnknown},
  {kG, kPrefix, "crypto/hkdf.",                          kHash, kUnknown},
  {kG, kPrefix, "crypto/internal/fips140/hkdf.",         kHash, kUnknown},
  {kG, kPrefix, "golang.org/x/crypto/hkdf.",             kHash, kUnknown},
  {kG, kPrefix, "crypto/internal/fips140/tls12.",        kHash, kUnknown},
  {kG, kPrefix, "crypto/internal/fips140/tls13.",        kHash, kUnknown},
  {kG, kPrefix, "crypto/tls.prf",                        kHash, kUnknown},  // prf10, prf12, prfAndHashForVersion
  {kG, kPrefix, "crypto/tls.pHash",                      kHash, kUnknown},
  {kG, kPrefix, "crypto/tls.tls10MAC",                   kHash, kUnknown},
  {kG, kPrefix, "crypto/tls.(*cthWrapper).",             kHash, kUnknown},
  {kG, kPrefix, "crypto/tls.(*finishedHash).",           kHash, kUnknown},
  {kG, kPrefix, "crypto/tls.(*cipherSuiteTLS13).",       kHash, kUnknown},  // TLS 1.3 key schedule (HKDF)
  {kG, kPrefix, "crypto/sha256.",                        kHash, kSha256},
  {kG, kPrefix, "crypto/sha512.",                        kHash, kSha512},
  {kG, kPrefix, "crypto/sha1.",                          kHash, kSha1},
  {kG, kPrefix, "crypto/md5.",                           kHash, kMd5},
};

// Phase entries. A stack is handshake if any of its TLS frames is a
// handshake entry, else record if any is a record entry, else other. So a
// handshake that SSL_read/SSL_write (or Go's Conn.Read/Write) runs
// implicitly is handshake, and so are post-handshake messages
// (NewSessionTicket, KeyUpdate) processed inside SSL_read.
constexpr PhaseEntry kPhaseEntries[] = {
  // ---- OpenSSL 1.1/3.x and BoringSSL public API
  {kOB, kExact,  "SSL_do_handshake",             kHandshake},
  {kOB, kExact,  "SSL_accept",                   kHandshake},
  {kOB, kExact,  "SSL_connect",                  kHandshake},
  {kOB, kPrefix, "SSL_renegotiate",              kHandshake},
  {kOB, kExact,  "SSL_key_update",               kHandshake},
  {kOB, kExact,  "SSL_verify_client_post_handshake", kHandshake},
  {kOB, kExact,  "SSL_stateless",                kHandshake},
  {kOB, kExact,  "SSL_read_early_data",          kHandshake},
  {kOB, kExact,  "SSL_write_early_data",         kHandshake},
  {kB,  kExact,  "SSL_process_quic_post_handshake", kHandshake},
  {kB,  kExact,  "SSL_process_tls13_new_session_ticket", kHandshake},
  // ---- OpenSSL state machine: SSL_connect/SSL_accept/SSL_do_handshake tail-call
  // into state_machine, so these are often the only handshake frames.
  // state_machine is a generic static name: matched only on frames the
  // caller marks as TLS code (like every row here).
  {kO,  kPrefix, "ossl_statem_",                 kHandshake},  // accept, connect, *_process_message, ...
  {kO,  kPrefix, "statem_",                      kHandshake},  // statem_flush
  {kO,  kExact,  "state_machine",                kHandshake},
  {kO,  kExact,  "read_state_machine",           kHandshake},
  {kO,  kExact,  "write_state_machine",          kHandshake},
  {kO,  kPrefix, "tls_construct_",               kHandshake},  // handshake messages and extensions
  {kO,  kPrefix, "tls_process_",                 kHandshake},
  {kO,  kPrefix, "tls_post_process_",            kHandshake},
  {kO,  kPrefix, "tls_prepare_",                 kHandshake},
  {kO,  kPrefix, "tls_parse_",                   kHandshake},
  {kO,  kExact,  "tls_setup_handshake",          kHandshake},
  {kO,  kExact,  "tls_finish_handshake",         kHandshake},
  {kO,  kExact,  "tls_get_message_header",       kHandshake},
  {kO,  kExact,  "tls_get_message_body",         kHandshake},
  {kO,  kPrefix, "dtls_construct_",              kHandshake},
  {kO,  kPrefix, "dtls_process_",                kHandshake},
  // ---- BoringSSL handshake driver (C++, bssl::)
  {kB,  kExact,  "ssl_run_handshake",            kHandshake},
  {kB,  kExact,  "ssl_server_handshake",         kHandshake},
  {kB,  kExact,  "ssl_client_handshake",         kHandshake},
  {kB,  kExact,  "tls13_server_handshake",       kHandshake},
  {kB,  kExact,  "tls13_client_handshake",       kHandshake},
  {kB,  kExact,  "tls13_post_handshake",         kHandshake},
  {kB,  kExact,  "ssl_do_post_handshake",        kHandshake},
  // ---- Record layer: application data, alerts, close_notify.
  {kOB, kExact,  "SSL_read",                     kRecord},
  {kOB, kExact,  "SSL_read_ex",                  kRecord},
  {kOB, kExact,  "SSL_peek",                     kRecord},
  {kOB, kExact,  "SSL_peek_ex",                  kRecord},
  {kOB, kExact,  "SSL_write",                    kRecord},
  {kOB, kExact,  "SSL_write_ex",                 kRecord},
  {kOB, kExact,  "SSL_write_ex2",                kRecord},
  {kOB, kExact,  "SSL_sendfile",                 kRecord},
  {kOB, kExact,  "SSL_shutdown",                 kRecord},
  {kO,  kPrefix, "ssl_read_internal",            kRecord},
  {kO,  kPrefix, "ssl_write_internal",           kRecord},
  {kO,  kPrefix, "ssl_peek_internal",            kRecord},
  {kO,  kPrefix, "ssl3_read_",                   kRecord},     // ssl3_read_bytes, ssl3_read_n, ssl3_read_internal
  {kO,  kPrefix, "ssl3_write_",                  kRecord},     // ssl3_write_bytes, ssl3_write_pending
  {kO,  kExact,  "ssl3_get_record",              kRecord},
  {kO,  kExact,  "do_ssl3_write",                kRecord},
  {kO,  kPrefix, "dtls1_read_bytes",             kRecord},
  {kO,  kPrefix, "dtls1_write_",                 kRecord},
  {kB,  kExact,  "ssl_read_impl",                kRecord},
  {kB,  kExact,  "tls_open_record",              kRecord},
  {kB,  kExact,  "tls_seal_record",              kRecord},
  {kB,  kExact,  "tls_write_app_data",           kRecord},
  {kB,  kExact,  "tls_read_app_data",            kRecord},
  {kB,  kExact,  "tls_open_app_data",            kRecord},

  // ---- Go crypto/tls (Go 1.19-1.24)
  {kG,  kPrefix, "crypto/tls.(*Conn).Handshake",                 kHandshake},  // Handshake, HandshakeContext
  {kG,  kPrefix, "crypto/tls.(*Conn).handshakeContext",          kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).handshakeFn",               kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).serverHandshake",           kHandshake},  // and the -fm method value
  {kG,  kPrefix, "crypto/tls.(*Conn).clientHandshake",           kHandshake},
  {kG,  kPrefix, "crypto/tls.(*serverHandshakeState",            kHandshake},  // TLS 1.2 and TLS13 variants
  {kG,  kPrefix, "crypto/tls.(*clientHandshakeState",            kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).readClientHello",           kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).readHandshake",             kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).writeHandshakeRecord",      kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).handlePostHandshakeMessage", kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).handleNewSessionTicket",    kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).handleKeyUpdate",           kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).handleRenegotiation",       kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).verifyServerCertificate",   kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).processCertsFromClient",    kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).makeClientHello",           kHandshake},
  {kG,  kPrefix, "crypto/tls.(*Conn).Read",                      kRecord},
  {kG,  kPrefix, "crypto/tls.(*Conn).Write",                     kRecord},
  {kG,  kPrefix, "crypto/tls.(*Conn).Close",                     kRecord},     // Close, CloseWrite
  {kG,  kPrefix, "crypto/tls.(*Conn).closeNotify",               kRecord},
  {kG,  kPrefix, "crypto/tls.(*Conn).readRecord",                kRecord},     // readRecord, readRecordOrCCS
  {kG,  kPrefix, "crypto/tls.(*Conn).writeRecordLocked",         kRecord},
  {kG,  kPrefix, "crypto/tls.(*halfConn).",                      kRecord},
};

// The parts of `other` (README.md, "The parts of other"). A stack with no
// crypto operation is x509 if any frame is certificate or ASN.1 code, else
// rng if any frame is the DRBG, else library if any is library plumbing
// (so a handshake's provider fetch or malloc is library: OpenSSL 3's lookup
// cost shows as its own part), else handshake or record by its phase, else
// unknown.
constexpr std::string_view kX509 = kOtherX509;
constexpr std::string_view kRng = kOtherRng;
constexpr std::string_view kLib = kOtherLibrary;
constexpr OtherPart kOtherParts[] = {
  // ---- certificates, keys on the wire, ASN.1
  {kOB, kPrefix, "X509",                         kX509},   // X509_*, X509V3_*, X509_STORE_*, X509_verify_cert
  {kOB, kPrefix, "x509",                         kX509},
  {kOB, kPrefix, "ossl_x509",                    kX509},
  {kOB, kPrefix, "ASN1_",                        kX509},
  {kOB, kPrefix, "asn1_",                        kX509},
  {kOB, kPrefix, "ossl_asn1",                    kX509},
  {kOB, kPrefix, "d2i_",                         kX509},
  {kOB, kPrefix, "i2d_",                         kX509},
  {kOB, kPrefix, "PEM_",                         kX509},
  {kOB, kPrefix, "OSSL_DECODER",                 kX509},
  {kOB, kPrefix, "OSSL_ENCODER",                 kX509},
  {kO,  kPrefix, "provider:decoder:",            kX509},
  {kO,  kPrefix, "provider:encoder:",            kX509},
  {kO,  kPrefix, "ssl_verify_cert_chain",        kX509},
  {kO,  kPrefix, "ssl_add_cert",                 kX509},   // ssl_add_cert_chain, ssl_add_cert_to_wpacket
  {kO,  kPrefix, "tls_process_server_certificate", kX509},
  {kO,  kPrefix, "tls_process_client_certificate", kX509},
  {kO,  kPrefix, "tls_construct_server_certificate", kX509},
  {kB,  kContains, "ssl_crypto_x509",            kX509},
  {kB,  kContains, "ssl_parse_cert_chain",       kX509},
  {kB,  kContains, "ssl_cert_",                  kX509},
  {kB,  kPrefix, "CBB_",                         kX509},   // BoringSSL's ASN.1 builder
  {kG,  kPrefix, "crypto/x509.",                 kX509},
  {kG,  kPrefix, "encoding/asn1.",               kX509},
  {kG,  kPrefix, "encoding/pem.",                kX509},
  {kG,  kPrefix, "golang.org/x/crypto/cryptobyte.", kX509},
  // ---- randomness
  {kOB, kPrefix, "RAND_",                        kRng},
  {kOB, kPrefix, "rand_",                        kRng},
  {kOB, kPrefix, "drbg_",                        kRng},
  {kOB, kPrefix, "ossl_drbg_",                   kRng},
  {kOB, kPrefix, "ossl_rand_",                   kRng},
  {kOB, kPrefix, "ossl_prov_drbg_",              kRng},
  {kOB, kPrefix, "EVP_RAND_",                    kRng},
  {kOB, kPrefix, "evp_rand_",                    kRng},
  {kO,  kPrefix, "provider:rand:",               kRng},
  {kB,  kPrefix, "CTR_DRBG_",                    kRng},
  {kOB, kContains, "rdrand",                     kRng},
  {kG,  kPrefix, "crypto/rand.",                 kRng},
  // ---- library plumbing: provider and method lookup, parameters, the error
  // queue, memory, locks and thread-local state, containers, initialisation
  {kOB, kPrefix, "evp_generic_fetch",            kLib},
  {kOB, kContains, "_fetch",                     kLib},    // EVP_*_fetch, evp_*_fetch_from_prov
  {kOB, kPrefix, "ossl_namemap",                 kLib},
  {kOB, kPrefix, "namemap_",                     kLib},
  {kOB, kPrefix, "ossl_method_",                 kLib},
  {kOB, kPrefix, "ossl_provider",                kLib},
  {kOB, kPrefix, "OSSL_PROVIDER",                kLib},
  {kOB, kPrefix, "ossl_lib_ctx",                 kLib},
  {kOB, kPrefix, "OSSL_PARAM",                   kLib},
  {kOB, kPrefix, "ossl_param",                   kLib},
  {kOB, kPrefix, "ossl_property",                kLib},
  {kOB, kPrefix, "ossl_decoder",                 kLib},
  {kOB, kPrefix, "evp_keymgmt",                  kLib},
  {kOB, kPrefix, "EVP_KEYMGMT",                  kLib},
  {kO,  kPrefix, "provider:keymgmt:",            kLib},
  {kOB, kPrefix, "ERR_",                         kLib},
  {kOB, kPrefix, "err_",                         kLib},
  {kOB, kPrefix, "ossl_err",                     kLib},
  {kOB, kPrefix, "CRYPTO_malloc",                kLib},
  {kOB, kPrefix, "CRYPTO_zalloc",                kLib},
  {kOB, kPrefix, "CRYPTO_realloc",               kLib},
  {kOB, kPrefix, "CRYPTO_free",                  kLib},
  {kOB, kPrefix, "CRYPTO_clear_free",            kLib},
  {kOB, kPrefix, "CRYPTO_strdup",                kLib},
  {kOB, kPrefix, "CRYPTO_strndup",               kLib},
  {kOB, kPrefix, "CRYPTO_THREAD",                kLib},
  {kOB, kPrefix, "CRYPTO_atomic",                kLib},
  {kOB, kPrefix, "CRYPTO_get_ex",                kLib},
  {kOB, kPrefix, "CRYPTO_set_ex",                kLib},
  {kOB, kPrefix, "CRYPTO_new_ex",                kLib},
  {kOB, kPrefix, "CRYPTO_free_ex",               kLib},
  {kOB, kPrefix, "OPENSSL_malloc",               kLib},   // BoringSSL's allocator
  {kOB, kPrefix, "OPENSSL_zalloc",               kLib},
  {kOB, kPrefix, "OPENSSL_free",                 kLib},
  {kOB, kPrefix, "OPENSSL_cleanse",              kLib},
  {kOB, kPrefix, "OPENSSL_sk_",                  kLib},
  {kOB, kPrefix, "OPENSSL_LH_",                  kLib},
  {kOB, kPrefix, "OPENSSL_init",                 kLib},
  {kOB, kPrefix, "OPENSSL_strcasecmp",           kLib},
  {kOB, kPrefix, "OPENSSL_strncasecmp",          kLib},
  {kOB, kPrefix, "OBJ_",                         kLib},    // name and OID lookups
  {kOB, kPrefix, "ossl_bsearch",                 kLib},
  {kOB, kExact,  "EVP_PKEY_CTX_new",             kLib},    // key contexts inference did not place
  {kOB, kPrefix, "EVP_PKEY_CTX_new_",            kLib},
  {kOB, kExact,  "EVP_PKEY_CTX_free",            kLib},
  {kO,  kExact,  "int_ctx_new",                  kLib},
};

// Building blocks (rules.h, PartOf). A bare AES-CTR leaf with no GCM frame
// above it (the CTR-DRBG) stays AES-CTR.
constexpr PartOf kPartsOf[] = {
  {kAesCtr, kAesGcm},
};
// clang-format on

}  // namespace

std::span<const PartOf> PartsOf() { return kPartsOf; }
std::span<const Operation> Operations() { return kOperations; }
std::span<const PhaseEntry> PhaseEntries() { return kPhaseEntries; }
std::span<const OtherPart> OtherParts() { return kOtherParts; }

}  // namespace tlsprof::classify::rules
