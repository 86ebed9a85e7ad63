// Names for a stripped shared library from a static archive of the same build.
//
// Debian's libcrypto.so.3 keeps only .dynsym, so the provider functions and
// the perlasm that OpenSSL's exported entry points tail-call into have no
// names. libssl-dev ships libcrypto.a from the same build, and OpenSSL
// compiles every object once (-fPIC) for both the archive and the shared
// library: a function's machine code in the .so equals its object code except
// at relocation sites. So each function of the archive gets a fingerprint
// (size, hash of its bytes with the relocated fields masked out), and each
// function of the .so (its .eh_frame FDE ranges) is looked up by size and
// hashed with the candidates' masks.
//
// Matching, in order:
//  1. Archive check: the .so's exported .dynsym functions that the archive
//     also defines must (almost all) match their archive fingerprint at their
//     .dynsym address, else the archive is from another build and rejected.
//  2. FDE ranges: a range whose bytes match exactly one archive function body
//     (or several bodies that all carry the same name) gets its name, if the
//     body has enough unmasked bytes to be distinctive.
//  3. Anchors: the linker copies each object's code section whole, so every
//     unique match (and every verified export) fixes where its section sits
//     in the .so. The other functions of an anchored section are then checked
//     at section base + their offset, which names functions that were
//     ambiguous alone (identical small functions in several objects) or have
//     no FDE. Sections with conflicting anchors are not used. A section
//     without anchors is placed where an ambiguous range points if all of
//     its functions match there, nothing else fits there and it fits nowhere
//     else.
//
// Thread-safety: ArchiveIndex is immutable after Load; the cache behind
// GetArchiveIndex is locked. MatchArchive is reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/guard/guarded_file.h"
#include "common/result.h"

namespace tlsprof::symbols {

// One function of one relocatable member.
struct ArchiveFunction {
  std::string name;
  uint64_t size = 0;
  uint64_t hash = 0;      // of the bytes with `mask` zeroed
  uint32_t body = 0;      // same body id for aliases (same member, section, offset, size)
  uint32_t section = 0;   // id of (member, section) in the whole archive
  uint64_t offset = 0;    // st_value: offset inside that section
  uint32_t mask = 0;      // index into ArchiveIndex::masks()
  uint32_t unmasked = 0;  // bytes that the hash covers
  bool global = false;    // STB_GLOBAL / STB_WEAK
};

// Byte ranges [begin, end) relative to a function's start whose contents
// differ between the object and the linked library (relocated fields, and
// the instruction bytes linker relaxations may rewrite).
struct ByteRange {
  uint32_t begin = 0, end = 0;
};

class ArchiveIndex {
 public:
  // Parses an ar archive of ELF relocatable objects (x86-64). Members that are
  // not ELF relocatables are ignored; a malformed archive or member (bad
  // header, extents past the end of the file, bogus symbol or relocation
  // tables) is an Error.
  static Result<std::shared_ptr<const ArchiveIndex>> Load(const guard::GuardedFile& file);

  const std::string& path() const { return path_; }
  const std::vector<ArchiveFunction>& functions() const { return functions_; }
  std::span<const ByteRange> mask(uint32_t id) const;
  // Indices into functions() of the functions of exactly `size` bytes.
  std::span<const uint32_t> WithSize(uint64_t size) const;
  // Indices of the global functions named `name`.
  std::span<const uint32_t> GlobalsNamed(std::string_view name) const;
  // Indices of the functions of one (member, section), sorted by offset.
  std::span<const uint32_t> InSection(uint32_t section) const;
  size_t member_count() const { return members_; }
  size_t section_count() const { return section_members_.size(); }
  // Approximate heap bytes held (for the memory budget).
  size_t memory_bytes() const;

  // Hash of `bytes` (which must be `mask`'s function's size) with the masked
  // ranges treated as zero. Exposed so the .so side hashes the same way.
  static uint64_t MaskedHash(std::span<const uint8_t> bytes, std::span<const ByteRange> mask);

 private:
  std::string path_;
  size_t members_ = 0;
  std::vector<ArchiveFunction> functions_;
  std::vector<ByteRange> mask_ranges_;
  std::vector<uint32_t> mask_begin_;       // mask id -> first range; one extra at the end
  std::vector<uint32_t> section_members_;  // section id -> member number (for logs)
  std::vector<uint32_t> by_size_;          // function indices sorted by size
  std::vector<uint32_t> by_section_;       // function indices sorted by (section, offset)
  std::vector<uint32_t> section_begin_;    // section id -> first index in by_section_; one extra
  std::unordered_map<std::string_view, std::vector<uint32_t>> globals_;  // views into functions_[i].name

  friend class ArchiveIndexBuilder;
};

// Load() through a process-wide cache keyed by the file's device, inode, size,
// mtime and ctime, so processes that map the same library (node and nginx, or
// the same file seen through several /proc/PID/root paths) parse the archive
// once. Failures are not cached.
Result<std::shared_ptr<const ArchiveIndex>> GetArchiveIndex(const guard::GuardedFile& file);

struct ArchiveMatchOptions {
  // Use the .so's exported (.dynsym) names as anchors (step 3). Off only to
  // measure the matcher blind, against the exports as ground truth.
  bool anchor_on_exports = true;
  // Step 1: share of the checked exports that must match, and the share of
  // the .so's sized exported functions the archive must define at all.
  double min_export_match = 0.9;
  double min_export_coverage = 0.5;
  // Step 2: a function matched by its FDE range alone needs this many
  // unmasked bytes (a 3-byte `xor eax,eax; ret` says nothing).
  uint32_t min_unique_bytes = 12;
  // Step 3b: a section placed by its layout alone needs this many unmasked
  // bytes in all.
  uint64_t min_layout_bytes = 48;
};

struct MatchedFunction {
  uint64_t addr = 0;  // ELF virtual address in the .so
  uint64_t size = 0;
  std::string name;
};

struct ArchiveMatchStats {
  uint64_t exports = 0;          // sized STT_FUNC entries of .dynsym
  uint64_t exports_checked = 0;  // ... that the archive defines (step 1)
  uint64_t exports_matched = 0;  // ... whose fingerprint matched
  uint64_t fde_ranges = 0;       // FDEs inside executable segments
  uint64_t fde_no_candidate = 0;
  uint64_t fde_no_match = 0;   // candidates of that size, none matched
  uint64_t fde_unique = 0;     // named in step 2
  uint64_t fde_ambiguous = 0;  // matched several differently named bodies
  uint64_t fde_too_small = 0;  // matched, but too few unmasked bytes alone
  uint64_t anchored_sections = 0;
  uint64_t conflicting_sections = 0;
  uint64_t anchored_functions = 0;  // named in step 3 (not already by step 2)
  uint64_t layout_sections = 0;     // placed by their whole layout (step 3b)
  uint64_t layout_functions = 0;    // named by those
  uint64_t functions = 0;           // distinct addresses named in the result
};

struct ArchiveMatch {
  std::vector<MatchedFunction> functions;  // sorted by address; aliases share one
  ArchiveMatchStats stats;
};

// Matches the shared library `so` against `index`. Errors: the .so is
// malformed, or the archive fails the check of step 1 (the message says why;
// LoadBinaryImage logs it at debug level and moves on).
Result<ArchiveMatch> MatchArchive(const guard::ElfFile& so, const ArchiveIndex& index,
                                  const ArchiveMatchOptions& options = {});

// Default archives for a library: for a soname in `sonames`, lib<x>.a (its
// soname up to ".so") in `dirs`, in order, deduplicated.
std::vector<std::string> DefaultStaticArchives(std::string_view soname, const std::vector<std::string>& sonames,
                                               const std::vector<std::string>& dirs);

}  // namespace tlsprof::symbols
