#include "collector/store/journal.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tlsprof::collector {
namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint32_t Crc(std::string_view data) {
  return static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return MakeError("write: {}", std::strerror(errno));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return OkStatus();
}

Result<std::string> ReadAll(int fd) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return MakeError("read: {}", std::strerror(errno));
    }
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

std::string FrameRecord(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU32(out, Crc(payload));
  out.append(payload);
  return out;
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return MakeError("{}: cannot open the directory: {}", dir, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return MakeError("{}: fsync: {}", dir, std::strerror(err));
  return OkStatus();
}

Status WriteFileDurably(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return MakeError("{}: cannot create: {}", tmp, std::strerror(errno));
  Status written = WriteAll(fd, data);
  if (written.ok() && ::fsync(fd) != 0) written = MakeError("fsync: {}", std::strerror(errno));
  ::close(fd);
  if (!written.ok()) return MakeError("{}: {}", tmp, written.error().message);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return MakeError("rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
  return SyncDirectory(std::filesystem::path(path).parent_path().string());
}

Result<std::unique_ptr<Journal>> Journal::Open(const std::string& path,
                                               const std::function<Status(std::string_view)>& on_record) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return MakeError("{}: cannot open the journal: {}", path, std::strerror(errno));
  Result<std::string> data = ReadAll(fd);
  if (!data.ok()) {
    ::close(fd);
    return MakeError("{}: {}", path, data.error().message);
  }
  size_t offset = 0;
  uint64_t records = 0;
  std::string_view all(*data);
  while (offset < all.size()) {
    const size_t left = all.size() - offset;
    if (left < 8) break;
    const uint32_t length = GetU32(all.data() + offset);
    const uint32_t crc = GetU32(all.data() + offset + 4);
    if (length > kMaxJournalRecordBytes || length > left - 8) break;
    std::string_view payload = all.substr(offset + 8, length);
    if (Crc(payload) != crc) break;
    Status applied = on_record(payload);
    if (!applied.ok()) {
      ::close(fd);
      return MakeError("{}: record {} at byte {}: {}", path, records + 1, offset, applied.error().message);
    }
    ++records;
    offset += 8 + length;
  }
  if (offset < all.size()) {
    spdlog::warn(
        "journal {}: the record at byte {} is torn or corrupt (a write cut short by a crash); ignoring the "
        "last {} bytes",
        path, offset, all.size() - offset);
    if (::ftruncate(fd, static_cast<off_t>(offset)) != 0 || ::fsync(fd) != 0) {
      int err = errno;
      ::close(fd);
      return MakeError("{}: cannot cut off the torn tail: {}", path, std::strerror(err));
    }
  }
  if (::lseek(fd, static_cast<off_t>(offset), SEEK_SET) < 0) {
    int err = errno;
    ::close(fd);
    return MakeError("{}: lseek: {}", path, std::strerror(err));
  }
  std::unique_ptr<Journal> journal(new Journal(fd, path, offset));
  journal->records_replayed_ = records;
  return journal;
}

Journal::~Journal() {
  Status synced = Sync();
  if (!synced.ok()) spdlog::error("journal {}: {}", path_, synced.error().message);
  ::close(fd_);
}

uint64_t Journal::Enqueue(std::string_view payload) {
  char header[8];
  const uint32_t length = static_cast<uint32_t>(payload.size());
  const uint32_t crc = Crc(payload);
  for (int i = 0; i < 4; ++i) {
    header[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    header[4 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  }
  std::lock_guard lock(mu_);
  pending_.append(header, sizeof(header));
  pending_.append(payload);
  return ++enqueued_;
}

void Journal::FlushLocked(std::unique_lock<std::mutex>& lock) {
  flushing_ = true;
  std::string buffer;
  buffer.swap(pending_);
  const uint64_t upto = enqueued_;
  const int fd = fd_;
  lock.unlock();
  Status status = WriteAll(fd, buffer);
  if (status.ok() && ::fdatasync(fd) != 0) status = MakeError("fdatasync: {}", std::strerror(errno));
  lock.lock();
  flushing_ = false;
  if (status.ok()) {
    durable_ = upto;
    bytes_.fetch_add(buffer.size(), std::memory_order_relaxed);
  } else if (error_.empty()) {
    error_ = fmt::format("{}: {}", path_, status.error().message);
  }
  cv_.notify_all();
}

Status Journal::WaitDurable(uint64_t ticket) {
  std::unique_lock lock(mu_);
  while (durable_ < ticket) {
    if (!error_.empty()) return Error{error_};
    if (flushing_) {
      cv_.wait(lock);
    } else {
      FlushLocked(lock);
    }
  }
  return OkStatus();
}

Status Journal::Sync() {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mu_);
    ticket = enqueued_;
  }
  return WaitDurable(ticket);
}

void Journal::Fail(const std::string& reason) {
  std::lock_guard lock(mu_);
  if (error_.empty()) error_ = fmt::format("{}: {}", path_, reason);
}

Result<int> Journal::CreateSegment(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return MakeError("{}: cannot create the journal: {}", path, std::strerror(errno));
  Status dir = SyncDirectory(std::filesystem::path(path).parent_path().string());
  if (!dir.ok()) {
    ::close(fd);
    return dir.error();
  }
  return fd;
}

Status Journal::Rotate(const std::string& path) {
  Result<int> fd = CreateSegment(path);
  if (!fd.ok()) return fd.error();
  return Rotate(path, *fd);
}

Status Journal::Rotate(const std::string& path, int fd) {
  std::unique_lock lock(mu_);
  while (flushing_) cv_.wait(lock);
  if (durable_ < enqueued_) FlushLocked(lock);
  if (!error_.empty()) {
    ::close(fd);
    return Error{error_};
  }
  ::close(fd_);
  fd_ = fd;
  path_ = path;
  bytes_.store(0, std::memory_order_relaxed);
  return OkStatus();
}

}  // namespace tlsprof::collector
