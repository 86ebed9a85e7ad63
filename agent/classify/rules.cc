// THE rules table: which TLS library function is which bucket and algorithm.
//
// How a name is matched (see classify.cc and README.md):
//   * C names (OpenSSL, BoringSSL) are matched on their "leaf": leading '_' are
//     dropped (perlasm's _aesni_ctr32_ghash_6x, __ecp_nistz256_mul_montq), and
//     so is everything from the first '.' or '@' (GCC's .constprop.0/.isra.0/
//     .part.0/.cold/.localalias clones, nm -D's @@OPENSSL_3.0.0).
//     A C++ name (BoringSSL's libssl and newer libcrypto are C++) is matched on
//     its innermost function name.
//   * Go names are matched whole, with a leading "vendor/" dropped, so
//     vendor/golang.org/x/crypto/chacha20 and a module's own
//     golang.org/x/crypto/chacha20 share one row.
//   * A name is TLS library code only if it starts with a LibraryPrefix below,
//     or its C++ outermost namespace is listed in kCxxNamespaces. Rules then
//     pick the bucket and algorithm; first match wins; no match means
//     {other, unknown}. A rule never makes a name TLS code on its own, so a
//     kContains row cannot drag a node or libc function in.
//
// These rows see one name (the leaf, or one frame of a stack). Where a leaf
// serves more than one operation, the row says which one it picks and why;
// on a stack, the operation table (operations.cc) decides the bucket and
// resolves the shared P-256/P-384 labels (README.md, "Stacks").
#include "agent/classify/rules.h"

namespace tlsprof::classify::rules {
namespace {

using namespace table;

// clang-format off
constexpr Rule kRules[] = {
  // ===================== OpenSSL and BoringSSL (C leaf names) =====================

  // --- Randomness: DRBG and RAND plumbing is library overhead, not one of the
  // four primitive classes. Caveat: the default CTR-DRBG's own AES shows up as
  // an AES-CTR leaf (aesni_ctr32_encrypt_blocks); only the stack can tell.
  // Listed first so drbg_hmac_*/drbg_hash_* don't land in hash.
  {kOB, kPrefix,   "drbg_",                   "", kOther, kUnknown},
  {kOB, kPrefix,   "ossl_drbg_",              "", kOther, kUnknown},
  {kOB, kPrefix,   "ossl_rand_",              "", kOther, kUnknown},
  {kOB, kPrefix,   "ossl_prov_drbg_",         "", kOther, kUnknown},
  {kOB, kPrefix,   "RAND_",                   "", kOther, kUnknown},
  {kOB, kPrefix,   "rand_",                   "", kOther, kUnknown},
  {kOB, kPrefix,   "evp_rand_",               "", kOther, kUnknown},
  {kOB, kPrefix,   "EVP_RAND_",               "", kOther, kUnknown},
  {kB,  kPrefix,   "CTR_DRBG_",               "", kOther, kUnknown},
  {kOB, kContains, "rdrand",                  "", kOther, kUnknown},

  // --- ML-KEM / Kyber (BoringSSL: KYBER_*, kyber_*, MLKEM768_*, BCM_mlkem*,
  // the C++ mlkem:: namespace; hybrids X25519Kyber768/X25519MLKEM768 too,
  // whose X25519 half runs in its own x25519 leaves). Before X25519 for that.
  {kOB, kContains, "mlkem",                   "", kKx, kMlKem},
  {kOB, kContains, "MLKEM",                   "", kKx, kMlKem},
  {kOB, kContains, "kyber",                   "", kKx, kMlKem},
  {kOB, kContains, "KYBER",                   "", kKx, kMlKem},
  {kOB, kContains, "Kyber",                   "", kKx, kMlKem},
  // BoringSSL's Keccak serves only ML-KEM/Kyber (and ML-DSA, not in TLS): TLS
  // itself never hashes with SHA-3. OpenSSL's keccak is plain SHA-3 (below).
  {kB,  kPrefix,   "BORINGSSL_keccak",        "", kKx, kMlKem},
  {kB,  kPrefix,   "keccak_f",                "", kKx, kMlKem},
  // OpenSSL 3.5: the ML-KEM code (ossl_ml_kem_*), its provider (ml_kem_*) and
  // the hybrids' glue (mlx_kem_*: X25519MLKEM768, SecP256r1MLKEM768), whose
  // X25519/ECDH half runs in that curve's own leaves.
  {kO,  kPrefix,   "ossl_ml_kem_",            "", kKx, kMlKem},
  {kO,  kPrefix,   "ml_kem_",                 "", kKx, kMlKem},
  {kO,  kPrefix,   "mlx_",                    "", kKx, kMlKem},
  // --- ML-DSA signatures: OpenSSL 3.5 (ossl_ml_dsa_*, provider ml_dsa_*),
  // BoringSSL (MLDSA65_*, mldsa::).
  {kO,  kPrefix,   "ossl_ml_dsa_",            "", kSig, kMlDsa},
  {kO,  kPrefix,   "ml_dsa_",                 "", kSig, kMlDsa},
  {kOB, kContains, "mldsa",                   "", kSig, kMlDsa},
  {kOB, kContains, "MLDSA",                   "", kSig, kMlDsa},

  // --- AES-GCM: the stitched AES-CTR+GHASH asm (aesni_gcm_*, _aesni_ctr32_ghash_6x,
  // BoringSSL/OpenSSL 3.x VAES aes_gcm_*_vaes_*), GHASH (gcm_ghash_*, gcm_gmult_*,
  // gcm_init_*) and the GCM mode/provider/AEAD glue. GCM-SIV is not GCM.
  {kOB, kContains, "gcm_siv",                 "", kCipher, kUnknown},
  {kOB, kContains, "gcmsiv",                  "", kCipher, kUnknown},
  {kOB, kPrefix,   "aesni_gcm_",              "", kCipher, kAesGcm},
  {kOB, kPrefix,   "aesni_ctr32_ghash",       "", kCipher, kAesGcm},
  {kOB, kPrefix,   "aesni_ctr32_6x",          "", kCipher, kAesGcm},  // aesni-gcm-x86_64 helper
  {kOB, kPrefix,   "gcm_",                    "", kCipher, kAesGcm},
  {kOB, kPrefix,   "ghash_",                  "", kCipher, kAesGcm},
  {kOB, kPrefix,   "CRYPTO_gcm128_",          "", kCipher, kAesGcm},
  {kOB, kPrefix,   "CRYPTO_ghash_",           "", kCipher, kAesGcm},
  {kOB, kContains, "gcm",                     "", kCipher, kAesGcm},  // aes_gcm_*, ossl_gcm_*, aead_aes_gcm_*, aes128gcm_*
  {kOB, kContains, "GCM",                     "", kCipher, kAesGcm},

  // --- AES-CBC, including the stitched AES-CBC+HMAC-SHA1/SHA256 asm of TLS 1.2
  // CBC suites (aesni_cbc_sha1_enc*, aesni_cbc_sha256_enc*): that code exists
  // to protect records, so it counts as the cipher. ssl3_cbc_digest_record is
  // the constant-time (Lucky13) MAC over a CBC record: a hash.
  {kOB, kPrefix,   "ssl3_cbc_digest_record",  "", kHash, kUnknown},
  {kOB, kPrefix,   "aesni_cbc_",              "", kCipher, kAesCbc},
  {kOB, kPrefix,   "aesni_multi_cbc_",        "", kCipher, kAesCbc},
  {kOB, kPrefix,   "avx_cbc_",                "", kCipher, kAesCbc},  // aesni-mb _avx_cbc_{enc,dec}_shortcut
  {kOB, kContains, "cbc_hmac_sha",            "", kCipher, kAesCbc},
  {kOB, kContains, "cbc",                     "aes", kCipher, kAesCbc},
  {kOB, kContains, "cbc",                     "AES", kCipher, kAesCbc},
  {kOB, kPrefix,   "CRYPTO_cbc128_",          "", kCipher, kAesCbc},

  // --- AES-CTR. Caveat: in a TLS process a bare CTR leaf is GCM's counter
  // mode (short records, BoringSSL's non-stitched GCM) or the CTR-DRBG; TLS
  // has no AES-CTR suite. The leaf cannot tell; the stack will.
  {kOB, kPrefix,   "aesni_ctr32_",            "", kCipher, kAesCtr},
  {kOB, kContains, "ctr32",                   "aes", kCipher, kAesCtr},  // aes_hw_ctr32_*, vpaes_ctr32_*, bsaes_ctr32_*
  {kOB, kContains, "_ctr_",                   "aes", kCipher, kAesCtr},  // aes_ctr_cipher, aes_128_ctr_newctx
  {kOB, kContains, "_ctr",                    "aes", kCipher, kAesCtr},  // EVP_aes_128_ctr, ossl_prov_cipher_hw_aes_ctr
  {kOB, kPrefix,   "CRYPTO_ctr128_",          "", kCipher, kAesCtr},
  {kOB, kPrefix,   "ossl_cipher_hw_generic_ctr", "", kCipher, kAesCtr},

  // --- AES, mode not in the name: block functions, key schedules, ECB/CCM/OCB/XTS.
  {kOB, kPrefix,   "aesni_",                  "", kCipher, kUnknown},
  {kOB, kPrefix,   "aes_hw_",                 "", kCipher, kUnknown},
  {kOB, kPrefix,   "aes_nohw_",               "", kCipher, kUnknown},
  {kOB, kPrefix,   "vpaes_",                  "", kCipher, kUnknown},
  {kOB, kPrefix,   "bsaes_",                  "", kCipher, kUnknown},
  {kOB, kPrefix,   "ossl_bsaes_",             "", kCipher, kUnknown},
  {kOB, kPrefix,   "x86_64_AES_",             "", kCipher, kUnknown},
  {kOB, kPrefix,   "asm_AES_",                "", kCipher, kUnknown},
  {kOB, kPrefix,   "AES_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "aes",                     "", kCipher, kUnknown},  // provider aes_*, aes128ocb_*, ...
  {kOB, kContains, "_aes",                    "", kCipher, kUnknown},  // cipher_hw_aes*, EVP_aes_*, padlock_aes_*, afalg_aes_*
  {kOB, kPrefix,   "ccm_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "ossl_ccm_",               "", kCipher, kUnknown},
  {kOB, kPrefix,   "ocb_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "ossl_cipher_hw_generic_", "", kCipher, kUnknown},

  // --- ChaCha20-Poly1305. In TLS, Poly1305 and ChaCha20 only occur together.
  {kOB, kContains, "chacha",                  "", kCipher, kChaCha20Poly1305},
  {kOB, kContains, "ChaCha",                  "", kCipher, kChaCha20Poly1305},
  {kOB, kContains, "poly1305",                "", kCipher, kChaCha20Poly1305},
  {kOB, kContains, "Poly1305",                "", kCipher, kChaCha20Poly1305},
  {kOB, kContains, "POLY1305",                "", kCipher, kChaCha20Poly1305},

  // --- Legacy ciphers: not negotiated by a modern TLS stack; cipher, unknown.
  {kOB, kPrefix,   "DES_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "des",                     "", kCipher, kUnknown},  // des_*, desx_*, des3_*
  {kOB, kPrefix,   "tdes_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "RC4",                     "", kCipher, kUnknown},
  {kOB, kPrefix,   "rc4_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "RC2_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "rc2_",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "BF_",                     "", kCipher, kUnknown},
  {kOB, kPrefix,   "bf_",                     "", kCipher, kUnknown},
  {kOB, kPrefix,   "CAST_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "cast",                    "", kCipher, kUnknown},
  {kOB, kContains, "amellia",                 "", kCipher, kUnknown},  // Camellia_*, camellia_*
  {kOB, kPrefix,   "aria",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "ARIA",                    "", kCipher, kUnknown},
  {kOB, kPrefix,   "SEED_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "seed_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "IDEA_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "idea_",                   "", kCipher, kUnknown},
  {kOB, kPrefix,   "sm4",                     "", kCipher, kUnknown},
  {kOB, kPrefix,   "ossl_sm4",                "", kCipher, kUnknown},

  // --- P-256, ECDSA-only: arithmetic modulo the group order (ECDSA's k^-1 and
  // s = k^-1(z + r*d); ECDHE never reduces mod n), and BoringSSL's binary
  // extended-Euclid inverse used by ECDSA verify.
  {kOB, kPrefix,   "ecp_nistz256_ord_",       "", kSig, kEcdsaP256},
  {kOB, kPrefix,   "ecp_nistz256_inv_mod_ord","", kSig, kEcdsaP256},
  {kOB, kPrefix,   "ecp_nistz256_scalar_",    "", kSig, kEcdsaP256},  // BoringSSL ord inversion
  {kOB, kPrefix,   "beeu_mod_inverse_vartime","", kSig, kEcdsaP256},
  {kOB, kPrefix,   "p256_scalar_",            "", kSig, kEcdsaP256},
  // --- P-256 field and point arithmetic, shared by ECDSA-P256 and ECDHE-P256.
  // Bucket: signature, because with X25519 preferred by every major client and
  // by the OpenSSL, BoringSSL and Go server defaults, a server's P-256 work is
  // mostly signing with its ECDSA-P256 certificate. The algorithm says it is
  // ambiguous, so the report can show it apart.
  {kOB, kContains, "nistz256",                "", kSig, kP256Ambiguous},  // ecp_nistz256_*, EC_GFp_nistz256_method
  {kOB, kContains, "nistp256",                "", kSig, kP256Ambiguous},  // ossl_ec_GFp_nistp256_* (gcc128 C), BoringSSL ec_GFp_nistp256_*
  {kOB, kPrefix,   "fiat_p256_",              "", kSig, kP256Ambiguous},  // BoringSSL p256.c
  {kOB, kPrefix,   "p256_",                   "", kSig, kP256Ambiguous},
  {kOB, kPrefix,   "BN_nist_mod_256",         "", kSig, kP256Ambiguous},
  // --- P-384, and the generic prime-curve code (ec_GFp_mont_*/simple_*/nist_*):
  // OpenSSL 3.0 has no dedicated P-384 and BoringSSL runs P-384 on
  // ec_GFp_mont, while P-256 and P-521 have their own code on x86-64, so
  // generic-curve time in a TLS server is P-384. Same bucket choice as P-256.
  // Curve bookkeeping that every prime curve's method runs, P-256's nistz256
  // and nistp256 ones included: the point check and encodings of a peer's
  // key, group accessors, a point's set-up and tear-down. No curve; the
  // operation's other samples name it (aggregate's inference). Before the
  // generic rows below, which would read them as P-384.
  {kOB, kContains, "ec_GFp_simple_is_on_curve",   "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_group_",        "", kSig, kUnknown},  // get_curve, get_degree, init, copy, ...
  {kOB, kContains, "ec_GFp_simple_point_init",    "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_point_finish",  "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_point_clear_finish", "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_point_copy",    "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_point_set_to_infinity", "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_is_at_infinity", "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_cmp",           "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_oct2point",     "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_point2oct",     "", kSig, kUnknown},
  {kOB, kContains, "ec_GFp_simple_set_compressed_coordinates", "", kSig, kUnknown},
  {kOB, kContains, "nistp384",                "", kSig, kP384Ambiguous},
  {kOB, kPrefix,   "fiat_p384_",              "", kSig, kP384Ambiguous},
  {kOB, kPrefix,   "p384_",                   "", kSig, kP384Ambiguous},
  {kOB, kPrefix,   "BN_nist_mod_384",         "", kSig, kP384Ambiguous},
  {kOB, kContains, "ec_GFp_mont_",            "", kSig, kP384Ambiguous},
  {kOB, kContains, "ec_GFp_simple_",          "", kSig, kP384Ambiguous},
  {kOB, kContains, "ec_GFp_nist_",            "", kSig, kP384Ambiguous},
  {kOB, kPrefix,   "ec_GFp_mont",             "", kSig, kP384Ambiguous},
  {kOB, kPrefix,   "ec_simple_",              "", kSig, kP384Ambiguous},  // BoringSSL generic scalar/felem ops
  // P-224/P-521 (ecp_nistp224.c/ecp_nistp521.c felem code): rare in TLS.
  {kOB, kContains, "nistp224",                "", kSig, kUnknown},
  {kOB, kContains, "nistp521",                "", kSig, kUnknown},
  {kOB, kContains, "felem_",                  "", kSig, kUnknown},  // felem_/smallfelem_/widefelem_/longfelem_

  // --- ECDSA and ECDH where the name shows the operation but not the curve.
  {kOB, kContains, "ecdsa",                   "", kSig, kUnknown},
  {kOB, kContains, "ECDSA",                   "", kSig, kUnknown},
  {kOB, kContains, "ecdh",                    "", kKx, kUnknown},
  {kOB, kContains, "ECDH",                    "", kKx, kUnknown},

  // --- X25519, Ed25519 and their curve25519 field/group code.
  // OpenSSL's and BoringSSL's fe_*/ge_* (and BoringSSL's x25519_ge_*) serve
  // both X25519 (ossl_x25519_public_from_private/X25519_keypair use the
  // Edwards base-point multiply) and Ed25519. We call them X25519: X25519 runs
  // in nearly every TLS 1.3 handshake, Ed25519 certificates are rare. sc_* is
  // Ed25519's scalar arithmetic only.
  {kOB, kContains, "x25519",                  "", kKx, kX25519},
  {kOB, kContains, "X25519",                  "", kKx, kX25519},
  {kOB, kContains, "ed25519",                 "", kSig, kEd25519},
  {kOB, kContains, "ED25519",                 "", kSig, kEd25519},
  {kOB, kContains, "Ed25519",                 "", kSig, kEd25519},
  {kOB, kPrefix,   "sc_",                     "", kSig, kEd25519},
  {kOB, kPrefix,   "fe_",                     "", kKx, kX25519},
  {kOB, kPrefix,   "fe25519_",                "", kKx, kX25519},
  {kOB, kPrefix,   "ge_",                     "", kKx, kX25519},
  {kOB, kPrefix,   "fiat_25519_",             "", kKx, kX25519},
  {kOB, kPrefix,   "curve25519_",             "", kKx, kX25519},
  // X448/Ed448: rare; bucket by operation, algorithm unknown.
  {kOB, kContains, "ed448",                   "", kSig, kUnknown},
  {kOB, kContains, "ED448",                   "", kSig, kUnknown},
  {kOB, kContains, "x448",                    "", kKx, kUnknown},
  {kOB, kContains, "X448",                    "", kKx, kUnknown},
  {kOB, kContains, "curve448",                "", kKx, kUnknown},
  {kOB, kContains, "c448",                    "", kKx, kUnknown},
  {kOB, kPrefix,   "gf_",                     "", kKx, kUnknown},   // curve448 field

  // --- RSA, and the bignum kernels RSA runs on (Montgomery multiply/square,
  // windowed exponentiation, rsaz AVX2/AVX-512 IFMA). Caveat: finite-field DH
  // (DHE suites, ffdhe groups) and DSA run on the same bignum code; in TLS
  // practice RSA certificate signing dominates, so the kernels say RSA. Generic
  // BN_* (allocation, conversion, compare) stays other.
  {kOB, kContains, "rsaz",                    "", kSig, kRsa},
  {kOB, kContains, "RSAZ",                    "", kSig, kRsa},
  {kOB, kPrefix,   "bn_mul",                  "", kSig, kRsa},   // bn_mul_mont*, bn_mul4x_mont*, bn_mulx4x_mont*, bn_mul_words, bn_mul_comba*
  {kOB, kPrefix,   "bn_sqr",                  "", kSig, kRsa},   // bn_sqr8x_*, bn_sqrx8x_*, bn_sqr_words, bn_sqr_comba*
  {kOB, kPrefix,   "bn_power",                "", kSig, kRsa},   // bn_power5, bn_powerx5
  {kOB, kPrefix,   "bn_from_mont",            "", kSig, kRsa},
  {kOB, kPrefix,   "bn_to_mont",              "", kSig, kRsa},
  {kOB, kPrefix,   "bn_post",                 "", kSig, kRsa},   // __bn_post4x_internal
  {kOB, kPrefix,   "bn_gather",               "", kSig, kRsa},
  {kOB, kPrefix,   "bn_scatter",              "", kSig, kRsa},
  {kOB, kPrefix,   "bn_get_bits",             "", kSig, kRsa},
  {kOB, kPrefix,   "bn_add_words",            "", kSig, kRsa},
  {kOB, kPrefix,   "bn_sub_words",            "", kSig, kRsa},
  {kOB, kPrefix,   "bn_div",                  "", kSig, kRsa},
  {kOB, kPrefix,   "bn_mod_",                 "", kSig, kRsa},   // bn_mod_exp_*, bn_mod_mul_montgomery_small (BoringSSL)
  {kOB, kPrefix,   "mulx4x_internal",         "", kSig, kRsa},
  {kOB, kPrefix,   "mul4x_internal",          "", kSig, kRsa},
  {kOB, kPrefix,   "sqr8x_internal",          "", kSig, kRsa},
  {kOB, kPrefix,   "BN_mod_exp",              "", kSig, kRsa},
  {kOB, kPrefix,   "BN_mod_mul",              "", kSig, kRsa},
  {kOB, kPrefix,   "BN_mod_sqr",              "", kSig, kRsa},
  {kOB, kPrefix,   "BN_from_mont",            "", kSig, kRsa},
  {kOB, kPrefix,   "BN_to_mont",              "", kSig, kRsa},
  {kOB, kPrefix,   "BN_div",                  "", kSig, kRsa},
  {kOB, kExact,    "BN_mul",                  "", kSig, kRsa},
  {kOB, kExact,    "BN_sqr",                  "", kSig, kRsa},
  {kOB, kPrefix,   "RSA",                     "", kSig, kRsa},   // RSA_*, RSAPrivateKey_*, RSAPublicKey_*
  {kOB, kPrefix,   "rsa",                     "", kSig, kRsa},   // rsa_*, rsapss_*, rsakem_*
  {kOB, kPrefix,   "ossl_rsa",                "", kSig, kRsa},
  {kOB, kContains, "_rsa_",                   "", kSig, kRsa},   // pkey_rsa_*, EVP_PKEY_CTX_set_rsa_*
  // Finite-field DH (DHE suites) and DSA.
  {kOB, kPrefix,   "DH_",                     "", kKx, kUnknown},
  {kOB, kPrefix,   "dh_",                     "", kKx, kUnknown},
  {kOB, kPrefix,   "dhx_",                    "", kKx, kUnknown},
  {kOB, kPrefix,   "ossl_dh_",                "", kKx, kUnknown},
  {kOB, kPrefix,   "DSA",                     "", kSig, kUnknown},
  {kOB, kPrefix,   "dsa_",                    "", kSig, kUnknown},
  {kOB, kPrefix,   "ossl_dsa_",               "", kSig, kUnknown},

  // --- Hashes. SHA-384 and SHA-512/256 run on SHA-512's block function, and
  // SHA-224 on SHA-256's: the leaf names the compression function's family.
  // MD5 before SHA-1 so the TLS 1.0 md5_sha1_* pair counts once, as MD5.
  {kOB, kContains, "md5",                     "", kHash, kMd5},
  {kOB, kContains, "MD5",                     "", kHash, kMd5},
  {kOB, kContains, "sha1",                    "", kHash, kSha1},
  {kOB, kContains, "SHA1",                    "", kHash, kSha1},
  {kOB, kContains, "sha224",                  "", kHash, kSha256},
  {kOB, kContains, "SHA224",                  "", kHash, kSha256},
  {kOB, kContains, "sha256",                  "", kHash, kSha256},
  {kOB, kContains, "SHA256",                  "", kHash, kSha256},
  {kOB, kContains, "sha384",                  "", kHash, kSha512},
  {kOB, kContains, "SHA384",                  "", kHash, kSha512},
  {kOB, kContains, "sha512",                  "", kHash, kSha512},
  {kOB, kContains, "SHA512",                  "", kHash, kSha512},
  // HMAC/HKDF/TLS PRF: hash-based MACs and KDFs; the digest is a parameter the
  // leaf does not show (HMAC-SHA256 and friends matched above already).
  {kOB, kContains, "hmac",                    "", kHash, kUnknown},
  {kOB, kContains, "HMAC",                    "", kHash, kUnknown},
  {kOB, kContains, "hkdf",                    "", kHash, kUnknown},
  {kOB, kContains, "HKDF",                    "", kHash, kUnknown},
  {kOB, kContains, "tls1_prf",                "", kHash, kUnknown},
  {kOB, kContains, "_prf",                    "", kHash, kUnknown},   // BoringSSL tls1_P_hash via CRYPTO_tls1_prf
  // Other digests: SHA-3/SHAKE (OpenSSL), MD4, RIPEMD, Whirlpool, BLAKE2, SM3.
  {kOB, kContains, "eccak",                   "", kHash, kUnknown},   // KeccakF1600, keccak_*
  {kOB, kContains, "sha3",                    "", kHash, kUnknown},
  {kOB, kContains, "SHA3",                    "", kHash, kUnknown},
  {kOB, kPrefix,   "shake",                   "", kHash, kUnknown},
  {kOB, kContains, "md4",                     "", kHash, kUnknown},
  {kOB, kContains, "MD4",                     "", kHash, kUnknown},
  {kOB, kContains, "ripemd",                  "", kHash, kUnknown},
  {kOB, kContains, "RIPEMD",                  "", kHash, kUnknown},
  {kOB, kContains, "hirlpool",                "", kHash, kUnknown},
  {kOB, kContains, "HIRLPOOL",                "", kHash, kUnknown},
  {kOB, kContains, "blake2",                  "", kHash, kUnknown},
  {kOB, kContains, "BLAKE2",                  "", kHash, kUnknown},
  {kOB, kPrefix,   "sm3",                     "", kHash, kUnknown},
  {kOB, kPrefix,   "ossl_sm3",                "", kHash, kUnknown},
  {kOB, kContains, "mdc2",                    "", kHash, kUnknown},
  {kOB, kContains, "MDC2",                    "", kHash, kUnknown},

  // ============================ Go (whole names) ============================
  // Go 1.19-1.23 keep each primitive in crypto/<pkg>; Go 1.24 moves the
  // implementations to crypto/internal/fips140/<pkg> and leaves thin
  // wrappers behind. Rows below list both.

  // --- AES.
  {kG, kPrefix,   "crypto/internal/fips140/aes/gcm.", "",    kCipher, kAesGcm},
  {kG, kPrefix,   "crypto/internal/fips140/aes.",     "CBC", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/internal/fips140/aes.",     "cbc", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/internal/fips140/aes.",     "CTR", kCipher, kAesCtr},
  {kG, kPrefix,   "crypto/internal/fips140/aes.",     "ctr", kCipher, kAesCtr},
  {kG, kPrefix,   "crypto/internal/fips140/aes.",     "",    kCipher, kUnknown},
  {kG, kPrefix,   "crypto/aes.",      "gcm", kCipher, kAesGcm},   // gcmAesEnc, (*gcmAsm).Seal
  {kG, kPrefix,   "crypto/aes.",      "GCM", kCipher, kAesGcm},   // (*aesCipherGCM).Encrypt
  {kG, kPrefix,   "crypto/aes.",      "cbc", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/aes.",      "CBC", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/aes.",      "ctr", kCipher, kAesCtr},   // Go 1.22+ ctrBlocks*Asm
  {kG, kPrefix,   "crypto/aes.",      "CTR", kCipher, kAesCtr},
  {kG, kPrefix,   "crypto/aes.",      "",    kCipher, kUnknown},      // encryptBlockAsm, expandKeyAsm
  {kG, kPrefix,   "_expand_key_",     "",    kCipher, kUnknown},      // crypto/aes asm-local key schedule helpers
  // crypto/cipher: the generic modes (used when the AES has no asm mode).
  {kG, kPrefix,   "crypto/cipher.",   "gcm", kCipher, kAesGcm},
  {kG, kPrefix,   "crypto/cipher.",   "GCM", kCipher, kAesGcm},
  {kG, kPrefix,   "crypto/cipher.",   "cbc", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/cipher.",   "CBC", kCipher, kAesCbc},
  {kG, kPrefix,   "crypto/cipher.",   "ctr", kCipher, kAesCtr},
  {kG, kPrefix,   "crypto/cipher.",   "CTR", kCipher, kAesCtr},
  {kG, kPrefix,   "crypto/cipher.",   "",    kCipher, kUnknown},  // xorBytes*, StreamReader
  // XOR helpers used by every stream/CTR/CBC mode (Go 1.20+ moved xorBytes here).
  {kG, kPrefix,   "crypto/subtle.",                  "xor", kCipher, kUnknown},
  {kG, kPrefix,   "crypto/subtle.",                  "XOR", kCipher, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/subtle.", "xor", kCipher, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/subtle.", "XOR", kCipher, kUnknown},

  // --- ChaCha20-Poly1305 (golang.org/x/crypto, vendored into std as
  // vendor/golang.org/x/crypto/...; Go 1.24 also has an internal copy).
  {kG, kPrefix,   "golang.org/x/crypto/chacha20",    "", kCipher, kChaCha20Poly1305},  // chacha20. and chacha20poly1305.
  {kG, kPrefix,   "golang.org/x/crypto/internal/poly1305.", "", kCipher, kChaCha20Poly1305},
  {kG, kPrefix,   "golang.org/x/crypto/poly1305.",   "", kCipher, kChaCha20Poly1305},
  {kG, kContains, "chacha",                          "", kCipher, kChaCha20Poly1305},
  {kG, kContains, "poly1305",                        "", kCipher, kChaCha20Poly1305},

  // --- Legacy ciphers.
  {kG, kPrefix,   "crypto/des.",      "", kCipher, kUnknown},
  {kG, kPrefix,   "crypto/rc4.",      "", kCipher, kUnknown},

  // --- ML-KEM: Go 1.23 crypto/internal/mlkem768, Go 1.24 fips140/mlkem and
  // crypto/mlkem. Their SHA-3/SHAKE (x/crypto/sha3 in 1.23, fips140/sha3 in
  // 1.24) serves only ML-KEM inside TLS: TLS never hashes with SHA-3.
  {kG, kPrefix,   "crypto/internal/mlkem768.",        "", kKx, kMlKem},
  {kG, kPrefix,   "crypto/internal/fips140/mlkem.",   "", kKx, kMlKem},
  {kG, kPrefix,   "crypto/mlkem.",                    "", kKx, kMlKem},
  {kG, kPrefix,   "crypto/internal/fips140/sha3.",    "", kKx, kMlKem},
  {kG, kPrefix,   "golang.org/x/crypto/sha3.",        "", kKx, kMlKem},
  {kG, kPrefix,   "crypto/sha3.",                     "", kHash, kUnknown},  // explicit use by the program

  // --- Hashes, HMAC, HKDF, TLS PRF.
  {kG, kPrefix,   "crypto/sha256.",                   "", kHash, kSha256},
  {kG, kPrefix,   "crypto/internal/fips140/sha256.",  "", kHash, kSha256},
  {kG, kPrefix,   "crypto/sha512.",                   "", kHash, kSha512},
  {kG, kPrefix,   "crypto/internal/fips140/sha512.",  "", kHash, kSha512},
  {kG, kPrefix,   "crypto/sha1.",                     "", kHash, kSha1},
  {kG, kPrefix,   "crypto/md5.",                      "", kHash, kMd5},
  {kG, kPrefix,   "crypto/hmac.",                     "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/hmac.",    "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/hkdf.",                     "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/hkdf.",    "", kHash, kUnknown},
  {kG, kPrefix,   "golang.org/x/crypto/hkdf.",        "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/tls12.",   "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/tls13.",   "", kHash, kUnknown},
  {kG, kPrefix,   "crypto/tls.",      "pHash", kHash, kUnknown},   // TLS 1.0-1.2 PRF
  {kG, kPrefix,   "crypto/tls.prf",   "",      kHash, kUnknown},

  // --- RSA. Go 1.19 RSA runs on math/big (nat.expNN, nat.montgomery,
  // addMulVVW); 1.20+ on crypto/internal/bigmod (1.24: fips140/bigmod).
  // Caveat: ECDSA's scalar inversion for curves without an asm order inverse
  // (P-384, P-521) also runs there, and math/big serves x509 parsing; RSA
  // signing dwarfs both in a TLS server.
  {kG, kPrefix,   "crypto/rsa.",                      "", kSig, kRsa},
  {kG, kPrefix,   "crypto/internal/fips140/rsa.",     "", kSig, kRsa},
  {kG, kPrefix,   "crypto/internal/bigmod.",          "", kSig, kRsa},
  {kG, kPrefix,   "crypto/internal/fips140/bigmod.",  "", kSig, kRsa},
  {kG, kPrefix,   "math/big.",                        "", kSig, kRsa},

  // --- P-256 ECDSA-only order arithmetic (p256OrdMul, p256OrdSqr,
  // P256OrdInverse), then NIST curve field/point math: shared by ECDSA and
  // ECDHE, same bucket choice as OpenSSL's (signature, ambiguous algorithm).
  {kG, kContains, "p256Ord",                          "", kSig, kEcdsaP256},
  {kG, kContains, "P256Ord",                          "", kSig, kEcdsaP256},
  {kG, kPrefix,   "crypto/internal/nistec",           "256", kSig, kP256Ambiguous},  // nistec. and nistec/fiat.
  {kG, kPrefix,   "crypto/internal/nistec",           "384", kSig, kP384Ambiguous},
  {kG, kPrefix,   "crypto/internal/nistec",           "",    kSig, kUnknown},        // P-224, P-521
  {kG, kPrefix,   "crypto/internal/fips140/nistec",   "256", kSig, kP256Ambiguous},
  {kG, kPrefix,   "crypto/internal/fips140/nistec",   "384", kSig, kP384Ambiguous},
  {kG, kPrefix,   "crypto/internal/fips140/nistec",   "",    kSig, kUnknown},
  {kG, kPrefix,   "crypto/elliptic.",                 "256", kSig, kP256Ambiguous},
  {kG, kPrefix,   "crypto/elliptic.",                 "384", kSig, kP384Ambiguous},
  {kG, kPrefix,   "crypto/elliptic.",                 "",    kSig, kUnknown},
  // File-local assembly of crypto/internal/nistec's p256_asm_amd64.s has no
  // package path: p256MulInternal, p256SqrInternal, p256SubInternal, p256IsZero.
  {kG, kPrefix,   "p256",                             "",    kSig, kP256Ambiguous},

  // --- ECDSA. Go instantiates its generic ECDSA code per GC shape
  // ("signNISTEC[go.shape.*uint8]"), so the curve rarely shows: ECDSA, curve
  // unknown, unless the name carries it.
  {kG, kPrefix,   "crypto/ecdsa.",                    "P256", kSig, kEcdsaP256},
  {kG, kPrefix,   "crypto/ecdsa.",                    "P384", kSig, kEcdsaP384},
  {kG, kPrefix,   "crypto/ecdsa.",                    "",     kSig, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/ecdsa.",   "P256", kSig, kEcdsaP256},
  {kG, kPrefix,   "crypto/internal/fips140/ecdsa.",   "P384", kSig, kEcdsaP384},
  {kG, kPrefix,   "crypto/internal/fips140/ecdsa.",   "",     kSig, kUnknown},

  // --- X25519 and Ed25519. Go 1.19 X25519 is golang.org/x/crypto/curve25519
  // (with its own internal/field); Go 1.20+ crypto/ecdh's X25519 runs on
  // crypto/internal/edwards25519/field, which Ed25519 shares: we call that
  // field code X25519 (every TLS 1.3 handshake vs. rare Ed25519 certs; in Go
  // 1.19 it is Ed25519's alone). edwards25519 point/scalar code is Ed25519 only.
  {kG, kPrefix,   "golang.org/x/crypto/curve25519",   "", kKx, kX25519},
  {kG, kPrefix,   "crypto/internal/edwards25519/field.", "", kKx, kX25519},
  {kG, kPrefix,   "crypto/internal/fips140/edwards25519/field.", "", kKx, kX25519},
  {kG, kPrefix,   "crypto/ecdh.",                     "x25519", kKx, kX25519},
  {kG, kPrefix,   "crypto/ecdh.",                     "X25519", kKx, kX25519},
  {kG, kPrefix,   "crypto/ecdh.",                     "P256",   kKx, kEcdheP256},
  {kG, kPrefix,   "crypto/ecdh.",                     "P384",   kKx, kEcdheP384},
  {kG, kPrefix,   "crypto/ecdh.",                     "",       kKx, kUnknown},
  {kG, kPrefix,   "crypto/internal/fips140/ecdh.",    "P256",   kKx, kEcdheP256},
  {kG, kPrefix,   "crypto/internal/fips140/ecdh.",    "P384",   kKx, kEcdheP384},
  {kG, kPrefix,   "crypto/internal/fips140/ecdh.",    "",       kKx, kUnknown},
  {kG, kPrefix,   "crypto/internal/edwards25519.",    "", kSig, kEd25519},
  {kG, kPrefix,   "crypto/internal/fips140/edwards25519.", "", kSig, kEd25519},
  {kG, kPrefix,   "crypto/ed25519.",                  "", kSig, kEd25519},
  {kG, kPrefix,   "crypto/internal/fips140/ed25519.", "", kSig, kEd25519},
  // Everything else under crypto/ (crypto/tls, crypto/x509, crypto/rand,
  // fips140/drbg, cryptobyte, ...) is TLS library code: {other, unknown}.
};

// "This is TLS library code" prefixes. A name matching none of these (and no
// TLS C++ namespace) is not TLS: classify returns nullopt.
//
// OpenSSL/BoringSSL: the libraries' public and internal namespaces, plus the
// perlasm and static-helper prefixes of the hot code. Deliberately absent:
// generic static helper names (do_*, get_*, check_*, print_*, ...) that a
// static binary's own code may define too; they are listed, with the share of
// libcrypto.a they cover, in testdata/openssl3_not_covered.txt.
// OpenSSL 3 provider tables (rules.h, ProviderOperation/TableAlgorithm).
constexpr ProviderOperation kProviderOperations[] = {
  {"cipher",      kCipher, ""},
  {"digest",      kHash,   ""},
  {"mac",         kHash,   ""},
  {"kdf",         kHash,   ""},
  {"signature",   kSig,    ""},
  {"keyexch",     kKx,     ""},
  {"kem",         kKx,     ""},
  {"asym_cipher", kKx,     ""},    // TLS 1.2 RSA key transport
  {"keymgmt",     kKx,     "gen"}, // gen, gen_init, gen_set_params, ...
};

constexpr TableAlgorithm kProviderAlgorithms[] = {
  {"cipher",      "AES-GCM",             kCipher, kAesGcm},
  {"cipher",      "ChaCha20-Poly1305",   kCipher, kChaCha20Poly1305},
  {"cipher",      "AES-CBC",             kCipher, kAesCbc},
  {"cipher",      "AES-CBC-HMAC-SHA1",   kCipher, kAesCbc},   // the stitched TLS 1.2 CBC suites
  {"cipher",      "AES-CBC-HMAC-SHA256", kCipher, kAesCbc},
  {"cipher",      "AES-CTR",             kCipher, kAesCtr},
  {"digest",      "SHA1",                kHash,   kSha1},
  {"digest",      "SHA2-224",            kHash,   kSha256},   // SHA-256's compression function
  {"digest",      "SHA2-256",            kHash,   kSha256},
  {"digest",      "SHA2-384",            kHash,   kSha512},   // SHA-512's
  {"digest",      "SHA2-512",            kHash,   kSha512},
  {"digest",      "SHA2-512/224",        kHash,   kSha512},
  {"digest",      "SHA2-512/256",        kHash,   kSha512},
  {"digest",      "MD5",                 kHash,   kMd5},
  {"signature",   "ECDSA",               kSig,    kAnyEcdsa},
  {"signature",   "RSA",                 kSig,    kRsa},
  {"signature",   "ED25519",             kSig,    kEd25519},
  {"signature",   "ML-DSA-44",           kSig,    kMlDsa},    // OpenSSL 3.5
  {"signature",   "ML-DSA-65",           kSig,    kMlDsa},
  {"signature",   "ML-DSA-87",           kSig,    kMlDsa},
  {"keyexch",     "ECDH",                kKx,     kAnyEcdh},
  {"keyexch",     "X25519",              kKx,     kX25519},
  {"keyexch",     "TLS1-PRF",            kHash,   kUnknown},  // KDFs offered as key exchange
  {"keyexch",     "HKDF",                kHash,   kUnknown},
  {"keyexch",     "SCRYPT",              kHash,   kUnknown},
  {"kem",         "ML-KEM-512",          kKx,     kMlKem},    // OpenSSL 3.5
  {"kem",         "ML-KEM-768",          kKx,     kMlKem},
  {"kem",         "ML-KEM-1024",         kKx,     kMlKem},
  {"kem",         "X25519MLKEM768",      kKx,     kMlKem},    // the hybrid's glue; its X25519 half names itself
  {"kem",         "RSA",                 kKx,     kRsa},
  {"asym_cipher", "RSA",                 kKx,     kRsa},
  {"keymgmt",     "EC",                  kKx,     kAnyEcdh},  // generation: an ephemeral key share
  {"keymgmt",     "X25519",              kKx,     kX25519},
  {"keymgmt",     "ML-KEM-512",          kKx,     kMlKem},
  {"keymgmt",     "ML-KEM-768",          kKx,     kMlKem},
  {"keymgmt",     "ML-KEM-1024",         kKx,     kMlKem},
  {"keymgmt",     "X25519MLKEM768",      kKx,     kMlKem},
  {"keymgmt",     "ML-DSA-44",           kSig,    kMlDsa},    // generation of a signing key
  {"keymgmt",     "ML-DSA-65",           kSig,    kMlDsa},
  {"keymgmt",     "ML-DSA-87",           kSig,    kMlDsa},
};

// ---- BoringSSL method tables (rules.h, BoringTableKind/TableAlgorithm;
// names from agent/symbols/boringssl_tables.h).
constexpr BoringTableKind kBoringTableKinds[] = {
  {"aead",   kCipher},
  {"cipher", kCipher},
  {"md",     kHash},
  {"ec",     kSig},     // the curve's arithmetic; ECDSA or ECDH by the operation above
};

constexpr TableAlgorithm kBoringTableAlgorithms[] = {
  {"aead",   "AES-GCM",              kCipher, kAesGcm},
  {"aead",   "ChaCha20-Poly1305",    kCipher, kChaCha20Poly1305},
  {"aead",   "XChaCha20-Poly1305",   kCipher, kChaCha20Poly1305},  // the same cipher with a longer nonce; shares init/cleanup
  {"aead",   "AES-CBC-HMAC-SHA1",    kCipher, kAesCbc},            // TLS 1.2 CBC suites
  {"aead",   "AES-CTR-HMAC-SHA256",  kCipher, kAesCtr},
  {"cipher", "AES-CBC",              kCipher, kAesCbc},
  {"cipher", "AES-CTR",              kCipher, kAesCtr},
  {"cipher", "AES-GCM",              kCipher, kAesGcm},
  {"md",     "SHA-1",                kHash,   kSha1},
  {"md",     "SHA-224",              kHash,   kSha256},            // SHA-256's compression function
  {"md",     "SHA-256",              kHash,   kSha256},
  {"md",     "SHA-384",              kHash,   kSha512},            // SHA-512's
  {"md",     "SHA-512",              kHash,   kSha512},
  {"md",     "SHA-512-256",          kHash,   kSha512},
  {"md",     "MD5",                  kHash,   kMd5},
  {"ec",     "P-256",                kSig,    kP256Ambiguous},
  {"ec",     "P-384",                kSig,    kP384Ambiguous},
};

// ---- OpenSSL 3 code tables below the providers (rules.h, OpenSslTableKinds;
// names from agent/symbols/library_tables.h).
constexpr BoringTableKind kOpenSslTableKinds[] = {
  {"ec",        kSig},     // an EC_METHOD's function: the curve; ECDSA or ECDH by the operation above
  {"cipher-hw", kCipher},  // a cipher's hw struct (PROV_CIPHER_HW, PROV_GCM_HW, ...)
  {"ecx",       kKx},      // the X25519 function below the derive X25519 and X448 share
  {"ml-kem",    kKx},      // the ML-KEM code below the provider's encapsulate/decapsulate (3.5)
};

constexpr TableAlgorithm kOpenSslTableAlgorithms[] = {
  // Curves: only P-256's and P-384's names are the report's. A function
  // shared with another curve's method (the generic Montgomery code under
  // P-384 and most others) lists them and names no curve.
  {"ec",        "P-256",               kSig,    kP256Ambiguous},
  {"ec",        "P-384",               kSig,    kP384Ambiguous},
  {"cipher-hw", "AES-CBC",             kCipher, kAesCbc},
  {"cipher-hw", "AES-CBC-CTS",         kCipher, kAesCbc},   // CBC with ciphertext stealing: the same hw (newctx is shared)
  {"cipher-hw", "AES-CBC-HMAC-SHA1",   kCipher, kAesCbc},   // the stitched TLS 1.2 CBC suites
  {"cipher-hw", "AES-CBC-HMAC-SHA256", kCipher, kAesCbc},
  {"cipher-hw", "AES-CTR",             kCipher, kAesCtr},
  {"cipher-hw", "AES-GCM",             kCipher, kAesGcm},
  {"cipher-hw", "ChaCha20-Poly1305",   kCipher, kChaCha20Poly1305},
  {"ecx",       "X25519",              kKx,     kX25519},
  {"ml-kem",    "ML-KEM",              kKx,     kMlKem},
};

constexpr LibraryPrefix kLibraryPrefixes[] = {
  // ---- TLS/DTLS protocol (libssl)
  {kOB, "SSL_"}, {kOB, "ssl_"}, {kOB, "ssl3_"}, {kOB, "SSL3_"}, {kOB, "SSLv"}, {kOB, "tls1_"}, {kOB, "tls12_"},
  {kOB, "tls13_"}, {kOB, "tls_"}, {kOB, "TLS_"}, {kOB, "TLSv1"}, {kOB, "dtls1_"}, {kOB, "DTLS"}, {kOB, "dtls_"},
  {kOB, "ossl_statem_"}, {kOB, "statem_"}, {kOB, "SRP_"}, {kOB, "srp_"}, {kOB, "SCT_"}, {kOB, "CT_"}, {kOB, "CTLOG_"},
  {kOB, "ctlog_"}, {kOB, "OCSP_"}, {kOB, "ocsp_"}, {kOB, "WPACKET_"}, {kOB, "wpacket_"}, {kOB, "PACKET_"},
  {kOB, "DANETLS_"}, {kOB, "dane_"}, {kOB, "OPENSSL_"}, {kOB, "openssl_"}, {kOB, "OpenSSL_"},
  // ---- libcrypto framework: providers, EVP, errors, objects, config, threads
  {kOB, "OSSL_"}, {kOB, "ossl_"}, {kOB, "EVP_"}, {kOB, "evp_"}, {kOB, "CRYPTO_"}, {kOB, "crypto_128_"},
  {kOB, "ERR_"}, {kOB, "err_"}, {kOB, "OBJ_"}, {kOB, "obj_"}, {kOB, "CONF_"}, {kOB, "_CONF_"}, {kOB, "conf_ssl_"},
  {kOB, "conf_value_"}, {kOB, "conf_lhash_"}, {kOB, "conf_modules_"}, {kOB, "NCONF_"},
  {kOB, "ENGINE_"}, {kOB, "engine_"}, {kOB, "DSO_"}, {kOB, "dso_"}, {kOB, "dlfcn_"}, {kOB, "UI_"}, {kOB, "ui_"},
  {kOB, "ASYNC_"}, {kOB, "async_"}, {kOB, "BUF_"}, {kOB, "buf_"}, {kOB, "COMP_"}, {kOB, "comp_"},
  {kOB, "provider_"}, {kO, "provider:"}, {kO, "openssl:"}, {kOB, "ossl_property_"}, {kOB, "prov_"}, {kOB, "core_provider_"}, {kOB, "core_obj_"},
  {kOB, "core_bio_"}, {kOB, "core_thread_"}, {kOB, "deflt_"},
  {kOB, "fips_"}, {kOB, "FIPS_"}, {kOB, "nullprov_"},
  {kOB, "encoder_"}, {kOB, "decoder_"}, {kOB, "keymgmt_"}, {kOB, "namemap_"}, {kOB, "ossl_method_"},
  {kOB, "secmem_"}, {kOB, "OPENSSL_sk_"}, {kOB, "OPENSSL_LH_"}, {kOB, "RECORD_LAYER_"}, {kOB, "pqueue_"},
  {kOB, "pitem_"}, {kOB, "ktls_"}, {kOB, "tlsv1"}, {kOB, "dtlsv1"}, {kOB, "nss_keylog"}, {kOB, "serverinfo"},
  {kOB, "n_ssl3_"},
  // ---- ASN.1, X.509, PEM, PKCS, CMS and friends
  {kOB, "ASN1_"}, {kOB, "ASN1"}, {kOB, "asn1_bio_"}, {kOB, "asn1_template_"}, {kOB, "asn1_item_"},
  {kOB, "asn1_string_"}, {kOB, "asn1_primitive_"}, {kOB, "asn1_d2i_"}, {kOB, "asn1_i2d_"}, {kOB, "asn1_ex_"},
  {kOB, "asn1_str2tag"}, {kOB, "asn1_parse2"}, {kOB, "asn1_collect"}, {kOB, "asn1_cb"}, {kOB, "asn1_enc_"},
  {kOB, "asn1_do_"}, {kOB, "asn1_get_choice_"}, {kOB, "asn1_set_choice_"}, {kOB, "asn1_time_"},
  {kOB, "asn1_check_tlen"}, {kOB, "asn1_print_fsname"}, {kOB, "asn1_get_field_ptr"}, {kOB, "asn1_refcount_"}, {kOB, "X509"}, {kOB, "x509"}, {kOB, "PEM_"}, {kOB, "pem_"},
  {kOB, "PKCS"}, {kOB, "pkcs"}, {kOB, "CMS_"}, {kOB, "cms_"}, {kOB, "TS_"}, {kOB, "ESS_"}, {kOB, "ess_"},
  {kOB, "d2i_"}, {kOB, "i2d_"}, {kOB, "i2a_"}, {kOB, "a2i_"}, {kOB, "i2s_"}, {kOB, "s2i_"}, {kOB, "i2v_"},
  {kOB, "v2i_"}, {kOB, "i2r_"}, {kOB, "r2i_"}, {kOB, "i2o_"}, {kOB, "o2i_"}, {kOB, "i2c_"}, {kOB, "c2i_"},
  {kOB, "i2t_"}, {kOB, "a2d_"}, {kOB, "i2b_"}, {kOB, "b2i_"}, {kOB, "BIO_"}, {kOB, "bio_"}, {kOB, "GENERAL_"},
  {kOB, "OTHERNAME_"}, {kOB, "EDIPARTYNAME_"}, {kOB, "AUTHORITY_"}, {kOB, "BASIC_CONSTRAINTS_"},
  {kOB, "POLICY"}, {kOB, "CERTIFICATEPOLICIES_"}, {kOB, "DIST_POINT"}, {kOB, "CRL_DIST_POINTS_"},
  {kOB, "ISSUING_DIST_POINT_"}, {kOB, "NAME_CONSTRAINTS_"}, {kOB, "NOTICEREF_"}, {kOB, "USERNOTICE_"},
  {kOB, "SXNET"}, {kOB, "PROXY_"}, {kOB, "ACCESS_DESCRIPTION_"}, {kOB, "EXTENDED_KEY_USAGE_"},
  {kOB, "IPAddr"}, {kOB, "ASId"}, {kOB, "ASRange_"}, {kOB, "ADMISSION"}, {kOB, "PROFESSION_INFO"},
  {kOB, "NAMING_AUTHORITY_"}, {kOB, "DIRECTORYSTRING_"}, {kOB, "DISPLAYTEXT_"}, {kOB, "PBEPARAM_"},
  {kOB, "PBE2PARAM_"}, {kOB, "PBKDF2PARAM_"}, {kOB, "PBMAC1PARAM_"}, {kOB, "SCRYPT_PARAMS_"},
  {kOB, "NETSCAPE_"}, {kOB, "SMIME_"}, {kOB, "CRL_"}, {kOB, "ECPARAMETERS_"}, {kOB, "ECPKPARAMETERS_"},
  {kOB, "ECParameters_"}, {kOB, "ECPKParameters_"}, {kOB, "DHparams_"}, {kOB, "DHxparams_"}, {kOB, "DSAparams_"},
  {kOB, "DSAPublicKey_"}, {kOB, "DSAPrivateKey_"}, {kOB, "DSA_"}, {kOB, "DIRECTORYSTRING_"}, {kOB, "ZLONG_"},
  {kOB, "LONG_"}, {kOB, "ZINT32"}, {kOB, "ZINT64"}, {kOB, "INT32"}, {kOB, "INT64"}, {kOB, "UINT32"}, {kOB, "UINT64"},
  {kOB, "ZUINT32"}, {kOB, "ZUINT64"}, {kOB, "UTF8_"}, {kOB, "BIGNUM_"}, {kOB, "X9_62_"}, {kOB, "PKEY_USAGE_PERIOD_"},
  {kOB, "ISSUER_SIGN_TOOL_"}, {kOB, "GOST_"}, {kOB, "B64_"}, {kOB, "DHvparams_"}, {kOB, "MOD_EXP_CTIME_"},
  {kOB, "SSKDF_"}, {kOB, "INTEGER_"}, {kOB, "ASIdentifier"}, {kOB, "IPAddressFamily"},
  {kOB, "CBIGNUM_"}, {kOB, "SubjectPublicKeyInfo_"}, {kOB, "PrivateKeyInfo_"}, {kOB, "EncryptedPrivateKeyInfo_"},
  {kOB, "DHX_"}, {kOB, "OSSL_CMP_"}, {kOB, "OSSL_CRMF_"}, {kOB, "TXT_DB_"}, {kOB, "NAME_"},
  // ---- public-key math
  {kOB, "BN_"}, {kOB, "bn_"}, {kOB, "bnrand"}, {kOB, "EC_"}, {kOB, "ec_"}, {kOB, "ecp_"}, {kOB, "ecx_"},
  {kOB, "ecd_"}, {kOB, "eckey_"}, {kOB, "ECDSA_"}, {kOB, "ecdsa_"}, {kOB, "ECDH_"}, {kOB, "ecdh_"}, {kOB, "RSA_"},
  {kOB, "RSAPrivateKey"}, {kOB, "RSAPublicKey"}, {kOB, "RSA_PSS_PARAMS"}, {kOB, "RSA_OAEP_PARAMS"}, {kOB, "RSAZ_"},
  {kOB, "rsa_"}, {kOB, "rsapss_"}, {kOB, "rsakem_"}, {kOB, "rsaz_"}, {kOB, "__rsaz_"}, {kOB, "rsa2"},
  {kOB, "DSAparams"}, {kOB, "dsa_"}, {kOB, "dsa2"}, {kOB, "DH_"}, {kOB, "DHparams"}, {kOB, "dh_"}, {kOB, "dh2"},
  {kOB, "dhx_"}, {kOB, "dhx2"}, {kOB, "ffc_"}, {kOB, "ec2"}, {kOB, "eddsa_digest_"}, {kOB, "x255192"}, {kOB, "x4482"},
  {kOB, "ed255192"}, {kOB, "ed4482"}, {kOB, "sm22"}, {kOB, "sm2sig_"}, {kOB, "der2key_"}, {kOB, "der2obj_"},
  {kOB, "key2any_"}, {kOB, "key2blob_"}, {kOB, "key2ms"}, {kOB, "key2pvk_"}, {kOB, "key2text_"},
  {kOB, "msblob2"}, {kOB, "pvk2"}, {kOB, "pem2der_"}, {kOB, "epki2pki_"}, {kOB, "any2obj_"},
  {kOB, "pkey_rsa_"}, {kOB, "pkey_ec_"}, {kOB, "pkey_ecd_"}, {kOB, "pkey_ecx_"}, {kOB, "pkey_dsa_"},
  {kOB, "pkey_dh_"}, {kOB, "pkey_pss_"}, {kOB, "pkey_hkdf_"}, {kOB, "pkey_tls1_prf_"}, {kOB, "pkey_scrypt_"},
  {kOB, "pkey_hmac_"}, {kOB, "pkey_cmac_"}, {kOB, "pkey_poly1305_"}, {kOB, "pkey_siphash_"}, {kOB, "pkey_sm2_"},
  {kOB, "pkey_mac_"}, {kOB, "pkey_asn1_"}, {kOB, "x25519"}, {kOB, "X25519"}, {kOB, "x448"}, {kOB, "X448"}, {kOB, "ed25519"},
  {kOB, "ED25519"}, {kOB, "ed448"}, {kOB, "ED448"}, {kOB, "fe_"}, {kOB, "fe51_"}, {kOB, "fe64_"},
  {kOB, "ge_"}, {kOB, "sc_"}, {kOB, "gf_"}, {kOB, "felem_"}, {kOB, "smallfelem_"}, {kOB, "widefelem_"},
  {kOB, "longfelem_"}, {kOB, "p256_"}, {kOB, "p384_"}, {kOB, "fiat_"}, {kOB, "beeu_"},
  {kOB, "mulx4x_internal"}, {kOB, "mul4x_internal"}, {kOB, "sqr8x_internal"}, {kOB, "_mul_1x1"},
  {kOB, "__bn_"}, {kOB, "__ecp_nistz256_"},
  {kOB, "curve25519_"}, {kOB, "curve448_"}, {kOB, "sm2_"}, {kOB, "SM2_"}, {kOB, "KYBER"}, {kOB, "kyber"},
  {kOB, "MLKEM"}, {kOB, "mlkem"}, {kOB, "MLDSA"}, {kOB, "mldsa"}, {kO, "ml_kem_"}, {kO, "ml_dsa_"}, {kO, "mlx_"}, {kOB, "SLHDSA"}, {kOB, "slhdsa"},
  {kOB, "SPAKE2_"}, {kOB, "spake2"}, {kOB, "HRSS_"}, {kOB, "hrss_"}, {kOB, "TRUST_TOKEN"}, {kOB, "trust_token"},
  {kOB, "pmbtoken_"}, {kOB, "voprf_"}, {kOB, "DLEQ"},
  // ---- symmetric ciphers, MACs, hashes, KDFs, randomness (perlasm included)
  {kOB, "AES_"}, {kOB, "aes"}, {kOB, "generic_aes_"}, {kOB, "vpaes_"}, {kOB, "_vpaes_"}, {kOB, "bsaes_"}, {kOB, "_bsaes_"},
  {kOB, "_aesni_"}, {kOB, "__aesni_"}, {kOB, "_x86_64_AES_"}, {kOB, "asm_AES_"}, {kOB, "_avx_cbc_"},
  {kOB, "gcm_"}, {kOB, "ghash_"}, {kOB, "ChaCha20"}, {kOB, "chacha"}, {kOB, "Poly1305"}, {kOB, "poly1305"},
  {kOB, "__poly1305_"}, {kOB, "__ocb_"}, {kOB, "cipher_"}, {kOB, "ccm_"}, {kOB, "ocb_"}, {kOB, "siv_"}, {kOB, "xts_"},
  {kOB, "padlock_"}, {kOB, "_padlock_"}, {kOB, "afalg_"}, {kOB, "DES_"}, {kOB, "des_ede"}, {kOB, "desx_"}, {kOB, "des3_"},
  {kOB, "tdes_"}, {kOB, "RC4"}, {kOB, "rc4_"}, {kOB, "RC2_"}, {kOB, "rc2_"}, {kOB, "BF_"}, {kOB, "bf_"},
  {kOB, "CAST_"}, {kOB, "cast5_"}, {kOB, "cast_"}, {kOB, "Camellia_"}, {kOB, "camellia_"},
  {kOB, "_x86_64_Camellia_"}, {kOB, "aria_"}, {kOB, "aria"}, {kOB, "ARIA_"}, {kOB, "SEED_"}, {kOB, "seed_"},
  {kOB, "IDEA_"}, {kOB, "idea_"}, {kOB, "sm4"}, {kOB, "SM4_"},
  // Exact one-shot digests: libmd (SHA256Init, MD5Update) shares the prefixes.
  {kOB, "SHA1", true}, {kOB, "SHA224", true}, {kOB, "SHA256", true}, {kOB, "SHA384", true}, {kOB, "SHA512", true},
  {kOB, "MD5", true}, {kOB, "MD4", true}, {kOB, "HMAC", true}, {kOB, "SHA1_"}, {kOB, "SHA224_"}, {kOB, "SHA256_"},
  {kOB, "SHA384_"}, {kOB, "SHA512_"}, {kOB, "SHA3_"}, {kOB, "MD5_"}, {kOB, "MD4_"},
  {kOB, "K256"}, {kOB, "K512"}, {kOB, "K_XX_XX"}, {kOB, "_shaext_shortcut"}, {kOB, "_ssse3_shortcut"},
  {kOB, "_avx_shortcut"}, {kOB, "_avx2_shortcut"}, {kOB, "sha1_"}, {kOB, "sha224_"}, {kOB, "sha256_"},
  {kOB, "sha384_"}, {kOB, "sha512_"}, {kOB, "sha3_"}, {kOB, "shake_"}, {kOB, "keccak_"}, {kOB, "KeccakF1600"},
  {kOB, "__KeccakF1600"}, {kOB, "generic_sha3_"}, {kOB, "md5_"}, {kOB, "md4_"}, {kOB, "RIPEMD160"}, {kOB, "ripemd160_"},
  {kOB, "ripe_"}, {kOB, "WHIRLPOOL"}, {kOB, "whirlpool_"}, {kOB, "wp_"}, {kOB, "blake2"}, {kOB, "BLAKE2"},
  {kOB, "sm3_"}, {kOB, "SM3_"}, {kOB, "MDC2"}, {kOB, "mdc2_"}, {kOB, "HMAC_"}, {kOB, "hmac_"}, {kOB, "CMAC_"},
  {kOB, "cmac_"}, {kOB, "gmac_"}, {kOB, "kmac_"}, {kOB, "kmac"}, {kOB, "mac_"}, {kOB, "siphash_"},
  {kOB, "SipHash"}, {kOB, "SIPHASH_"}, {kOB, "HKDF"}, {kOB, "hkdf_"}, {kOB, "kdf_"}, {kOB, "KDF_"},
  {kOB, "PKCS5_"}, {kOB, "scrypt"}, {kOB, "sskdf_"}, {kOB, "kbkdf_"}, {kOB, "x942kdf_"}, {kOB, "x963kdf_"},
  {kOB, "pbkdf"}, {kOB, "PBKDF"}, {kOB, "krb5kdf_"}, {kOB, "tls1prf_"}, {kOB, "RAND_"}, {kOB, "rand_pool_"},
  {kOB, "rand_crng_"}, {kOB, "rand_drbg_"}, {kOB, "drbg_"}, {kOB, "CTR_DRBG_"}, {kOB, "rdrand"}, {kOB, "nullmd_"},
  // ---- BoringSSL's own C namespaces (shared android build and upstream)
  {kB, "CBB_"}, {kB, "CBS_"}, {kB, "cbb_"}, {kB, "cbs_"}, {kB, "BORINGSSL_"}, {kB, "boringssl_"},
  {kB, "BCM_"}, {kB, "bcm_"}, {kB, "aead_"}, {kB, "EVP_AEAD_"}, {kB, "HPKE_"}, {kB, "hpke_"},
  {kB, "POLYVAL_"}, {kB, "CRYPTO_BUFFER"}, {kB, "ERR_"}, {kB, "BUF_MEM_"}, {kB, "keccak_"},
  {kOB, "sk_"}, {kOB, "SSLeay"}, {kB, "asn1_get_string_table"},  // BoringSSL exports its stack API as sk_*; OpenSSL has sk_* statics
  // ---- BoringSSL method tables: the names agent/symbols/boringssl_tables.h gives
  {kB, "boringssl:"},

  // ---- Go: package paths (after a leading "vendor/" is dropped). crypto/
  // holds crypto/tls, crypto/x509 and every primitive; math/big is Go 1.19's
  // RSA arithmetic. encoding/asn1 is deliberately not here: it is a general
  // library (x509 parses with it, but so does any program), and its time in a
  // TLS server is certificate parsing that happens once per key load, while
  // calling it TLS would pull every ASN.1 user's parsing into the report.
  // _goboringcrypto_ is BoringSSL linked into Go (GOEXPERIMENT=boringcrypto).
  {kG, "crypto/"}, {kG, "golang.org/x/crypto/"}, {kG, "math/big."}, {kG, "_goboringcrypto_"},
  // File-local assembly of crypto/ (no package path in the name): nistec's
  // p256*Internal/p256IsZero, aes's _expand_key_*.
  {kG, "p256"}, {kG, "_expand_key_"},
};

// C++ outermost namespaces that are TLS library code. BoringSSL's libssl and
// (since 2024) libcrypto are C++ in namespace bssl; ML-KEM/ML-DSA have their
// own namespaces. Node's node::crypto:: is node's code, not OpenSSL's.
constexpr CxxNamespace kCxxNamespaces[] = {
  {kB, "bssl"}, {kB, "mlkem"}, {kB, "mldsa"}, {kB, "slhdsa"},
};
// clang-format on

}  // namespace

std::span<const ProviderOperation> ProviderOperations() { return kProviderOperations; }
std::span<const TableAlgorithm> ProviderAlgorithms() { return kProviderAlgorithms; }
std::span<const BoringTableKind> BoringTableKinds() { return kBoringTableKinds; }
std::span<const TableAlgorithm> BoringTableAlgorithms() { return kBoringTableAlgorithms; }
std::span<const BoringTableKind> OpenSslTableKinds() { return kOpenSslTableKinds; }
std::span<const TableAlgorithm> OpenSslTableAlgorithms() { return kOpenSslTableAlgorithms; }
std::span<const Rule> Rules() { return kRules; }
std::span<const LibraryPrefix> LibraryPrefixes() { return kLibraryPrefixes; }
std::span<const CxxNamespace> CxxNamespaces() { return kCxxNamespaces; }

}  // namespace tlsprof::classify::rules
