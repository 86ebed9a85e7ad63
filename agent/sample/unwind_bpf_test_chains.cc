// Compiled with -fomit-frame-pointer (see CMakeLists.txt): RBP is a general
// register here and only the .eh_frame rows say where each return address is.
// Each frame has a different size, so wrong CFA offsets cannot go unnoticed.
#include "agent/sample/unwind_bpf_test_chains.h"

#include <openssl/evp.h>

#include <vector>

volatile int tlsprof_chain_stop = 0;

namespace {
template <int N>
inline uint64_t Use(volatile uint64_t* sink) {
  volatile uint64_t pad[N];
  for (int i = 0; i < N; ++i) pad[i] = *sink + static_cast<uint64_t>(i);
  return pad[N - 1];
}
}  // namespace

extern "C" {
__attribute__((noinline)) uint64_t tlsprof_dw_leaf(volatile uint64_t* sink) {
  uint64_t r = Use<3>(sink);
  while (tlsprof_chain_stop == 0) *sink = *sink + 1;
  return r;
}
__attribute__((noinline)) uint64_t tlsprof_dw_chain5(volatile uint64_t* sink) {
  return tlsprof_dw_leaf(sink) + Use<5>(sink);
}
__attribute__((noinline)) uint64_t tlsprof_dw_chain4(volatile uint64_t* sink) {
  return tlsprof_dw_chain5(sink) + Use<9>(sink);
}
__attribute__((noinline)) uint64_t tlsprof_dw_chain3(volatile uint64_t* sink) {
  return tlsprof_dw_chain4(sink) + Use<17>(sink);
}
__attribute__((noinline)) uint64_t tlsprof_dw_chain2(volatile uint64_t* sink) {
  return tlsprof_dw_chain3(sink) + Use<2>(sink);
}
__attribute__((noinline)) uint64_t tlsprof_dw_chain1(volatile uint64_t* sink) {
  return tlsprof_dw_chain2(sink) + Use<33>(sink);
}
__attribute__((noinline)) uint64_t tlsprof_gcm_loop(volatile uint64_t* sink) {
  std::vector<unsigned char> in(16 * 1024, 0x5a), out(in.size() + 32);
  const unsigned char key[16] = {1}, iv[12] = {2};
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (!ctx || EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key, iv) != 1) return 0;
  int len = 0;
  while (tlsprof_chain_stop == 0) {
    if (EVP_EncryptUpdate(ctx, out.data(), &len, in.data(), static_cast<int>(in.size())) != 1) break;
    *sink = *sink + out[static_cast<size_t>(len) - 1];
  }
  EVP_CIPHER_CTX_free(ctx);
  return *sink;
}
}
