// BinaryImage: what tlsprof needs from one ELF file (executable or shared
// library), loaded once per build-id and shared between processes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agent/common/result.h"
#include "agent/symbols/symbol_table.h"

namespace tlsprof::symbols {

struct LoadSegment {
  uint64_t offset = 0;  // p_offset
  uint64_t vaddr = 0;   // p_vaddr
  uint64_t filesz = 0;  // p_filesz
  uint64_t memsz = 0;   // p_memsz
  bool executable = false;
};

// Where the symbols of an image came from (reported per library).
enum class SymbolSource { kNone, kDynsym, kSymtab, kGoPclntab };
std::string_view SymbolSourceName(SymbolSource source);  // "none", "dynsym", "symtab", "gopclntab"

struct BinaryImage {
  // Lowercase hex of NT_GNU_BUILD_ID. Go binaries linked internally have no GNU
  // note: they get the bytes of Go's build ID note (owner "Go", type 4; an ASCII
  // string like "abc/def/ghi/jkl"), hex-encoded. That ID is a fine cache key but
  // unknown to debuginfod. Empty if neither note exists.
  std::string build_id;
  std::string soname;  // DT_SONAME, empty for executables
  bool is_go = false;  // has .gopclntab or .go.buildinfo (or a pclntab was found by magic)
  std::vector<LoadSegment> segments;
  SymbolTable symbols;
  SymbolSource symbol_source = SymbolSource::kNone;
  // Function symbols in the file, before the keep filter: those of .symtab (or
  // pclntab), plus .dynsym entries at addresses the former lacks (a .dynsym
  // name at an address .symtab already covers is a versioned alias and is
  // neither counted nor stored). Symbols of size 0 are counted but not stored:
  // they could never match.
  //
  // Go names: .symtab calls assembly functions "pkg.name.abi0"; pclntab calls
  // them "pkg.name" and spells generic type arguments "[...]".
  uint64_t symbols_seen = 0;

  // Maps a file offset (from /proc/PID/maps: ip - map_start + map_pgoff) to the
  // ELF virtual address used by the symbol table. nullopt if no PT_LOAD covers it.
  std::optional<uint64_t> FileOffsetToVaddr(uint64_t file_offset) const;
};

// Decides which function symbols to keep (by name). Big statically linked
// binaries such as node (~100 MB) keep only the TLS library's symbols, so the
// agent's RSS stays small. nullptr keeps everything.
using SymbolFilter = std::function<bool(std::string_view name)>;

struct LoadOptions {
  SymbolFilter keep;  // may be empty
};

// Reads an ELF file through an open fd (so deleted or replaced files, opened via
// /proc/PID/map_files, work). Symbol order of preference: .symtab, then
// .dynsym (both merged when .symtab exists, since .dynsym may hold names a
// partial .symtab lacks), then Go's .gopclntab when the binary has no symtab.
// Malformed files (truncated, bogus offsets or counts) give an Error, never a
// crash. Thread-safe (no shared state).
Result<std::shared_ptr<const BinaryImage>> LoadBinaryImage(int fd, std::string_view display_path,
                                                           const LoadOptions& options = {});

// Cheap: reads only the ELF header and notes. Returns "" when there is none.
Result<std::string> ReadBuildId(int fd);

// ImageCache: keeps one BinaryImage per build-id (or per dev:inode:size:mtime
// when a file has no build-id). Thread-safe.
class ImageCache {
 public:
  explicit ImageCache(LoadOptions options = {}) : options_(std::move(options)) {}
  Result<std::shared_ptr<const BinaryImage>> Get(int fd, std::string_view display_path);
  size_t size() const;

 private:
  LoadOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const BinaryImage>> images_;
};

}  // namespace tlsprof::symbols
