#include "agent/symbols/debug_sources.h"

#include <elfutils/debuginfod.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace tlsprof::symbols {

std::optional<DebugLink> ParseDebugLink(std::span<const uint8_t> section, bool big_endian) {
  // An empty section (sh_size 0) has no data pointer, and memchr(nullptr, ...)
  // is undefined even for 0 bytes (tests/fuzz/elf_symbols_fuzz covers it).
  if (section.empty()) return std::nullopt;
  const void* nul = std::memchr(section.data(), '\0', section.size());
  if (nul == nullptr) return std::nullopt;
  const size_t name_len = static_cast<const uint8_t*>(nul) - section.data();
  const size_t crc_off = (name_len + 1 + 3) & ~size_t{3};
  if (crc_off + 4 > section.size()) return std::nullopt;
  DebugLink link;
  link.name.assign(reinterpret_cast<const char*>(section.data()), name_len);
  if (link.name.empty() || link.name == "." || link.name == ".." || link.name.find('/') != std::string::npos) {
    return std::nullopt;
  }
  const uint8_t* c = section.data() + crc_off;
  link.crc = big_endian ? (uint32_t{c[0]} << 24 | uint32_t{c[1]} << 16 | uint32_t{c[2]} << 8 | c[3])
                        : (uint32_t{c[3]} << 24 | uint32_t{c[2]} << 16 | uint32_t{c[1]} << 8 | c[0]);
  return link;
}

namespace {

// Joins path pieces with exactly one '/' between them.
std::string Join(std::string_view a, std::string_view b) {
  while (a.size() > 1 && a.back() == '/') a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a.empty()) return std::string(b);
  if (a == "/") a = "";
  // append() rather than operator+: gcc 12 at -O3 warns falsely (-Wrestrict,
  // GCC PR 105329) on "/" + std::string.
  std::string out;
  out.reserve(a.size() + 1 + b.size());
  out.append(a).append("/").append(b);
  return out;
}

}  // namespace

std::vector<std::string> BesideCandidates(std::string_view dir, std::string_view name) {
  std::vector<std::string> out;
  if (dir.empty() || dir.front() != '/') return out;
  out.push_back(Join(dir, name));
  out.push_back(Join(Join(dir, ".debug"), name));
  return out;
}

std::vector<std::string> DebugRootCandidates(std::string_view dir, std::string_view name,
                                             const std::vector<std::string>& debug_roots) {
  std::vector<std::string> out;
  if (dir.empty() || dir.front() != '/') return out;
  for (const std::string& root : debug_roots) {
    if (!root.empty()) out.push_back(Join(Join(root, dir), name));
  }
  return out;
}

std::vector<std::string> BuildIdCandidates(std::string_view build_id_hex, const std::vector<std::string>& debug_roots) {
  std::vector<std::string> out;
  if (build_id_hex.size() < 4) return out;
  const std::string rel = fmt::format(".build-id/{}/{}.debug", build_id_hex.substr(0, 2), build_id_hex.substr(2));
  for (const std::string& root : debug_roots) {
    if (!root.empty()) out.push_back(Join(root, rel));
  }
  return out;
}

Result<uint32_t> FileCrc32(const guard::GuardedFile& file) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<uint8_t> buf(1 << 16);
  for (uint64_t off = 0; off < file.size();) {
    const uint64_t n = std::min<uint64_t>(buf.size(), file.size() - off);
    if (auto st = file.ReadExact(off, std::span<uint8_t>(buf.data(), n)); !st) return st.error();
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    off += n;
  }
  return static_cast<uint32_t>(crc);
}

bool DebuginfodConfigured() {
  const char* urls = std::getenv(DEBUGINFOD_URLS_ENV_VAR);
  return urls != nullptr && urls[0] != '\0';
}

namespace {

struct NegativeCache {
  std::mutex mu;
  std::unordered_set<std::string> missing;
  DebuginfodStats stats;
};

NegativeCache& Negatives() {
  static NegativeCache* cache = new NegativeCache;  // never destroyed: used until exit
  return *cache;
}

using ClientPtr = std::unique_ptr<debuginfod_client, decltype([](debuginfod_client* c) { debuginfod_end(c); })>;

// Called by libdebuginfod about once a second (and on progress) while a query
// runs; a non-zero return cancels the query.
int CancelAtDeadline(debuginfod_client* client, long /*done*/, long /*total*/) {
  const auto* deadline = static_cast<const std::chrono::steady_clock::time_point*>(debuginfod_get_user_data(client));
  return deadline != nullptr && std::chrono::steady_clock::now() >= *deadline ? 1 : 0;
}

}  // namespace

Result<UniqueFd> FetchFromDebuginfod(std::string_view build_id_hex, std::chrono::milliseconds timeout) {
  if (build_id_hex.empty()) return MakeError("no build-id to ask debuginfod for");
  const std::string key(build_id_hex);
  NegativeCache& neg = Negatives();
  {
    std::lock_guard<std::mutex> lock(neg.mu);
    if (neg.missing.contains(key)) {
      ++neg.stats.negative_hits;
      return MakeError("build-id {}: not found by debuginfod earlier in this run", key);
    }
    ++neg.stats.queries;
  }
  // One client per query: a debuginfod_client must not be used by two threads
  // at once, and queries are rare (once per build-id), so a pool is not worth
  // it. libdebuginfod initialises libcurl in its own constructor, so
  // debuginfod_begin() is safe to call from any thread.
  ClientPtr client(debuginfod_begin());
  if (!client) return MakeError("build-id {}: cannot start a debuginfod client", key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  debuginfod_set_user_data(client.get(), const_cast<std::chrono::steady_clock::time_point*>(&deadline));
  debuginfod_set_progressfn(client.get(), CancelAtDeadline);
  // build_id_len 0: libdebuginfod takes the build-id as a lowercase hex string.
  char* path = nullptr;
  const int rc = debuginfod_find_debuginfo(client.get(), reinterpret_cast<const unsigned char*>(key.c_str()), 0, &path);
  std::free(path);
  if (rc >= 0) return UniqueFd(rc);
  {
    std::lock_guard<std::mutex> lock(neg.mu);
    neg.missing.insert(key);
  }
  if (std::chrono::steady_clock::now() >= deadline) {
    return MakeError("build-id {}: debuginfod did not answer within {} ms (servers: {})", key, timeout.count(),
                     std::getenv(DEBUGINFOD_URLS_ENV_VAR) ? std::getenv(DEBUGINFOD_URLS_ENV_VAR) : "");
  }
  return MakeError("build-id {}: no debug file from debuginfod: {}", key, std::strerror(-rc));
}

DebuginfodStats GetDebuginfodStats() {
  NegativeCache& neg = Negatives();
  std::lock_guard<std::mutex> lock(neg.mu);
  return neg.stats;
}

}  // namespace tlsprof::symbols
