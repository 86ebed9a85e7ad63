// BoringSSL helpers shared by the BoringSSL workload and tests
// (workloads/boringssl-server, agent/usage/boringssl_plan_test): a key and
// a self-signed certificate made in-process, and the error queue as text.
// Header-only; include it only where BoringSSL's headers come before
// OpenSSL's on the include path (it checks OPENSSL_IS_BORINGSSL).
#pragma once

#include <openssl/base.h>
#ifndef OPENSSL_IS_BORINGSSL
#error "BoringSSL headers expected (put /usr/include/android first on the include path)"
#endif

#include <openssl/bn.h>
#include <openssl/ec_key.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/nid.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include <string>

namespace tlsprof::workload {

// Drains this thread's error queue into one string, each entry preceded by
// a space (empty if the queue was empty).
inline std::string BoringSslErrors() {
  std::string errors;
  while (const uint32_t e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    errors += " ";
    errors += buf;
  }
  return errors;
}

// An RSA-2048 ("rsa") or ECDSA P-256 (anything else) key; null on failure.
inline bssl::UniquePtr<EVP_PKEY> MakeBoringSslKey(const std::string& kind) {
  bssl::UniquePtr<EVP_PKEY> pkey(EVP_PKEY_new());
  if (!pkey) return nullptr;
  if (kind == "rsa") {
    bssl::UniquePtr<RSA> rsa(RSA_new());
    bssl::UniquePtr<BIGNUM> e(BN_new());
    if (!rsa || !e || BN_set_word(e.get(), RSA_F4) != 1 ||
        RSA_generate_key_ex(rsa.get(), 2048, e.get(), nullptr) != 1 || EVP_PKEY_set1_RSA(pkey.get(), rsa.get()) != 1)
      return nullptr;
    return pkey;
  }
  bssl::UniquePtr<EC_KEY> ec(EC_KEY_new_by_curve_name(NID_X9_62_prime256v1));
  if (!ec || EC_KEY_generate_key(ec.get()) != 1 || EVP_PKEY_set1_EC_KEY(pkey.get(), ec.get()) != 1) return nullptr;
  return pkey;
}

// A self-signed certificate for `pkey` with CN `cn`, valid from an hour ago
// for a week; null on failure.
inline bssl::UniquePtr<X509> MakeBoringSslCertificate(EVP_PKEY* pkey, const std::string& cn) {
  bssl::UniquePtr<X509> cert(X509_new());
  if (!cert || X509_set_version(cert.get(), X509_VERSION_3) != 1 ||
      ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7 * 24 * 3600) == nullptr)
    return nullptr;
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const uint8_t*>(cn.c_str()), -1, -1, 0) !=
          1 ||
      X509_set_issuer_name(cert.get(), name) != 1 || X509_set_pubkey(cert.get(), pkey) != 1 ||
      X509_sign(cert.get(), pkey, EVP_sha256()) == 0)
    return nullptr;
  return cert;
}

}  // namespace tlsprof::workload
