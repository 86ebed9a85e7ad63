#include "agent/discovery/proc_maps.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "agent/guard/limits.h"

namespace tlsprof::discovery {
namespace {

constexpr std::string_view kDeletedSuffix = " (deleted)";

bool ParseHex(std::string_view s, uint64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseDec(std::string_view s, uint64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 10);
  return ec == std::errc() && p == s.data() + s.size();
}

// Splits off the next space-delimited field of `line`.
std::string_view NextField(std::string_view& line) {
  size_t begin = line.find_first_not_of(' ');
  if (begin == std::string_view::npos) {
    line = {};
    return {};
  }
  line.remove_prefix(begin);
  size_t end = line.find(' ');
  std::string_view field = line.substr(0, end);
  line.remove_prefix(end == std::string_view::npos ? line.size() : end);
  return field;
}

Result<Mapping> ParseLine(std::string_view line) {
  // 7f1c2a000000-7f1c2a200000 r-xp 00002000 fd:01 1234  /usr/lib/x86_64-linux-gnu/libcrypto.so.3
  Mapping m;
  std::string_view range = NextField(line);
  std::string_view perms = NextField(line);
  std::string_view offset = NextField(line);
  std::string_view dev = NextField(line);
  std::string_view inode = NextField(line);
  size_t dash = range.find('-');
  size_t colon = dev.find(':');
  uint64_t major = 0, minor = 0;
  if (dash == std::string_view::npos || !ParseHex(range.substr(0, dash), m.start) ||
      !ParseHex(range.substr(dash + 1), m.end) || m.end < m.start || perms.size() < 4 || !ParseHex(offset, m.offset) ||
      colon == std::string_view::npos || !ParseHex(dev.substr(0, colon), major) ||
      !ParseHex(dev.substr(colon + 1), minor) || !ParseDec(inode, m.inode)) {
    return MakeError("malformed maps line '{}'", line);
  }
  m.dev_major = static_cast<uint32_t>(major);
  m.dev_minor = static_cast<uint32_t>(minor);
  m.executable = perms[2] == 'x';
  size_t path_begin = line.find_first_not_of(' ');
  if (path_begin != std::string_view::npos) {
    std::string_view path = line.substr(path_begin);
    if (path.ends_with(kDeletedSuffix)) {
      m.deleted = true;
      path.remove_suffix(kDeletedSuffix.size());
    }
    m.path.assign(path);
  }
  return m;
}

Result<std::string> ReadSmallFile(const std::string& path) {
  auto text = guard::ReadProcText(path, guard::kMaxProcFileBytes);
  if (!text) return text.error();
  return std::move(text->text);
}

}  // namespace

Result<std::vector<Mapping>> ParseMaps(std::string_view text) {
  std::vector<Mapping> out;
  size_t lineno = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++lineno;
    if (line.empty()) continue;
    auto m = ParseLine(line);
    if (!m.ok()) return MakeError("line {}: {}", lineno, m.error().message);
    out.push_back(std::move(m).value());
  }
  return out;
}

Result<ExecMaps> ReadExecMaps(pid_t pid, const std::string& proc_root) {
  ExecMaps out;
  std::optional<Error> bad;
  size_t lineno = 0;
  auto cut = guard::ForEachProcLine(fmt::format("{}/{}/maps", proc_root, pid), guard::kMaxMapsBytes,
                                    [&](std::string_view line) {
                                      ++lineno;
                                      if (line.empty()) return true;
                                      auto m = ParseLine(line);
                                      if (!m.ok()) {
                                        bad = MakeError("/proc/{}/maps: line {}: {}", pid, lineno, m.error().message);
                                        return false;
                                      }
                                      if (!m->executable || !m->is_file()) return true;
                                      if (out.mappings.size() >= guard::kMaxExecMappings) {
                                        out.cut = true;
                                        return false;
                                      }
                                      out.mappings.push_back(std::move(m).value());
                                      return true;
                                    });
  if (!cut.ok()) return MakeError("process {} is gone or not readable ({})", pid, cut.error().message);
  if (bad) return *bad;
  if (*cut) out.cut = true;
  if (out.cut) {
    guard::Refuse(guard::Reason::kMaps, fmt::format("process {}", pid),
                  fmt::format("/proc/{}/maps is over {} bytes or {} executable file mappings; the rest is left out",
                              pid, guard::kMaxMapsBytes, guard::kMaxExecMappings));
  }
  return out;
}

std::string ReadComm(pid_t pid, const std::string& proc_root) {
  auto text = ReadSmallFile(fmt::format("{}/{}/comm", proc_root, pid));
  if (!text.ok()) return {};
  std::string comm = std::move(text).value();
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\0')) comm.pop_back();
  return comm;
}

guard::MappedFileRef MappedFileOf(pid_t pid, const Mapping& mapping) {
  guard::MappedFileRef ref;
  ref.pid = pid;
  ref.start = mapping.start;
  ref.end = mapping.end;
  ref.id = {makedev(mapping.dev_major, mapping.dev_minor), mapping.inode};
  ref.path = mapping.path;
  ref.deleted = mapping.deleted;
  return ref;
}

Result<uint64_t> ParseStatStartTime(std::string_view text) {
  const size_t paren = text.rfind(')');
  if (paren == std::string_view::npos) return MakeError("malformed stat: no ')' after the command name");
  std::string_view rest = text.substr(paren + 1);
  // Field 3 (state) is the first after the name; field 22 is the 20th.
  std::string_view field;
  for (int i = 3; i <= 22; ++i) field = NextField(rest);
  while (!field.empty() && field.back() == '\n') field.remove_suffix(1);
  uint64_t start_time = 0;
  if (!ParseDec(field, start_time)) return MakeError("malformed stat: field 22 is '{}'", field);
  return start_time;
}

Result<ProcessIdentity> ReadProcessIdentity(pid_t pid, const std::string& proc_root) {
  auto text = ReadSmallFile(fmt::format("{}/{}/stat", proc_root, pid));
  if (!text.ok()) return MakeError("process {} is gone or not readable ({})", pid, text.error().message);
  auto start_time = ParseStatStartTime(*text);
  if (!start_time.ok()) return MakeError("/proc/{}/stat: {}", pid, start_time.error().message);
  ProcessIdentity id;
  id.start_time = *start_time;
  // Kernel threads have no executable; a process that exits in between is
  // caught by the next read of its maps. AT_STATX_DONT_SYNC: the inode's
  // cached attributes, so a tenant's FUSE daemon is never asked (and can
  // never make this wait).
  struct statx stx {};
  if (::statx(AT_FDCWD, fmt::format("{}/{}/exe", proc_root, pid).c_str(), AT_STATX_DONT_SYNC, STATX_INO, &stx) == 0) {
    id.exe_dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    id.exe_inode = stx.stx_ino;
  }
  return id;
}

std::vector<pid_t> ListPids(const std::string& proc_root) {
  std::vector<pid_t> pids;
  DIR* dir = ::opendir(proc_root.c_str());
  if (dir == nullptr) return pids;
  while (dirent* e = ::readdir(dir)) {
    uint64_t pid = 0;
    std::string_view name(e->d_name);
    if (ParseDec(name, pid) && pid > 0) pids.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  return pids;
}

}  // namespace tlsprof::discovery
