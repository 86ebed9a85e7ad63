// ProbePlan: which functions of a process's TLS library files get a usage
// probe, and where the fields the probes read are (bpf/usage.h).
//
// The probed functions run once per handshake call or per public-key
// operation (docs/usage.md): SSL_do_handshake, EVP_DigestSign, EVP_PKEY_sign,
// EVP_DigestVerify, EVP_PKEY_verify, EVP_PKEY_derive. SSL_accept and
// SSL_connect need no probe of their own: they call SSL_do_handshake.
// The field layout comes from the library's own accessors (accessors.h),
// looked up across all the files of the process, since libssl's
// SSL_get_privatekey() and libcrypto's EVP_PKEY_get_id() together give the
// certificate key's type. OpenSSL 1.1's accessors are the same but for two
// that 3.0 renamed (EVP_PKEY_id, EVP_MD_CTX_pkey_ctx), looked up by either
// name.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/usage/accessors.h"
#include "agent/usage/elf_functions.h"
#include "bpf/usage.h"

namespace tlsprof::usage {

// The functions ProbePlan looks for: probed functions and accessors.
std::vector<std::string_view> WantedFunctions();

struct ProbeSite {
  std::string function;
  uint64_t file_offset = 0;
  uint32_t probe = 0;  // enum usage_probe
  uint32_t insn = 0;   // enum usage_insn_class of its first instruction
};

// The class of a function's first instruction (bpf/usage.h): how the
// kernel's uprobe runs it, which sets the probes' own time in each call.
uint32_t FirstInstructionClass(std::span<const uint8_t> code);

struct FilePlan {
  std::vector<ProbeSite> sites;  // empty: nothing to probe in this file
};

// A function with no symbol that the plan probes, found some other way.
struct FoundFunction {
  std::string name;  // what the plan calls it, e.g. "state_machine"
  FunctionCode code;
};

// OpenSSL's handshake state machine: what every handshake step runs,
// whichever API drove it (SSL_do_handshake, SSL_accept, or SSL_read and
// SSL_write on a connection still in its handshake, which never call
// SSL_do_handshake: `openssl s_server -www`). Its functions are internal and
// have no symbol in a stripped libssl, so they are found through the method
// tables: TLS_method(), TLS_server_method() and TLS_client_method() return
// SSL_METHOD structs that differ in two slots only, ssl_accept (the client
// method's is ssl_undefined_function) and ssl_connect (likewise the
// server's). When both are `mov/xor %esi; jmp X` (OpenSSL 3.0's
// ossl_statem_accept/connect tail-calling state_machine(s, server); in
// Debian's OpenSSL 1.1.1 after an inlined `return -1` on the error state; in
// 3.2+ on a TLS connection's path, after a NULL test and the type dispatch), X
// is probed once; else both are. Empty when the tables are not as expected
// (another library or version): the plan then probes SSL_do_handshake.
std::vector<FoundFunction> FindHandshakeStateMachine(const guard::ElfFile& elf,
                                                     const std::map<std::string, FunctionCode, std::less<>>& functions);

struct ProcessPlan {
  // The fields every file's probes read; n == 0 for a field whose accessor
  // the library lacks or that did not decode.
  lib_layout layout{};
  std::map<std::string, std::string> fields;  // field name -> chain (ToString) or "unknown"
};

// One file's probe sites, from its functions (FindFunctions(WantedFunctions())).
// `state_machine` (FindHandshakeStateMachine) replaces SSL_do_handshake as
// the handshake probe when not empty.
FilePlan PlanFile(const std::map<std::string, FunctionCode, std::less<>>& functions,
                  const std::vector<FoundFunction>& state_machine = {});

// The layout, from the functions of every TLS file of one process.
ProcessPlan PlanLayout(const std::vector<const std::map<std::string, FunctionCode, std::less<>>*>& files);

// The accessors `names` decoded by `decode` (one name each) and composed in
// order, up to the first ""; nullopt when one does not decode or compose.
std::optional<LoadChain> ComposeAccessors(std::span<const std::string_view> names,
                                          const std::function<std::optional<LoadChain>(std::string_view)>& decode);
// Sets `field` of the plan's layout from `chain`, and its line in
// `fields` ("unknown" for nullopt).
void SetField(ProcessPlan& plan, uint32_t field, const std::optional<LoadChain>& chain);

std::string_view FieldName(uint32_t field);  // enum usage_field
std::string_view ProbeName(uint32_t probe);  // enum usage_probe

}  // namespace tlsprof::usage
