// An append-only journal of length+CRC framed records with group commit.
//
// Frame: u32 length (little endian), u32 CRC-32 of the payload, payload; the
// payload is never empty, so zeroed bytes never read as a record. At open,
// records are read back in order. A frame that is short, empty or fails its
// CRC is bad:
//  - with no intact frame after it, it is a write torn by a crash (the reply
//    for it was never sent, because replies wait for the fsync): the tail is
//    cut off with a warning;
//  - with intact frames after it, the file was damaged in place (a flipped
//    bit, a zeroed block): the bad bytes are skipped with an error naming
//    their offset, and every intact record after them is kept.
// Finding the next intact frame hashes candidates; past a budget
// proportional to the file's size, Open() fails naming the offset instead.
//
// Group commit: Enqueue() only appends to a buffer; WaitDurable() makes the
// first waiter write everything queued and fdatasync it once for all the
// callers queued behind it.
//
// A failed write (ENOSPC, EIO) is not the end: the file is cut back to its
// durable end, what was not written stays queued, and the next WaitDurable()
// after kRetryAfter writes it again. Until then WaitDurable() fails at once
// and healthy() is false. Only a file whose end cannot be restored (the cut
// fails) or Fail() stops the journal for good. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
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
  // How long after a failed write the next one is tried.
  static constexpr std::chrono::milliseconds kRetryAfter{1000};

  // Opens (creating) `path`, calls `on_record` for each intact record in
  // order, cuts off a torn tail, and appends after the last intact record.
  static Result<std::unique_ptr<Journal>> Open(const std::string& path,
                                               const std::function<Status(std::string_view)>& on_record);
  ~Journal();

  // Queues a record (not empty); returns its ticket for WaitDurable().
  uint64_t Enqueue(std::string_view payload);
  // Returns once the record of `ticket` (and everything before it) is on
  // disk; an Error when the write failed (the record stays queued) or the
  // journal is stopped.
  Status WaitDurable(uint64_t ticket);
  // Writes and fsyncs everything queued.
  Status Sync();
  // Syncs, then continues in a new, empty file at `path` (compaction: the
  // caller wrote a snapshot of everything before). The old file is kept; the
  // caller removes it. When the sync fails, nothing changes: the journal
  // goes on in the old file, and the new one's descriptor is closed.
  Status Rotate(const std::string& path);
  // The same in two steps: CreateSegment (create the file, fsync the
  // directory) first, then Rotate onto its descriptor (takes ownership; only
  // the records queued since the last flush are written before the switch).
  static Result<int> CreateSegment(const std::string& path);
  Status Rotate(const std::string& path, int fd);

  // Makes every later WaitDurable() fail with `reason` (the collector then
  // answers UNAVAILABLE rather than accept what it cannot keep).
  void Fail(const std::string& reason);

  // False within kRetryAfter of a failed write, and for good after Fail() or
  // a file whose end could not be restored.
  bool healthy() {
    std::lock_guard lock(mu_);
    return stopped_.empty() && (write_error_.empty() || std::chrono::steady_clock::now() >= retry_at_);
  }

  // The failure that stopped the journal for good (Fail(), or an end that
  // could not be restored); empty while it writes or will retry.
  std::string stopped() {
    std::lock_guard lock(mu_);
    return stopped_;
  }
  // The last write's failure while it is not mended (it is retried); empty
  // when the last write succeeded.
  std::string write_error() {
    std::lock_guard lock(mu_);
    return write_error_;
  }

  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t records_replayed() const { return records_replayed_; }
  // Bytes skipped at Open() between intact records (damage in place).
  uint64_t corrupt_bytes_skipped() const { return corrupt_bytes_skipped_; }
  const std::string& path() const { return path_; }

 private:
  Journal(int fd, std::string path, uint64_t bytes) : fd_(fd), path_(std::move(path)), bytes_(bytes) {}
  // Writes the queue; called with `lock` held and !flushing_, returns with it held.
  void FlushLocked(std::unique_lock<std::mutex>& lock);

  int fd_;
  std::string path_;
  std::atomic<uint64_t> bytes_;
  uint64_t records_replayed_ = 0;
  uint64_t corrupt_bytes_skipped_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  uint64_t enqueued_ = 0;
  uint64_t durable_ = 0;
  bool flushing_ = false;
  uint64_t failed_flushes_ = 0;  // waiters tell whether the flush they waited for failed
  std::string write_error_;      // the last write's failure; cleared by the next that succeeds
  std::chrono::steady_clock::time_point retry_at_{};
  std::string stopped_;  // for good: Fail(), or the file's end is unknown
};

// Writes `data` to `path` durably: temp file, fsync, rename, fsync the directory.
Status WriteFileDurably(const std::string& path, std::string_view data);
Status SyncDirectory(const std::string& dir);

}  // namespace tlsprof::collector
