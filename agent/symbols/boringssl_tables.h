// Names for a stripped BoringSSL libcrypto from its own method structs, when
// there is no .symtab, no debug file and no static archive of the same build
// (Debian's android-libboringssl exports only the API).
//
// BoringSSL reaches every implementation through a small struct of function
// pointers that an exported getter returns:
//   EVP_aead_*()   -> EVP_AEAD    { init, cleanup, open, seal_scatter, ... }
//   EVP_aes_*(), EVP_des_*(), ... -> EVP_CIPHER { init, cipher, cleanup, ctrl }
//   EVP_sha*(), EVP_md5() -> EVP_MD  { init, update, final }
// and EC_GROUP_new_by_curve_name() builds its groups from a built-in curve
// table whose entries point at an EC_METHOD { mul, mul_base, ... } per curve.
// A getter is either `lea rax, [rip+S]; ret` with S a static struct whose
// pointers are dynamic relocations (R_X86_64_RELATIVE), or, for the structs
// of the FIPS module, a CRYPTO_once(&once, init) before the lea, where `init`
// fills S with straight-line stores (`lea rax, [rip+fn]; mov [rip+S+off],
// rax`). Both are decoded here from the machine code (capstone) without
// running anything: the getter, the init functions it passes to CRYPTO_once
// (through its PLT stub), and, for EC, the curve table's init and the
// method inits it calls. Function extents come from the .eh_frame FDE that
// starts at each pointer; a pointer with none is not named.
//
// Names are synthetic and say what the struct says:
//   boringssl:<kind>:<algorithm>:<role>
//     kind       aead, cipher, md, ec; "*" if the function serves several
//     algorithm  from the getter's name, key size dropped (EVP_aead_aes_128_gcm
//                and EVP_aead_aes_256_gcm_tls13 are AES-GCM; EVP_aes_128_cbc is
//                AES-CBC; EVP_sha256 is SHA-256), or the curve (P-256, P-384,
//                P-521, P-224) for ec; a function shared by several lists
//                them all, sorted, joined by '|' (ec_GFp_mont_group_init is
//                P-224|P-256|P-384|P-521), or "*" for more than 8
//     role       the struct field (seal_scatter, open_gather, cipher, update,
//                mul_base, scalar_inv0_montgomery, ...); "slot<offset>" for an
//                EC_METHOD laid out otherwise than BoringSSL's of 2021-2023
//                (Android 13 and 14); joined by '+' when one function fills
//                several fields, "*" for more than three
//   e.g. boringssl:aead:ChaCha20-Poly1305|XChaCha20-Poly1305:cleanup,
//        boringssl:cipher:AES-CBC:cipher, boringssl:md:SHA-256:update,
//        boringssl:ec:P-256:mul_base.
// No compiler emits "boringssl:" names, so classify can match them as they are.
//
// Only a library that exports a BoringSSL-only function (BORINGSSL_self_test,
// CRYPTO_is_confidential_build, EVP_AEAD_CTX_seal_scatter) is read: OpenSSL
// and LibreSSL export getters of the same names whose structs are laid out
// otherwise. A malformed file gives an Error, never a crash; a getter or
// init that does not decode is skipped, so the result is partial, never
// wrong. Reentrant.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/symbols/library_tables.h"
#include "common/result.h"

namespace tlsprof::symbols {

struct BoringSslTablesStats {
  uint64_t getters = 0;    // exported getters decoded to a struct
  uint64_t curves = 0;     // built-in curves whose EC_METHOD was found
  uint64_t slots = 0;      // function pointers read from the structs
  uint64_t functions = 0;  // distinct functions named (with an extent)
  uint64_t no_extent = 0;  // pointers to code with no FDE starting there (not named)
};

struct BoringSslTables {
  std::vector<TableFunction> functions;  // sorted by address, one per address
  BoringSslTablesStats stats;
};

// Decodes the method structs of the x86-64 ELF BoringSSL libcrypto `elf`. A
// library that is not BoringSSL's libcrypto gives an empty result, not an
// error. Errors: not an x86-64 ELF64 file, or its headers are malformed.
Result<BoringSslTables> ReadBoringSslTables(const guard::ElfFile& elf);

}  // namespace tlsprof::symbols
