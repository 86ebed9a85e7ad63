// Static-archive matching (agent/symbols/archive_match.h), which names a
// stripped library's functions from a libcrypto.a found beside it:
// ArchiveIndex::Load (GetArchiveIndex's parse, without its process-wide
// cache, which would keep every input) on an `ar` archive of ELF objects,
// then MatchArchive of a shared library against that index, with and without
// anchoring on its exports.
//
// Promises checked: the index's lookups agree with its function list
// (WithSize, GlobalsNamed, InSection find each function; masks are ranges);
// a match's functions are named and sorted by address, aliases (one
// address, one size) by name, and stats.functions counts the addresses.
//
// Input: u32 LE length N, N bytes of the archive, then the library, as
// debuglink_fuzz splits. In archive_match_large the library is sparse and
// 6 GiB; the archive never is (its members must tile the file, and an ar
// size field holds at most 10 digits).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "agent/guard/elf_file.h"
#include "agent/symbols/archive_match.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename T>
bool Has(std::span<const T> s, T v) {
  return std::find(s.begin(), s.end(), v) != s.end();
}

void CheckIndex(const tlsprof::symbols::ArchiveIndex& index) {
  const auto& fns = index.functions();
  for (uint32_t i = 0; i < fns.size(); ++i) {
    const tlsprof::symbols::ArchiveFunction& f = fns[i];
    if (!Has(index.WithSize(f.size), i) || !Has(index.InSection(f.section), i)) __builtin_trap();
    if (f.global && !Has(index.GlobalsNamed(f.name), i)) __builtin_trap();
    for (const tlsprof::symbols::ByteRange& r : index.mask(f.mask)) {
      if (r.begin >= r.end) __builtin_trap();
    }
  }
  (void)index.memory_bytes();
}

void CheckMatch(const tlsprof::symbols::ArchiveMatch& m) {
  uint64_t addresses = 0;
  for (size_t i = 0; i < m.functions.size(); ++i) {
    const tlsprof::symbols::MatchedFunction& f = m.functions[i];
    if (f.name.empty()) __builtin_trap();
    if (i == 0 || f.addr != m.functions[i - 1].addr) {
      ++addresses;
      if (i > 0 && f.addr < m.functions[i - 1].addr) __builtin_trap();
    } else if (f.size != m.functions[i - 1].size || f.name <= m.functions[i - 1].name) {
      __builtin_trap();  // aliases: one size, distinct names in order
    }
  }
  if (m.stats.functions != addresses) __builtin_trap();
}

// The calls into the code under test, on the open archive and library.
void Exercise(const tlsprof::guard::GuardedFile& archive, const tlsprof::guard::GuardedFile& library) {
  using namespace tlsprof::symbols;
  auto index = ArchiveIndex::Load(archive);
  if (!index.ok()) return;
  CheckIndex(**index);
  auto so = tlsprof::guard::ElfFile::Open(library);
  if (!so.ok()) return;
  for (bool anchor : {true, false}) {
    ArchiveMatchOptions options;
    options.anchor_on_exports = anchor;
    if (auto m = MatchArchive(*so, **index, options); m.ok()) CheckMatch(*m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> archive, library;
  if (!tlsprof::fuzz::SplitTwo(std::span<const uint8_t>(data, size), archive, library)) return 0;
  Exercise(tlsprof::fuzz::GuardedMemFile(archive.data(), archive.size(), /*sparse=*/false),
           tlsprof::fuzz::GuardedMemFile(library.data(), library.size()));
  return 0;
}
