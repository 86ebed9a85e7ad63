// BoringSSL's probe plan: which functions of its libssl/libcrypto get a usage
// probe, and where the fields are, for BoringSSL built as a shared library
// (Debian's android-libboringssl: stripped libssl.so.0 and libcrypto.so.0,
// only the exported API has symbols).
//
// What is probed (once per handshake step or operation, never per record):
//   - SSL_do_handshake: every handshake step runs it, whichever API drove it
//     (SSL_accept and SSL_connect tail-call it, SSL_read and SSL_write call
//     it while the connection is in its handshake);
//   - EVP_PKEY_sign / EVP_PKEY_verify: the signatures of the handshake
//     (ssl_private_key_sign's EVP_DigestSign calls EVP_PKEY_sign through the
//     PLT; EVP_DigestSign itself is not probed: this build exports no
//     accessor from an EVP_MD_CTX to its key, and EVP_PKEY_sign's time is the
//     signature's);
//   - X25519: BoringSSL's key shares call libcrypto's primitives directly,
//     never EVP_PKEY_derive; X25519(out, private, peer) runs once per X25519
//     key exchange (PROBE_X25519). P-256 and other groups' exchanges are not
//     timed (their EC_POINT_mul serves key generation too);
//   - EVP_PKEY_derive (an application's own key exchanges) and SSL_free
//     (the end of a connection).
//
// The fields come from the accessors through DecodeAccessor()
// (accessor_paths.h), which follows their calls and branches:
//   version      SSL_version                              at completion
//   in init      SSL_in_init (the handshake under way)    at every step
//   resumed      SSL_session_reused                       at completion
//   server side  SSL_is_server
//   cipher suite SSL_get_current_cipher -> SSL_CIPHER_get_protocol_id   at completion
//   group        SSL_get_curve_id (IANA id)               at completion
//   own key      SSL_get_privatekey -> EVP_PKEY_id
//   PKEY_CTX key EVP_PKEY_CTX_get0_pkey -> EVP_PKEY_id
// "At completion" means when SSL_do_handshake returned 1 from a step that
// began in init and is no longer in init: BoringSSL has then freed the
// handshake object (ssl->s3->hs.reset() in SSL_do_handshake), the pointer
// SSL_in_init() tests, so the accessors' branches on it are settled
// (AccessorContext::null_pointers). There is no handshake state field
// (FIELD_SSL_STATE): FIELD_SSL_IN_INIT says when a handshake runs.
//
// Pure functions apart from reading the files; thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "agent/usage/elf_functions.h"
#include "agent/usage/probe_plan.h"

namespace tlsprof::usage {

// The family name (classify::LibraryKindName) the agent plans this way.
inline constexpr std::string_view kBoringSslLibrary = "boringssl";

// The functions the BoringSSL plan looks for: probed functions, accessors
// and the functions the accessors call.
std::vector<std::string_view> BoringSslWantedFunctions();

// One BoringSSL file's probe sites, from its functions
// (FindFunctions(BoringSslWantedFunctions())).
FilePlan PlanBoringSslFile(const std::map<std::string, FunctionCode, std::less<>>& functions);

struct BoringSslFile {
  const guard::ElfFile* elf = nullptr;  // read for the code the accessors call (PLT stubs, long functions)
  const std::map<std::string, FunctionCode, std::less<>>* functions = nullptr;
};

// The layout, from the BoringSSL files of one process (libssl and libcrypto).
ProcessPlan PlanBoringSslLayout(const std::vector<BoringSslFile>& files);

}  // namespace tlsprof::usage
