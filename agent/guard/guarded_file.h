// The one way into files that another process controls.
//
// The agent runs as root and reads the files every process on the host maps:
// libraries and executables in containers, and the debug files and static
// archives next to them. Any of those a tenant can replace, truncate, turn
// into a FIFO or a symlink at any moment. Every reader in the agent
// (discovery, symbols, debug files, archives, unwind tables, usage plans)
// opens such files only through this header, which holds to this contract:
//
//  - Resolution stays inside the process's root. A path the process sees is
//    resolved from a directory fd of /proc/PID/root with
//    openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): an absolute symlink or
//    ".." in a container resolves inside that container, never on the host.
//    A mapping is opened through /proc/PID/map_files/START-END, which reaches
//    the very inode that is mapped, with the path as the fallback.
//  - Nothing is opened for reading before it is known to be a regular file:
//    the path is opened with O_PATH (no driver's open, no FIFO wait), then
//    fstat-ed, and only a regular file is re-opened read-only through
//    /proc/self/fd with O_NONBLOCK | O_NOCTTY | O_CLOEXEC. A mapping's file
//    must also be the mapped one: (st_dev, st_ino) equal to the maps line's,
//    checked before a byte is read.
//  - Every read is a bounded pread. Nothing is mmapped: a file truncated
//    while it is read gives a short read (an Error counted as
//    guard::Reason::kShortRead), never SIGBUS. Files over kMaxFileBytes are
//    refused at open.
//  - Refusals (not a regular file, another file than the one mapped, too
//    large) are counted by reason (guard/limits.h) and the caller gets an
//    Error; absent files are the usual case and are not counted.
//
// The agent's own configuration (--debug-dir, /usr/lib/debug, --static-archive)
// names host paths the operator controls: OpenHostFile opens them with the
// same checks but without a root to stay inside.
//
// Thread-safety: GuardedFile is a move-only value (its reads are pread and
// may run on several threads at once); ProcessRoot is immutable once open.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/result.h"

namespace tlsprof::guard {

// What the kernel says a file is: the device and inode a maps line prints.
struct FileId {
  uint64_t dev = 0;  // st_dev, i.e. makedev(major, minor) of a maps line
  uint64_t ino = 0;
  bool operator==(const FileId&) const = default;
};

// A regular file opened read-only under the contract above.
class GuardedFile {
 public:
  GuardedFile() = default;
  GuardedFile(GuardedFile&&) noexcept = default;
  GuardedFile& operator=(GuardedFile&&) noexcept = default;

  bool valid() const { return fd_ != nullptr && fd_->valid(); }
  // For libelf (ELF_C_READ reads with pread) and fstat; never for mmap.
  int fd() const { return fd_->get(); }
  // The fd, shared: a uprobe link keeps the file open through it.
  const std::shared_ptr<UniqueFd>& shared_fd() const { return fd_; }
  FileId id() const { return id_; }
  uint64_t size() const { return size_; }  // st_size at open
  int64_t mtime_ns() const { return mtime_ns_; }
  int64_t ctime_ns() const { return ctime_ns_; }
  // Whether the file's filesystem sits on a block device (st_dev's major is
  // not 0: ext4, xfs on a disk). Only the host's root mounts those (no user
  // namespace can), so a read of such a file never waits on a tenant's
  // daemon the way one on FUSE, NFS or an overlay over FUSE (all major 0)
  // can: work on it may run on the caller's thread (guard/deadline.h).
  bool on_block_device() const { return OnBlockDevice(id_.dev); }
  static bool OnBlockDevice(uint64_t dev);  // dev: st_dev
  // The path as the process sees it (or the host path), for messages.
  const std::string& name() const { return name_; }
  // /proc/self/fd/N: names this very file to the kernel (uprobes), whatever
  // happens to its path.
  std::string ProcPath() const;

  // Reads exactly out.size() bytes at `offset`. An Error when the file ends
  // first (counted as kShortRead: it shrank since it was opened, or a header
  // lied about where its data is) or the read fails.
  Status ReadExact(uint64_t offset, std::span<uint8_t> out) const;
  // Reads `length` bytes at `offset` into a new buffer, refusing (kSectionSize)
  // a length over `cap` before allocating anything. `what` names the range in
  // messages ("section .symtab").
  Result<std::vector<uint8_t>> ReadRange(uint64_t offset, uint64_t length, uint64_t cap, std::string_view what) const;
  // Whether fstat now shows another size, mtime or ctime than at open.
  bool ChangedSinceOpen() const;
  // The SHA-256 of the file's size() bytes, as lowercase hex: what its
  // content is, which no tenant can make match another file's.
  Result<std::string> Sha256() const;

 private:
  friend Result<GuardedFile> FinishOpen(UniqueFd path_fd, std::string name, std::optional<FileId> expected);
  std::shared_ptr<UniqueFd> fd_;
  FileId id_;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  int64_t ctime_ns_ = 0;
  std::string name_;
};

// The root directory of a process (/proc/PID/root), held open so that every
// path under it resolves inside it, even if the process exits or chroots
// again later.
class ProcessRoot {
 public:
  static Result<ProcessRoot> Open(pid_t pid, const std::string& proc_root = "/proc");
  // A directory taken as a root (tests, and roots the agent makes itself):
  // paths resolve inside it as inside a process's root; host_prefix() is
  // the directory.
  static Result<ProcessRoot> OpenDirectory(const std::string& dir);

  pid_t pid() const { return pid_; }
  // Opens `path` as the process sees it, resolved inside its root. Absent:
  // an Error, not counted. `expected`: the file must be that one (kReplaced).
  Result<GuardedFile> OpenFile(std::string_view path, std::optional<FileId> expected = std::nullopt) const;
  // The path inside the root of a path from /proc/PID/maps. The kernel prints
  // maps paths relative to the READER's root: for a process in its own mount
  // namespace (pivot_root) that is already the path inside; for a process in
  // a plain chroot it is the host path, under the directory the root is at
  // (host_prefix()), which is stripped. nullopt when the path is not under it.
  std::optional<std::string> InsidePath(std::string_view maps_path) const;
  // Where the host sees this root ("" when it is "/" or not reachable from
  // the agent's root, e.g. another mount namespace's).
  const std::string& host_prefix() const { return host_prefix_; }

 private:
  pid_t pid_ = 0;
  std::shared_ptr<UniqueFd> dir_;  // O_PATH | O_DIRECTORY of /proc/PID/root
  std::string host_prefix_;
};

// A file mapping as /proc/PID/maps shows it.
struct MappedFileRef {
  pid_t pid = 0;
  uint64_t start = 0, end = 0;
  FileId id;
  std::string path;  // as maps prints it (without " (deleted)")
  bool deleted = false;
};

// Opens the file behind a mapping: /proc/PID/map_files/START-END first (the
// mapped inode, even deleted or replaced, in any mount namespace), else the
// path resolved inside the process's root (ProcessRoot::InsidePath). Either
// way the file must be a regular file with the mapping's (dev, ino), or it
// is refused.
Result<GuardedFile> OpenMapping(const MappedFileRef& mapping, const std::string& proc_root = "/proc");

// The first half of OpenMapping alone: /proc/PID/map_files/START-END, and
// no path. It resolves no path of the process, so it waits on no
// filesystem of a tenant's but the file's own (for one on a block device,
// on none): an Error when the range is no longer mapped.
Result<GuardedFile> OpenMappedInode(const MappedFileRef& mapping, const std::string& proc_root = "/proc");

// Opens a host path the agent's operator configured (debug roots, static
// archives, its own libraries): O_PATH, regular file, size cap, O_NONBLOCK.
Result<GuardedFile> OpenHostFile(const std::string& path);

// Reads a small /proc file of another process (comm, stat, status, cgroup)
// whole, up to `cap` bytes; `truncated` says whether there was more.
struct ProcText {
  std::string text;
  bool truncated = false;
};
Result<ProcText> ReadProcText(const std::string& path, uint64_t cap);

// Calls `line` for each line of a /proc file (without its newline), read in
// chunks, until `line` returns false or `max_bytes` were read. Returns whether
// the file was cut there (the line the cut fell in is not passed on).
Result<bool> ForEachProcLine(const std::string& path, uint64_t max_bytes,
                             const std::function<bool(std::string_view)>& line);

}  // namespace tlsprof::guard
