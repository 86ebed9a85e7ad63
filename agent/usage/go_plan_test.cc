// GoPlan on real Go binaries built by the machine's toolchain: the
// workloads' crypto/tls server with symbols and DWARF, the same package
// linked with -ldflags="-s -w", and a copy stripped with objcopy. No
// privileges needed.
#include "agent/usage/go_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/fd.h"

namespace tlsprof::usage {
namespace {

const std::string kGoTls = std::string(TLSPROF_BINARY_DIR) + "/bin/tlsprof-go-tls";
const std::string kGoTlsStripped = std::string(TLSPROF_BINARY_DIR) + "/bin/tlsprof-go-tls-stripped";

Result<GoFilePlan> Plan(const std::string& path) {
  auto file = guard::OpenHostFile(path);
  if (!file.ok()) return file.error();
  return PlanGoFile(*file, path);
}

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

uint32_t ProbeOf(const GoProbeSite& s) { return USAGE_COOKIE_PROBE(s.cookie_bits); }

TEST(ReturnInstructions, DecodesRatherThanScansBytes) {
  // sub $8,%rsp; ret; nop; ret
  const std::vector<uint8_t> code = {0x48, 0x83, 0xec, 0x08, 0xc3, 0x90, 0xc3};
  EXPECT_EQ(ReturnInstructions(code, 0x1000), (std::vector<uint64_t>{0x1004, 0x1006}));
  // mov $0xc3,%eax; ret: the 0xc3 inside the immediate is no RET.
  const std::vector<uint8_t> imm = {0xb8, 0xc3, 0x00, 0x00, 0x00, 0xc3};
  EXPECT_EQ(ReturnInstructions(imm, 0), (std::vector<uint64_t>{5}));
  EXPECT_TRUE(ReturnInstructions({}, 0).empty());
}

TEST(GoEntryProbeAddress, OnTheStackChecksJump) {
  // cmp 0x10(%r14),%rsp; jbe +0x40
  const std::vector<uint8_t> small = {0x49, 0x3b, 0x66, 0x10, 0x76, 0x40, 0x48, 0x83, 0xec, 0x18};
  EXPECT_EQ(GoEntryProbeAddress(small, 0x1000), 0x1004u);
  // lea -0x88(%rsp),%r12; cmp 0x10(%r14),%r12; jbe rel32
  const std::vector<uint8_t> big = {0x4c, 0x8d, 0xa4, 0x24, 0x78, 0xff, 0xff, 0xff, 0x4d,
                                    0x3b, 0x66, 0x10, 0x0f, 0x86, 0x10, 0x00, 0x00, 0x00};
  EXPECT_EQ(GoEntryProbeAddress(big, 0x2000), 0x200cu);
  // No stack check (a NOSPLIT function, or C): the entry itself.
  const std::vector<uint8_t> other = {0x55, 0x48, 0x89, 0xe5, 0x76, 0x10};
  EXPECT_EQ(GoEntryProbeAddress(other, 0x3000), 0x3000u);
  // A jump without the check before it is no prologue.
  const std::vector<uint8_t> jump = {0x76, 0x10, 0xc3};
  EXPECT_EQ(GoEntryProbeAddress(jump, 0x4000), 0x4000u);
}

TEST(GoBuildInfoVersion, Go118Layout) {
  std::vector<uint8_t> s(32, 0);
  const std::string magic = "\xff Go buildinf:";
  std::copy(magic.begin(), magic.end(), s.begin());
  s[14] = 8;
  s[15] = 2;  // inline strings
  const std::string v = "go1.19.8";
  s.push_back(static_cast<uint8_t>(v.size()));
  s.insert(s.end(), v.begin(), v.end());
  EXPECT_EQ(GoBuildInfoVersion(s), "go1.19.8");
  // Pointers to strings (before 1.18), a length past the end, no magic.
  auto old = s;
  old[15] = 0;
  EXPECT_FALSE(GoBuildInfoVersion(old));
  auto truncated = s;
  truncated.resize(36);
  EXPECT_FALSE(GoBuildInfoVersion(truncated));
  auto bad = s;
  bad[1] = 'X';
  EXPECT_FALSE(GoBuildInfoVersion(bad));
  EXPECT_FALSE(GoBuildInfoVersion({}));
}

TEST(GoConnLayoutFromTable, MatchesReleasesOnly) {
  EXPECT_TRUE(GoConnLayoutFromTable("go1.19"));
  EXPECT_TRUE(GoConnLayoutFromTable("go1.19.8"));
  EXPECT_FALSE(GoConnLayoutFromTable("go1.190"));
  EXPECT_FALSE(GoConnLayoutFromTable("go1.1"));
  EXPECT_FALSE(GoConnLayoutFromTable(""));
}

// The unstripped server: every probed function that the program links, an
// entry and RETs that are RET bytes in the file, fields from DWARF.
TEST(PlanGoFile, WorkloadServerWithDwarf) {
  auto plan = Plan(kGoTls);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->go_version.rfind("go1.", 0), 0u) << plan->go_version;
  const std::set<std::string> functions(plan->functions.begin(), plan->functions.end());
  for (const char* f :
       {"crypto/tls.(*Conn).serverHandshake", "crypto/tls.(*Conn).clientHandshake", "crypto/ecdsa.(*PrivateKey).Sign",
        "crypto/rsa.(*PrivateKey).Sign", "crypto/ecdsa.VerifyASN1", "crypto/tls.(*x25519Parameters).SharedKey",
        "crypto/tls.(*nistParameters).SharedKey", "crypto/tls.(*Conn).Close"}) {
    EXPECT_TRUE(functions.count(f)) << f;
  }
  const std::vector<uint8_t> bytes = FileBytes(kGoTls);
  std::map<std::string, int> entries, rets;
  for (const GoProbeSite& s : plan->sites) {
    ASSERT_LT(s.file_offset, bytes.size());
    EXPECT_EQ(USAGE_COOKIE_LIB(s.cookie_bits), 0u);  // added at attach time
    EXPECT_EQ(USAGE_COOKIE_INSN(s.cookie_bits), static_cast<uint32_t>(INSN_GO));
    EXPECT_EQ((USAGE_COOKIE_FLAGS(s.cookie_bits) & USAGE_GO_RETURN) != 0, s.ret);
    if (s.ret) {
      EXPECT_EQ(bytes[s.file_offset], 0xc3) << s.function << " +" << s.file_offset;
      ++rets[s.function];
    } else {
      ++entries[s.function];
      // On the stack check's jbe (rel8 or rel32), which uprobes emulate.
      const bool jbe =
          bytes[s.file_offset] == 0x76 || (bytes[s.file_offset] == 0x0f && bytes[s.file_offset + 1] == 0x86);
      EXPECT_TRUE(jbe) << s.function << " +" << s.file_offset;
    }
  }
  for (const std::string& f : plan->functions) {
    EXPECT_EQ(entries[f], 1) << f;
    // A connection's end is an entry probe alone.
    if (f == "crypto/tls.(*Conn).Close") {
      EXPECT_EQ(rets[f], 0) << f;
    } else {
      EXPECT_GE(rets[f], 1) << f;
    }
  }
  // Server and client handshakes, and what each operation serves.
  for (const GoProbeSite& s : plan->sites) {
    const uint32_t flags = USAGE_COOKIE_FLAGS(s.cookie_bits);
    if (s.function == "crypto/tls.(*Conn).serverHandshake") {
      EXPECT_EQ(ProbeOf(s), static_cast<uint32_t>(PROBE_GO_HANDSHAKE));
      EXPECT_TRUE(flags & USAGE_GO_SERVER);
    } else if (s.function == "crypto/tls.(*Conn).clientHandshake") {
      EXPECT_FALSE(flags & USAGE_GO_SERVER);
    } else if (s.function == "crypto/ecdsa.VerifyASN1") {
      EXPECT_EQ(ProbeOf(s), static_cast<uint32_t>(PROBE_GO_VERIFY));
      EXPECT_EQ(USAGE_COOKIE_REG(s.cookie_bits), static_cast<uint32_t>(GO_REG_R8));
      EXPECT_EQ(USAGE_COOKIE_KEY_TYPE(s.cookie_bits), 408u);
    } else if (s.function == "crypto/rsa.(*PrivateKey).Sign") {
      EXPECT_EQ(ProbeOf(s), static_cast<uint32_t>(PROBE_GO_SIGN));
      EXPECT_EQ(USAGE_COOKIE_KEY_TYPE(s.cookie_bits), 6u);
    }
  }
  EXPECT_EQ(plan->conn.source, "dwarf");
  EXPECT_GE(plan->conn.vers, 0);
  EXPECT_GE(plan->conn.cipher_suite, 0);
  EXPECT_GE(plan->conn.did_resume, 0);
  EXPECT_EQ(plan->layout.field[FIELD_SSL_VERSION].n, 1);
  EXPECT_EQ(plan->layout.field[FIELD_SSL_VERSION].width, 2);
  EXPECT_EQ(plan->layout.field[FIELD_SSL_RESUMED].width, 1);
  EXPECT_EQ(plan->layout.field[FIELD_SSL_STATE].n, 0);  // Go's handshake function runs once per handshake
}

// The table that stripped binaries rely on says what this toolchain's DWARF
// says. A new toolchain without a row fails here: add its row.
TEST(PlanGoFile, TableRowOfThisToolchainIsItsDwarf) {
  auto plan = Plan(kGoTls);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto row = GoConnLayoutFromTable(plan->go_version);
  ASSERT_TRUE(row) << "no row for " << plan->go_version << " in go_plan.cc's kGoConnTable; its DWARF says vers +"
                   << plan->conn.vers << ", cipherSuite +" << plan->conn.cipher_suite << ", didResume +"
                   << plan->conn.did_resume;
  EXPECT_EQ(row->vers, plan->conn.vers);
  EXPECT_EQ(row->cipher_suite, plan->conn.cipher_suite);
  EXPECT_EQ(row->did_resume, plan->conn.did_resume);
}

// -ldflags="-s -w": no .symtab, no DWARF. Functions from .gopclntab, fields
// from the table; the same functions as with symbols.
TEST(PlanGoFile, StrippedAtLinkTime) {
  auto full = Plan(kGoTls);
  auto stripped = Plan(kGoTlsStripped);
  ASSERT_TRUE(full.ok()) << full.error().message;
  ASSERT_TRUE(stripped.ok()) << stripped.error().message;
  EXPECT_EQ(std::set<std::string>(stripped->functions.begin(), stripped->functions.end()),
            std::set<std::string>(full->functions.begin(), full->functions.end()));
  EXPECT_EQ(stripped->conn.source.rfind("table go1.", 0), 0u) << stripped->conn.source;
  EXPECT_EQ(stripped->conn.vers, full->conn.vers);
  const std::vector<uint8_t> bytes = FileBytes(kGoTlsStripped);
  for (const GoProbeSite& s : stripped->sites) {
    ASSERT_LT(s.file_offset, bytes.size());
    if (s.ret) {
      EXPECT_EQ(bytes[s.file_offset], 0xc3) << s.function;
    }
  }
}

// objcopy --strip-all of the unstripped binary: the code is where it was,
// so the sites are exactly those found with symbols.
TEST(PlanGoFile, StrippedByObjcopyFindsTheSameSites) {
  char dir[] = "/tmp/tlsprof-go-plan-XXXXXX";
  ASSERT_TRUE(mkdtemp(dir));
  const std::string copy = std::string(dir) + "/server";
  ASSERT_EQ(std::system(("objcopy --strip-all " + kGoTls + " " + copy).c_str()), 0);
  auto full = Plan(kGoTls);
  auto stripped = Plan(copy);
  EXPECT_EQ(std::system(("rm -rf " + std::string(dir)).c_str()), 0);
  ASSERT_TRUE(full.ok()) << full.error().message;
  ASSERT_TRUE(stripped.ok()) << stripped.error().message;
  auto offsets = [](const GoFilePlan& p) {
    std::set<std::pair<std::string, uint64_t>> out;
    for (const GoProbeSite& s : p.sites) out.insert({s.function, s.file_offset});
    return out;
  };
  EXPECT_EQ(offsets(*stripped), offsets(*full));
  EXPECT_NE(stripped->conn.source, "dwarf");
}

TEST(PlanGoFile, RejectsWhatIsNotGoTls) {
  EXPECT_FALSE(Plan("/usr/lib/x86_64-linux-gnu/libssl.so.3").ok());  // not Go
  EXPECT_FALSE(Plan("/etc/hostname").ok());                          // not ELF
  EXPECT_FALSE(Plan("/nonexistent").ok());
}

}  // namespace
}  // namespace tlsprof::usage
