// Where separate debug files for a stripped binary may be found: the paths of
// its .gnu_debuglink and of the /usr/lib/debug/.build-id tree, and a
// debuginfod server (through libdebuginfod). LoadBinaryImage tries them in
// that order; this header holds the pieces so each can be tested alone.
//
// Thread-safety: all functions are thread-safe. The debuginfod negative cache
// is process-wide and guarded by a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/guarded_file.h"
#include "common/fd.h"
#include "common/result.h"

namespace tlsprof::symbols {

// The contents of a .gnu_debuglink section: a file name, NUL, padding to 4
// bytes, then the CRC32 (zlib's) of the whole debug file in the ELF's byte
// order.
struct DebugLink {
  std::string name;
  uint32_t crc = 0;
};
// nullopt if the section is malformed, or names something that is not a plain
// file name (empty, ".", "..", or containing '/').
std::optional<DebugLink> ParseDebugLink(std::span<const uint8_t> section, bool big_endian);

// GDB's search order for a debuglink name, in two parts:
//  - beside the binary: <dir>/<name>, <dir>/.debug/<name>, where `dir` is the
//    binary's directory as its process sees it; these are opened inside the
//    process's root (guard::ProcessRoot), as the tenant's files they are;
//  - under the agent's debug roots (host paths the operator configured):
//    <root>/<dir>/<name> per root, which is how distributions lay out
//    /usr/lib/debug.
// A `dir` that is not absolute gives none.
std::vector<std::string> BesideCandidates(std::string_view dir, std::string_view name);
std::vector<std::string> DebugRootCandidates(std::string_view dir, std::string_view name,
                                             const std::vector<std::string>& debug_roots);

// <root>/.build-id/<first two hex digits>/<rest>.debug per root. Empty if the
// build-id is shorter than 2 bytes.
std::vector<std::string> BuildIdCandidates(std::string_view build_id_hex, const std::vector<std::string>& debug_roots);

// zlib's CRC32 of the file's `file.size()` bytes (pread; an Error when it
// ends earlier).
Result<uint32_t> FileCrc32(const guard::GuardedFile& file);

// True iff $DEBUGINFOD_URLS is set and non-empty (read at each call).
bool DebuginfodConfigured();

// Asks the debuginfod servers of $DEBUGINFOD_URLS for the debug file of a GNU
// build-id (lowercase hex). Returns an open fd to the file in libdebuginfod's
// cache ($DEBUGINFOD_CACHE_PATH, else $XDG_CACHE_HOME/debuginfod_client, else
// ~/.cache/debuginfod_client), or an Error.
//
// Never blocks for much longer than `timeout`: libdebuginfod 0.188 has no
// setter for its timeout (DEBUGINFOD_TIMEOUT only bounds the connect and
// stalled-transfer times, default 90 s), so a progress callback, which it
// calls at least once per second while a query runs, cancels the query at the
// deadline. The environment is never modified.
//
// A build-id that was not found (or timed out, or failed) is remembered for
// the life of the process and not asked again: one query per build-id per
// agent run. Two threads asking for the same new build-id at once may both
// query.
Result<UniqueFd> FetchFromDebuginfod(std::string_view build_id_hex, std::chrono::milliseconds timeout);

struct DebuginfodStats {
  uint64_t queries = 0;        // queries sent to libdebuginfod
  uint64_t negative_hits = 0;  // answered "not found" from the in-process negative cache
};
DebuginfodStats GetDebuginfodStats();

}  // namespace tlsprof::symbols
