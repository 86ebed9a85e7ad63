// Helpers shared by the symbols tests: temp dirs, files, commands, the
// libraries built from testdata/ and the malformed copies of a real one.
// gtest assertions.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/symbols/binary_image.h"
#include "agent/symbols/library_tables.h"
#include "common/fd.h"
#include "common/result.h"

// Fails the test (never skips it) when one of the files is missing; `hint`
// says how to install it.
#define SYMTEST_REQUIRE_FILES(hint, ...)                             \
  for (const char* f : {__VA_ARGS__}) {                              \
    ASSERT_EQ(access(f, R_OK), 0) << f << " is missing: " << (hint); \
  }

namespace tlsprof::symbols::symtest {

// Debian's OpenSSL 3 the tests read (libssl3 and libssl-dev, installed by
// scripts/install-deps.sh).
inline constexpr const char* kLibcrypto = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";
inline constexpr const char* kLibcryptoA = "/usr/lib/x86_64-linux-gnu/libcrypto.a";
inline constexpr const char* kLibssl = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
inline constexpr const char* kLibsslA = "/usr/lib/x86_64-linux-gnu/libssl.a";

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> ReadFileBytes(const std::string& path);
void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes);

// Runs `command` through /bin/sh; returns its exit status and stdout+stderr.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);
bool HaveTool(const std::string& name);  // on $PATH
// RunCommand's output; a test failure when it exits non-zero.
std::string MustRun(const std::string& command);
// Build ID as printed by `readelf -n`, or "" if it prints none.
std::string ReadelfBuildId(const std::string& path);

// Opens `path` and loads it.
Result<std::shared_ptr<const BinaryImage>> LoadPath(const std::string& path, const LoadOptions& options = {});

// Opens `path` as ELF (guard::ElfFile) and hands it to `read`
// (ReadLibraryTables, ReadBoringSslTables, ...).
template <typename T>
Result<T> ReadPath(const std::string& path, Result<T> (*read)(const guard::ElfFile&)) {
  auto file = guard::OpenHostFile(path);
  if (!file) return file.error();
  auto elf = guard::ElfFile::Open(*file);
  if (!elf) return elf.error();
  return read(*elf);
}

// Names from the file itself (and local debug files) only: no static archive,
// no debuginfod.
LoadOptions NoArchiveNoDebuginfod();

// Loads `path` and checks where its names came from; null (after a test
// failure) when it does not load.
std::shared_ptr<const BinaryImage> LoadFrom(const std::string& path, const LoadOptions& options, SymbolSource source);

// How many symbols `path` has from .dynsym alone (`options` with the library
// tables off); checks that .dynsym is where they came from.
size_t DynsymOnlySize(const std::string& path, LoadOptions options);

// The symbol `name` of `image` is found at its middle address too.
void ExpectFoundInside(const BinaryImage& image, const std::string& name);

// Address of the symbol named `name` (first match), or 0.
uint64_t AddrOf(const BinaryImage& image, const std::string& name);
const Symbol* SymbolNamed(const BinaryImage& image, const std::string& name);

// Builds agent/symbols/testdata/`source` into DIR/`stem`.so with
// `cc -fPIC -shared -Wl,-soname,<soname> <cflags> ... <libs>` (keeping its
// .symtab: the truth of a tables test) and strips a copy to
// DIR/`stem`.stripped.so (what the reader sees).
CommandResult BuildTestLibrary(const TempDir& dir, const std::string& stem, const std::string& soname,
                               const std::string& cflags, const std::string& source, const std::string& libs = "");

// What a tables reader made of a library built from testdata/ (BuildTestLibrary).
template <typename Tables>
struct BuiltTables {
  Tables tables;                                    // read from the stripped copy
  std::map<std::string, std::string> by_real_name;  // TableNamesByRealName
};

// Builds `source` as BuildTestLibrary does and reads the stripped copy with
// `read`. Needs cc.
template <typename Tables>
void ReadBuiltLibrary(const std::string& stem, const std::string& soname, const std::string& cflags,
                      const std::string& source, const std::string& libs, Result<Tables> (*read)(const guard::ElfFile&),
                      BuiltTables<Tables>* out);

// The functions a tables reader named, by the name `full` (the same library
// with its .symtab) gives their address: real name -> table name. Adds a test
// failure for a function at no real function's address or with another
// extent.
std::map<std::string, std::string> TableNamesByRealName(const BinaryImage& full,
                                                        const std::vector<TableFunction>& functions);

// Writes truncated copies of `bytes` (0, 3, 64 and 4096 bytes, a third, all
// but the last byte) to `path` and adds a test failure for each copy shorter
// than half the file that `reads(path)` accepts.
void ExpectTruncatedCopiesFail(const std::vector<uint8_t>& bytes, const std::string& path,
                               const std::function<bool(const std::string&)>& reads);

// A generator seeded at random; the seed is printed, so a failure replays.
std::mt19937 SeededRng(unsigned& seed);

// Writes `rounds` copies of `bytes` to `path`, each with `flips` random bytes
// of [begin, end) changed, and calls check() after each.
void ForEachCorruptedCopy(const std::vector<uint8_t>& bytes, const std::string& path, size_t begin, size_t end,
                          int rounds, int flips, std::mt19937& rng, const std::function<void()>& check);

// `read` rejects a file of 10000 'A's at `path`, saying it is not ELF.
template <typename Read>
void ExpectNotElfRejected(const std::string& path, Read read) {
  WriteFileBytes(path, std::vector<uint8_t>(10000, 0x41));
  auto r = read(path);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("not an ELF"), std::string::npos) << r.error().message;
}

// Bytes [begin, end) of a file; end 0: to its end.
struct ByteRegion {
  size_t begin = 0, end = 0;
};

// Truncated, corrupted and non-ELF copies of the real library `real`
// (at least 1 MiB), written to a scratch file named `copy_name`: `read`
// rejects the truncated ones and the non-ELF one, and `check(result, seed)`
// looks at what it makes of each corrupted one (`rounds` copies per region,
// each with `flips` random bytes changed).
template <typename Read, typename Check>
void ExpectMalformedCopiesHandled(const char* real, const std::string& copy_name,
                                  std::initializer_list<ByteRegion> regions, int rounds, int flips, Read read,
                                  Check check) {
  const std::vector<uint8_t> bytes = ReadFileBytes(real);
  ASSERT_GT(bytes.size(), 1u << 20);
  TempDir dir;
  const std::string path = dir.File(copy_name);
  ExpectTruncatedCopiesFail(bytes, path, [&](const std::string& p) { return static_cast<bool>(read(p)); });
  unsigned seed = 0;
  std::mt19937 rng = SeededRng(seed);
  for (const ByteRegion& r : regions) {
    ForEachCorruptedCopy(bytes, path, r.begin, r.end == 0 ? bytes.size() : r.end, rounds, flips, rng,
                         [&] { check(read(path), seed); });
  }
  ExpectNotElfRejected(path, read);
}

template <typename Tables>
void ReadBuiltLibrary(const std::string& stem, const std::string& soname, const std::string& cflags,
                      const std::string& source, const std::string& libs, Result<Tables> (*read)(const guard::ElfFile&),
                      BuiltTables<Tables>* out) {
  ASSERT_TRUE(HaveTool("cc")) << "cc is missing: run scripts/install-deps.sh";
  TempDir dir;
  auto built = BuildTestLibrary(dir, stem, soname, cflags, source, libs);
  ASSERT_EQ(built.status, 0) << built.output;
  auto full = LoadPath(dir.File(stem + ".so"));  // .symtab: the truth
  ASSERT_TRUE(full) << full.error().message;
  auto tables = ReadPath(dir.File(stem + ".stripped.so"), read);
  ASSERT_TRUE(tables) << tables.error().message;
  out->by_real_name = TableNamesByRealName(**full, tables->functions);
  out->tables = std::move(*tables);
}

}  // namespace tlsprof::symbols::symtest
