// Compiled with -fomit-frame-pointer (see CMakeLists.txt): RBP is a general
// register here and only the .eh_frame rows say where each return address is.
// Each frame has a different size, so wrong CFA offsets cannot go unnoticed.
#include "agent/sample/unwind_bpf_test_chains.h"

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
}
