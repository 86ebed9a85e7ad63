// A shared library's loadable image as the dynamic loader would see it before
// running it: the PT_LOAD bytes, the pointers its dynamic relocations put
// into them, and the function extents of its .eh_frame. The readers that name
// a stripped library's functions from its own static tables
// (library_tables.h for OpenSSL 3, boringssl_tables.h for BoringSSL) decode
// those tables from here.
//
// Everything is read with pread into memory (no mapping: a file truncated
// while it is read must not SIGBUS the agent); a malformed file gives an
// Error, never a crash. A LoaderImage is immutable once loaded and safe to
// read from several threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/symbols/library_tables.h"
#include "common/result.h"

namespace tlsprof::symbols {

class LoaderImage {
 public:
  enum Kind : uint8_t { kNone, kCode, kReadOnly, kWritable };

  struct Segment {
    uint64_t vaddr = 0;
    std::vector<uint8_t> bytes;  // p_filesz bytes; the rest of p_memsz is zero
    uint64_t memsz = 0;          // p_memsz (.bss lies past the file bytes)
    Kind kind = kNone;
  };

  std::vector<Segment> segments;
  std::unordered_map<uint64_t, uint64_t> pointers;  // slot vaddr -> target vaddr
  std::vector<std::pair<uint64_t, uint64_t>> fdes;  // (start, length), sorted
  // Only with LoaderImageOptions::symbol_names: the defined .dynsym symbols
  // (name -> st_value), and the GOT slots of .rela.plt (slot vaddr -> the
  // imported or interposable symbol's name), which is what a call through a
  // PLT stub calls.
  std::unordered_map<std::string, uint64_t> exports;
  std::unordered_map<uint64_t, std::string> plt_slots;

  // The kind of the segment whose file bytes hold `vaddr`.
  Kind KindAt(uint64_t vaddr) const;
  // The kind of the segment whose memory (file bytes or the zero-filled rest,
  // .bss) holds `vaddr`.
  Kind MemoryKindAt(uint64_t vaddr) const;

  std::optional<uint64_t> PointerAt(uint64_t slot) const {
    auto it = pointers.find(slot);
    if (it == pointers.end()) return std::nullopt;
    return it->second;
  }

  // The `len` (at most 8) bytes at vaddr as the file holds them (before
  // relocation).
  std::optional<uint64_t> Read(uint64_t vaddr, size_t len) const;

  // Up to `max` file bytes from vaddr to the end of its segment (fewer at a
  // segment's end); empty if vaddr is in none.
  std::pair<const uint8_t*, size_t> Bytes(uint64_t vaddr, size_t max) const;

  // A NUL-terminated string of printable ASCII in a segment that is not
  // writable (.rodata shares the code's segment when linked with -z
  // noseparate-code, as older binutils did by default).
  std::optional<std::string_view> String(uint64_t vaddr) const;

  // The FDE that starts exactly at vaddr: its length.
  std::optional<uint64_t> FunctionSize(uint64_t vaddr) const;

 private:
  const Segment* SegmentAt(uint64_t vaddr) const;
};

struct LoaderImageOptions {
  bool symbol_names = false;  // fill `exports` and `plt_slots`
};

// Naming helpers the table readers share: a function that several table
// entries point at is named by all of them.
inline void AddDistinct(std::vector<std::string>& items, std::string item) {
  for (const std::string& i : items) {
    if (i == item) return;
  }
  items.push_back(std::move(item));
}

// `items` joined by `sep`, or "*" when there are more than `max`.
inline std::string JoinOrStar(const std::vector<std::string>& items, std::string_view sep, size_t max) {
  if (items.size() > max) return "*";
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out.append(sep);
    out.append(item);
  }
  return out;
}

// A function shared by more algorithms than this, or filling more slots of
// its tables, is named with "*" there.
inline constexpr size_t kMaxListed = 8;
inline constexpr size_t kMaxRoles = 3;

// The name a table reader gives a function from its table uses (each with
// an `algorithm` and a `role`; kind_name(use) gives its kind):
// "<prefix>:<kind>:<algorithms>:<roles>". Several kinds: "*". Several
// algorithms: all of them, sorted (AES-GCM|ARIA-GCM), "*" past kMaxListed.
// Several slots (ChaCha20-Poly1305's update and cipher): update+cipher, "*"
// past kMaxRoles.
template <typename Use, typename KindName>
std::string TableFunctionName(std::string_view prefix, const std::vector<Use>& uses, KindName kind_name) {
  std::vector<std::string> kinds, algs, roles;
  for (const Use& u : uses) {
    AddDistinct(kinds, std::string(kind_name(u)));
    AddDistinct(algs, u.algorithm);
    AddDistinct(roles, u.role);
  }
  std::sort(algs.begin(), algs.end());
  return std::string(prefix) + ":" + JoinOrStar(kinds, ":", 1) + ":" + JoinOrStar(algs, "|", kMaxListed) + ":" +
         JoinOrStar(roles, "+", kMaxRoles);
}

// Adds a TableFunction for each function `uses` maps (address -> its table
// uses), named TableFunctionName(prefix, its uses, kind_name), when it has
// an extent (an FDE); counts the others in `no_extent`.
template <typename Uses, typename KindName>
void NameTableFunctions(const LoaderImage& image, std::string_view prefix, const Uses& uses, KindName kind_name,
                        std::vector<TableFunction>& out, uint64_t& no_extent) {
  for (const auto& [addr, list] : uses) {
    auto size = image.FunctionSize(addr);
    if (!size) {
      ++no_extent;
      continue;
    }
    out.push_back({addr, *size, TableFunctionName(prefix, list, kind_name)});
  }
}

// Loads the x86-64 ELF64 file `elf`. Errors: not such a file, its headers or
// sections are malformed, or its loadable segments exceed 256 MiB.
Result<LoaderImage> LoadLoaderImage(const guard::ElfFile& elf, const LoaderImageOptions& options = {});

}  // namespace tlsprof::symbols
