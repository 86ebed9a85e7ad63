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
// Some provider functions are shared in a way that hides the algorithm (the
// generic block-cipher update, ECDSA and ECDH of any curve, the derive X25519
// and X448 share), so the code below them is named too, from the structs the
// library reaches it through (machine code read with x86_interpreter.h):
//   openssl:<kind>:<algorithm>:<role>
//     kind ec         an EC_METHOD's function pointers (role: the field,
//                     mul, field_inverse_mod_ord, ...). The methods are those
//                     of the built-in curve table (crypto/ec/ec_curve.c, found
//                     by its {nid, curve data, method getter, comment}
//                     entries): a curve's own getter (P-256's
//                     EC_GFp_nistz256_method on x86-64), else the generic
//                     method EC_GROUP_new_curve_GFp/GF2m call. Algorithm: the
//                     curve (P-224, P-256, P-384, P-521, nid<N> for others),
//                     or all of them when methods share the function, "*"
//                     for more than 8 (the Montgomery code of most curves).
//     kind cipher-hw  the hw struct a cipher's newctx gets from its hw getter
//                     (ossl_prov_cipher_hw_aes_cbc -> aesni_cbc/aes_cbc:
//                     init, cipher, copyctx; GCM's, CCM's and
//                     ChaCha20-Poly1305's own layouts), reached through
//                     newctx's direct callees and theirs. Algorithm: every
//                     algorithm whose newctx reaches the struct, key size
//                     dropped (AES-CBC|AES-CBC-CTS share newctx).
//     kind ecx        the function both the provider's X25519|X448 derive
//                     and the legacy X25519 EVP_PKEY_METHOD's derive call,
//                     and X448's does not (ossl_x25519); algorithm X25519.
//   e.g. openssl:ec:P-256:mul, openssl:cipher-hw:AES-CBC|AES-CBC-CTS:cipher,
//        openssl:ec:*:field_mul, openssl:ecx:X25519:derive.
// A function that has a provider name keeps it.
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

#include "agent/guard/elf_file.h"
#include "common/result.h"

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
  uint64_t functions = 0;       // distinct functions named (with an extent), both kinds of name
  uint64_t no_extent = 0;       // table functions with no FDE starting at them (not named)
  uint64_t curves = 0;          // entries of the built-in curve table
  uint64_t ec_methods = 0;      // EC_METHOD structs read (the curves' and the generic ones)
  uint64_t hw_structs = 0;      // cipher hw structs reached from a newctx
  uint64_t code_functions = 0;  // functions given an "openssl:" name
};

struct LibraryTables {
  std::vector<TableFunction> functions;  // sorted by address, one per address
  LibraryTablesStats stats;
};

// Decodes the provider algorithm tables of the x86-64 ELF shared library
// `elf`, and the code tables below them. A library without such tables
// (libssl, BoringSSL, not OpenSSL 3) gives an empty result, not an error.
// Errors: not an x86-64 ELF64 file, or its headers are malformed.
Result<LibraryTables> ReadLibraryTables(const guard::ElfFile& elf);

}  // namespace tlsprof::symbols
