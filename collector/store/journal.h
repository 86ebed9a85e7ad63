// An append-only journal of length+CRC framed records with group commit.
//
// Frame: u32 length (little endian), u32 CRC-32 of the payload, payload. At
// open, records are read back until the first frame that is short or fails
// its CRC: that is a write torn by a crash (the reply for it was never sent,
// because replies wait for the fsync), so it is cut off with a warning.
//
// Group commit: Enqueue() only appends to a buffer; WaitDurable() makes the
// first waiter write everything queued and fdatasync it once for all the
// callers queued behind it. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/result.h"

namespace tlsprof::collector {

// Largest record Open() believes; a larger length is a torn frame.
inline constexpr uint32_t kMaxJournalRecordBytes = 256u << 20;

// Frames `payload` (length, CRC, payload).
std::string FrameRecord(std::string_view payload);

class Journal {
 public:
  // Opens (creating) `path`, calls `on_record` for each intact record in
  // order, cuts off a torn tail, and appends after the last intact record.
  static Result<std::unique_ptr<Journal>> Open(const std::string& path,
                                               const std::function<Status(std::string_view)>& on_record);
  ~Journal();

  // Queues a record; returns its ticket for WaitDurable().
  uint64_t Enqueue(std::string_view payload);
  // Returns once the record of `ticket` (and everything before it) is on disk.
  Status WaitDurable(uint64_t ticket);
  // Writes and fsyncs everything queued.
  Status Sync();
  // Syncs, then continues in a new, empty file at `path` (compaction: the
  // caller wrote a snapshot of everything before). The old file is kept; the
  // caller removes it.
  Status Rotate(const std::string& path);
  // The same in two steps: CreateSegment (create the file, fsync the
  // directory) first, then Rotate onto its descriptor (takes ownership; only
  // the records queued since the last flush are written before the switch).
  static Result<int> CreateSegment(const std::string& path);
  Status Rotate(const std::string& path, int fd);

  // Makes every later WaitDurable() fail with `reason` (the collector then
  // answers UNAVAILABLE rather than accept what it cannot keep).
  void Fail(const std::string& reason);

  // False after a failed write or Fail(): nothing more will become durable.
  bool healthy() {
    std::lock_guard lock(mu_);
    return error_.empty();
  }

  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t records_replayed() const { return records_replayed_; }
  const std::string& path() const { return path_; }

 private:
  Journal(int fd, std::string path, uint64_t bytes) : fd_(fd), path_(std::move(path)), bytes_(bytes) {}
  // Writes the queue; called with `lock` held and !flushing_, returns with it held.
  void FlushLocked(std::unique_lock<std::mutex>& lock);

  int fd_;
  std::string path_;
  std::atomic<uint64_t> bytes_;
  uint64_t records_replayed_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  uint64_t enqueued_ = 0;
  uint64_t durable_ = 0;
  bool flushing_ = false;
  std::string error_;  // sticky: after a failed write the file's tail is unknown
};

// Writes `data` to `path` durably: temp file, fsync, rename, fsync the directory.
Status WriteFileDurably(const std::string& path, std::string_view data);
Status SyncDirectory(const std::string& dir);

}  // namespace tlsprof::collector
