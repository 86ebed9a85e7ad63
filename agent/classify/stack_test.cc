// stack_test: ClassifyStack, ClassifyOperation and ClassifyPhaseEntry against
// real call chains (testdata/stacks_*.txt, captured with perf from the
// workloads, including Debian's stripped BoringSSL; each file's header says
// how) and small hand-built stacks of real symbol names for what no workload
// here runs (BoringSSL's libssl and symbolized assembly, OpenSSL 1.1). No
// privileges needed.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent/classify/classify.h"
#include "agent/classify/rules.h"
#include "common/sanitizer.h"

namespace tlsprof::classify {
namespace {

struct StackCase {
  std::string title;
  std::string bucket, algorithm, phase, tls;
  Family family = Family::kOpenSSL;
  std::vector<std::string> names;  // owns the strings FrameInfo points into
  std::vector<bool> tls_flags;

  std::vector<FrameInfo> Frames() const {
    std::vector<FrameInfo> out;
    for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], family, tls_flags[i]});
    return out;
  }
};

std::vector<StackCase> ReadStacks(const std::string& file) {
  const std::string path = std::string(TLSPROF_SOURCE_DIR) + "/agent/classify/testdata/" + file;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<StackCase> out;
  std::string line;
  StackCase cur;
  auto flush = [&] {
    if (!cur.title.empty()) out.push_back(cur);
    cur = StackCase{};
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '#') continue;
    if (line.empty()) {
      flush();
    } else if (line.rfind("== ", 0) == 0) {
      cur.title = line.substr(3);
    } else if (line.rfind("expect: ", 0) == 0) {
      std::istringstream ss(line.substr(8));
      ss >> cur.bucket >> cur.algorithm >> cur.phase >> cur.tls;
    } else if (line.rfind("family: ", 0) == 0) {
      const std::string f = line.substr(8);
      cur.family = f == "go" ? Family::kGo : f == "boringssl" ? Family::kBoringSSL : Family::kOpenSSL;
    } else {
      EXPECT_TRUE(line.size() >= 3 && (line[0] == 'T' || line[0] == '-') && line[1] == ' ') << file << ": " << line;
      std::string name = line.substr(2);
      cur.names.push_back(name == "?" ? std::string() : name);
      cur.tls_flags.push_back(line[0] == 'T');
    }
  }
  flush();
  return out;
}

void ExpectStacks(const std::string& file, size_t min_cases) {
  const auto cases = ReadStacks(file);
  ASSERT_GE(cases.size(), min_cases) << file;
  for (const auto& c : cases) {
    const auto frames = c.Frames();
    const StackClassification got = ClassifyStack(frames);
    EXPECT_EQ(BucketName(got.classification.bucket), c.bucket) << c.title;
    EXPECT_EQ(got.classification.algorithm, c.algorithm) << c.title;
    EXPECT_EQ(PhaseName(got.phase), c.phase) << c.title;
    EXPECT_EQ(got.tls ? "true" : "false", c.tls) << c.title;
  }
}

TEST(ClassifyStackFixtures, OpenSsl3RealChains) { ExpectStacks("stacks_openssl3.txt", 20); }
TEST(ClassifyStackFixtures, Go119RealChains) { ExpectStacks("stacks_go119.txt", 8); }
TEST(ClassifyStackFixtures, BoringSslAndroidRealChains) { ExpectStacks("stacks_boringssl_android.txt", 13); }
TEST(ClassifyStackFixtures, Go119CryptoWithoutCryptoTlsRealChains) { ExpectStacks("stacks_go119_crypto.txt", 8); }

// ---- Hand-built stacks (leaf first) from real names.

StackClassification Classify(Family family, std::initializer_list<std::pair<const char*, bool>> frames) {
  std::vector<FrameInfo> v;
  for (const auto& [name, tls] : frames) v.push_back({name, family, tls});
  return ClassifyStack(v);
}

void ExpectResult(const StackClassification& got, Bucket bucket, std::string_view algorithm, Phase phase) {
  EXPECT_TRUE(got.tls);
  EXPECT_EQ(BucketName(got.classification.bucket), BucketName(bucket));
  EXPECT_EQ(got.classification.algorithm, algorithm);
  EXPECT_EQ(PhaseName(got.phase), PhaseName(phase));
}

TEST(ClassifyStack, EmptyAndNonTlsStacks) {
  EXPECT_FALSE(ClassifyStack({}).tls);
  auto got = Classify(Family::kOpenSSL, {{"__memmove_avx_unaligned_erms", false}, {"main", false}});
  EXPECT_FALSE(got.tls);
  EXPECT_EQ(got.phase, Phase::kOther);
  EXPECT_EQ(got.classification.bucket, Bucket::kOther);
}

TEST(ClassifyStack, LibcCalledFromLibcryptoIsTlsTime) {
  auto got = Classify(Family::kOpenSSL,
                      {{"__memcpy_avx_unaligned_erms", false}, {"aesni_gcm_encrypt", true}, {"worker", false}});
  ExpectResult(got, Bucket::kCipher, algo::kAesGcm, Phase::kOther);  // no operation: innermost primitive
}

TEST(ClassifyStack, UnnamedFramesOfAStrippedLibrary) {
  auto got = Classify(Family::kOpenSSL, {{"", true}, {"", true}, {"EVP_DigestSign", true}, {"", true}, {"app", false}});
  ExpectResult(got, Bucket::kSignature, algo::kUnknown, Phase::kOther);
  got = Classify(Family::kOpenSSL, {{"", true}, {"", true}, {"app", false}});
  ExpectResult(got, Bucket::kOther, algo::kUnknown, Phase::kOther);
}

TEST(ClassifyStack, OutermostOperationPicksTheBucket) {
  // SHA-256 inside EVP_DigestSignFinal (ECDSA): signature, and SHA-256 (hash
  // bucket) does not name the signature's algorithm.
  auto got = Classify(Family::kOpenSSL, {{"sha256_block_data_order_avx2", true},
                                         {"SHA256_Final", true},
                                         {"EVP_DigestFinal_ex", true},
                                         {"ecdsa_digest_sign_final", true},
                                         {"EVP_DigestSignFinal", true},
                                         {"tls_construct_cert_verify", true},
                                         {"state_machine", true}});
  ExpectResult(got, Bucket::kSignature, algo::kUnknown, Phase::kHandshake);
  // HKDF inside ECDH with a KDF: key exchange.
  got = Classify(Family::kOpenSSL,
                 {{"sha256_block_data_order_shaext", true}, {"HMAC_Update", true}, {"ecdh_X9_63_kdf_derive", true}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kUnknown, Phase::kOther);
}

// OpenSSL 3.5 (Debian 13), names from its libcrypto.a: ML-KEM, ML-DSA, and
// the X25519MLKEM768 hybrid, whose two halves keep their own names.
TEST(ClassifyStack, OpenSsl35PostQuantum) {
  ExpectResult(Classify(Family::kOpenSSL, {{"ossl_ml_kem_encap_seed", true},
                                           {"ossl_ml_kem_encap_rand", true},
                                           {"ml_kem_encapsulate", true},
                                           {"EVP_PKEY_encapsulate", true},
                                           {"app", false}}),
               Bucket::kKeyExchange, algo::kMlKem, Phase::kOther);
  // The hybrid's X25519 half, then its ML-KEM half, then its own glue.
  ExpectResult(Classify(Family::kOpenSSL, {{"x25519_fe51_mul", true},
                                           {"ossl_x25519", true},
                                           {"ecx_derive", true},
                                           {"EVP_PKEY_derive", true},
                                           {"mlx_kem_encapsulate", true},
                                           {"EVP_PKEY_encapsulate", true},
                                           {"tls_construct_stoc_key_share", true}}),
               Bucket::kKeyExchange, algo::kX25519, Phase::kHandshake);
  ExpectResult(Classify(Family::kOpenSSL, {{"", true},
                                           {"ossl_ml_kem_encap_rand", true},
                                           {"ml_kem_encapsulate", true},
                                           {"mlx_kem_encapsulate", true},
                                           {"EVP_PKEY_encapsulate", true}}),
               Bucket::kKeyExchange, algo::kMlKem, Phase::kOther);
  ExpectResult(
      Classify(Family::kOpenSSL,
               {{"__memcpy_avx_unaligned_erms", false}, {"mlx_kem_encapsulate", true}, {"EVP_PKEY_encapsulate", true}}),
      Bucket::kKeyExchange, algo::kMlKem, Phase::kOther);
  // ML-DSA: its SHAKE is the signature's.
  ExpectResult(Classify(Family::kOpenSSL, {{"KeccakF1600_avx512vl", true},
                                           {"ossl_ml_dsa_poly_expand_mask", true},
                                           {"ossl_ml_dsa_sign", true},
                                           {"ml_dsa_sign", true},
                                           {"EVP_PKEY_sign", true}}),
               Bucket::kSignature, algo::kMlDsa, Phase::kOther);
  ExpectResult(Classify(Family::kOpenSSL, {{"provider:signature:ML-DSA-65:sign", true}, {"EVP_PKEY_sign", true}}),
               Bucket::kSignature, algo::kMlDsa, Phase::kOther);
  ExpectResult(Classify(Family::kOpenSSL, {{"provider:kem:ML-KEM-768:decapsulate", true}}), Bucket::kKeyExchange,
               algo::kMlKem, Phase::kOther);
}

TEST(ClassifyStack, ImplicitHandshakeInsideSslReadIsHandshake) {
  auto got = Classify(Family::kOpenSSL, {{"x25519_fe64_mul", true},
                                         {"x25519_scalar_mult", true},
                                         {"ossl_x25519", true},
                                         {"ecx_derive", true},
                                         {"ssl_derive", true},
                                         {"tls_process_client_hello", true},
                                         {"state_machine", true},
                                         {"ossl_statem_accept", true},
                                         {"ssl3_read_bytes", true},
                                         {"SSL_read", true},
                                         {"serve", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kX25519, Phase::kHandshake);
}

TEST(ClassifyStack, OpenSsl11Names) {
  // 1.1.1: EVP_PKEY_derive -> pkey_ec_derive -> ECDH_compute_key -> P-256.
  auto got = Classify(Family::kOpenSSL, {{"ecp_nistz256_point_doublex", true},
                                         {"ecp_nistz256_points_mul", true},
                                         {"EC_POINT_mul", true},
                                         {"ecdh_simple_compute_key", true},
                                         {"ECDH_compute_key", true},
                                         {"pkey_ec_derive", true},
                                         {"EVP_PKEY_derive", true},
                                         {"ssl_derive", true},
                                         {"tls_process_cke_ecdhe", true},
                                         {"tls_process_client_key_exchange", true},
                                         {"ossl_statem_server_process_message", true},
                                         {"state_machine", true},
                                         {"SSL_do_handshake", true}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP256, Phase::kHandshake);
  got = Classify(Family::kOpenSSL, {{"bn_sqr8x_internal", true},
                                    {"BN_mod_exp_mont_consttime", true},
                                    {"rsa_ossl_mod_exp", true},
                                    {"rsa_ossl_private_encrypt", true},
                                    {"pkey_rsa_sign", true},
                                    {"EVP_DigestSignFinal", true},
                                    {"tls_construct_cert_verify", true},
                                    {"state_machine", true}});
  ExpectResult(got, Bucket::kSignature, algo::kRsa, Phase::kHandshake);
}

TEST(ClassifyStack, BoringSsl) {
  // AES-GCM record seal in SSL_write (mangled bssl:: names as in .symtab).
  auto got =
      Classify(Family::kBoringSSL, {{"aesni_gcm_encrypt", true},
                                    {"aead_aes_gcm_seal_scatter", true},
                                    {"EVP_AEAD_CTX_seal_scatter", true},
                                    {"_ZN4bssl14SSLAEADContext11SealScatterEPhS1_S1_hthNS_4SpanIKhEES4_S4_S4_", true},
                                    {"_ZN4bssl15tls_seal_recordEP6ssl_stPhPmmhPKhm", true},
                                    {"SSL_write", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kCipher, algo::kAesGcm, Phase::kRecord);
  // Stripped android libcrypto.so.0: only the export X25519 is named.
  got = Classify(Family::kBoringSSL,
                 {{"", true}, {"", true}, {"X25519", true}, {"", true}, {"", true}, {"SSL_do_handshake", true}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kX25519, Phase::kHandshake);
  // bssl::ssl_run_handshake inside SSL_read (implicit handshake), demangled.
  got = Classify(Family::kBoringSSL, {{"ecp_nistz256_ord_sqr_mont", true},
                                      {"ECDSA_do_sign", true},
                                      {"ECDSA_sign", true},
                                      {"bssl::ssl_private_key_sign(bssl::SSL_HANDSHAKE*, unsigned char*)", true},
                                      {"bssl::ssl_run_handshake(bssl::SSL_HANDSHAKE*, bool*)", true},
                                      {"SSL_read", true}});
  ExpectResult(got, Bucket::kSignature, algo::kEcdsaP256, Phase::kHandshake);
  // A Kyber/ML-KEM hybrid key share: the class name is the operation.
  got =
      Classify(Family::kBoringSSL,
               {{"_ZN4bssl12_GLOBAL__N_122X25519MLKEM768KeyShare6AcceptEPNS_3CBBEPNS_5ArrayIhEEPhNS_4SpanIKhEE", true},
                {"_ZN4bssl25ssl_ext_key_share_acceptEPNS_13SSL_HANDSHAKEEPNS_5ArrayIhEEPhPKNS_4SpanIKhEE", true}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kUnknown, Phase::kOther);
  // EVP_AEAD_CTX_seal with no primitive named: cipher, algorithm unknown.
  EXPECT_EQ(ClassifyOperation(Family::kBoringSSL, "EVP_AEAD_CTX_seal")->bucket, Bucket::kCipher);
  EXPECT_FALSE(ClassifyOperation(Family::kBoringSSL, "EVP_aead_aes_128_gcm"));
}

// Debian's stripped android libcrypto.so.0 named from its method structs
// (agent/symbols/boringssl_tables.h): the frame the exported entry point
// dispatched through names the algorithm (or the curve) of the unexported
// code beneath; the entry keeps the bucket.
TEST(ClassifyStack, BoringSslMethodTables) {
  // ECDSA_sign -> ECDSA_do_sign -> (unexported) -> the P-256 method's mul_base.
  auto got = Classify(Family::kBoringSSL, {{"", true},
                                           {"boringssl:ec:P-256:mul_base", true},
                                           {"", true},
                                           {"ECDSA_do_sign", true},
                                           {"ECDSA_sign", true},
                                           {"app", false}});
  ExpectResult(got, Bucket::kSignature, algo::kEcdsaP256, Phase::kOther);
  // ECDH_compute_key through the same method: key exchange, ECDHE-P256.
  got =
      Classify(Family::kBoringSSL,
               {{"", true}, {"boringssl:ec:P-256:mul", true}, {"", true}, {"ECDH_compute_key", true}, {"app", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP256, Phase::kOther);
  got = Classify(Family::kBoringSSL, {{"", true},
                                      {"boringssl:ec:P-256:point_get_affine_coordinates", true},
                                      {"", true},
                                      {"ECDH_compute_key", true},
                                      {"bssl::ssl_run_handshake(bssl::SSL_HANDSHAKE*, bool*)", true},
                                      {"SSL_do_handshake", true}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP256, Phase::kHandshake);
  // The scalar inversion every curve shares names no curve: unknown here
  // (aggregate's InferFromOperations then gives it ECDSA_sign's named share).
  got = Classify(Family::kBoringSSL, {{"", true},
                                      {"boringssl:ec:P-224|P-256|P-384|P-521:scalar_inv0_montgomery", true},
                                      {"", true},
                                      {"ECDSA_do_sign", true},
                                      {"ECDSA_sign", true}});
  ExpectResult(got, Bucket::kSignature, algo::kUnknown, Phase::kOther);
  // An EC method function under no operation: leaf-only rules, as for nistp256.
  got = Classify(Family::kBoringSSL, {{"", true}, {"boringssl:ec:P-256:mul", true}, {"", true}});
  ExpectResult(got, Bucket::kSignature, algo::kP256Ambiguous, Phase::kOther);
  // ChaCha20-Poly1305 and AES-CBC records.
  got = Classify(Family::kBoringSSL, {{"", true},
                                      {"", true},
                                      {"boringssl:aead:ChaCha20-Poly1305:seal_scatter", true},
                                      {"EVP_AEAD_CTX_seal", true},
                                      {"app", false}});
  ExpectResult(got, Bucket::kCipher, algo::kChaCha20Poly1305, Phase::kOther);
  got = Classify(
      Family::kBoringSSL,
      {{"", true}, {"boringssl:cipher:AES-CBC:cipher", true}, {"", true}, {"EVP_EncryptUpdate", true}, {"app", false}});
  ExpectResult(got, Bucket::kCipher, algo::kAesCbc, Phase::kOther);
  // A digest's update under a signature is the signature's, never SHA-256.
  got = Classify(
      Family::kBoringSSL,
      {{"", true}, {"boringssl:md:SHA-256:update", true}, {"", true}, {"RSA_sign_pss_mgf1", true}, {"app", false}});
  ExpectResult(got, Bucket::kSignature, algo::kRsa, Phase::kOther);
  // The same update alone (EVP_DigestUpdate's callee, no operation of its own here).
  got = Classify(Family::kBoringSSL, {{"", true}, {"boringssl:md:SHA-256:update", true}, {"app", false}});
  ExpectResult(got, Bucket::kHash, algo::kSha256, Phase::kOther);
}

// Debian's stripped libcrypto.so.3 with the code below its providers named
// (agent/symbols/library_tables.h): the provider function keeps the
// bucket, the EC method, cipher hw or X25519 frame beneath it names the
// algorithm.
TEST(ClassifyStack, OpenSsl3CodeTables) {
  // ECDSA sign through the P-256 method's mul (ecp_nistz256_points_mul);
  // the sign_setup every curve's method shares names nothing.
  auto got = Classify(Family::kOpenSSL, {{"", true},
                                         {"openssl:ec:P-256:mul", true},
                                         {"EC_POINT_mul", true},
                                         {"openssl:ec:*:ecdsa_sign_setup", true},
                                         {"openssl:ec:*:ecdsa_sign_sig", true},
                                         {"ECDSA_do_sign_ex", true},
                                         {"provider:signature:ECDSA:sign", true},
                                         {"EVP_DigestSignFinal", true},
                                         {"app", false}});
  ExpectResult(got, Bucket::kSignature, algo::kEcdsaP256, Phase::kOther);
  // ECDH derive through the same method: ECDHE-P256, and a generic
  // Montgomery function beneath it (shared with P-384) keeps it P-256.
  got = Classify(Family::kOpenSSL, {{"", true},
                                    {"openssl:ec:*:field_mul", true},
                                    {"openssl:ec:P-256:mul", true},
                                    {"EC_POINT_mul", true},
                                    {"openssl:ec:*:ecdh_compute_key", true},
                                    {"ECDH_compute_key", true},
                                    {"provider:keyexch:ECDH:derive", true},
                                    {"EVP_PKEY_derive", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP256, Phase::kOther);
  // ECDSA's inversion mod the order (ecp_nistz256_inv_mod_ord).
  got = Classify(Family::kOpenSSL, {{"", true},
                                    {"openssl:ec:P-256:field_inverse_mod_ord", true},
                                    {"", true},
                                    {"openssl:ec:*:ecdsa_sign_sig", true},
                                    {"ECDSA_do_sign_ex", true},
                                    {"provider:signature:ECDSA:sign", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kSignature, algo::kEcdsaP256, Phase::kOther);
  // Only shared EC code on the stack: the curve stays unknown.
  got = Classify(Family::kOpenSSL, {{"", true},
                                    {"openssl:ec:P-224|P-521:field_mul", true},
                                    {"openssl:ec:*:ecdh_compute_key", true},
                                    {"provider:keyexch:ECDH:derive", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kUnknown, Phase::kOther);
  // AES-CBC records: the generic block update every mode shares, then the
  // AES-NI CBC hw function (cipher_hw_aesni_cbc) above aesni_cbc_encrypt.
  got = Classify(Family::kOpenSSL, {{"", true},
                                    {"openssl:cipher-hw:AES-CBC|AES-CBC-CTS:cipher", true},
                                    {"provider:cipher:*:update", true},
                                    {"EVP_EncryptUpdate", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kCipher, algo::kAesCbc, Phase::kOther);
  // X25519 derive: ecx_derive is X25519's and X448's, ossl_x25519 below it only X25519's.
  got = Classify(Family::kOpenSSL, {{"", true},
                                    {"openssl:ecx:X25519:derive", true},
                                    {"provider:keyexch:X25519|X448:derive", true},
                                    {"EVP_PKEY_derive", true},
                                    {"app", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kX25519, Phase::kOther);
}

TEST(ClassifyStack, GoCbcRecordMacStaysHashInsideTheHalfConnContainer) {
  auto got = Classify(Family::kGo, {{"crypto/sha1.block", true},
                                    {"crypto/sha1.(*digest).Write", true},
                                    {"crypto/hmac.(*hmac).Write", true},
                                    {"crypto/tls.tls10MAC", true},
                                    {"crypto/tls.(*halfConn).encrypt", true},
                                    {"crypto/tls.(*Conn).writeRecordLocked", true},
                                    {"crypto/tls.(*Conn).Write", true}});
  ExpectResult(got, Bucket::kHash, algo::kSha1, Phase::kRecord);
  got = Classify(Family::kGo, {{"crypto/aes.encryptBlockAsm.abi0", true},
                               {"crypto/cipher.(*cbcEncrypter).CryptBlocks", true},
                               {"crypto/tls.(*halfConn).encrypt", true},
                               {"crypto/tls.(*Conn).Write", true}});
  ExpectResult(got, Bucket::kCipher, algo::kAesCbc, Phase::kRecord);
}

TEST(ClassifyStack, GoReadThatRunsTheHandshakeIsHandshake) {
  auto got = Classify(Family::kGo, {{"math/big.addMulVVW.abi0", true},
                                    {"math/big.nat.montgomery", true},
                                    {"crypto/rsa.decrypt", true},
                                    {"crypto/rsa.SignPSS", true},
                                    {"crypto/rsa.(*PrivateKey).Sign", true},
                                    {"crypto/tls.(*serverHandshakeStateTLS13).sendServerCertificate", true},
                                    {"crypto/tls.(*serverHandshakeStateTLS13).handshake", true},
                                    {"crypto/tls.(*Conn).serverHandshake", true},
                                    {"crypto/tls.(*Conn).handshakeContext", true},
                                    {"crypto/tls.(*Conn).HandshakeContext", true},
                                    {"crypto/tls.(*Conn).Read", true},
                                    {"net/http.(*conn).serve", false}});
  ExpectResult(got, Bucket::kSignature, algo::kRsa, Phase::kHandshake);
  // ECDSA's scalar inverse runs on math/big (labelled RSA as a leaf): under
  // crypto/ecdsa.Sign it must not say RSA.
  got = Classify(Family::kGo, {{"math/big.nat.expNN", true},
                               {"math/big.(*Int).Exp", true},
                               {"crypto/ecdsa.fermatInverse", true},
                               {"crypto/ecdsa.signGeneric", true},
                               {"crypto/ecdsa.Sign", true}});
  ExpectResult(got, Bucket::kSignature, algo::kUnknown, Phase::kOther);
}

// Entries that narrow the algorithm pool their samples for inference; the
// generic EVP entries, shared by every algorithm, must not.
// ECDH is key exchange wherever it is entered: crypto/elliptic's point API
// outside crypto/ecdsa, with no crypto/tls frame (ScalarBaseMult: a key
// server's ephemeral key); inside crypto/ecdsa the same call is the
// signature's.
TEST(ClassifyStack, GoEllipticPointApiIsKeyExchangeOutsideEcdsa) {
  auto got =
      Classify(Family::kGo, {{"p256MulInternal", true},
                             {"crypto/internal/nistec.(*P256Point).p256BaseMult", true},
                             {"crypto/internal/nistec.(*P256Point).ScalarBaseMult", true},
                             {"crypto/elliptic.(*nistCurve[go.shape.*uint8_0]).ScalarBaseMult", true},
                             {"crypto/elliptic.(*nistCurve[*crypto/internal/nistec.P256Point]).ScalarBaseMult", true},
                             {"crypto/elliptic.GenerateKey", true},
                             {"main.newKeyShare", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP256, Phase::kOther);
  // P-384 through the generic GC-shape instance: the curve comes from nistec.
  got = Classify(Family::kGo, {{"crypto/internal/nistec/fiat.p384Mul", true},
                               {"crypto/internal/nistec/fiat.(*P384Element).Mul", true},
                               {"crypto/internal/nistec.(*P384Point).ScalarMult", true},
                               {"crypto/elliptic.(*nistCurve[go.shape.*uint8_0]).ScalarMult", true},
                               {"main.derive", false}});
  ExpectResult(got, Bucket::kKeyExchange, algo::kEcdheP384, Phase::kOther);
  got = Classify(Family::kGo, {{"p256MulInternal", true},
                               {"crypto/internal/nistec.(*P256Point).ScalarBaseMult", true},
                               {"crypto/elliptic.(*nistCurve[*crypto/internal/nistec.P256Point]).ScalarBaseMult", true},
                               {"crypto/ecdsa.signGeneric", true},
                               {"crypto/ecdsa.Sign", true},
                               {"crypto/ecdsa.(*PrivateKey).Sign", true}});
  ExpectResult(got, Bucket::kSignature, algo::kEcdsaP256, Phase::kOther);
}

TEST(ClassifyOperation, SpecificVersusGenericEntries) {
  EXPECT_TRUE(IsSpecificOperation(Family::kOpenSSL, "ecdsa_sign"));
  EXPECT_TRUE(IsSpecificOperation(Family::kOpenSSL, "ECDSA_do_sign"));
  EXPECT_TRUE(IsSpecificOperation(Family::kOpenSSL, "RSA_private_encrypt"));
  EXPECT_TRUE(IsSpecificOperation(Family::kBoringSSL, "X25519"));
  EXPECT_TRUE(IsSpecificOperation(Family::kGo, "crypto/ecdsa.Sign"));
  EXPECT_FALSE(IsSpecificOperation(Family::kOpenSSL, "EVP_PKEY_sign"));
  EXPECT_FALSE(IsSpecificOperation(Family::kOpenSSL, "EVP_EncryptUpdate"));
  EXPECT_FALSE(IsSpecificOperation(Family::kOpenSSL, "EVP_PKEY_derive"));
  EXPECT_FALSE(IsSpecificOperation(Family::kOpenSSL, "SSL_write"));  // not an operation at all
}

TEST(ClassifyOperation, EntryPointsFromTheIssue) {
  auto op = [](Family f, std::string_view n) { return ClassifyOperation(f, n); };
  ASSERT_TRUE(op(Family::kOpenSSL, "RSA_sign"));
  EXPECT_EQ(op(Family::kOpenSSL, "RSA_sign")->algorithm, algo::kRsa);
  EXPECT_EQ(op(Family::kOpenSSL, "RSA_private_encrypt")->algorithm, algo::kRsa);
  EXPECT_EQ(op(Family::kOpenSSL, "ECDSA_do_sign")->bucket, Bucket::kSignature);
  EXPECT_EQ(op(Family::kOpenSSL, "ECDSA_do_sign")->algorithm, algo::kUnknown);  // curve unknown
  EXPECT_EQ(op(Family::kBoringSSL, "X25519")->algorithm, algo::kX25519);
  EXPECT_EQ(op(Family::kBoringSSL, "X25519")->bucket, Bucket::kKeyExchange);
  EXPECT_EQ(op(Family::kOpenSSL, "EVP_PKEY_derive_set_peer_ex")->bucket, Bucket::kKeyExchange);
  EXPECT_EQ(op(Family::kOpenSSL, "EVP_PKEY_generate")->bucket, Bucket::kKeyExchange);
  EXPECT_EQ(op(Family::kOpenSSL, "EVP_DecryptUpdate")->bucket, Bucket::kCipher);
  EXPECT_EQ(op(Family::kOpenSSL, "EVP_MAC_final")->bucket, Bucket::kHash);
  EXPECT_EQ(op(Family::kOpenSSL, "tls1_PRF.constprop.0")->bucket, Bucket::kHash);
  EXPECT_EQ(op(Family::kOpenSSL, "EVP_DigestSignFinal@@OPENSSL_3.0.0")->bucket, Bucket::kSignature);
  EXPECT_EQ(op(Family::kGo, "crypto/ecdsa.Sign")->algorithm, algo::kUnknown);
  EXPECT_EQ(op(Family::kGo, "crypto/rsa.VerifyPSS")->algorithm, algo::kRsa);
  EXPECT_EQ(op(Family::kGo, "crypto/rsa.DecryptPKCS1v15SessionKey")->bucket, Bucket::kKeyExchange);
  EXPECT_EQ(op(Family::kGo, "vendor/golang.org/x/crypto/curve25519.X25519")->algorithm, algo::kX25519);
  EXPECT_EQ(op(Family::kGo, "crypto/internal/mlkem768.Decapsulate")->algorithm, algo::kMlKem);
  EXPECT_EQ(op(Family::kGo, "crypto/tls.(*halfConn).encrypt")->bucket, Bucket::kCipher);
  EXPECT_EQ(op(Family::kGo, "crypto/tls.prf12.func1")->bucket, Bucket::kHash);
  EXPECT_FALSE(op(Family::kGo, "crypto/tls.(*Conn).Handshake"));
  EXPECT_FALSE(op(Family::kOpenSSL, "SSL_do_handshake"));
  EXPECT_FALSE(op(Family::kOpenSSL, "aesni_gcm_encrypt"));  // a primitive, not an entry point
  // C++ outside a TLS namespace never matches.
  EXPECT_FALSE(op(Family::kBoringSSL, "_ZN4node6crypto4Sign10SignFinalEv"));
  EXPECT_FALSE(op(Family::kBoringSSL, "node::crypto::ECDH::ComputeSecret(v8::FunctionCallbackInfo<v8::Value> const&)"));
  // Families are kept apart.
  EXPECT_FALSE(op(Family::kGo, "EVP_DigestSign"));
  EXPECT_FALSE(op(Family::kOpenSSL, "crypto/ecdsa.Sign"));
}

TEST(ClassifyPhaseEntry, PublicApiAndStateMachine) {
  auto ph = [](Family f, std::string_view n) { return ClassifyPhaseEntry(f, n); };
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_do_handshake"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_accept"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_connect@@OPENSSL_3.0.0"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kOpenSSL, "ossl_statem_accept"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kOpenSSL, "state_machine"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_read_ex"), Phase::kRecord);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_write"), Phase::kRecord);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_peek"), Phase::kRecord);
  EXPECT_EQ(ph(Family::kOpenSSL, "SSL_sendfile"), Phase::kRecord);
  EXPECT_FALSE(ph(Family::kOpenSSL, "SSL_new"));
  EXPECT_FALSE(ph(Family::kOpenSSL, "SSL_CTX_use_certificate"));
  EXPECT_EQ(ph(Family::kBoringSSL, "_ZN4bssl17ssl_run_handshakeEPNS_13SSL_HANDSHAKEEPb"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kBoringSSL, "bssl::ssl_run_handshake(bssl::SSL_HANDSHAKE*, bool*)"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*Conn).Handshake"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*Conn).HandshakeContext"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*Conn).serverHandshake-fm"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*clientHandshakeStateTLS13).handshake"), Phase::kHandshake);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*Conn).Read"), Phase::kRecord);
  EXPECT_EQ(ph(Family::kGo, "crypto/tls.(*Conn).Write"), Phase::kRecord);
  EXPECT_FALSE(ph(Family::kGo, "crypto/tls.(*Conn).ConnectionState"));
}

// ---- Table hygiene

// Every operation row names TLS library code: an exact or prefix pattern
// passes the library gate, so the operation table cannot widen what is TLS.
// The exceptions are library internals too generic for the gate; a static
// link's layout keeps them (agent/symbols/object_layout.h), a shared
// library's file is TLS code throughout.
TEST(ClassifyTables, OperationPatternsAreTlsLibraryNames) {
  const std::set<std::string_view> internals = {"int_ctx_new"};
  for (const auto& r : rules::Operations()) {
    if (r.match == rules::Match::kContains) continue;  // C++ class names: gated by namespace
    if (internals.contains(r.pattern)) {
      EXPECT_FALSE(IsTlsSymbol(r.pattern)) << r.pattern << " passes the gate now: drop it from `internals`";
      continue;
    }
    // BoringSSL's libssl functions are C++ in namespace bssl.
    const std::string cxx = "bssl::" + std::string(r.pattern) + "()";
    EXPECT_TRUE(IsTlsSymbol(r.pattern) || (r.families == rules::kB && IsTlsSymbol(cxx))) << r.pattern;
  }
}

TEST(ClassifyTables, NoOperationRowIsShadowedByAnEarlierOne) {
  const auto ops = rules::Operations();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].match == rules::Match::kContains) continue;
    auto got = ClassifyOperation((ops[i].families & rules::kG)   ? Family::kGo
                                 : (ops[i].families & rules::kO) ? Family::kOpenSSL
                                                                 : Family::kBoringSSL,
                                 ops[i].pattern);
    ASSERT_TRUE(got) << ops[i].pattern;
    EXPECT_EQ(got->bucket, ops[i].bucket) << ops[i].pattern << " is taken by an earlier row";
  }
}

TEST(ClassifyTables, PhaseRowsAreReachable) {
  for (const auto& r : rules::PhaseEntries()) {
    if (r.match == rules::Match::kContains) continue;
    Family f = (r.families & rules::kG)   ? Family::kGo
               : (r.families & rules::kO) ? Family::kOpenSSL
                                          : Family::kBoringSSL;
    EXPECT_EQ(ClassifyPhaseEntry(f, r.pattern), r.phase) << r.pattern;
  }
}

// Cheap enough to run once per unique stack: a 40-frame stack well under
// 100 us on any machine this runs on (bench/README.md has the figure).
TEST(ClassifyStack, IsCheap) {
  const auto cases = ReadStacks("stacks_openssl3.txt");
  ASSERT_FALSE(cases.empty());
  std::vector<std::vector<FrameInfo>> stacks;
  for (const auto& c : cases) stacks.push_back(c.Frames());
  const auto start = std::chrono::steady_clock::now();
  int n = 0;
  for (int rep = 0; rep < 50; ++rep) {
    for (const auto& s : stacks) {
      n += ClassifyStack(s).tls ? 1 : 0;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                    (50.0 * static_cast<double>(stacks.size()));
  EXPECT_GT(n, 0);
  // 500 us in the release build; kSanitizerTimeFactor times that under ASan (common/sanitizer.h).
  const double budget = 500.0 * kSanitizerTimeFactor;
  EXPECT_LT(us, budget) << "per stack";
  std::printf("ClassifyStack: %.1f us per stack (%zu real stacks), budget %.0f us%s\n", us, stacks.size(), budget,
              kAddressSanitizer ? " (ASan build: the release budget times kSanitizerTimeFactor)" : "");
}

}  // namespace
}  // namespace tlsprof::classify
