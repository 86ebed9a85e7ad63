#include "agent/symbols/go_pclntab.h"

#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

using namespace symtest;

struct Func {
  uint64_t entry;
  uint64_t end;
  std::string name;
};

Result<std::vector<Func>> Decode(std::span<const uint8_t> data, uint64_t text_start = 0) {
  std::vector<Func> out;
  auto n = ForEachGoFunction(data, text_start, [&](uint64_t entry, uint64_t end, std::string_view name) {
    out.push_back(Func{entry, end, std::string(name)});
  });
  if (!n) return n.error();
  EXPECT_EQ(*n, out.size());
  return out;
}

// ---------------------------------------------------------------------------
// Synthetic tables, one per layout, little-endian with 8-byte pointers.

constexpr uint64_t kText = 0x401000;
const std::vector<std::pair<uint64_t, std::string>> kFuncs = {
    {0x0, "runtime.text"}, {0x40, "crypto/aes.encryptBlockAsm"}, {0x100, "crypto/tls.(*Conn).Handshake"}};
constexpr uint64_t kEndOff = 0x180;

struct Builder {
  std::vector<uint8_t> b;
  void Put(uint64_t off, uint64_t v, unsigned size) {
    if (b.size() < off + size) b.resize(off + size);
    for (unsigned i = 0; i < size; ++i) b[off + i] = i < 8 ? static_cast<uint8_t>(v >> (8 * i)) : 0;
  }
  uint64_t PutString(uint64_t off, const std::string& s) {
    if (b.size() < off + s.size() + 1) b.resize(off + s.size() + 1);
    std::memcpy(b.data() + off, s.c_str(), s.size() + 1);
    return off + s.size() + 1;
  }
  // The header's magic, quantum (1) and pointer size (8).
  void PutMagic(uint32_t magic) {
    Put(0, magic, 4);
    Put(6, 1, 1);  // quantum
    Put(7, 8, 1);  // ptr size
  }
  // kFuncs' names from `names` on; their offsets from `names`, and the end.
  std::vector<uint64_t> PutNames(uint64_t names, uint64_t* end) {
    std::vector<uint64_t> nameoffs;
    uint64_t off = names;
    for (auto& [entry, name] : kFuncs) {
      nameoffs.push_back(off - names);
      off = PutString(off, name);
    }
    *end = off;
    return nameoffs;
  }
  // The functab at `pcln` ({pc, funcoff} of `word` bytes each, then the end
  // PC) and the _func entries after it ({entry, nameoff, rest}), PCs from
  // `pc_base`: 1.18's u32 offsets (word 4) or 1.16's uintptr PCs (word 8).
  void PutFunctab(uint64_t pcln, uint64_t pc_base, unsigned word, const std::vector<uint64_t>& nameoffs) {
    const uint64_t funcs = pcln + (kFuncs.size() + 1) * 2 * word;
    const uint64_t func_size = 2 * word + 8;
    for (size_t i = 0; i < kFuncs.size(); ++i) {
      const uint64_t funcoff = funcs + i * func_size - pcln;
      Put(pcln + i * 2 * word, pc_base + kFuncs[i].first, word);
      Put(pcln + i * 2 * word + word, funcoff, word);
      Put(pcln + funcoff, pc_base + kFuncs[i].first, word);
      Put(pcln + funcoff + word, nameoffs[i], 4);
      Put(pcln + funcoff + word + 4, 0, word + 4);  // rest of _func
    }
    Put(pcln + kFuncs.size() * 2 * word, pc_base + kEndOff, word);
  }
};

// 1.18 (magic 0xfffffff0) or 1.20 (0xfffffff1): u32 functab relative to textStart.
std::vector<uint8_t> Build118(uint32_t magic, uint64_t header_text_start) {
  Builder t;
  t.PutMagic(magic);
  const uint64_t names = 72;
  t.Put(8, kFuncs.size(), 8);  // nfunc
  t.Put(16, 0, 8);             // nfiles
  t.Put(24, header_text_start, 8);
  t.Put(32, names, 8);
  uint64_t off = 0;
  const std::vector<uint64_t> nameoffs = t.PutNames(names, &off);
  uint64_t pcln = (off + 7) & ~7ull;
  for (int w : {5, 6, 7, 8}) t.Put(8 + 8 * static_cast<uint64_t>(w - 1), pcln, 8);  // cu/file/pc tabs, pcln
  t.PutFunctab(pcln, 0, 4, nameoffs);
  return t.b;
}

// 1.16/1.17 (0xfffffffa): uintptr PCs, names in funcnametab.
std::vector<uint8_t> Build116() {
  Builder t;
  t.PutMagic(0xfffffffa);
  const uint64_t names = 64;
  t.Put(8, kFuncs.size(), 8);
  t.Put(16, 0, 8);
  t.Put(24, names, 8);
  uint64_t off = 0;
  const std::vector<uint64_t> nameoffs = t.PutNames(names, &off);
  uint64_t pcln = (off + 7) & ~7ull;
  for (int w : {4, 5, 6, 7}) t.Put(8 + 8 * static_cast<uint64_t>(w - 1), pcln, 8);
  t.PutFunctab(pcln, kText, 8, nameoffs);
  return t.b;
}

// 1.2-1.15 (0xfffffffb): functab right after the header, offsets from the
// table start for both _func and names.
std::vector<uint8_t> Build12() {
  Builder t;
  t.PutMagic(0xfffffffb);
  t.Put(8, kFuncs.size(), 8);
  const uint64_t functab = 16;
  uint64_t funcs = functab + (kFuncs.size() + 1) * 16 + 8;
  uint64_t names = funcs + kFuncs.size() * 24;
  uint64_t off = names;
  for (size_t i = 0; i < kFuncs.size(); ++i) {
    uint64_t func = funcs + i * 24;
    t.Put(functab + i * 16, kText + kFuncs[i].first, 8);
    t.Put(functab + i * 16 + 8, func, 8);
    t.Put(func, kText + kFuncs[i].first, 8);
    t.Put(func + 8, off, 4);
    t.Put(func + 12, 0, 12);
    off = t.PutString(off, kFuncs[i].second);
  }
  t.Put(functab + kFuncs.size() * 16, kText + kEndOff, 8);
  return t.b;
}

void ExpectKFuncs(const Result<std::vector<Func>>& got) {
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_EQ(got->size(), kFuncs.size());
  for (size_t i = 0; i < kFuncs.size(); ++i) {
    EXPECT_EQ((*got)[i].name, kFuncs[i].second);
    EXPECT_EQ((*got)[i].entry, kText + kFuncs[i].first);
    EXPECT_EQ((*got)[i].end, kText + (i + 1 < kFuncs.size() ? kFuncs[i + 1].first : kEndOff));
  }
}

TEST(GoPclntabTest, DecodesGo118Layout) { ExpectKFuncs(Decode(Build118(0xfffffff0, kText))); }
TEST(GoPclntabTest, DecodesGo120Layout) {
  auto t = Build118(0xfffffff1, kText);
  EXPECT_EQ(ParseGoPclntabHeader(t)->version, GoPclntabVersion::kGo120);
  ExpectKFuncs(Decode(t));
}
TEST(GoPclntabTest, DecodesGo116Layout) { ExpectKFuncs(Decode(Build116())); }
TEST(GoPclntabTest, DecodesGo12Layout) { ExpectKFuncs(Decode(Build12())); }

TEST(GoPclntabTest, UnrelocatedTextStartUsesCallersValue) {
  // PIE: textStart is 0 in the file; the loader passes runtime.text.
  auto t = Build118(0xfffffff0, 0);
  EXPECT_EQ(ParseGoPclntabHeader(t)->text_start, 0u);
  ExpectKFuncs(Decode(t, kText));
}

TEST(GoPclntabTest, RejectsBadHeaders) {
  EXPECT_FALSE(ParseGoPclntabHeader({}));
  std::vector<uint8_t> t = Build118(0xfffffff0, kText);
  auto bad = t;
  bad[0] = 0x12;
  EXPECT_NE(ParseGoPclntabHeader(bad).error().message.find("magic"), std::string::npos);
  bad = t;
  bad[4] = 1;  // padding must be zero
  EXPECT_FALSE(ParseGoPclntabHeader(bad));
  bad = t;
  bad[7] = 16;  // pointer size
  EXPECT_FALSE(ParseGoPclntabHeader(bad));
  bad = t;
  bad[6] = 3;  // quantum
  EXPECT_FALSE(ParseGoPclntabHeader(bad));
}

TEST(GoPclntabTest, HugeFunctionCountIsAnErrorNotAnAllocation) {
  auto t = Build118(0xfffffff0, kText);
  Builder b{t};
  b.Put(8, 1ull << 60, 8);
  auto r = Decode(b.b);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("do not fit"), std::string::npos) << r.error().message;
}

TEST(GoPclntabTest, HeaderOffsetsBeyondTableAreErrors) {
  auto t = Build118(0xfffffff0, kText);
  Builder b{t};
  b.Put(8 + 7 * 8, t.size() + 100, 8);  // pclnOffset
  EXPECT_FALSE(Decode(b.b));
  b = Builder{t};
  b.Put(8 + 3 * 8, ~0ull, 8);  // funcnameOffset
  EXPECT_FALSE(Decode(b.b));
}

TEST(GoPclntabTest, NameOffsetOutOfRangeIsAnError) {
  auto t = Build118(0xfffffff0, kText);
  auto h = ParseGoPclntabHeader(t);
  ASSERT_TRUE(h);
  Builder b{t};
  // First _func's nameOff (functab entry 0's funcoff + 4).
  uint64_t funcoff = t[h->functab_offset + 4] | (uint64_t{t[h->functab_offset + 5]} << 8);
  b.Put(h->funcdata_offset + funcoff + 4, 0x7fffffff, 4);
  auto r = Decode(b.b);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("out of range"), std::string::npos) << r.error().message;
}

TEST(GoPclntabTest, UnterminatedNameIsAnError) {
  // Cut the table right inside the last name: it has no NUL any more.
  auto t = Build12();  // names at the very end
  t.pop_back();
  auto r = Decode(t);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("out of range"), std::string::npos) << r.error().message;
}

TEST(GoPclntabTest, DecreasingEntriesAreAnError) {
  auto t = Build118(0xfffffff0, kText);
  auto h = ParseGoPclntabHeader(t);
  Builder b{t};
  b.Put(h->functab_offset + 8, 0x500, 4);  // function 1 after function 2
  auto r = Decode(b.b);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("before function"), std::string::npos) << r.error().message;
}

TEST(GoPclntabTest, EveryTruncationIsHandled) {
  for (auto& table : {Build12(), Build116(), Build118(0xfffffff0, kText)}) {
    for (size_t len = 0; len < table.size(); ++len) {
      // An exact-size copy so ASan catches any read past the end.
      std::vector<uint8_t> cut(table.begin(), table.begin() + static_cast<ptrdiff_t>(len));
      auto r = Decode(cut);
      if (r) {
        EXPECT_LE(r->size(), kFuncs.size());
      }
    }
  }
}

TEST(GoPclntabTest, FindsTableInsideLargerRegion) {
  auto t = Build118(0xfffffff0, 0);
  std::vector<uint8_t> region(256 + t.size() + 64, 0xaa);
  std::fill(region.begin(), region.begin() + 256, 0);
  // A decoy: right magic and plausible header bytes, but not a table.
  region[8] = 0xf0, region[9] = region[10] = region[11] = 0xff, region[14] = 1, region[15] = 8;
  std::copy(t.begin(), t.end(), region.begin() + 256);
  auto off = FindGoPclntab(region);
  ASSERT_TRUE(off);
  EXPECT_EQ(*off, 256u);
  EXPECT_FALSE(FindGoPclntab(std::vector<uint8_t>(4096, 0xff)));
  EXPECT_FALSE(FindGoPclntab({}));
}

// ---------------------------------------------------------------------------
// Real Go binaries, built by the installed toolchain (std library only).

// The section's bytes and address, read with libelf.
struct SectionCopy {
  std::vector<uint8_t> bytes;
  uint64_t addr = 0;
};
std::optional<SectionCopy> ReadSection(const std::string& path, const std::string& name) {
  elf_version(EV_CURRENT);
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  Elf* elf = elf_begin(fd.get(), ELF_C_READ, nullptr);
  size_t shstrndx = 0;
  std::optional<SectionCopy> out;
  if (elf != nullptr && elf_getshdrstrndx(elf, &shstrndx) == 0) {
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr && !out; scn = elf_nextscn(elf, scn)) {
      GElf_Shdr shdr;
      const char* n = gelf_getshdr(scn, &shdr) ? elf_strptr(elf, shstrndx, shdr.sh_name) : nullptr;
      if (n == nullptr || name != n) continue;
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d == nullptr) break;
      const auto* p = static_cast<const uint8_t*>(d->d_buf);
      out = SectionCopy{std::vector<uint8_t>(p, p + d->d_size), shdr.sh_addr};
    }
  }
  elf_end(elf);
  return out;
}

class GoBinaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!symtest::HaveTool("go")) return;
    dir_ = new TempDir();
    std::ofstream(dir_->File("main.go")) << R"(package main

import (
	"crypto/aes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"os"
)

func main() {
	c, _ := aes.NewCipher(make([]byte, 16))
	b := make([]byte, 16)
	c.Encrypt(b, b)
	s := sha256.Sum256(b)
	if len(os.Args) > 5 {
		// Through an interface, so the small Handshake wrapper is not inlined away.
		var conn interface{ Handshake() error } = tls.Client(nil, &tls.Config{})
		_ = conn.Handshake()
	}
	fmt.Println(s[0])
}
)";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "needs the go toolchain";
  }

  // Builds main.go into `out` with extra flags; "" on failure (see output).
  static std::string Build(const std::string& out, const std::string& flags, const std::string& env = "") {
    std::string d = dir_->path();
    auto r = RunCommand("cd " + d + " && GOCACHE=" + d + "/cache GOPATH=" + d +
                        "/gopath GOFLAGS=-mod=mod GOPROXY=off GO111MODULE=off " + env + " go build " + flags + " -o " +
                        out + " main.go");
    if (r.status != 0) {
      ADD_FAILURE() << "go build " << flags << ": " << r.output;
      return "";
    }
    return d + "/" + out;
  }
  static std::string Strip(const std::string& in, const std::string& out) {
    auto r = RunCommand("objcopy --strip-all " + in + " " + dir_->File(out));
    return r.status == 0 ? dir_->File(out) : "";
  }

  static TempDir* dir_;
};
TempDir* GoBinaryTest::dir_ = nullptr;

const char* const kGoFuncs[] = {"crypto/tls.(*Conn).Handshake", "crypto/aes.encryptBlockAsm", "crypto/sha256.block",
                                "main.main"};

// Names .symtab gives each address. Go's .symtab marks assembly (ABI0)
// functions with a ".abi0" suffix that pclntab does not have, and pclntab
// then holds two functions of the same name (the ABI0 body and its
// ABIInternal wrapper), so comparisons go by address.
std::multimap<uint64_t, std::string> ByAddress(const BinaryImage& image) {
  std::multimap<uint64_t, std::string> out;
  for (const Symbol& s : image.symbols.all()) out.emplace(s.addr, s.name);
  return out;
}

// Go 1.18+ pclntab writes generic instantiations' type arguments as "[...]"
// where .symtab spells them out ("nistCurve[go.shape.*uint8_0]").
std::string ElideTypeArgs(const std::string& name) {
  std::string out;
  int depth = 0;
  for (char c : name) {
    if (c == '[') {
      if (depth++ == 0) out += "[...]";
    } else if (c == ']') {
      --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

bool HasName(const std::multimap<uint64_t, std::string>& by_addr, uint64_t addr, const std::string& name) {
  auto [lo, hi] = by_addr.equal_range(addr);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == name || it->second == name + ".abi0") return true;
    if (name.find("[...]") != std::string::npos && ElideTypeArgs(it->second) == name) return true;
  }
  return false;
}

// pclntab and .symtab agree on (nearly) every function. A few legitimately
// differ: C/assembly helpers of runtime/cgo whose .symtab entry has size 0
// (crosscall_amd64, only "runtime/cgo(.text)" has a size), and "type..eq"
// helpers for arrays, whose array length pclntab also elides.
constexpr double kMaxNameMismatch = 0.01;

// Every function the stripped image found through pclntab must be in the
// unstripped .symtab at the same address, and the ones we care about must
// resolve over their whole extent.
void ExpectSameFunctions(const BinaryImage& with_symtab, const BinaryImage& from_pclntab) {
  ASSERT_EQ(with_symtab.symbol_source, SymbolSource::kSymtab);
  ASSERT_EQ(from_pclntab.symbol_source, SymbolSource::kGoPclntab);
  EXPECT_TRUE(from_pclntab.is_go);
  auto symtab = ByAddress(with_symtab);
  size_t matched = 0, mismatched = 0;
  for (const Symbol& s : from_pclntab.symbols.all()) {
    if (HasName(symtab, s.addr, s.name)) {
      ++matched;
    } else {
      ++mismatched;
      if (mismatched <= 10) std::cerr << "not in .symtab: " << s.name << " at " << std::hex << s.addr << "\n";
    }
  }
  EXPECT_GT(matched, 1000u);
  EXPECT_LE(mismatched, matched * kMaxNameMismatch) << mismatched << " of " << matched + mismatched;
  for (const char* name : kGoFuncs) {
    // Assembly functions are "name.abi0" in .symtab, plain "name" in pclntab.
    const Symbol* a = SymbolNamed(with_symtab, name);
    if (a == nullptr) a = SymbolNamed(with_symtab, std::string(name) + ".abi0");
    const Symbol* b = SymbolNamed(from_pclntab, name);
    ASSERT_TRUE(a && b) << name;
    EXPECT_EQ(a->addr, b->addr) << name;
    EXPECT_GE(b->size, a->size) << name;  // pclntab extent includes padding
    auto found = from_pclntab.symbols.Find(a->addr + a->size - 1);
    ASSERT_TRUE(found) << name;
    EXPECT_EQ(from_pclntab.symbols.at(*found).name, name);
  }
}

TEST_F(GoBinaryTest, PclntabMatchesSymtabInTheSameBinary) {
  std::string full = Build("full", "");
  ASSERT_FALSE(full.empty());
  auto text = ReadSection(full, ".text");
  auto pcln = ReadSection(full, ".gopclntab");
  ASSERT_TRUE(text && pcln);
  auto header = ParseGoPclntabHeader(pcln->bytes);
  ASSERT_TRUE(header) << header.error().message;
  EXPECT_EQ(header->version, GoPclntabVersion::kGo118);  // Go 1.19 writes the 1.18 layout
  EXPECT_EQ(header->text_start, text->addr);
  auto funcs = Decode(pcln->bytes);
  ASSERT_TRUE(funcs) << funcs.error().message;

  auto img = LoadPath(full);
  ASSERT_TRUE(img) << img.error().message;
  EXPECT_TRUE((*img)->is_go);
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kSymtab);
  auto symtab = ByAddress(**img);
  size_t mismatched = 0;
  for (const Func& f : *funcs) {
    if (!HasName(symtab, f.entry, f.name)) {
      ++mismatched;
      continue;
    }
    auto found = (*img)->symbols.Find(f.entry);
    ASSERT_TRUE(found) << f.name;
    // The pclntab extent covers the symbol's (it may add alignment padding).
    EXPECT_GE(f.end, f.entry + (*img)->symbols.at(*found).size) << f.name;
  }
  EXPECT_LE(mismatched, funcs->size() * kMaxNameMismatch) << mismatched << " of " << funcs->size();
  for (const char* name : kGoFuncs) {
    EXPECT_TRUE(std::any_of(funcs->begin(), funcs->end(), [&](const Func& f) { return f.name == name; })) << name;
  }
}

TEST_F(GoBinaryTest, LdflagsStrippedBinaryUsesPclntab) {
  std::string full = Build("full", "");
  std::string stripped = Build("stripped", "-ldflags=-s");
  ASSERT_FALSE(full.empty() || stripped.empty());
  auto a = LoadPath(full);
  auto b = LoadPath(stripped);
  ASSERT_TRUE(a && b) << (a ? b.error().message : a.error().message);
  // -s only drops the symbol table; the code layout is the same.
  ExpectSameFunctions(**a, **b);
  // No GNU note: the build ID is the Go build ID, hex-encoded.
  auto goid = RunCommand("cd " + std::string(stripped).substr(0, stripped.rfind('/')) + " && go tool buildid stripped");
  ASSERT_EQ(goid.status, 0) << goid.output;
  std::string want;
  for (unsigned char c : goid.output.substr(0, goid.output.find('\n'))) want += fmt::format("{:02x}", c);
  EXPECT_EQ((*b)->build_id, want);
}

TEST_F(GoBinaryTest, InternallyLinkedPieUsesPclntabInRelro) {
  std::string full = Build("pie", "-buildmode=pie");
  ASSERT_FALSE(full.empty());
  std::string stripped = Strip(full, "pie.stripped");
  ASSERT_FALSE(stripped.empty());
  ASSERT_TRUE(ReadSection(stripped, ".data.rel.ro.gopclntab"));
  auto a = LoadPath(full);
  auto b = LoadPath(stripped);
  ASSERT_TRUE(a && b);
  ExpectSameFunctions(**a, **b);
}

TEST_F(GoBinaryTest, ExternallyLinkedPieFindsPclntabByMagic) {
  if (!symtest::HaveTool("gcc")) GTEST_SKIP() << "needs gcc for -linkmode=external";
  std::string full = Build("pieext", "-buildmode=pie -ldflags=-linkmode=external", "CGO_ENABLED=1");
  ASSERT_FALSE(full.empty());
  std::string stripped = Strip(full, "pieext.stripped");
  ASSERT_FALSE(stripped.empty());
  ASSERT_FALSE(ReadSection(stripped, ".gopclntab"));  // merged into .data.rel.ro by ld
  auto a = LoadPath(full);
  auto b = LoadPath(stripped);
  ASSERT_TRUE(a && b) << (a ? b.error().message : a.error().message);
  EXPECT_EQ((*b)->build_id, (*a)->build_id);  // the GNU note wins over Go's
  ExpectSameFunctions(**a, **b);
}

TEST_F(GoBinaryTest, KeepFilterAppliesToPclntab) {
  std::string stripped = Build("stripped", "-ldflags=-s");
  LoadOptions opts;
  opts.keep = [](std::string_view n) { return n.substr(0, 7) == "crypto/"; };
  auto img = LoadPath(stripped, opts);
  ASSERT_TRUE(img);
  EXPECT_GT((*img)->symbols_seen, (*img)->symbols.size());
  EXPECT_TRUE(SymbolNamed(**img, "crypto/aes.encryptBlockAsm"));
  EXPECT_FALSE(SymbolNamed(**img, "main.main"));
}

// Random corruption of a real table: errors are fine, crashes are not.
TEST_F(GoBinaryTest, RandomCorruptionOfRealPclntab) {
  std::string full = Build("full", "");
  auto pcln = ReadSection(full, ".gopclntab");
  ASSERT_TRUE(pcln);
  auto header = ParseGoPclntabHeader(pcln->bytes);
  ASSERT_TRUE(header);
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<uint8_t> t = pcln->bytes;
    for (int i = 0; i < 4; ++i) {
      // Header, functab and _func records are where corruption matters.
      size_t span = std::min<size_t>(t.size(), header->functab_offset + 200000);
      t[rng() % span] = static_cast<uint8_t>(rng());
    }
    (void)ForEachGoFunction(t, 0x401000, [](uint64_t, uint64_t, std::string_view) {});
    // The pcsp tables too (corrupt anywhere, including the pc-value tables).
    for (int i = 0; i < 4; ++i) t[rng() % t.size()] = static_cast<uint8_t>(rng());
    (void)ForEachGoFrame(t, 0x401000,
                         [](uint64_t entry, uint64_t end, std::string_view, std::span<const GoSpRange> sp) {
                           for (const GoSpRange& r : sp) {
                             EXPECT_TRUE(r.start >= entry && r.start < r.end && r.end <= end);
                           }
                         });
  }
}

// pcsp of the real binary: every function's ranges tile [entry, end) from
// its entry with no gaps, SP is never above the entry SP, and the functions
// that set up a frame do lower it.
TEST_F(GoBinaryTest, PcspTablesOfRealBinary) {
  std::string full = Build("full", "");
  auto pcln = ReadSection(full, ".gopclntab");
  ASSERT_TRUE(pcln);
  uint64_t funcs = 0, with_frame = 0, negative = 0, gaps = 0, empty = 0;
  bool main_has_frame = false;
  auto n = ForEachGoFrame(pcln->bytes, 0,
                          [&](uint64_t entry, uint64_t, std::string_view name, std::span<const GoSpRange> sp) {
                            ++funcs;
                            if (sp.empty()) {
                              ++empty;
                              return;
                            }
                            if (sp.front().start != entry || sp.front().sp_delta != 0)
                              ++gaps;  // entry: SP as the caller left it
                            int64_t max_delta = 0;
                            for (size_t i = 0; i < sp.size(); ++i) {
                              if (i > 0 && sp[i].start != sp[i - 1].end) ++gaps;
                              if (sp[i].sp_delta < 0) ++negative;
                              max_delta = std::max(max_delta, sp[i].sp_delta);
                            }
                            if (max_delta > 0) ++with_frame;
                            if (name == "main.main") main_has_frame = max_delta > 0;
                          });
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(*n, funcs);
  EXPECT_LE(empty, funcs / 100);
  EXPECT_EQ(gaps, 0u);
  EXPECT_EQ(negative, 0u);
  EXPECT_GT(with_frame, funcs / 2);
  EXPECT_TRUE(main_has_frame);
}

}  // namespace
}  // namespace tlsprof::symbols
