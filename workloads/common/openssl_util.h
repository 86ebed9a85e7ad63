// OpenSSL helpers shared by the C++ workloads: owning pointers for OpenSSL
// objects, error-queue reporting, keys and self-signed certificates. Header-only; a program pays (and links)
// only for the aliases it uses, so the libcrypto-only ground truth can include
// it too.
#pragma once

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdio>
#include <memory>
#include <string>

namespace tlsprof::workload {

// Deleter that calls OpenSSL's `Free` (EVP_PKEY_free, SSL_free, ...).
template <auto Free>
struct OpenSslDeleter {
  template <class T>
  void operator()(T* p) const {
    Free(p);
  }
};

// unique_ptr that frees a T with `Free`.
template <class T, auto Free>
using OpenSslPtr = std::unique_ptr<T, OpenSslDeleter<Free>>;

// libcrypto
using Pkey = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using PkeyCtx = OpenSslPtr<EVP_PKEY_CTX, EVP_PKEY_CTX_free>;
using CipherCtx = OpenSslPtr<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free>;
using MdCtx = OpenSslPtr<EVP_MD_CTX, EVP_MD_CTX_free>;
using Cipher = OpenSslPtr<EVP_CIPHER, EVP_CIPHER_free>;
using Md = OpenSslPtr<EVP_MD, EVP_MD_free>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
// libssl
using SslCtx = OpenSslPtr<SSL_CTX, SSL_CTX_free>;
using Ssl = OpenSslPtr<SSL, SSL_free>;
using Session = OpenSslPtr<SSL_SESSION, SSL_SESSION_free>;

// Drains this thread's OpenSSL error queue into one string, each entry
// preceded by a space (empty if the queue was empty).
inline std::string OpenSslErrors() {
  std::string s;
  unsigned long e = 0;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    s += " ";
    s += buf;
  }
  return s;
}

// Prints "<program>: <what> failed: <OpenSSL's error queue>" to stderr and
// returns false, so setup code can write `if (!x) return Fail("...")`.
inline bool ReportOpenSslFailure(const char* program, const std::string& what) {
  std::fprintf(stderr, "%s: %s failed:%s\n", program, what.c_str(), OpenSslErrors().c_str());
  return false;
}

// An RSA-2048 (`rsa`) or ECDSA P-256 (otherwise) key; null on failure.
inline Pkey MakeOpenSslKey(bool rsa) { return Pkey(rsa ? EVP_RSA_gen(2048) : EVP_EC_gen("P-256")); }

// A self-signed certificate for `key` with CN `cn`, valid from an hour ago
// for a week; null on failure.
inline X509Ptr MakeOpenSslCertificate(EVP_PKEY* key, const char* cn) {
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1 || ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7 * 24 * 3600) == nullptr)
    return nullptr;
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0) !=
          1 ||
      X509_set_issuer_name(cert.get(), name) != 1 || X509_set_pubkey(cert.get(), key) != 1 ||
      X509_sign(cert.get(), key, EVP_sha256()) <= 0)
    return nullptr;
  return cert;
}

}  // namespace tlsprof::workload
