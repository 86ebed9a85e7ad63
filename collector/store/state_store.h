// The collector's state directory (--state-dir): a snapshot of the Ingestor
// plus the journal of the reports accepted after it.
//
//   snapshot          framed state::State; names the journal that follows it
//   journal-<gen>     framed state::JournalRecord, one per accepted report
//   lock              flock()ed while a collector uses the directory
//
// Compaction, off the ingest path: when the journal passes `compact_bytes`, a
// background thread takes the Ingestor's lock just long enough to copy the
// state and switch the journal to a new segment journal-<gen+1> (the old one
// is synced first); new reports go there at once. It then writes and fsyncs
// the snapshot naming journal-<gen+1> with the lock released, and deletes the
// segments before it. Start replays the snapshot, then every segment from the
// one it names on, in order. A crash at any point replays exactly the
// acknowledged state: before the new snapshot is in place the old snapshot
// and both segments hold everything; after, the new snapshot and the new
// segment do, and the old segment is deleted at the next start.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <google/protobuf/arena.h>

#include "collector/ingest/ingestor.h"
#include "collector/store/journal.h"
#include "collector/store/snapshot.h"
#include "common/result.h"

namespace tlsprof::collector {

class StateStore {
 public:
  // Creates `dir` if needed, takes its lock, restores `ingestor` from the
  // snapshot and replays the journal segments into it. `ingestor` must outlive
  // the store (the background compaction reads it).
  static Result<std::unique_ptr<StateStore>> Open(const std::string& dir, uint64_t compact_bytes, Ingestor& ingestor);
  // Finishes a compaction in progress (or requested), then syncs.
  ~StateStore();

  // Called under the Ingestor's lock (Apply's commit callback).
  uint64_t Enqueue(std::string_view record) { return journal_->Enqueue(record); }
  Status WaitDurable(uint64_t ticket) { return journal_->WaitDurable(ticket); }
  // Asks the background thread to compact when the journal is over its bound;
  // returns at once.
  void MaybeCompact();
  // Compacts now, on this thread (both steps below).
  Status Compact();
  // Step 1, under the Ingestor's lock: the state, and the journal continued in
  // a new segment. Step 2, without it: the snapshot written, older segments
  // deleted. Public for tests (a crash between the two).
  struct Snapshot {
    google::protobuf::Arena arena;
    state::State* state = nullptr;  // on `arena`
  };
  Result<std::unique_ptr<Snapshot>> BeginCompaction();
  Status FinishCompaction(const Snapshot& snapshot);
  // Returns when no compaction is requested or running (tests).
  void WaitForCompaction();

  Status Sync() { return journal_->Sync(); }
  bool healthy() { return journal_->healthy(); }

  uint64_t journal_bytes() const { return journal_->bytes(); }
  // The journal segment being appended to.
  uint64_t generation() const { return generation_.load(); }

 private:
  StateStore() = default;
  std::string JournalPath(uint64_t generation) const;
  void CompactionLoop();

  std::string dir_;
  uint64_t compact_bytes_ = 0;
  int lock_fd_ = -1;
  Ingestor* ingestor_ = nullptr;
  std::atomic<uint64_t> generation_ = 0;
  std::unique_ptr<Journal> journal_;

  std::mutex compact_mu_;  // one compaction at a time
  std::mutex worker_mu_;
  std::condition_variable worker_cv_;
  bool requested_ = false;
  bool running_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace tlsprof::collector
