// OpenSSL helpers shared by the C++ workloads: owning pointers for OpenSSL
// objects and error-queue reporting. Header-only; a program pays (and links)
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

}  // namespace tlsprof::workload
