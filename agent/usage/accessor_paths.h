// DecodeAccessor: a field from every path through an accessor's code.
//
// BoringSSL's accessors are not the plain load chains DecodeLoadChain()
// (accessors.h) reads. They call each other: SSL_get_current_cipher() is
// `SSL_get_session(ssl)->cipher`, and SSL_get_session() asks SSL_in_init()
// which session to return. They branch on the handshake object:
// SSL_session_reused() is `s3->session_reused || SSL_in_early_data(ssl)`.
// And they read bit fields: SSL_is_server() is `ssl->server`, one bit.
//
// DecodeAccessor() runs the accessor's machine code symbolically from its
// first argument (rdi), into the functions it calls or jumps to (their code
// from AccessorContext::resolve), and forks at every branch on a value it
// read. It accepts the result only when the paths together say what one
// LoadChain says: the BPF walk (bpf/usage.h, struct field_path) reads the
// same value on every path, except where a pointer on the chain is NULL and
// the accessor returns 0 (the walk reads unknown there, as for
// DecodeLoadChain's NULL checks). Two shapes pass:
//   - every path that returns a read value returns the same one, and the
//     others return 0 because a pointer on its chain is NULL;
//   - every path returns 0 or 1 by one bit it tested: the field is that bit
//     (SSL_session_reused() at a completed handshake).
//
// `null_pointers` are facts about the moment the field is read: pointer
// chains known to be NULL then, which settle the branches on them; a path
// that loads through one would fault, so the accessor never takes it then,
// and it is dropped (BoringSSL 14's SSL_get_session() reads the handshake
// object only when there is no established session). At a
// completed BoringSSL handshake the handshake object is freed (ssl->s3->hs),
// so SSL_in_init() and SSL_in_early_data() return 0 and SSL_get_session() the
// established session (boringssl_plan.h).
//
// The instructions come decoded by capstone; only a small set is modelled:
// loads from a tracked pointer (mov, movzx), register moves and clears,
// mov/add/and/shr of immediates, test/testb/cmp-with-zero, sete/setne,
// je/jne/jmp, call, push, pop, ret, nops. Anything else on a path (a store, another jump condition, a call
// whose code is not given, an unknown instruction, too many paths or steps)
// gives nullopt: the field is unknown, never guessed.
//
// x86-64 only. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "agent/usage/accessors.h"
#include "agent/usage/elf_functions.h"

namespace tlsprof::usage {

struct AccessorContext {
  // Pointer chains (plain_pointer()) that are NULL when the field is read.
  std::vector<LoadChain> null_pointers;
  // The code at an address the accessor calls or jumps to outside its own
  // bytes (another function, a PLT stub resolved to its target, the rest of
  // a long function); nullptr when unknown. Unset: none is followed.
  std::function<const FunctionCode*(uint64_t vaddr)> resolve;
};

// The field the accessor at `code` returns from its first argument, or
// nullopt. `code.vaddr` must be the address its bytes run at (for relative
// jumps and calls).
std::optional<LoadChain> DecodeAccessor(const FunctionCode& code, const AccessorContext& context = {});

}  // namespace tlsprof::usage
