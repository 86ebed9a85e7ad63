// BinaryImage: what tlsprof needs from one ELF file (executable or shared
// library), loaded once per build-id and shared between processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agent/guard/guarded_file.h"
#include "agent/symbols/import_calls.h"
#include "agent/symbols/symbol_table.h"
#include "common/result.h"

namespace tlsprof::symbols {

struct LoadSegment {
  uint64_t offset = 0;  // p_offset
  uint64_t vaddr = 0;   // p_vaddr
  uint64_t filesz = 0;  // p_filesz
  uint64_t memsz = 0;   // p_memsz
  bool executable = false;
};

// Where the symbols of an image came from (reported per library).
// kDebugLink, kBuildIdDebugDir and kDebuginfod name the separate debug file
// whose .symtab was used (merged with the file's own .dynsym) because the file
// itself has none; kStaticArchive means the names were recovered by matching
// the code against a static archive of the same build (archive_match.h), also
// merged with .dynsym; kLibraryTables means .dynsym plus the names a stripped
// OpenSSL 3 library's own provider tables give its unexported functions
// (library_tables.h); kMethodTables the same from a stripped BoringSSL's
// method structs (boringssl_tables.h).
enum class SymbolSource {
  kNone,
  kDynsym,
  kSymtab,
  kGoPclntab,
  kDebugLink,
  kBuildIdDebugDir,
  kDebuginfod,
  kStaticArchive,
  kLibraryTables,
  kMethodTables
};
// "none", "dynsym", "symtab", "gopclntab", "debuglink", "build-id-dir",
// "debuginfod", "static-archive", "library-tables", "method-tables"
std::string_view SymbolSourceName(SymbolSource source);

struct BinaryImage {
  // Whether names came from files found beside the image inside its process's
  // root (a debuglink file or a static archive there): the tenant chose them,
  // so the image names that one file only and is never shared with another
  // file of the same content (ImageCache).
  bool tenant_sources = false;
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
  // x86-64 only: return addresses of calls to imported functions that the
  // keep filter accepts (import_calls.h), e.g. nginx's calls to SSL_write
  // or a program's call to EVP_PKEY_sign, which may tail-call away.
  ImportCalls import_calls;
  // Where each function of the file starts, from .eh_frame_hdr's search
  // table, which stripped binaries keep too: offsets from function_base
  // (the section's address, as the table counts them), sorted. Names no
  // function, but tells functions apart where no symbol does (an unnamed
  // caller, aggregate::Attributor). Empty without a usable table.
  uint64_t function_base = 0;
  std::vector<int32_t> function_starts;

  // The start of the function holding `vaddr` by function_starts: the
  // nearest start at or below it (past a function's end that is the last
  // one before the address). nullopt below the first or without a table.
  std::optional<uint64_t> FunctionStartAt(uint64_t vaddr) const;

  // Maps a file offset (from /proc/PID/maps: ip - map_start + map_pgoff) to the
  // ELF virtual address used by the symbol table. nullopt if no PT_LOAD covers it.
  std::optional<uint64_t> FileOffsetToVaddr(uint64_t file_offset) const;

  // The ELF virtual address of the first byte of a mapping that starts at
  // file offset `map_offset` (map_pgoff of /proc/PID/maps), so that the
  // mapping's load bias is map_start - MappingVaddr(...). The kernel maps a
  // PT_LOAD from its offset rounded down to a page, so that offset can lie
  // inside the previous segment's file range: lld gives each segment its own
  // pages with p_vaddr != p_offset (BoringSSL's libcrypto.so.0: R at offset 0,
  // R E at offset 0x863c0 / vaddr 0x873c0, mapped from offset 0x86000), where
  // FileOffsetToVaddr(0x86000) would answer from the R segment, 0x1000 off.
  // The segment whose permission matches `executable` and whose page-rounded
  // file range holds the offset wins; else FileOffsetToVaddr's answer.
  std::optional<uint64_t> MappingVaddr(uint64_t map_offset, bool executable) const;
};

// Decides which function symbols to keep (by name). Big statically linked
// binaries such as node (~100 MB) keep only the TLS library's symbols, so the
// agent's RSS stays small. nullptr keeps everything.
using SymbolFilter = std::function<bool(std::string_view name)>;

// Where to look for a separate debug file when a binary has no .symtab (and
// is not a Go binary with a pclntab). Sources are tried in this order, and the
// first debug file whose GNU build-id matches the binary's wins (a binary
// without a build-id accepts a debuglink file on its CRC alone):
//  1. .gnu_debuglink, GDB's order: <dir>/<name>, <dir>/.debug/<name> beside
//     the binary (inside its process's root: ImageOrigin), then
//     <root>/<dir>/<name> for each debug root; the file's CRC32 must match
//     the one in the link;
//  2. <root>/.build-id/xx/yyyy.debug for each debug root;
//  3. debuginfod, if use_debuginfod.
// Files that do not match, are malformed or lack .symtab are skipped (logged at
// debug level).
struct DebugSearch {
  // Directories as the agent sees them (host paths).
  std::vector<std::string> debug_roots = {"/usr/lib/debug"};
  // Default: true iff $DEBUGINFOD_URLS is set and non-empty when the options
  // are made. libdebuginfod reads DEBUGINFOD_URLS and DEBUGINFOD_CACHE_PATH
  // itself at each query.
  bool use_debuginfod = DefaultUseDebuginfod();
  // Longest wait for one debuginfod query (see FetchFromDebuginfod in
  // debug_sources.h: enforced by cancelling, ~1 s granularity).
  std::chrono::milliseconds debuginfod_timeout{5000};

  // Last resort for a stripped library that no debug file was found for:
  // static archives of the same build (see archive_match.h), tried in order
  // until one passes the same-build check. First `static_archives` (host
  // paths), tried for every such library; then, for a library whose DT_SONAME
  // is in `static_archive_sonames`, lib<name>.a in the library's own
  // directory (inside its process's root) and in the same directory of the
  // agent's own root (e.g. libssl-dev's /usr/lib/x86_64-linux-gnu/libcrypto.a).
  // A foreign archive fails the check and is skipped (logged at debug level).
  // Parsed archives are cached for the life of the process (per dev, inode,
  // size, mtime and ctime).
  std::vector<std::string> static_archives;
  std::vector<std::string> static_archive_sonames = {"libcrypto.so.3", "libssl.so.3", "libcrypto.so.1.1",
                                                     "libssl.so.1.1"};

  // After all of the above (and for a library no debug file or archive
  // names): the library's own tables (library_tables.h for OpenSSL 3,
  // boringssl_tables.h for BoringSSL), merged with .dynsym.
  bool library_tables = true;

  static bool DefaultUseDebuginfod();
};

struct LoadOptions {
  SymbolFilter keep;  // may be empty
  // With `keep`: a .symtab (the binary's or its debug file's) also keeps the
  // functions that share object files with kept ones, by the link's layout
  // (object_layout.h): a static link's library helpers with generic names.
  // Not for Go binaries.
  bool keep_whole_objects = false;
  DebugSearch debug;
};

// Where an image's file lives, for what is looked up beside it (debuglink
// files, static archives of the same build).
struct ImageOrigin {
  // The file's path as its process sees it (/proc/PID/maps, inside the
  // process's root); the directory of an absolute path is where debuglink
  // files and archives are looked for.
  std::string path;
  // The process's root, which that directory resolves in (its own mount
  // namespace, chroot, symlinks): guard::ProcessRoot. Null: the agent's own
  // root (tools and tests that load host files).
  std::shared_ptr<const guard::ProcessRoot> root;
};

// Asked before a load reads a file's data, with the bytes the load will read
// and keep at its peak, computed from the file's own headers (the sizes of
// the sections it reads, not the file's size: a sparse file can be of any
// size). `what` names the file. False refuses the load; the callee counts
// the refusal (guard::MemoryBudget::Skipped). Empty: every load is admitted.
using AdmitFn = std::function<bool(uint64_t bytes, std::string_view what)>;

// Reads the ELF file `file` (opened by guard: OpenMapping for a mapped file,
// so deleted or replaced files work). Symbol order of preference: .symtab,
// then .dynsym (both merged when .symtab exists, since .dynsym may hold names a
// partial .symtab lacks), then Go's .gopclntab when the binary has no symtab,
// then the .symtab of a separate debug file (see DebugSearch), merged with
// .dynsym the same way, then names matched from a static archive of the same
// build (DebugSearch::static_archives), merged with .dynsym too, then the
// library's own tables.
//
// Malformed files (truncated, bogus offsets or counts) give an Error, never a
// crash; a malformed debug file is skipped; what is over a guard cap is
// refused and counted (guard/limits.h). Thread-safe (the only shared state is
// the debuginfod negative cache and the archive cache, both locked).
Result<std::shared_ptr<const BinaryImage>> LoadBinaryImage(const guard::GuardedFile& file, const ImageOrigin& origin,
                                                           const LoadOptions& options = {}, const AdmitFn& admit = {});

// Cheap: reads only the ELF header and notes. Returns "" when there is none.
Result<std::string> ReadBuildId(const guard::GuardedFile& file);

// ImageCache: one BinaryImage per file, shared between the processes that
// map it. An image is found by what the file cannot forge:
//  - its identity: (st_dev, st_ino, size, mtime, ctime);
//  - or its content: the SHA-256 of the whole file (up to
//    kMaxContentHashedBytes), so that the same library in many containers
//    (each overlay mount has its own st_dev) is loaded once; an image whose
//    names came from the tenant's files (BinaryImage::tenant_sources) is
//    never found this way.
// Never by the build-id the file declares: a file that copies another's
// build-id with a crafted .symtab gets its own image. Thread-safe.
inline constexpr uint64_t kMaxContentHashedBytes = 1ull << 30;
class ImageCache {
 public:
  explicit ImageCache(LoadOptions options = {}) : options_(std::move(options)) {}
  // origin and admit as for LoadBinaryImage.
  Result<std::shared_ptr<const BinaryImage>> Get(const guard::GuardedFile& file, const ImageOrigin& origin,
                                                 const AdmitFn& admit = {});
  size_t size() const;
  // Drops the images only the cache holds.
  void Prune();

 private:
  LoadOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const BinaryImage>> images_;  // by identity
  std::unordered_map<std::string, std::weak_ptr<const BinaryImage>> by_content_;
};

}  // namespace tlsprof::symbols
