// Names for a stripped TLS library from its own tables, when there is no
// .symtab, no debug file and no static archive of the same build.
//
// OpenSSL 3 (libcrypto.so.3) implements every algorithm in a provider, and a
// provider publishes its implementations in static tables: for each operation
// (digest, cipher, signature, key exchange, ...) an array of OSSL_ALGORITHM
//   { "AES-256-GCM:id-aes256-GCM:2.16...", "provider=default", dispatch, desc }
// whose `dispatch` is an array of OSSL_DISPATCH { function id, function }
// ending in { 0, NULL }. In a shared library those pointers are dynamic
// relocations (R_X86_64_RELATIVE, or R_X86_64_64 against an exported symbol),
// so the tables survive stripping whole: they name the provider's functions
// (aes_gcm_newctx, ossl_gcm_stream_update, ecdsa_sign, x25519_derive, ...)
// that the exported EVP_* entry points call or tail-call into. A stack through
// them then names the operation and algorithm; the unexported code beneath
// (perlasm, bignum) takes them from that frame (docs/attribution.md).
//
// Names are synthetic and say what the table says:
//   provider:<operation>:<algorithm>:<role>
//     operation  digest, cipher, mac, kdf, rand, keymgmt, keyexch, signature,
//                asym_cipher, kem, encoder, decoder, store; "*" if the
//                function serves several operations
//     algorithm  the first name of the OSSL_ALGORITHM entry; a cipher's key
//                size is dropped (AES-128-GCM and AES-256-GCM share code and
//                are one algorithm here: AES-GCM); a function shared by
//                algorithms that differ beyond that lists them all, sorted
//                and joined by '|' (AES-GCM|ARIA-GCM, X25519|X448), or "*"
//                for more than 8 (the generic block-cipher update)
//     role       the dispatch function id's name (newctx, encrypt_init,
//                update, final, sign, derive, gen, ...), "fn<id>" for ids this
//                table does not know; joined by '+' when one function fills
//                several slots (ChaCha20-Poly1305's update+cipher), "*" for
//                more than three
//   e.g. provider:signature:ECDSA:sign, provider:keymgmt:X25519:gen,
//        provider:cipher:AES-GCM|ARIA-GCM:update, provider:cipher:*:update.
// No compiler emits "provider:" names, so classify (rules.cc, operations.cc)
// can match them as they are.
//
// Everything is read with pread into memory (no mapping: a file truncated
// while it is read must not SIGBUS the agent); a malformed file gives an
// Error, never a crash; a table that does not decode is skipped, so the result
// is partial, never wrong. Reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/common/result.h"

namespace tlsprof::symbols {

struct TableFunction {
  uint64_t addr = 0;  // ELF virtual address
  uint64_t size = 0;  // from the function's .eh_frame FDE
  std::string name;
};

struct LibraryTablesStats {
  uint64_t algorithms = 0;      // OSSL_ALGORITHM entries decoded
  uint64_t tables = 0;          // arrays of them
  uint64_t dispatch_slots = 0;  // OSSL_DISPATCH entries with a function
  uint64_t functions = 0;       // distinct functions named (with an extent)
  uint64_t no_extent = 0;       // functions with no FDE starting at them (not named)
};

struct LibraryTables {
  std::vector<TableFunction> functions;  // sorted by address, one per address
  LibraryTablesStats stats;
};

// Decodes the provider algorithm tables of the x86-64 ELF shared library open
// at `fd`. A library without such tables (libssl, BoringSSL, not OpenSSL 3)
// gives an empty result, not an error. Errors: not an x86-64 ELF64 file, or
// its headers are malformed.
Result<LibraryTables> ReadLibraryTables(int fd, std::string_view path);

}  // namespace tlsprof::symbols
