// Tests of the CFI interpreter behind BuildUnwindTable and of the caps on
// what one hostile file may cost:
//  - row for row, the same tables as the reference builder (libdw's own
//    interpreter, reference_table.h) on the real binaries of this machine;
//  - files written here (a minimal x86-64 ELF with .eh_frame, .debug_frame
//    or .gopclntab) with one FDE of 200,000 rows, a remember_state bomb, a
//    compressed .debug_frame that claims 64 GiB, a section name table over
//    the section cap, a Go table over the row cap;
//  - a file truncated and restored while it is read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zlib.h>

#include "agent/guard/limits.h"
#include "agent/unwind/reference_table.h"
#include "agent/unwind/unwind_table.h"
#include "common/fd.h"

using namespace tlsprof::unwind;
namespace guard = tlsprof::guard;

namespace {

constexpr char kLibDir[] = "/usr/lib/x86_64-linux-gnu/";
constexpr char kTrixieRoot[] = "/opt/tlsprof-trixie";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tlsprof-cfi-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name, const std::string& bytes) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

tlsprof::Result<std::shared_ptr<const UnwindTable>> Build(const std::string& path, bool reference = false,
                                                          bool go = false) {
  tlsprof::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return tlsprof::MakeError("{}: cannot open ({})", path, std::strerror(errno));
  if (go) return BuildGoUnwindTable(fd.get(), path);
  return reference ? BuildReferenceUnwindTable(fd.get(), path) : BuildUnwindTable(fd.get(), path);
}

std::string RowText(const unwind_row& r) {
  char s[160];
  std::snprintf(s, sizeof(s), "pc %#x kind %u reg %u off %d add %d rbp %u/%d flags %u", r.pc, r.cfa_kind, r.reg,
                r.cfa_off, r.deref_add, r.rbp_kind, r.rbp_off, r.flags);
  return s;
}

// The agent's table of `path` must be the reference's, row for row, with the
// same statistics.
void ExpectSameAsReference(const std::string& path) {
  SCOPED_TRACE(path);
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: scripts/install-deps.sh installs it";
  auto ref = Build(path, true);
  auto got = Build(path);
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  ASSERT_TRUE(got.ok()) << got.error().message;
  const UnwindTable& r = **ref;
  const UnwindTable& t = **got;
  std::printf("%s: %zu rows, %lu FDEs, %lu CFI rows, %lu unsupported, %lu CFA instructions\n", path.c_str(),
              t.rows.size(), t.fdes, t.cfi_rows, t.unsupported_rows, t.cfi_instructions);
  EXPECT_GT(t.rows.size(), 1000u);
  EXPECT_EQ(t.fdes, r.fdes);
  EXPECT_EQ(t.cfi_rows, r.cfi_rows);
  EXPECT_EQ(t.unsupported_rows, r.unsupported_rows);
  EXPECT_EQ(t.covered_bytes, r.covered_bytes);
  EXPECT_EQ(t.unsupported_bytes, r.unsupported_bytes);
  EXPECT_EQ(t.cfi_errors, r.cfi_errors);
  for (int k = 0; k < UNWIND_CFA_NR_KINDS; ++k) EXPECT_EQ(t.kind_rows[k], r.kind_rows[k]) << "kind " << k;
  EXPECT_EQ(t.cut_fdes, 0u);
  EXPECT_FALSE(t.cut_at_image_cap);
  // Each CFI row comes from at least one instruction (an advance), and the
  // FDEs' programs are each run once.
  EXPECT_GE(t.cfi_instructions, t.cfi_rows);
  ASSERT_EQ(t.rows.size(), r.rows.size());
  int shown = 0;
  for (size_t i = 0; i < t.rows.size() && shown < 10; ++i) {
    if (std::memcmp(&t.rows[i], &r.rows[i], sizeof(unwind_row)) == 0) continue;
    ++shown;
    ADD_FAILURE() << "row " << i << ": reference " << RowText(r.rows[i]) << ", agent " << RowText(t.rows[i]);
  }
}

// ---- A minimal x86-64 ELF file, written byte by byte.

void Put(std::string& b, uint64_t v, unsigned size) {
  for (unsigned i = 0; i < size; ++i) b.push_back(char(v >> (8 * i)));
}
void PutAt(std::string& b, size_t off, uint64_t v, unsigned size) {
  for (unsigned i = 0; i < size; ++i) b[off + i] = char(v >> (8 * i));
}
std::string Uleb(uint64_t v) {
  std::string s;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    s.push_back(char(b | (v ? 0x80 : 0)));
  } while (v);
  return s;
}

struct ElfSection {
  std::string name;
  uint32_t type = 1;  // SHT_PROGBITS
  uint64_t flags = 0;
  uint64_t addr = 0;
  std::string bytes;
  uint64_t nobits_size = 0;  // SHT_NOBITS: the size it claims
};

// An ELF64 x86-64 executable with one PT_LOAD R+X segment [text, text +
// text_size) (no bytes in the file) and the given sections.
std::string MakeElf(uint64_t text, uint64_t text_size, std::vector<ElfSection> sections) {
  sections.insert(sections.begin(), ElfSection{"", 0, 0, 0, "", 0});
  std::string shstrtab(1, '\0');
  std::vector<uint32_t> names;
  for (const ElfSection& s : sections) {
    names.push_back(s.name.empty() ? 0 : uint32_t(shstrtab.size()));
    if (!s.name.empty()) shstrtab += s.name + '\0';
  }
  names.push_back(uint32_t(shstrtab.size()));
  shstrtab += std::string(".shstrtab") + '\0';
  sections.push_back(ElfSection{".shstrtab", 3, 0, 0, shstrtab, 0});

  std::string f(64 + 56, '\0');
  std::vector<uint64_t> offsets;
  for (const ElfSection& s : sections) {
    while (f.size() % 8) f.push_back('\0');
    offsets.push_back(f.size());
    f += s.bytes;
  }
  while (f.size() % 8) f.push_back('\0');
  const uint64_t shoff = f.size();
  for (size_t i = 0; i < sections.size(); ++i) {
    const ElfSection& s = sections[i];
    Put(f, names[i], 4);
    Put(f, s.type, 4);
    Put(f, s.flags, 8);
    Put(f, s.addr, 8);
    Put(f, i == 0 ? 0 : offsets[i], 8);
    Put(f, s.type == 8 ? s.nobits_size : s.bytes.size(), 8);
    Put(f, 0, 4);  // link
    Put(f, 0, 4);  // info
    Put(f, i == 0 ? 0 : 1, 8);
    Put(f, 0, 8);
  }
  std::memcpy(f.data(),
              "\x7f"
              "ELF\x02\x01\x01",
              7);
  PutAt(f, 16, 2, 2);     // ET_EXEC
  PutAt(f, 18, 62, 2);    // EM_X86_64
  PutAt(f, 20, 1, 4);     // EV_CURRENT
  PutAt(f, 24, text, 8);  // entry
  PutAt(f, 32, 64, 8);    // phoff
  PutAt(f, 40, shoff, 8);
  PutAt(f, 52, 64, 2);  // ehsize
  PutAt(f, 54, 56, 2);  // phentsize
  PutAt(f, 56, 1, 2);   // phnum
  PutAt(f, 58, 64, 2);  // shentsize
  PutAt(f, 60, sections.size(), 2);
  PutAt(f, 62, sections.size() - 1, 2);  // shstrndx
  PutAt(f, 64, 1, 4);                    // PT_LOAD
  PutAt(f, 68, 5, 4);                    // PF_R | PF_X
  PutAt(f, 64 + 16, text, 8);            // vaddr
  PutAt(f, 64 + 24, text, 8);            // paddr
  PutAt(f, 64 + 40, text_size, 8);       // memsz (filesz 0)
  PutAt(f, 64 + 48, 0x1000, 8);
  return f;
}

constexpr uint64_t kText = 0x10000;

// CFI sections: a CIE (version 1, no augmentation, code alignment 1, data
// alignment -8, return address in r16) whose initial instructions say CFA =
// RSP + 8 and RA at CFA - 8, then FDEs.
class Cfi {
 public:
  explicit Cfi(bool eh_frame) : eh_(eh_frame) {
    std::string body;
    Put(body, eh_ ? 0 : 0xffffffff, 4);  // CIE id
    body += '\x01';                      // version
    body += '\0';                        // augmentation ""
    body += Uleb(1);                     // code alignment
    body += '\x78';                      // data alignment -8
    body += '\x10';                      // return address register 16
    body += kCieInstructions;
    Entry(body);
  }
  static constexpr char kCieInstructions[] = "\x0c\x07\x08\x90\x01";  // def_cfa rsp 8; offset r16 at cfa-8
  static constexpr uint64_t kCieInstructionCount = 2;

  // An FDE over [start, start + len) with `program`.
  void Fde(uint64_t start, uint64_t len, const std::string& program) {
    std::string body;
    Put(body, eh_ ? bytes_.size() + 4 : 0, 4);  // CIE pointer: back to offset 0
    Put(body, start, 8);
    Put(body, len, 8);
    body += program;
    Entry(body);
  }
  std::string bytes() const { return eh_ ? bytes_ + std::string(4, '\0') : bytes_; }

 private:
  void Entry(std::string body) {
    // Unpadded, so that every instruction is one the test wrote (padding
    // would be DW_CFA_nop instructions).
    Put(bytes_, body.size(), 4);
    bytes_ += body;
  }
  bool eh_;
  std::string bytes_;
};

// advance_loc 1; def_cfa_offset 16 or 24, alternating: `rows` rows of one
// byte each.
std::string AlternatingProgram(uint64_t rows) {
  std::string p;
  p.reserve(rows * 3);
  for (uint64_t i = 0; i < rows; ++i) {
    p += '\x41';
    p += '\x0e';
    p += char(16 + 8 * (i % 2));
  }
  return p;
}

std::string EhFrameElf(const Cfi& cfi, uint64_t text_size) {
  return MakeElf(kText, text_size, {ElfSection{".eh_frame", 1, 2 /* SHF_ALLOC */, 0x400000, cfi.bytes(), 0}});
}

// DW_CFA_set_loc with the CIE's absolute 8-byte address.
std::string SetLoc(uint64_t loc) {
  std::string s = "\x01";
  Put(s, loc, 8);
  return s;
}

uint64_t Refusals(guard::Reason r) { return guard::RefusalCounts()[static_cast<size_t>(r)]; }

}  // namespace

// ---- Differential: the agent's interpreter against libdw's.

TEST(CfiDifferentialTest, DebianLibraries) {
  for (const char* lib : {"libc.so.6", "libcrypto.so.3", "libssl.so.3", "libstdc++.so.6"}) {
    ExpectSameAsReference(std::string(kLibDir) + lib);
  }
}

TEST(CfiDifferentialTest, NodeAndNginx) {
  ExpectSameAsReference("/usr/bin/node");
  ExpectSameAsReference("/usr/sbin/nginx");
}

TEST(CfiDifferentialTest, AndroidBoringSsl) { ExpectSameAsReference(std::string(kLibDir) + "android/libcrypto.so.0"); }

TEST(CfiDifferentialTest, TrixieRoot) {
  ASSERT_TRUE(std::filesystem::exists(kTrixieRoot))
      << "the trixie root is made by scripts/make-trixie-root.sh (as root)";
  for (const char* lib : {"libcrypto.so.3", "libc.so.6"}) {
    ExpectSameAsReference(std::string(kTrixieRoot) + "/usr/lib/x86_64-linux-gnu/" + lib);
  }
}

// Go 1.19 writes .debug_frame only, compressed (SHF_COMPRESSED); with cgo,
// gcc's .eh_frame too.
TEST(CfiDifferentialTest, Go119Binaries) {
  ASSERT_EQ(std::system("command -v go >/dev/null 2>&1"), 0) << "go is missing: scripts/install-deps.sh installs it";
  TempDir dir;
  dir.File("go.mod", "module cfitest\n\ngo 1.19\n");
  dir.File("main.go",
           "package main\n\n/*\nint tlsprof_cfunc(int n) { int s = 0; for (int i = 0; i < n; i++) s += i * n; "
           "return s; }\n*/\nimport \"C\"\nimport (\n\t\"crypto/sha256\"\n\t\"fmt\"\n)\n\n"
           "func main() { fmt.Println(sha256.Sum256([]byte(\"hi\")), C.tlsprof_cfunc(3)) }\n");
  const std::string env = "cd " + dir.path() + " && GOPROXY=off GOFLAGS=-mod=mod GOCACHE=/tmp/tlsprof-go-cache ";
  ASSERT_EQ(std::system((env + "CGO_ENABLED=1 go build -o cgo . 2>&1").c_str()), 0);
  std::filesystem::remove(dir.path() + "/main.go");
  dir.File("main.go",
           "package main\n\nimport (\n\t\"crypto/sha256\"\n\t\"fmt\"\n)\n\n"
           "func main() { fmt.Println(sha256.Sum256([]byte(\"hi\"))) }\n");
  ASSERT_EQ(std::system((env + "CGO_ENABLED=0 go build -o pure . 2>&1").c_str()), 0);
  ExpectSameAsReference(dir.path() + "/pure");
  ExpectSameAsReference(dir.path() + "/cgo");
}

// Small files that exercise the rules one by one, against the reference.
TEST(CfiDifferentialTest, SynthesizedPrograms) {
  TempDir dir;
  const std::vector<std::pair<const char*, std::string>> programs = {
      {"alternating", AlternatingProgram(300)},
      // push rbp; mov rbp, rsp; ...; leave with remember/restore around an epilogue.
      {"frame pointer", std::string("\x41\x0e\x10\x86\x02\x43\x0d\x06\x4a\x0a\x0c\x07\x08\x41\x0b\x42", 16)},
      // rbp restored, same_value, undefined, register, val_offset, expression forms.
      {"rbp rules", std::string("\x41\x86\x02\x41\xc6\x41\x08\x06\x41\x07\x06\x41\x09\x06\x03\x41\x14\x06\x02"
                                "\x41\x10\x06\x02\x23\x10\x41\x10\x06\x03\x11\x70\x22\x41\x10\x06\x00",
                                36)},
      // RA undefined (outermost frame), then restored.
      {"ra undefined", std::string("\x41\x07\x10\x41\xd0\x41", 6)},
      // CFA expressions: rsp+8 deref +16; r9 + 8; the PLT form; bn_mul_mont's.
      {"cfa expressions", std::string("\x41\x0f\x05\x77\x08\x06\x23\x10\x41\x0f\x02\x79\x08"
                                      "\x41\x0f\x0b\x77\x08\x80\x00\x3f\x1a\x3b\x2a\x33\x24\x22"
                                      "\x41\x0f\x0a\x77\x08\x79\x00\x38\x1e\x22\x06\x23\x08\x41",
                                      41)},
      // def_cfa_register / def_cfa_offset after an expression: invalid until def_cfa.
      {"invalid cfa", std::string("\x41\x0f\x02\x77\x08\x41\x0e\x20\x41\x0c\x07\x10\x41", 13)},
      // def_cfa_sf, def_cfa_offset_sf, offset_extended_sf, GNU_negative_offset_extended, args_size, nops.
      {"signed forms",
       std::string("\x41\x12\x07\x7e\x41\x13\x7d\x41\x11\x06\x7e\x41\x2f\x06\x02\x41\x2e\x10\x00\x41", 20)},
      // advance_loc1/2/4, then set_loc backwards (no row opens) and forwards.
      {"locations", std::string("\x02\x04\x0e\x10\x03\x04\x00\x0e\x18\x04\x02\x00\x00\x00\x0e\x20", 16) +
                        SetLoc(kText + 2) + "\x0e\x28" + SetLoc(kText + 0x20) + "\x0e\x30"},
      // An unknown opcode: the rest of the FDE is unsupported.
      {"unknown opcode", std::string("\x41\x0e\x10\x41\x3f\x41\x0e\x18", 8)},
      // restore_state without remember_state.
      {"bad restore", std::string("\x41\x0b\x41", 3)},
  };
  for (const auto& [name, program] : programs) {
    SCOPED_TRACE(name);
    for (bool eh : {true, false}) {
      Cfi cfi(eh);
      cfi.Fde(kText, 0x400, program);
      cfi.Fde(kText + 0x400, 0x10, "");  // a plain FDE after it
      const std::string path =
          dir.File("prog", eh ? EhFrameElf(cfi, 0x1000)
                              : MakeElf(kText, 0x1000, {ElfSection{".debug_frame", 1, 0, 0, cfi.bytes(), 0}}));
      auto ref = Build(path, true);
      auto got = Build(path);
      ASSERT_TRUE(ref.ok() && got.ok());
      const UnwindTable& r = **ref;
      const UnwindTable& t = **got;
      EXPECT_EQ(t.fdes, 2u);
      EXPECT_GE(t.cfi_rows, 2u);
      EXPECT_EQ(t.cfi_rows, r.cfi_rows);
      EXPECT_EQ(t.unsupported_rows, r.unsupported_rows);
      EXPECT_EQ(t.unsupported_bytes, r.unsupported_bytes);
      EXPECT_EQ(t.covered_bytes, r.covered_bytes);
      EXPECT_EQ(t.cfi_errors, r.cfi_errors);
      ASSERT_EQ(t.rows.size(), r.rows.size());
      for (size_t i = 0; i < t.rows.size(); ++i) {
        EXPECT_EQ(RowText(t.rows[i]), RowText(r.rows[i])) << i;
      }
    }
  }
}

// ---- Linear cost and the row caps.

// One FDE of N rows: every instruction runs once (libdw ran N^2 / 2).
TEST(CfiCapsTest, LongFdeCostsLinearInstructions) {
  constexpr uint64_t kRows = 60'000;
  static_assert(kRows < guard::kMaxRowsPerFde);
  Cfi cfi(true);
  cfi.Fde(kText, kRows + 1, AlternatingProgram(kRows));
  TempDir dir;
  auto built = Build(dir.File("long", EhFrameElf(cfi, kRows + 16)));
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  EXPECT_EQ(t.cfi_instructions, Cfi::kCieInstructionCount + 2 * kRows);
  EXPECT_EQ(t.cfi_rows, kRows + 1);
  EXPECT_EQ(t.unsupported_rows, 0u);
  EXPECT_EQ(t.cut_fdes, 0u);
  ASSERT_EQ(t.rows.size(), kRows + 2);  // + CFA_NONE past the FDE
  EXPECT_EQ(t.rows[0].cfa_off, 8);
  for (uint64_t i = 1; i <= kRows; ++i) {
    ASSERT_EQ(t.rows[i].pc, kText + i);
    ASSERT_EQ(t.rows[i].cfa_kind, CFA_RSP);
    ASSERT_EQ(t.rows[i].cfa_off, int32_t(16 + 8 * ((i - 1) % 2)));
  }
  EXPECT_EQ(t.rows.back().cfa_kind, CFA_NONE);
}

// 200,000 rows in one FDE: cut at kMaxRowsPerFde, the rest CFA_NONE, one
// refusal; the interpreter stops there.
TEST(CfiCapsTest, FdeOverTheRowCapIsCut) {
  constexpr uint64_t kRows = 200'000;
  const uint64_t cap = guard::kMaxRowsPerFde;
  Cfi cfi(true);
  cfi.Fde(kText, kRows + 1, AlternatingProgram(kRows));
  cfi.Fde(kText + kRows + 1, 0x20, "\x41\x0e\x10");  // the next FDE still has its rows
  TempDir dir;
  const uint64_t refused = Refusals(guard::Reason::kCfiRows);
  auto built = Build(dir.File("bomb", EhFrameElf(cfi, kRows + 64)));
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  EXPECT_EQ(Refusals(guard::Reason::kCfiRows), refused + 1);
  EXPECT_EQ(t.cut_fdes, 1u);
  EXPECT_FALSE(t.cut_at_image_cap);
  EXPECT_EQ(t.cfi_rows, cap + 2);  // + the next FDE's two
  EXPECT_EQ(t.unsupported_rows, 1u);
  EXPECT_EQ(t.unsupported_bytes, kRows + 1 - cap);
  // Up to the advance that would open row cap + 1, then the next FDE (CIE
  // instructions once, advance + def_cfa_offset there).
  EXPECT_EQ(t.cfi_instructions, Cfi::kCieInstructionCount + 2 * cap + 1 + 2);
  const unwind_row* cut = FindRow(t, kText + cap);
  ASSERT_NE(cut, nullptr);
  EXPECT_EQ(cut->pc, kText + cap);
  EXPECT_EQ(cut->cfa_kind, CFA_NONE);
  EXPECT_EQ(FindRow(t, kText + kRows)->cfa_kind, CFA_NONE);
  const unwind_row* next = FindRow(t, kText + kRows + 1 + 1);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->cfa_kind, CFA_RSP);
  EXPECT_EQ(next->cfa_off, 16);
}

// More rows than kMaxRowsPerImage over many FDEs: the table stops there,
// CFA_NONE after.
TEST(CfiCapsTest, FileOverTheRowCapIsCut) {
  constexpr uint64_t kRowsPerFde = 60'000;
  const uint64_t fdes = guard::kMaxRowsPerImage / (kRowsPerFde + 1) + 2;
  Cfi cfi(true);
  const std::string program = AlternatingProgram(kRowsPerFde);
  for (uint64_t i = 0; i < fdes; ++i) cfi.Fde(kText + i * (kRowsPerFde + 1), kRowsPerFde + 1, program);
  TempDir dir;
  const uint64_t refused = Refusals(guard::Reason::kCfiRows);
  auto built = Build(dir.File("many", EhFrameElf(cfi, fdes * (kRowsPerFde + 1))));
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  EXPECT_EQ(Refusals(guard::Reason::kCfiRows), refused + 1);
  EXPECT_TRUE(t.cut_at_image_cap);
  EXPECT_EQ(t.cut_fdes, 0u);
  EXPECT_EQ(t.cfi_rows, guard::kMaxRowsPerImage);
  EXPECT_LT(t.fdes, fdes);
  const uint64_t cut_pc = kText + guard::kMaxRowsPerImage;  // every CFI row covers one byte
  EXPECT_EQ(t.rows.back().pc, cut_pc);
  EXPECT_EQ(t.rows.back().cfa_kind, CFA_NONE);
  EXPECT_EQ(FindRow(t, cut_pc - 1)->cfa_kind, CFA_RSP);
}

// More FDEs than kMaxRowsPerImage (each one row): the list stops there.
TEST(CfiCapsTest, TooManyFdesAreCut) {
  const uint64_t fdes = guard::kMaxRowsPerImage + 10;
  Cfi cfi(true);
  for (uint64_t i = 0; i < fdes; ++i) cfi.Fde(kText + 2 * i, 1, "");
  TempDir dir;
  const uint64_t refused = Refusals(guard::Reason::kCfiRows);
  auto built = Build(dir.File("fdes", EhFrameElf(cfi, 2 * fdes)));
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  EXPECT_EQ(Refusals(guard::Reason::kCfiRows), refused + 1);  // once per file
  EXPECT_TRUE(t.cut_at_image_cap);
  EXPECT_EQ(t.fdes, guard::kMaxRowsPerImage);
  EXPECT_EQ(t.cfi_rows, guard::kMaxRowsPerImage);
  EXPECT_EQ(FindRow(t, kText + 2 * (guard::kMaxRowsPerImage - 1))->cfa_kind, CFA_RSP);
  EXPECT_EQ(FindRow(t, kText + 2 * guard::kMaxRowsPerImage)->cfa_kind, CFA_NONE);
}

// remember_state nested past the cap: the FDE is unsupported from there; a
// long run of balanced remember/restore pairs is fine and linear.
TEST(CfiCapsTest, RememberStateBomb) {
  TempDir dir;
  {
    Cfi cfi(true);
    cfi.Fde(kText, 0x100, "\x41\x0e\x10" + std::string(100'000, '\x0a') + "\x41\x0e\x18\x41");
    auto built = Build(dir.File("deep", EhFrameElf(cfi, 0x1000)));
    ASSERT_TRUE(built.ok()) << built.error().message;
    const UnwindTable& t = **built;
    EXPECT_EQ(t.cfi_errors, 1u);
    EXPECT_EQ(t.cfi_rows, 1u);  // [start, start + 1), before the bomb
    EXPECT_EQ(t.unsupported_rows, 1u);
    EXPECT_EQ(t.unsupported_bytes, 0x100u - 1);
    // The program stopped at the first remember_state past the cap.
    EXPECT_EQ(t.cfi_instructions, Cfi::kCieInstructionCount + 2 + 65);
    EXPECT_EQ(FindRow(t, kText + 1)->cfa_kind, CFA_NONE);
  }
  {
    constexpr uint64_t kPairs = 100'000;
    std::string program;
    for (uint64_t i = 0; i < kPairs; ++i) program += std::string("\x0a\x0e\x20\x0b", 4);
    program += "\x41\x0e\x10";
    Cfi cfi(true);
    cfi.Fde(kText, 0x10, program);
    auto built = Build(dir.File("pairs", EhFrameElf(cfi, 0x1000)));
    ASSERT_TRUE(built.ok());
    const UnwindTable& t = **built;
    EXPECT_EQ(t.cfi_errors, 0u);
    EXPECT_EQ(t.cfi_instructions, Cfi::kCieInstructionCount + 3 * kPairs + 2);
    EXPECT_EQ(FindRow(t, kText)->cfa_off, 8);
    EXPECT_EQ(FindRow(t, kText + 1)->cfa_off, 16);
  }
}

namespace {

// An SHF_COMPRESSED section's bytes: its Elf64_Chdr (zlib, `claimed` bytes
// inflated), then `stream`.
std::string Compressed(uint64_t claimed, const std::string& stream) {
  std::string b;
  Put(b, 1, 4);  // ELFCOMPRESS_ZLIB
  Put(b, 0, 4);  // reserved
  Put(b, claimed, 8);
  Put(b, 8, 8);  // ch_addralign
  return b + stream;
}

std::string Zlib(const std::string& bytes) {
  uLongf size = compressBound(bytes.size());
  std::string out(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(out.data()), &size, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size(),
                9) != Z_OK) {
    return "";
  }
  out.resize(size);
  return out;
}

}  // namespace

// A compressed .debug_frame is inflated when its header claims a sane size;
// one that claims 64 GiB is refused before anything is inflated, and the
// .eh_frame rows are still there.
TEST(CfiCapsTest, CompressedDebugFrameClaimingTooMuchIsNotInflated) {
  Cfi eh(true);
  eh.Fde(kText, 0x10, "\x41\x0e\x10");
  Cfi debug(false);
  debug.Fde(kText + 0x100, 0x10, "\x41\x0e\x18");
  const std::string stream = Zlib(debug.bytes());
  ASSERT_FALSE(stream.empty());
  TempDir dir;
  for (const uint64_t claimed : {uint64_t(debug.bytes().size()), uint64_t{64} << 30}) {
    SCOPED_TRACE(claimed);
    const bool sane = claimed <= guard::kMaxSectionBytes;
    const std::string elf =
        MakeElf(kText, 0x1000,
                {ElfSection{".eh_frame", 1, 2, 0x400000, eh.bytes(), 0},
                 ElfSection{".debug_frame", 1, 0x800 /* SHF_COMPRESSED */, 0, Compressed(claimed, stream), 0}});
    const uint64_t refused = Refusals(guard::Reason::kSectionSize);
    auto built = Build(dir.File("compressed", elf));
    ASSERT_TRUE(built.ok()) << built.error().message;
    const UnwindTable& t = **built;
    EXPECT_EQ(Refusals(guard::Reason::kSectionSize), refused + (sane ? 0 : 1));
    EXPECT_EQ(t.cfi_errors, 0u);  // refused, not inflated and failed
    EXPECT_EQ(t.cut_at_image_cap, !sane);
    EXPECT_EQ(t.fdes, sane ? 2u : 1u);
    EXPECT_EQ(FindRow(t, kText + 1)->cfa_off, 16);
    const unwind_row* debug_row = FindRow(t, kText + 0x101);
    ASSERT_NE(debug_row, nullptr);
    EXPECT_EQ(debug_row->cfa_kind, sane ? CFA_RSP : CFA_NONE);
    if (sane) {
      EXPECT_EQ(debug_row->cfa_off, 24);
    }
  }
}

// A section name table over kMaxSectionBytes (the rest of the file a hole)
// is refused, so .eh_frame cannot be found by name: the table says its CFI
// was left out at a cap (libdw, which reads the names, has the FDE) rather
// than reading as a file without CFI.
TEST(CfiCapsTest, SectionNamesOverTheCapMarkTheTableCut) {
  Cfi cfi(true);
  cfi.Fde(kText, 0x10, "\x41\x0e\x10");
  std::string elf = EhFrameElf(cfi, 0x1000);
  uint64_t shoff = 0, shstrndx = 0;
  for (unsigned i = 0; i < 8; ++i) shoff |= uint64_t(uint8_t(elf[40 + i])) << (8 * i);
  for (unsigned i = 0; i < 2; ++i) shstrndx |= uint64_t(uint8_t(elf[62 + i])) << (8 * i);
  const size_t names = shoff + shstrndx * 64;
  uint64_t names_offset = 0;
  for (unsigned i = 0; i < 8; ++i) names_offset |= uint64_t(uint8_t(elf[names + 24 + i])) << (8 * i);
  PutAt(elf, names + 32, guard::kMaxSectionBytes + 1, 8);  // sh_size
  TempDir dir;
  const std::string path = dir.File("names", elf);
  std::filesystem::resize_file(path, names_offset + guard::kMaxSectionBytes + 1);  // sparse
  const uint64_t refused = Refusals(guard::Reason::kSectionSize);
  auto built = Build(path);
  ASSERT_TRUE(built.ok()) << built.error().message;
  const UnwindTable& t = **built;
  EXPECT_GT(Refusals(guard::Reason::kSectionSize), refused);
  EXPECT_TRUE(t.cut_at_image_cap);
  EXPECT_EQ(t.cfi_errors, 0u);
  EXPECT_EQ(t.fdes, 0u);
  EXPECT_TRUE(t.rows.empty());
}

// ---- Go: a pclntab whose functions all share one long pcsp table.

namespace {

// A Go 1.18 pclntab of `nfunc` functions of `func_size` bytes from kGoText,
// all pointing at one pcsp table of `func_size` one-byte steps (SP 0, 8, 0,
// 8, ...).
constexpr uint64_t kGoText = 0x401000;
std::string SharedPcspPclntab(uint64_t nfunc, uint64_t func_size) {
  std::string t(72, '\0');
  PutAt(t, 0, 0xfffffff0, 4);
  t[6] = 1;  // quantum
  t[7] = 8;  // pointer size
  PutAt(t, 8, nfunc, 8);
  PutAt(t, 24, kGoText, 8);
  PutAt(t, 32, 72, 8);  // funcnametab
  t += std::string("main.f") + '\0';
  while (t.size() % 8) t.push_back('\0');
  const uint64_t pctab = t.size();
  t.push_back('\0');                                                              // pcsp offset 0 means "none"
  t += std::string("\x02\x01", 2);                                                // SP delta 0 over one byte
  for (uint64_t i = 1; i < func_size; ++i) t += i % 2 ? "\x10\x01" : "\x0f\x01";  // +8, -8
  t.push_back('\0');
  while (t.size() % 8) t.push_back('\0');
  const uint64_t pcln = t.size();
  PutAt(t, 40, pcln, 8);                   // cutab (unused)
  PutAt(t, 48, pcln, 8);                   // filetab (unused)
  PutAt(t, 56, pctab, 8);                  // pctab
  PutAt(t, 64, pcln, 8);                   // functab
  const uint64_t funcs = (nfunc + 1) * 8;  // _func records after the functab, offsets from pcln
  t.resize(pcln + funcs + nfunc * 40, '\0');
  for (uint64_t i = 0; i < nfunc; ++i) {
    PutAt(t, pcln + i * 8, i * func_size, 4);
    PutAt(t, pcln + i * 8 + 4, funcs + i * 40, 4);
    const uint64_t f = pcln + funcs + i * 40;
    PutAt(t, f, i * func_size, 4);  // entryoff
    PutAt(t, f + 4, 0, 4);          // nameoff
    PutAt(t, f + 16, 1, 4);         // pcsp, from pctab
  }
  PutAt(t, pcln + nfunc * 8, nfunc * func_size, 4);  // end of text
  return t;
}

}  // namespace

TEST(CfiCapsTest, GoTableOverTheRowCapIsRefused) {
  constexpr uint64_t kFuncSize = 60'000;
  TempDir dir;
  auto go_elf = [&](uint64_t nfunc) {
    return MakeElf(kGoText, nfunc * kFuncSize,
                   {ElfSection{".text", 8, 6 /* SHF_ALLOC | SHF_EXECINSTR */, kGoText, "", nfunc * kFuncSize},
                    ElfSection{".gopclntab", 1, 2, 0x800000, SharedPcspPclntab(nfunc, kFuncSize), 0}});
  };
  // Under the cap: one row per byte.
  const uint64_t under = guard::kMaxRowsPerImage / kFuncSize / 2;
  auto ok = Build(dir.File("go-under", go_elf(under)), false, true);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)->fdes, under);
  EXPECT_EQ((*ok)->cfi_rows, under * kFuncSize);
  EXPECT_EQ(FindRow(**ok, kGoText + 1)->cfa_off, 16);

  const uint64_t over = guard::kMaxRowsPerImage / kFuncSize + 2;
  const uint64_t refused = Refusals(guard::Reason::kPclntabRows);
  auto bomb = Build(dir.File("go-over", go_elf(over)), false, true);
  ASSERT_FALSE(bomb.ok());
  EXPECT_NE(bomb.error().message.find("refused"), std::string::npos) << bomb.error().message;
  EXPECT_EQ(Refusals(guard::Reason::kPclntabRows), refused + 1);
}

// ---- A file truncated and restored while it is read: errors, never a
// crash (the file is read with pread, never mapped).
TEST(CfiTruncationTest, FileTruncatedWhileBuilding) {
  const std::string lib = std::string(kLibDir) + "libcrypto.so.3";
  std::ifstream in(lib, std::ios::binary);
  ASSERT_TRUE(in) << lib << " is missing";
  const std::string image((std::istreambuf_iterator<char>(in)), {});
  TempDir dir;
  const std::string path = dir.File("libcrypto-copy.so", image);
  tlsprof::UniqueFd writer(open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(writer.valid());
  // The whole table, before the tenant starts cutting (an ASSERT with the
  // tenant's thread running would end the test binary).
  auto whole = Build(path);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> cuts{0};
  // The tenant keeps the file cut about half of the time.
  std::thread tenant([&] {
    for (uint64_t i = 0; !stop.load(); ++i) {
      const off_t len = off_t((image.size() / 7) * (1 + i % 6));
      if (ftruncate(writer.get(), len) != 0) continue;
      cuts.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      for (size_t off = size_t(len); off < image.size();) {
        const ssize_t n = pwrite(writer.get(), image.data() + off, image.size() - off, off_t(off));
        if (n <= 0) break;
        off += size_t(n);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  int complete = 0, partial = 0, errors = 0;
  for (int i = 0; i < 200; ++i) {
    auto built = Build(path);
    if (!built.ok()) {
      ++errors;
    } else {
      (*built)->rows.size() == (*whole)->rows.size() ? ++complete : ++partial;
    }
  }
  stop = true;
  tenant.join();
  std::printf("200 builds while the file was cut %lu times: %d complete tables, %d partial, %d errors\n", cuts.load(),
              complete, partial, errors);
  EXPECT_GT(cuts.load(), 0u);
}
