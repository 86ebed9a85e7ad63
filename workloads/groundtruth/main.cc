// tlsprof-groundtruth (static libcrypto.a) and tlsprof-groundtruth-shared
// (Debian's stripped libcrypto.so.3): a process whose crypto CPU split is
// known, on OpenSSL 3. Built against OpenSSL 3.5 (inside the Debian 13 root,
// tests/integration/trixie.py) it also measures ML-KEM-768 and ML-DSA-65.
//
// This file holds only the OpenSSL primitives, one closure per category.
// common/groundtruth_runner.cc does the rest: one worker thread runs short
// slices (default 20 ms of thread CPU) of one primitive at a time, picking
// next the category furthest below its target share, and measures each slice
// with CLOCK_THREAD_CPUTIME_ID. Keys, peers and buffers are made before the
// measured window; a warm-up runs the same mix unmeasured. At exit (duration
// or SIGTERM) it writes JSON with the CPU it measured per category, so a
// profile of the same window can be compared share by share.

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "groundtruth_runner.h"
#include "openssl_util.h"

#ifndef TLSPROF_GROUNDTRUTH_PROGRAM
#define TLSPROF_GROUNDTRUTH_PROGRAM "tlsprof-groundtruth"
#endif

namespace {

constexpr size_t kBufferBytes = tlsprof::workload::kGroundTruthBufferBytes;
constexpr int kPeerKeys = 64;

using tlsprof::workload::Cipher;
using tlsprof::workload::CipherCtx;
using tlsprof::workload::Md;
using tlsprof::workload::MdCtx;
using tlsprof::workload::Pkey;
using tlsprof::workload::PkeyCtx;

// Prints OpenSSL's error queue after `what` and returns false, so setup code
// can write `if (!x) return Fail("...")`.
bool Fail(const std::string& what) {
  return tlsprof::workload::ReportOpenSslFailure(TLSPROF_GROUNDTRUTH_PROGRAM, what);
}

Pkey Keygen(const char* type, const char* group = nullptr, unsigned rsa_bits = 0) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0) return nullptr;
  if (group != nullptr && EVP_PKEY_CTX_set_group_name(ctx.get(), group) <= 0) return nullptr;
  if (rsa_bits != 0 && EVP_PKEY_CTX_set_rsa_keygen_bits(ctx.get(), static_cast<int>(rsa_bits)) <= 0) return nullptr;
  EVP_PKEY* key = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &key) <= 0) return nullptr;
  return Pkey(key);
}

// State behind the category closures; everything is allocated in Setup().
struct Primitives {
  std::vector<unsigned char> in = std::vector<unsigned char>(kBufferBytes);
  std::vector<unsigned char> out = std::vector<unsigned char>(kBufferBytes + 64);
  unsigned char key[32] = {};
  unsigned char iv[16] = {};
  unsigned long long counter = 0;
  Cipher aes_gcm, chacha, aes_cbc;
  CipherCtx gcm_ctx, chacha_ctx, cbc_ctx;
  Md sha256, sha1;
  MdCtx md_ctx;
  Pkey rsa_key, ecdsa_key;
  PkeyCtx rsa_sign_ctx, ecdsa_sign_ctx;
  unsigned char digest[32] = {};
  unsigned char sig[512] = {};
  Pkey x25519_key, p256_key;
  PkeyCtx x25519_ctx, p256_ctx;
  std::vector<Pkey> x25519_peers, p256_peers;
  unsigned char secret[64] = {};
  size_t peer_index = 0;

  // AEAD seal of one 16 KiB record with a fresh nonce, as a TLS record does.
  bool Seal(EVP_CIPHER_CTX* ctx) {
    ++counter;
    std::memcpy(iv + 4, &counter, sizeof counter);
    int len = 0;
    if (EVP_EncryptInit_ex2(ctx, nullptr, nullptr, iv, nullptr) <= 0) return false;
    if (EVP_EncryptUpdate(ctx, nullptr, &len, iv, 13) <= 0) return false;  // AAD
    if (EVP_EncryptUpdate(ctx, out.data(), &len, in.data(), static_cast<int>(in.size())) <= 0) return false;
    if (EVP_EncryptFinal_ex(ctx, out.data() + len, &len) <= 0) return false;
    unsigned char tag[16];
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) > 0;
  }

  bool CbcEncrypt() {
    // The context keeps chaining across calls, like a CBC record stream.
    int len = 0;
    return EVP_EncryptUpdate(cbc_ctx.get(), out.data(), &len, in.data(), static_cast<int>(in.size())) > 0;
  }

  bool Digest(const EVP_MD* md) {
    unsigned int len = 0;
    return EVP_DigestInit_ex2(md_ctx.get(), md, nullptr) > 0 &&
           EVP_DigestUpdate(md_ctx.get(), in.data(), in.size()) > 0 &&
           EVP_DigestFinal_ex(md_ctx.get(), out.data(), &len) > 0;
  }

  bool Sign(EVP_PKEY_CTX* ctx) {
    size_t siglen = sizeof sig;
    digest[0]++;
    return EVP_PKEY_sign(ctx, sig, &siglen, digest, sizeof digest) > 0;
  }

  bool Derive(EVP_PKEY_CTX* ctx, const std::vector<Pkey>& peers) {
    peer_index = (peer_index + 1) % peers.size();
    size_t len = sizeof secret;
    return EVP_PKEY_derive_set_peer(ctx, peers[peer_index].get()) > 0 && EVP_PKEY_derive(ctx, secret, &len) > 0;
  }

  // The fresh variants: the whole API sequence of a caller that keeps no
  // context, through the legacy EVP_aes_*()/EVP_sha*() objects, so each init
  // also does the implicit provider fetch.
  bool SealFresh(const EVP_CIPHER* cipher) {
    CipherCtx ctx(EVP_CIPHER_CTX_new());
    return ctx && EVP_EncryptInit_ex(ctx.get(), cipher, nullptr, key, iv) > 0 && Seal(ctx.get());
  }

  bool CbcEncryptFresh() {
    CipherCtx ctx(EVP_CIPHER_CTX_new());
    int len = 0, final_len = 0;
    return ctx && EVP_EncryptInit_ex(ctx.get(), EVP_aes_128_cbc(), nullptr, key, iv) > 0 &&
           EVP_CIPHER_CTX_set_padding(ctx.get(), 0) > 0 &&
           EVP_EncryptUpdate(ctx.get(), out.data(), &len, in.data(), static_cast<int>(in.size())) > 0 &&
           EVP_EncryptFinal_ex(ctx.get(), out.data() + len, &final_len) > 0;
  }

  bool DigestFresh(const EVP_MD* md) {
    MdCtx ctx(EVP_MD_CTX_new());
    unsigned int len = 0;
    return ctx && EVP_DigestInit_ex(ctx.get(), md, nullptr) > 0 &&
           EVP_DigestUpdate(ctx.get(), in.data(), in.size()) > 0 && EVP_DigestFinal_ex(ctx.get(), out.data(), &len) > 0;
  }

  bool SignFresh(EVP_PKEY* pkey, bool rsa) {
    PkeyCtx ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, pkey, nullptr));
    if (!ctx || EVP_PKEY_sign_init(ctx.get()) <= 0) return false;
    if (rsa && EVP_PKEY_CTX_set_rsa_padding(ctx.get(), RSA_PKCS1_PSS_PADDING) <= 0) return false;
    return EVP_PKEY_CTX_set_signature_md(ctx.get(), EVP_sha256()) > 0 && Sign(ctx.get());
  }

  bool DeriveFresh(EVP_PKEY* pkey, const std::vector<Pkey>& peers) {
    PkeyCtx ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, pkey, nullptr));
    return ctx && EVP_PKEY_derive_init(ctx.get()) > 0 && Derive(ctx.get(), peers);
  }

#if OPENSSL_VERSION_NUMBER >= 0x30500000L
  // OpenSSL 3.5's post-quantum algorithms (Debian 13's libssl-dev).
  Pkey ml_kem_peer, ml_dsa_key;
  PkeyCtx ml_kem_keygen_ctx, ml_kem_encap_ctx, ml_dsa_sign_ctx;
  EVP_SIGNATURE* ml_dsa = nullptr;
  unsigned char ml_kem_ct[1568] = {}, ml_kem_secret[32] = {};
  std::vector<unsigned char> ml_dsa_sig = std::vector<unsigned char>(4627);

  // A hybrid handshake's ML-KEM-768 share of work: the client's keygen and
  // decapsulation, the server's encapsulation to that key.
  bool MlKem(bool fresh) {
    EVP_PKEY* key = nullptr;
    if (fresh) {
      PkeyCtx gen(EVP_PKEY_CTX_new_from_name(nullptr, "ML-KEM-768", nullptr));
      if (!gen || EVP_PKEY_keygen_init(gen.get()) <= 0 || EVP_PKEY_keygen(gen.get(), &key) <= 0) return false;
    } else if (EVP_PKEY_keygen(ml_kem_keygen_ctx.get(), &key) <= 0) {
      return false;
    }
    Pkey client(key);
    size_t ct_len = sizeof ml_kem_ct, secret_len = sizeof ml_kem_secret;
    PkeyCtx encap(EVP_PKEY_CTX_new_from_pkey(nullptr, client.get(), nullptr));
    if (!encap || EVP_PKEY_encapsulate_init(encap.get(), nullptr) <= 0 ||
        EVP_PKEY_encapsulate(encap.get(), ml_kem_ct, &ct_len, ml_kem_secret, &secret_len) <= 0)
      return false;
    PkeyCtx decap(EVP_PKEY_CTX_new_from_pkey(nullptr, client.get(), nullptr));
    return decap && EVP_PKEY_decapsulate_init(decap.get(), nullptr) > 0 &&
           EVP_PKEY_decapsulate(decap.get(), ml_kem_secret, &secret_len, ml_kem_ct, ct_len) > 0;
  }

  bool MlDsaSign(EVP_PKEY_CTX* ctx) {
    size_t len = ml_dsa_sig.size();
    digest[0]++;
    return EVP_PKEY_sign(ctx, ml_dsa_sig.data(), &len, digest, sizeof digest) > 0;
  }

  bool MlDsaSignFresh() {
    PkeyCtx ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, ml_dsa_key.get(), nullptr));
    return ctx && EVP_PKEY_sign_message_init(ctx.get(), ml_dsa, nullptr) > 0 && MlDsaSign(ctx.get());
  }
#endif
};

bool SetupCipher(Cipher& cipher, CipherCtx& ctx, const char* name, const unsigned char* key, const unsigned char* iv) {
  cipher.reset(EVP_CIPHER_fetch(nullptr, name, nullptr));
  ctx.reset(EVP_CIPHER_CTX_new());
  if (!cipher || !ctx) return Fail(std::string("fetching ") + name);
  if (EVP_EncryptInit_ex2(ctx.get(), cipher.get(), key, iv, nullptr) <= 0)
    return Fail(std::string("initialising ") + name);
  return true;
}

bool SetupSign(Pkey& key, PkeyCtx& ctx, bool rsa) {
  key = rsa ? Keygen("RSA", nullptr, 2048) : Keygen("EC", "P-256");
  if (!key) return Fail(rsa ? "RSA-2048 keygen" : "P-256 keygen");
  ctx.reset(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!ctx || EVP_PKEY_sign_init(ctx.get()) <= 0) return Fail("sign init");
  if (rsa && EVP_PKEY_CTX_set_rsa_padding(ctx.get(), RSA_PKCS1_PSS_PADDING) <= 0)
    return Fail("RSA PSS padding");  // TLS 1.3 signs with rsa_pss_rsae_*
  if (EVP_PKEY_CTX_set_signature_md(ctx.get(), EVP_sha256()) <= 0) return Fail("signature md");
  return true;
}

bool SetupDerive(Pkey& key, PkeyCtx& ctx, std::vector<Pkey>& peers, bool x25519) {
  auto gen = [&] { return x25519 ? Keygen("X25519") : Keygen("EC", "P-256"); };
  key = gen();
  if (!key) return Fail("key-exchange keygen");
  for (int i = 0; i < kPeerKeys; ++i) {
    // Only the public half is needed by the deriving side.
    Pkey peer = gen();
    if (!peer) return Fail("peer keygen");
    peers.push_back(std::move(peer));
  }
  ctx.reset(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0) return Fail("derive init");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Primitives p;
  tlsprof::workload::GroundTruthSpec spec;
  spec.program = TLSPROF_GROUNDTRUTH_PROGRAM;
  spec.library = "openssl";
  spec.report_failure = [](const std::string& what) { Fail(what); };
  spec.categories = tlsprof::workload::StandardCategories({
    .aes_gcm = {[&] { return p.Seal(p.gcm_ctx.get()); }, [&] { return p.SealFresh(EVP_aes_128_gcm()); }},
    .chacha20_poly1305 = {[&] { return p.Seal(p.chacha_ctx.get()); },
                          [&] { return p.SealFresh(EVP_chacha20_poly1305()); }},
    .aes_cbc = {[&] { return p.CbcEncrypt(); }, [&] { return p.CbcEncryptFresh(); }},
    .sha256 = {[&] { return p.Digest(p.sha256.get()); }, [&] { return p.DigestFresh(EVP_sha256()); }},
    .sha1 = {[&] { return p.Digest(p.sha1.get()); }, [&] { return p.DigestFresh(EVP_sha1()); }},
    .rsa = {[&] { return p.Sign(p.rsa_sign_ctx.get()); }, [&] { return p.SignFresh(p.rsa_key.get(), true); }},
    .x25519 = {[&] { return p.Derive(p.x25519_ctx.get(), p.x25519_peers); },
               [&] { return p.DeriveFresh(p.x25519_key.get(), p.x25519_peers); }},
    .ecdsa_p256 = {[&] { return p.Sign(p.ecdsa_sign_ctx.get()); },
                   [&] { return p.SignFresh(p.ecdsa_key.get(), false); }},
    .ecdhe_p256 = {[&] { return p.Derive(p.p256_ctx.get(), p.p256_peers); },
                   [&] { return p.DeriveFresh(p.p256_key.get(), p.p256_peers); }},
#if OPENSSL_VERSION_NUMBER >= 0x30500000L
    .ml_kem_768 = {[&] { return p.MlKem(false); }, [&] { return p.MlKem(true); }},
    .ml_dsa_65 = {[&] { return p.MlDsaSign(p.ml_dsa_sign_ctx.get()); }, [&] { return p.MlDsaSignFresh(); }},
#else
    .ml_kem_768 = {},  // OpenSSL before 3.5: none
        .ml_dsa_65 = {},
#endif
  });
  spec.setup = [&](const auto& enabled) {
    if (RAND_bytes(p.in.data(), static_cast<int>(p.in.size())) <= 0 || RAND_bytes(p.key, 32) <= 0)
      return Fail("RAND_bytes");
    bool ok = SetupCipher(p.aes_gcm, p.gcm_ctx, "AES-128-GCM", p.key, p.iv) &&
              SetupCipher(p.chacha, p.chacha_ctx, "ChaCha20-Poly1305", p.key, p.iv) &&
              SetupCipher(p.aes_cbc, p.cbc_ctx, "AES-128-CBC", p.key, p.iv);
    if (ok) {
      EVP_CIPHER_CTX_set_padding(p.cbc_ctx.get(), 0);
      p.sha256.reset(EVP_MD_fetch(nullptr, "SHA2-256", nullptr));
      p.sha1.reset(EVP_MD_fetch(nullptr, "SHA1", nullptr));
      p.md_ctx.reset(EVP_MD_CTX_new());
      ok = (p.sha256 && p.sha1 && p.md_ctx) || Fail("fetching digests");
    }
    if (ok && enabled("rsa")) ok = SetupSign(p.rsa_key, p.rsa_sign_ctx, true);
    if (ok && enabled("ecdsa_p256")) ok = SetupSign(p.ecdsa_key, p.ecdsa_sign_ctx, false);
    if (ok && enabled("x25519")) ok = SetupDerive(p.x25519_key, p.x25519_ctx, p.x25519_peers, true);
    if (ok && enabled("ecdhe_p256")) ok = SetupDerive(p.p256_key, p.p256_ctx, p.p256_peers, false);
#if OPENSSL_VERSION_NUMBER >= 0x30500000L
    if (ok && enabled("ml_kem_768")) {
      p.ml_kem_keygen_ctx.reset(EVP_PKEY_CTX_new_from_name(nullptr, "ML-KEM-768", nullptr));
      ok = (p.ml_kem_keygen_ctx && EVP_PKEY_keygen_init(p.ml_kem_keygen_ctx.get()) > 0) || Fail("ML-KEM-768 keygen");
    }
    if (ok && enabled("ml_dsa_65")) {
      p.ml_dsa_key = Keygen("ML-DSA-65");
      p.ml_dsa = EVP_SIGNATURE_fetch(nullptr, "ML-DSA-65", nullptr);
      if (p.ml_dsa_key && p.ml_dsa)
        p.ml_dsa_sign_ctx.reset(EVP_PKEY_CTX_new_from_pkey(nullptr, p.ml_dsa_key.get(), nullptr));
      ok = (p.ml_dsa_sign_ctx && EVP_PKEY_sign_message_init(p.ml_dsa_sign_ctx.get(), p.ml_dsa, nullptr) > 0) ||
           Fail("ML-DSA-65 sign init");
    }
#endif
    return ok;
  };
  return tlsprof::workload::RunGroundTruth(argc, argv, std::move(spec));
}
