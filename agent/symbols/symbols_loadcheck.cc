// Loads one binary the way the agent does and prints load time, symbol counts
// and the RSS it cost. A manual check of the memory budget (node is ~95 MB
// with a full .symtab), not a test:
//   tlsprof-symbols-loadcheck /usr/bin/node [--all]
// Without --all only OpenSSL-looking names are kept, as the agent does for
// big statically linked binaries.
#include <fcntl.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "agent/common/fd.h"
#include "agent/symbols/binary_image.h"

namespace {

// VmRSS / VmHWM from /proc/self/status, in KiB.
long StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

bool IsTlsName(std::string_view n) {
  for (std::string_view p :
       {"OPENSSL_", "EVP_",     "ossl_",    "SSL_",     "ssl_",    "tls1_",        "tls13_", "aesni_",
        "aes_",     "gcm_",     "sha1_",    "sha256_",  "sha512_", "ecp_nistz256", "bn_",    "BN_",
        "RSA_",     "rsa_",     "ECDSA_",   "ecdsa_",   "EC_",     "ec_",          "x25519", "X25519",
        "ChaCha20", "chacha20", "Poly1305", "poly1305", "CRYPTO_"}) {
    if (n.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BINARY [--all]\n", argv[0]);
    return 2;
  }
  bool all = argc > 2 && std::string_view(argv[2]) == "--all";
  tlsprof::UniqueFd fd(open(argv[1], O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    std::perror(argv[1]);
    return 1;
  }
  tlsprof::symbols::LoadOptions options;
  if (!all) options.keep = IsTlsName;
  long rss_before = StatusKb("VmRSS:");
  long hwm_before = StatusKb("VmHWM:");
  auto t0 = std::chrono::steady_clock::now();
  auto image = tlsprof::symbols::LoadBinaryImage(fd.get(), argv[1], options);
  auto t1 = std::chrono::steady_clock::now();
  if (!image) {
    std::fprintf(stderr, "error: %s\n", image.error().message.c_str());
    return 1;
  }
  long rss_after = StatusKb("VmRSS:");
  long hwm_after = StatusKb("VmHWM:");
  const auto& img = **image;
  std::printf("%s: build-id %s, source %s, %llu function symbols seen, %zu kept, go=%d\n", argv[1],
              img.build_id.c_str(), std::string(tlsprof::symbols::SymbolSourceName(img.symbol_source)).c_str(),
              static_cast<unsigned long long>(img.symbols_seen), img.symbols.size(), img.is_go);
  std::printf("load time %.1f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
  std::printf("RSS before %ld KiB, after %ld KiB (+%ld), peak before %ld KiB, peak after %ld KiB (+%ld)\n", rss_before,
              rss_after, rss_after - rss_before, hwm_before, hwm_after, hwm_after - hwm_before);
  return 0;
}
