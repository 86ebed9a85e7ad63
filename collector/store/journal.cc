#include "collector/store/journal.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

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

// The payload of the intact frame at `offset`, if there is one: a non-empty
// payload that fits in `all` and matches its CRC. `hashed` counts the bytes
// hashed (the resynchronisation's budget).
std::optional<std::string_view> FrameAt(std::string_view all, size_t offset, uint64_t& hashed) {
  if (all.size() - offset < 8) return std::nullopt;
  const uint32_t length = GetU32(all.data() + offset);
  if (length == 0 || length > kMaxJournalRecordBytes || length > all.size() - offset - 8) return std::nullopt;
  std::string_view payload = all.substr(offset + 8, length);
  hashed += length;
  if (Crc(payload) != GetU32(all.data() + offset + 4)) return std::nullopt;
  return payload;
}

// The offset of the first intact frame after the bad one at `bad`, or
// nullopt when there is none (a torn tail). An Error when the search hashed
// more than its budget (the caller's, shared by every bad frame of a file).
Result<std::optional<size_t>> FindNextFrame(std::string_view all, size_t bad, uint64_t& hashed, uint64_t budget) {
  for (size_t offset = bad + 1; offset + 8 <= all.size(); ++offset) {
    if (FrameAt(all, offset, hashed)) return std::optional<size_t>(offset);
    if (hashed > budget) return MakeError("no intact record found within {} bytes hashed", budget);
  }
  return std::optional<size_t>();
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
  uint64_t records = 0, skipped = 0, hashed = 0;
  std::string_view all(*data);
  // Intact records hash the file once; resynchronising may hash it 8 times
  // more (plus 1 MiB) before giving up.
  const uint64_t budget = 9 * static_cast<uint64_t>(all.size()) + (1u << 20);
  while (offset < all.size()) {
    std::optional<std::string_view> payload = FrameAt(all, offset, hashed);
    if (!payload) {
      Result<std::optional<size_t>> next = FindNextFrame(all, offset, hashed, budget);
      if (!next.ok()) {
        ::close(fd);
        return MakeError(
            "{}: the record at byte {} is corrupt and {}; the {} records before it are intact: restore the file, "
            "or cut it at byte {} to keep them",
            path, offset, next.error().message, records, offset);
      }
      if (!*next) break;  // a torn tail
      spdlog::error(
          "journal {}: {} bytes at byte {} are corrupt (damaged in place: intact records follow); skipping them, "
          "keeping every record after byte {}",
          path, **next - offset, offset, **next);
      skipped += **next - offset;
      offset = **next;
      continue;
    }
    Status applied = on_record(*payload);
    if (!applied.ok()) {
      ::close(fd);
      return MakeError("{}: record {} at byte {}: {}", path, records + 1, offset, applied.error().message);
    }
    ++records;
    offset += 8 + payload->size();
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
  journal->corrupt_bytes_skipped_ = skipped;
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
  const uint64_t end = bytes_.load(std::memory_order_relaxed);
  lock.unlock();
  Status status = WriteAll(fd, buffer);
  if (status.ok() && ::fdatasync(fd) != 0) status = MakeError("fdatasync: {}", std::strerror(errno));
  bool restored = true;
  if (!status.ok()) {
    // Part of the buffer may be in the file: cut it back to its durable end,
    // where the next write starts again with the whole buffer.
    restored = ::ftruncate(fd, static_cast<off_t>(end)) == 0 && ::lseek(fd, static_cast<off_t>(end), SEEK_SET) >= 0;
  }
  lock.lock();
  flushing_ = false;
  if (status.ok()) {
    durable_ = upto;
    bytes_.fetch_add(buffer.size(), std::memory_order_relaxed);
    if (!write_error_.empty()) spdlog::info("journal {}: writing again after: {}", path_, write_error_);
    write_error_.clear();
  } else {
    ++failed_flushes_;
    pending_.insert(0, buffer);  // what was queued meanwhile goes after it
    write_error_ = fmt::format("{}: {}", path_, status.error().message);
    retry_at_ = std::chrono::steady_clock::now() + kRetryAfter;
    spdlog::error("journal {} (retried in {} ms)", write_error_, kRetryAfter.count());
    if (!restored && stopped_.empty()) {
      stopped_ = fmt::format("{}; and its end cannot be restored: {}", write_error_, std::strerror(errno));
    }
  }
  cv_.notify_all();
}

Status Journal::WaitDurable(uint64_t ticket) {
  std::unique_lock lock(mu_);
  while (durable_ < ticket) {
    if (!stopped_.empty()) return Error{stopped_};
    if (flushing_) {
      // The flush under way may not hold this ticket; if it fails, so does
      // this wait (its caller answers, the next one retries).
      const uint64_t failed = failed_flushes_;
      cv_.wait(lock, [&] { return !flushing_; });
      if (failed_flushes_ != failed) return Error{write_error_};
      continue;
    }
    if (!write_error_.empty() && std::chrono::steady_clock::now() < retry_at_) return Error{write_error_};
    const uint64_t failed = failed_flushes_;
    FlushLocked(lock);
    if (failed_flushes_ != failed) return Error{write_error_};
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
  if (stopped_.empty()) stopped_ = fmt::format("{}: {}", path_, reason);
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
  const uint64_t failed = failed_flushes_;
  if (durable_ < enqueued_ && stopped_.empty()) FlushLocked(lock);
  if (!stopped_.empty() || failed_flushes_ != failed) {
    ::close(fd);
    return Error{stopped_.empty() ? write_error_ : stopped_};
  }
  ::close(fd_);
  fd_ = fd;
  path_ = path;
  bytes_.store(0, std::memory_order_relaxed);
  return OkStatus();
}

}  // namespace tlsprof::collector
