// Calls into imports, found by decoding real binaries built here: through the
// PLT (with and without -fcf-protection's .plt.sec) and through the GOT
// (-fno-plt). The expected return addresses come from objdump's disassembly
// of the same binary, not from our decoder.
#include "agent/symbols/import_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"

namespace tlsprof::symbols {
namespace {

using symtest::RunCommand;
using symtest::TempDir;

constexpr const char* kLibSource = R"(
int tlsprof_api_sign(int x) { return x * 3; }
int tlsprof_api_other(int x) { return x + 1; }
)";

// caller() calls the import, local() is a plain local call that must not be
// recorded, tail() ends in a tail call to the import (a jmp: no return
// address, nothing to record).
constexpr const char* kMainSource = R"(
int tlsprof_api_sign(int);
int tlsprof_api_other(int);
__attribute__((noinline)) static int local(int x) { __asm__ volatile("" ::: "memory"); return x ^ 5; }
__attribute__((noinline)) int caller(int x) { int r = tlsprof_api_sign(x); __asm__ volatile("" ::: "memory"); return r + local(x); }
__attribute__((noinline)) int other(int x) { int r = tlsprof_api_other(x); __asm__ volatile("" ::: "memory"); return r + 2; }
__attribute__((noinline)) int tail(int x) { return tlsprof_api_sign(x + 1); }
int main(int argc, char** argv) { (void)argv; return caller(argc) + other(argc) + tail(argc); }
)";

void WriteText(const std::string& path, const char* text) { std::ofstream(path) << text; }

// Return addresses of the calls objdump shows to `callee`: the address of the
// instruction after each `call` whose operand names it.
std::set<uint64_t> ObjdumpCallReturns(const std::string& binary, const std::string& callee) {
  auto r = RunCommand("objdump -d --no-show-raw-insn " + binary);
  EXPECT_EQ(r.status, 0) << r.output;
  std::set<uint64_t> out;
  std::istringstream in(r.output);
  std::string line;
  bool pending = false;
  static const std::regex kInsn(R"(^\s*([0-9a-f]+):\s+(\S+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, kInsn)) continue;
    const uint64_t addr = std::stoull(m[1].str(), nullptr, 16);
    if (pending) out.insert(addr);
    pending = m[2].str().starts_with("call") && line.find("<" + callee) != std::string::npos;
  }
  return out;
}

class ImportCallsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ImportCallsTest, CallsToImportsMatchObjdump) {
  ASSERT_TRUE(symtest::HaveTool("cc")) << "needs cc";
  ASSERT_TRUE(symtest::HaveTool("objdump")) << "needs objdump (binutils)";
  TempDir dir;
  WriteText(dir.File("api.c"), kLibSource);
  WriteText(dir.File("main.c"), kMainSource);
  const std::string flags = GetParam();
  auto r = RunCommand("cd " + dir.path() + " && cc -O2 -fPIC -shared -o libapi.so api.c && cc -O2 " + flags +
                      " -o prog main.c -L. -lapi");
  ASSERT_EQ(r.status, 0) << r.output;

  const std::set<uint64_t> sign_returns = ObjdumpCallReturns(dir.File("prog"), "tlsprof_api_sign");
  const std::set<uint64_t> other_returns = ObjdumpCallReturns(dir.File("prog"), "tlsprof_api_other");
  ASSERT_EQ(sign_returns.size(), 1u) << "objdump should show caller()'s one call (tail() jumps)";
  ASSERT_EQ(other_returns.size(), 1u);

  auto img = symtest::LoadPath(dir.File("prog"));
  ASSERT_TRUE(img.ok()) << img.error().message;
  const ImportCalls& calls = (*img)->import_calls;
  for (uint64_t ret : sign_returns) EXPECT_EQ(calls.CalleeAt(ret).value_or("?"), "tlsprof_api_sign");
  for (uint64_t ret : other_returns) EXPECT_EQ(calls.CalleeAt(ret).value_or("?"), "tlsprof_api_other");
  // Nothing else of ours: not the local call, not the tail call (a jmp).
  // (The C runtime's own imports, __libc_start_main and __cxa_finalize, may
  // add sites of their own.)
  for (const auto& [ret, index] : calls.sites) {
    const std::string& name = calls.names[index];
    if (name == "tlsprof_api_sign") {
      EXPECT_TRUE(sign_returns.contains(ret)) << std::hex << ret;
    } else if (name == "tlsprof_api_other") {
      EXPECT_TRUE(other_returns.contains(ret)) << std::hex << ret;
    } else {
      EXPECT_TRUE(name.starts_with("__")) << "unexpected call of " << name << " at " << std::hex << ret;
    }
  }
  EXPECT_FALSE(calls.CalleeAt(*sign_returns.begin() + 1).has_value());
  EXPECT_FALSE(calls.CalleeAt(*sign_returns.begin() - 1).has_value());

  // The keep filter decides which imports are worth recording.
  LoadOptions only_sign;
  only_sign.keep = [](std::string_view name) { return name == "tlsprof_api_sign"; };
  auto filtered = symtest::LoadPath(dir.File("prog"), only_sign);
  ASSERT_TRUE(filtered.ok()) << filtered.error().message;
  ASSERT_EQ((*filtered)->import_calls.names, std::vector<std::string>{"tlsprof_api_sign"});
  EXPECT_EQ((*filtered)->import_calls.sites.size(), 1u);
  EXPECT_FALSE((*filtered)->import_calls.CalleeAt(*other_returns.begin()).has_value());
}

INSTANTIATE_TEST_SUITE_P(CallForms, ImportCallsTest,
                         ::testing::Values("-fcf-protection=full",  // .plt.sec stubs: endbr64; bnd jmp *slot
                                           "-fcf-protection=none",  // classic .plt stubs: jmp *slot
                                           "-fno-plt"),             // call *slot(%rip), no stub
                         [](const auto& info) {
                           std::string name = info.param.substr(1);
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

// Debian's libssl.so.3 calls libcrypto through the PLT; EVP_CipherUpdate
// and friends are among the imports its record layer calls.
TEST(ImportCallsSystemTest, DebianLibsslCallsLibcryptoThroughThePlt) {
  const std::string libssl = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
  auto img = symtest::LoadPath(libssl);
  ASSERT_TRUE(img.ok()) << img.error().message;
  const ImportCalls& calls = (*img)->import_calls;
  EXPECT_GT(calls.sites.size(), 500u);
  std::set<std::string> names(calls.names.begin(), calls.names.end());
  for (const char* expected : {"EVP_CipherUpdate", "EVP_DigestSignFinal", "EVP_PKEY_derive", "EVP_MD_CTX_new"}) {
    EXPECT_TRUE(names.contains(expected)) << expected;
  }
}

}  // namespace
}  // namespace tlsprof::symbols
