// Accessors: where a library keeps a field, read off the library's own
// accessor function.
//
// OpenSSL's structs are opaque and their layout changes between releases,
// but the library exports one-line accessors for the fields the usage
// telemetry needs: SSL_version() is `return s->version`, SSL_get_privatekey()
// is `return s->cert ? s->cert->key->privatekey : NULL`. Compiled, each is a
// chain of loads from its first argument (rdi) ending in rax, e.g.
//   mov 0x898(%rdi),%rax; test %rax,%rax; je 1f; mov (%rax),%rax;
//   mov 0x8(%rax),%rax; 1: ret
// DecodeLoadChain() reads that chain (offsets and the last load's width), so
// the BPF probes (bpf/usage.h, struct field_path) can follow it in the
// profiled process without a per-version offset table.
// OpenSSL 3.2+ (QUIC) dispatches on the object's type first: SSL * may be a
// QUIC object, and an accessor reads the field only from a TLS connection,
// whose ssl_st.type (the 32-bit word at +0) is 0:
//   test %rdi,%rdi; je <trap>; mov (%rdi),%eax; test %eax,%eax; je 1f;
//   <QUIC path: calls>; 1: mov 0x48(%rdi),%eax; ret
// That chain is the one after the je, with a type guard: the walk reads the
// field only where the type word is 0 (else unknown). A NULL test may jump
// to a trap (ud2, GCC's isolated NULL path) instead of a NULL return. Anything else in the
// function (a call, a branch that does not return NULL, an unknown
// instruction) gives nullopt: the field is then reported as unknown, never
// guessed.
//
// x86-64 only. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tlsprof::usage {

struct LoadChain {
  std::vector<int32_t> offsets;  // one per load; all but the last load 8 bytes
  uint8_t width = 0;             // bytes of the last load: 1, 2, 4 or 8
  // A bit field of the last load (DecodeAccessor, accessor_paths.h):
  // (v >> shift) & ((1 << bits) - 1) when shift or bits is set (bits 0:
  // all that is left), then !v when `invert`. DecodeLoadChain never sets them.
  uint8_t shift = 0;
  uint8_t bits = 0;
  bool invert = false;
  // The 32-bit word at +0 of the start pointer must be 0 for the chain to
  // apply (OpenSSL 3.2+'s SSL_CONNECTION type); else the field is unknown.
  bool type_guard = false;

  // A pointer that can be followed further: 8 bytes, no bit field.
  bool plain_pointer() const { return width == 8 && shift == 0 && bits == 0 && !invert; }
  bool operator==(const LoadChain&) const = default;
};

// Decodes an accessor's machine code (from its first byte; `code` may run
// past its end). nullopt when the code is not a plain load chain from rdi.
std::optional<LoadChain> DecodeLoadChain(std::span<const uint8_t> code);

// OpenSSL 3.2+'s type dispatch at `code[at]`: mov (%rdi),%eax; test
// %eax,%eax; je rel8/rel32 forward. The jump's target (where a TLS
// connection's path goes on), as an index into `code`; 0 if it is not one.
size_t TypeDispatchTarget(std::span<const uint8_t> code, size_t at);

// `first` then `second`: `first` must end in a pointer (width 8, no bit
// field), from which `second` continues, e.g. SSL_get_privatekey() then
// EVP_PKEY_get_id(). `first`'s type guard is kept; `second` must have none
// (it would apply to a pointer on the way, which the walk does not check).
std::optional<LoadChain> Compose(const LoadChain& first, const LoadChain& second);

// "+0x898 -> +0x0 -> +0x8 (8 bytes)", for logs and tests; a bit field
// follows: "+0xa4 (1 bytes) bit 0", "+0x618 (1 bytes) bit 3 == 0"; a type
// guard leads: "[+0x0 == 0] +0x48 (4 bytes)".
std::string ToString(const LoadChain& chain);

}  // namespace tlsprof::usage
