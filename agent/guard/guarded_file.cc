#include "agent/guard/guarded_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <openssl/evp.h>

#include "agent/guard/limits.h"

namespace tlsprof::guard {
namespace {

int64_t Nanos(const struct timespec& t) { return t.tv_sec * 1000000000LL + t.tv_nsec; }

std::string ErrnoText(int err) { return std::strerror(err); }

// glibc 2.36 (Debian 12) has no openat2() wrapper.
int OpenAt2(int dirfd, const char* path, uint64_t flags, uint64_t resolve) {
  struct open_how how {};
  how.flags = flags;
  how.resolve = resolve;
  return static_cast<int>(syscall(SYS_openat2, dirfd, path, &how, sizeof how));
}

const char* KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

// The second half of every open: `path_fd` is an O_PATH fd (nothing was
// opened for reading yet). Checks it, then re-opens that very inode
// read-only through /proc/self/fd.
Result<GuardedFile> FinishOpen(UniqueFd path_fd, std::string name, std::optional<FileId> expected) {
  struct stat st {};
  if (fstat(path_fd.get(), &st) != 0) return MakeError("{}: fstat failed: {}", name, ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) {
    Refuse(Reason::kNotRegular, name, fmt::format("{} where a regular file was expected", KindOf(st.st_mode)));
    return MakeError("{} is {}, not a regular file", name, KindOf(st.st_mode));
  }
  const FileId id{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  if (expected && !(id == *expected)) {
    Refuse(Reason::kReplaced, name,
           fmt::format("names {}:{} but {}:{} is mapped", id.dev, id.ino, expected->dev, expected->ino));
    return MakeError("{} is another file ({}:{}) than the one mapped ({}:{}): replaced since it was mapped", name,
                     id.dev, id.ino, expected->dev, expected->ino);
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    Refuse(Reason::kFileSize, name, fmt::format("{} bytes, over the cap of {}", st.st_size, kMaxFileBytes));
    return MakeError("{} is {} bytes, over the {} bytes the agent reads from one file", name, st.st_size,
                     kMaxFileBytes);
  }
  const std::string self = fmt::format("/proc/self/fd/{}", path_fd.get());
  UniqueFd fd(::open(self.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return MakeError("{}: cannot open for reading: {}", name, ErrnoText(errno));
  struct stat again {};
  if (fstat(fd.get(), &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
    return MakeError("{}: re-opening it reached another file", name);
  }
  GuardedFile f;
  f.fd_ = std::make_shared<UniqueFd>(std::move(fd));
  f.id_ = id;
  f.size_ = static_cast<uint64_t>(again.st_size);
  f.mtime_ns_ = Nanos(again.st_mtim);
  f.ctime_ns_ = Nanos(again.st_ctim);
  f.name_ = std::move(name);
  return f;
}

bool GuardedFile::OnBlockDevice(uint64_t dev) { return major(static_cast<dev_t>(dev)) != 0; }

std::string GuardedFile::ProcPath() const { return fmt::format("/proc/self/fd/{}", fd()); }

Status GuardedFile::ReadExact(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = pread(fd(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return MakeError("{}: read of {} bytes at {:#x} failed: {}", name_, out.size(), offset, ErrnoText(errno));
    if (n == 0) {
      Refuse(Reason::kShortRead, name_, fmt::format("ends before {:#x}: truncated while read", offset + out.size()));
      return MakeError("{}: the file ends before {:#x} (truncated while it was read?)", name_, offset + out.size());
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Result<std::vector<uint8_t>> GuardedFile::ReadRange(uint64_t offset, uint64_t length, uint64_t cap,
                                                    std::string_view what) const {
  if (length > cap) {
    Refuse(Reason::kSectionSize, name_, fmt::format("{} is {} bytes, over the cap of {}", what, length, cap));
    return MakeError("{}: {} is {} bytes, over the {} bytes the agent reads at once", name_, what, length, cap);
  }
  if (offset > size_ || size_ - offset < length) {
    return MakeError("{}: {} ({} bytes at {:#x}) extends past the end of the file ({} bytes)", name_, what, length,
                     offset, size_);
  }
  std::vector<uint8_t> out(length);
  if (auto st = ReadExact(offset, out); !st) return st.error();
  return out;
}

bool GuardedFile::ChangedSinceOpen() const {
  struct stat st {};
  if (fstat(fd(), &st) != 0) return true;
  return static_cast<uint64_t>(st.st_size) != size_ || Nanos(st.st_mtim) != mtime_ns_ || Nanos(st.st_ctim) != ctime_ns_;
}

Result<std::string> GuardedFile::Sha256() const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return MakeError("SHA-256 is unavailable");
  std::vector<uint8_t> buf(1 << 20);
  for (uint64_t off = 0; off < size_;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), size_ - off);
    if (auto st = ReadExact(off, std::span<uint8_t>(buf.data(), n)); !st) return st.error();
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
    off += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kDigits[digest[i] >> 4]);
    hex.push_back(kDigits[digest[i] & 15]);
  }
  return hex;
}

Result<ProcessRoot> ProcessRoot::Open(pid_t pid, const std::string& proc_root) {
  const std::string path = fmt::format("{}/{}/root", proc_root, pid);
  UniqueFd dir(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return MakeError("process {}: cannot open its root ({}): {}", pid, path, ErrnoText(errno));
  ProcessRoot root;
  root.pid_ = pid;
  root.dir_ = std::make_shared<UniqueFd>(std::move(dir));
  // Where the host sees this root: "/srv/root" for a plain chroot there. A
  // root the agent cannot reach (another mount namespace's) reads as "/".
  char buf[4096];
  const ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  if (n > 1 && buf[0] == '/') root.host_prefix_.assign(buf, static_cast<size_t>(n));
  return root;
}

Result<ProcessRoot> ProcessRoot::OpenDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return MakeError("cannot open directory {}: {}", dir, ErrnoText(errno));
  ProcessRoot root;
  root.dir_ = std::make_shared<UniqueFd>(std::move(fd));
  if (dir != "/") root.host_prefix_ = dir;
  while (root.host_prefix_.size() > 1 && root.host_prefix_.back() == '/') root.host_prefix_.pop_back();
  return root;
}

std::optional<std::string> ProcessRoot::InsidePath(std::string_view maps_path) const {
  if (maps_path.empty() || maps_path.front() != '/') return std::nullopt;
  if (host_prefix_.empty()) return std::string(maps_path);
  if (!maps_path.starts_with(host_prefix_) || maps_path.size() <= host_prefix_.size() ||
      maps_path[host_prefix_.size()] != '/') {
    return std::nullopt;
  }
  return std::string(maps_path.substr(host_prefix_.size()));
}

Result<GuardedFile> ProcessRoot::OpenFile(std::string_view path, std::optional<FileId> expected) const {
  const std::string name = pid_ != 0 ? fmt::format("{} (in the root of process {})", path, pid_)
                                     : fmt::format("{} (under {})", path, host_prefix_);
  if (path.empty() || path.front() != '/') return MakeError("{}: not an absolute path", name);
  const std::string p(path);
  UniqueFd fd(OpenAt2(dir_->get(), p.c_str(), O_PATH | O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS));
  if (!fd.valid()) {
    if (errno == ENOSYS) return MakeError("{}: openat2 is not available (Linux 5.6 or later is needed)", name);
    return MakeError("{}: {}", name, ErrnoText(errno));
  }
  return FinishOpen(std::move(fd), std::string(path), expected);
}

namespace {
// /proc/PID/map_files/START-END, O_PATH: the mapped inode, no path looked
// up. On failure the fd is invalid and errno says why.
UniqueFd OpenMapFilesEntry(const MappedFileRef& m, const std::string& proc_root, std::string& map_file) {
  map_file = fmt::format("{}/{}/map_files/{:x}-{:x}", proc_root, m.pid, m.start, m.end);
  return UniqueFd(::open(map_file.c_str(), O_PATH | O_CLOEXEC));
}
}  // namespace

Result<GuardedFile> OpenMappedInode(const MappedFileRef& m, const std::string& proc_root) {
  std::string map_file;
  UniqueFd fd = OpenMapFilesEntry(m, proc_root, map_file);
  if (!fd.valid()) return MakeError("{}: {}", map_file, ErrnoText(errno));
  return FinishOpen(std::move(fd), m.path.empty() ? map_file : m.path, m.id);
}

Result<GuardedFile> OpenMapping(const MappedFileRef& m, const std::string& proc_root) {
  std::string map_file;
  UniqueFd fd = OpenMapFilesEntry(m, proc_root, map_file);
  if (fd.valid()) return FinishOpen(std::move(fd), m.path.empty() ? map_file : m.path, m.id);
  const int map_files_errno = errno;
  if (m.path.empty() || m.path.front() != '/') {
    return MakeError("mapping {:x}-{:x} of process {} has no file", m.start, m.end, m.pid);
  }
  // Unmapped since its maps line was read, or map_files is not allowed (no
  // CAP_CHECKPOINT_RESTORE): the path, if it still names the mapped file.
  if (m.deleted) {
    return MakeError("{} of process {} was deleted and is no longer mapped ({})", m.path, m.pid,
                     ErrnoText(map_files_errno));
  }
  auto root = ProcessRoot::Open(m.pid, proc_root);
  if (!root) return root.error();
  auto inside = root->InsidePath(m.path);
  if (!inside) return MakeError("{} of process {} is outside its root", m.path, m.pid);
  auto file = root->OpenFile(*inside, m.id);
  if (!file) {
    return MakeError("cannot open {} of process {} ({}; map_files: {})", m.path, m.pid, file.error().message,
                     ErrnoText(map_files_errno));
  }
  return file;
}

Result<GuardedFile> OpenHostFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_PATH | O_CLOEXEC));
  if (!fd.valid()) return MakeError("{}: {}", path, ErrnoText(errno));
  return FinishOpen(std::move(fd), path, std::nullopt);
}

Result<ProcText> ReadProcText(const std::string& path, uint64_t cap) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return MakeError("cannot open {}: {}", path, ErrnoText(errno));
  ProcText out;
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return MakeError("cannot read {}: {}", path, ErrnoText(errno));
    if (n == 0) break;
    const uint64_t room = cap - out.text.size();
    if (static_cast<uint64_t>(n) > room) {
      out.text.append(buf, room);
      out.truncated = true;
      break;
    }
    out.text.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<bool> ForEachProcLine(const std::string& path, uint64_t max_bytes,
                             const std::function<bool(std::string_view)>& line) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return MakeError("cannot open {}: {}", path, ErrnoText(errno));
  std::string pending;
  std::vector<char> buf(64 << 10);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = read(fd.get(), buf.data(), std::min<uint64_t>(buf.size(), max_bytes - total));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return MakeError("cannot read {}: {}", path, ErrnoText(errno));
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
    std::string_view chunk(buf.data(), static_cast<size_t>(n));
    while (!chunk.empty()) {
      const size_t nl = chunk.find('\n');
      if (nl == std::string_view::npos) {
        pending.append(chunk);
        break;
      }
      pending.append(chunk.substr(0, nl));
      chunk.remove_prefix(nl + 1);
      if (!line(pending)) return false;
      pending.clear();
    }
    // The part of a line a cut leaves is not passed on: it would be half a
    // path. A file that ends exactly at the cap is cut all the same.
    if (total >= max_bytes) return true;
  }
  if (!pending.empty() && !line(pending)) return false;
  return false;
}

}  // namespace tlsprof::guard
