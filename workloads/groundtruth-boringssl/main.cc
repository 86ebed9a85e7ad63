// tlsprof-groundtruth-boringssl: the ground truth of tlsprof-groundtruth on
// BoringSSL, as Debian ships it (android-libboringssl: a stripped shared
// libcrypto.so.0, so the hot assembly has no symbols and only stack-aware
// attribution can name it).
//
// This file holds only the BoringSSL primitives, one closure per category,
// through BoringSSL's own APIs (EVP_AEAD, one-shot SHA256/SHA1, RSA_sign_pss_mgf1,
// X25519, ECDSA_sign, ECDH_compute_key) rather than OpenSSL-compatible EVP_PKEY
// paths, because those are what BoringSSL-based servers call.
// common/groundtruth_runner.cc does the scheduling, measuring and JSON, the
// same as for the OpenSSL variants.

// The include path must reach /usr/include/android before /usr/include;
// catch a build that picked up OpenSSL's headers instead.
#include <openssl/base.h>
#ifndef OPENSSL_IS_BORINGSSL
#error "BoringSSL headers expected (put /usr/include/android first on the include path)"
#endif

#include <openssl/aead.h>
#include <openssl/bn.h>
#include <openssl/cipher.h>
#include <openssl/curve25519.h>
#include <openssl/digest.h>
#include <openssl/ec.h>
#include <openssl/ec_key.h>
#include <openssl/ecdh.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/nid.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "boringssl_util.h"
#include "groundtruth_runner.h"

namespace {

constexpr char kProgram[] = "tlsprof-groundtruth-boringssl";
constexpr size_t kBufferBytes = tlsprof::workload::kGroundTruthBufferBytes;
constexpr int kPeerKeys = 64;

// Prints BoringSSL's error queue after `what` and returns false.
bool Fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s failed:%s\n", kProgram, what.c_str(), tlsprof::workload::BoringSslErrors().c_str());
  return false;
}

struct X25519Key {
  uint8_t pub[32];
  uint8_t priv[32];
};

// State behind the category closures; everything is allocated in Setup().
struct Primitives {
  std::vector<uint8_t> in = std::vector<uint8_t>(kBufferBytes);
  std::vector<uint8_t> out = std::vector<uint8_t>(kBufferBytes + 64);
  uint8_t key[32] = {};
  uint8_t nonce[12] = {};
  uint8_t iv[16] = {};
  unsigned long long counter = 0;
  bssl::ScopedEVP_AEAD_CTX gcm_ctx, chacha_ctx;
  bssl::ScopedEVP_CIPHER_CTX cbc_ctx;
  bssl::UniquePtr<RSA> rsa;
  bssl::UniquePtr<EC_KEY> ecdsa_key;
  bssl::UniquePtr<EVP_PKEY> rsa_pkey, ecdsa_pkey, p256_pkey;  // the same keys, for the EVP_PKEY paths
  std::vector<bssl::UniquePtr<EVP_PKEY>> p256_peer_pkeys;
  uint8_t digest[32] = {};
  uint8_t sig[512] = {};
  X25519Key x25519_key{};
  std::vector<X25519Key> x25519_peers;
  bssl::UniquePtr<EC_KEY> p256_key;
  std::vector<bssl::UniquePtr<EC_KEY>> p256_peers;  // only the public points are used
  uint8_t secret[64] = {};
  size_t peer_index = 0;

  // AEAD seal of one 16 KiB record with a fresh nonce and 13-byte AAD, as a
  // TLS record does.
  bool Seal(const EVP_AEAD_CTX* ctx) {
    ++counter;
    std::memcpy(nonce + 4, &counter, sizeof counter);
    size_t len = 0;
    return EVP_AEAD_CTX_seal(ctx, out.data(), &len, out.size(), nonce, sizeof nonce, in.data(), in.size(), nonce, 13) ==
           1;
  }

  bool CbcEncrypt() {
    // The context keeps chaining across calls, like a CBC record stream.
    int len = 0;
    return EVP_EncryptUpdate(cbc_ctx.get(), out.data(), &len, in.data(), static_cast<int>(in.size())) == 1;
  }

  bool Sha256() { return SHA256(in.data(), in.size(), out.data()) != nullptr; }
  bool Sha1() { return SHA1(in.data(), in.size(), out.data()) != nullptr; }

  // RSA-2048 PSS/SHA-256 (salt = digest length), what TLS 1.3 signs with.
  bool RsaSign() {
    size_t len = 0;
    digest[0]++;
    return RSA_sign_pss_mgf1(rsa.get(), &len, sig, sizeof sig, digest, sizeof digest, EVP_sha256(), nullptr,
                             /*salt_len=*/-1) == 1;
  }

  bool EcdsaSign() {
    unsigned int len = 0;
    digest[0]++;
    return ECDSA_sign(0, digest, sizeof digest, sig, &len, ecdsa_key.get()) == 1;
  }

  bool X25519Derive() {
    peer_index = (peer_index + 1) % x25519_peers.size();
    return X25519(secret, x25519_key.priv, x25519_peers[peer_index].pub) == 1;
  }

  bool P256Derive() {
    peer_index = (peer_index + 1) % p256_peers.size();
    return ECDH_compute_key(secret, 32, EC_KEY_get0_public_key(p256_peers[peer_index].get()), p256_key.get(),
                            nullptr) == 32;
  }

  // The fresh variants: the whole API sequence of a caller that keeps no
  // context (an AEAD context made and freed around each seal, the EVP
  // cipher, digest and EVP_PKEY paths with their contexts), as BoringSSL's
  // own TLS code signs and derives through EVP_PKEY.
  bool SealFresh(const EVP_AEAD* aead, size_t key_len) {
    bssl::UniquePtr<EVP_AEAD_CTX> ctx(EVP_AEAD_CTX_new(aead, key, key_len, EVP_AEAD_DEFAULT_TAG_LENGTH));
    return ctx && Seal(ctx.get());
  }

  bool CbcEncryptFresh() {
    bssl::ScopedEVP_CIPHER_CTX ctx;
    int len = 0, final_len = 0;
    return EVP_EncryptInit_ex(ctx.get(), EVP_aes_128_cbc(), nullptr, key, iv) == 1 &&
           EVP_CIPHER_CTX_set_padding(ctx.get(), 0) == 1 &&
           EVP_EncryptUpdate(ctx.get(), out.data(), &len, in.data(), static_cast<int>(in.size())) == 1 &&
           EVP_EncryptFinal_ex(ctx.get(), out.data() + len, &final_len) == 1;
  }

  bool DigestFresh(const EVP_MD* md) {
    bssl::ScopedEVP_MD_CTX ctx;
    unsigned int len = 0;
    return EVP_DigestInit_ex(ctx.get(), md, nullptr) == 1 && EVP_DigestUpdate(ctx.get(), in.data(), in.size()) == 1 &&
           EVP_DigestFinal_ex(ctx.get(), out.data(), &len) == 1;
  }

  bool SignFresh(EVP_PKEY* pkey, bool rsa_pss) {
    bssl::UniquePtr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new(pkey, nullptr));
    if (!ctx || EVP_PKEY_sign_init(ctx.get()) != 1) return false;
    if (rsa_pss && (EVP_PKEY_CTX_set_rsa_padding(ctx.get(), RSA_PKCS1_PSS_PADDING) != 1 ||
                    EVP_PKEY_CTX_set_rsa_pss_saltlen(ctx.get(), -1) != 1))
      return false;
    size_t len = sizeof sig;
    digest[0]++;
    return EVP_PKEY_CTX_set_signature_md(ctx.get(), EVP_sha256()) == 1 &&
           EVP_PKEY_sign(ctx.get(), sig, &len, digest, sizeof digest) == 1;
  }

  bool P256DeriveFresh() {
    peer_index = (peer_index + 1) % p256_peer_pkeys.size();
    bssl::UniquePtr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new(p256_pkey.get(), nullptr));
    size_t len = sizeof secret;
    return ctx && EVP_PKEY_derive_init(ctx.get()) == 1 &&
           EVP_PKEY_derive_set_peer(ctx.get(), p256_peer_pkeys[peer_index].get()) == 1 &&
           EVP_PKEY_derive(ctx.get(), secret, &len) == 1;
  }
};

// An EVP_PKEY holding (a reference to) `key`.
template <typename Key, int (*Set1)(EVP_PKEY*, Key*)>
bssl::UniquePtr<EVP_PKEY> WrapKey(Key* key) {
  bssl::UniquePtr<EVP_PKEY> pkey(EVP_PKEY_new());
  if (!pkey || Set1(pkey.get(), key) != 1) return nullptr;
  return pkey;
}

bssl::UniquePtr<EC_KEY> P256Keygen() {
  bssl::UniquePtr<EC_KEY> key(EC_KEY_new_by_curve_name(NID_X9_62_prime256v1));
  if (!key || EC_KEY_generate_key(key.get()) != 1) return nullptr;
  return key;
}

bool Setup(Primitives& p, const std::function<bool(std::string_view)>& enabled) {
  if (RAND_bytes(p.in.data(), p.in.size()) != 1 || RAND_bytes(p.key, sizeof p.key) != 1) return Fail("RAND_bytes");
  if (EVP_AEAD_CTX_init(p.gcm_ctx.get(), EVP_aead_aes_128_gcm(), p.key, 16, EVP_AEAD_DEFAULT_TAG_LENGTH, nullptr) != 1)
    return Fail("AES-128-GCM init");
  if (EVP_AEAD_CTX_init(p.chacha_ctx.get(), EVP_aead_chacha20_poly1305(), p.key, 32, EVP_AEAD_DEFAULT_TAG_LENGTH,
                        nullptr) != 1)
    return Fail("ChaCha20-Poly1305 init");
  if (EVP_EncryptInit_ex(p.cbc_ctx.get(), EVP_aes_128_cbc(), nullptr, p.key, p.iv) != 1)
    return Fail("AES-128-CBC init");
  EVP_CIPHER_CTX_set_padding(p.cbc_ctx.get(), 0);
  if (enabled("rsa")) {
    p.rsa.reset(RSA_new());
    bssl::UniquePtr<BIGNUM> e(BN_new());
    if (!p.rsa || !e || BN_set_word(e.get(), RSA_F4) != 1 ||
        RSA_generate_key_ex(p.rsa.get(), 2048, e.get(), nullptr) != 1)
      return Fail("RSA-2048 keygen");
    if (!(p.rsa_pkey = WrapKey<RSA, EVP_PKEY_set1_RSA>(p.rsa.get()))) return Fail("RSA EVP_PKEY");
  }
  if (enabled("ecdsa_p256")) {
    if (!(p.ecdsa_key = P256Keygen())) return Fail("P-256 keygen");
    if (!(p.ecdsa_pkey = WrapKey<EC_KEY, EVP_PKEY_set1_EC_KEY>(p.ecdsa_key.get()))) return Fail("P-256 EVP_PKEY");
  }
  if (enabled("x25519")) {
    X25519_keypair(p.x25519_key.pub, p.x25519_key.priv);
    p.x25519_peers.resize(kPeerKeys);
    for (auto& peer : p.x25519_peers) X25519_keypair(peer.pub, peer.priv);
  }
  if (enabled("ecdhe_p256")) {
    if (!(p.p256_key = P256Keygen())) return Fail("P-256 keygen");
    if (!(p.p256_pkey = WrapKey<EC_KEY, EVP_PKEY_set1_EC_KEY>(p.p256_key.get()))) return Fail("P-256 EVP_PKEY");
    for (int i = 0; i < kPeerKeys; ++i) {
      auto peer = P256Keygen();
      if (!peer) return Fail("P-256 peer keygen");
      auto peer_pkey = WrapKey<EC_KEY, EVP_PKEY_set1_EC_KEY>(peer.get());
      if (!peer_pkey) return Fail("P-256 peer EVP_PKEY");
      p.p256_peers.push_back(std::move(peer));
      p.p256_peer_pkeys.push_back(std::move(peer_pkey));
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Primitives p;
  tlsprof::workload::GroundTruthSpec spec;
  spec.program = kProgram;
  spec.library = "boringssl";
  spec.report_failure = [](const std::string& what) { Fail(what); };
  spec.categories = tlsprof::workload::StandardCategories({
      .aes_gcm = {[&] { return p.Seal(p.gcm_ctx.get()); }, [&] { return p.SealFresh(EVP_aead_aes_128_gcm(), 16); }},
      .chacha20_poly1305 = {[&] { return p.Seal(p.chacha_ctx.get()); },
                            [&] { return p.SealFresh(EVP_aead_chacha20_poly1305(), 32); }},
      .aes_cbc = {[&] { return p.CbcEncrypt(); }, [&] { return p.CbcEncryptFresh(); }},
      .sha256 = {[&] { return p.Sha256(); }, [&] { return p.DigestFresh(EVP_sha256()); }},
      .sha1 = {[&] { return p.Sha1(); }, [&] { return p.DigestFresh(EVP_sha1()); }},
      .rsa = {[&] { return p.RsaSign(); }, [&] { return p.SignFresh(p.rsa_pkey.get(), true); }},
      // X25519() takes raw keys: there is no context to make.
      .x25519 = {[&] { return p.X25519Derive(); }, [&] { return p.X25519Derive(); }},
      .ecdsa_p256 = {[&] { return p.EcdsaSign(); }, [&] { return p.SignFresh(p.ecdsa_pkey.get(), false); }},
      .ecdhe_p256 = {[&] { return p.P256Derive(); }, [&] { return p.P256DeriveFresh(); }},
      .ml_kem_768 = {},  // not measured on BoringSSL yet
      .ml_dsa_65 = {},
  });
  spec.setup = [&](const std::function<bool(std::string_view)>& enabled) { return Setup(p, enabled); };
  return tlsprof::workload::RunGroundTruth(argc, argv, std::move(spec));
}
