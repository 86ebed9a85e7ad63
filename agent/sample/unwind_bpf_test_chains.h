// Call chains for unwind_bpf_test: a child process spins in the leaf of one
// of them while the BPF sampler unwinds it. extern "C" and exported (the test
// links with ENABLE_EXPORTS) so dladdr() names the frames.
#pragma once

#include <cstdint>

extern "C" {
// Built with -fno-omit-frame-pointer (in unwind_bpf_test.cc): RBP chains.
uint64_t tlsprof_fp_chain1(volatile uint64_t* sink);
uint64_t tlsprof_fp_chain2(volatile uint64_t* sink);
uint64_t tlsprof_fp_chain3(volatile uint64_t* sink);
uint64_t tlsprof_fp_chain4(volatile uint64_t* sink);
uint64_t tlsprof_fp_chain5(volatile uint64_t* sink);
uint64_t tlsprof_fp_leaf(volatile uint64_t* sink);
// Built with -fomit-frame-pointer (in unwind_bpf_test_chains.cc): only the
// DWARF CFI describes these frames; each has its own stack size.
uint64_t tlsprof_dw_chain1(volatile uint64_t* sink);
uint64_t tlsprof_dw_chain2(volatile uint64_t* sink);
uint64_t tlsprof_dw_chain3(volatile uint64_t* sink);
uint64_t tlsprof_dw_chain4(volatile uint64_t* sink);
uint64_t tlsprof_dw_chain5(volatile uint64_t* sink);
uint64_t tlsprof_dw_leaf(volatile uint64_t* sink);
// AES-128-GCM EVP_EncryptUpdate on 16 KiB buffers through the shared
// libcrypto, forever (while tlsprof_chain_stop is zero); without frame
// pointers. Its stack passes perlasm's aesni_gcm_encrypt (CFA = rax + 8).
uint64_t tlsprof_gcm_loop(volatile uint64_t* sink);
// Never set: the leaves spin while it is zero (not provably infinite, so the
// compiler keeps ordinary calls and returns).
extern volatile int tlsprof_chain_stop;
}
