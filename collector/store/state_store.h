// The collector's state directory (--state-dir): a snapshot of the Ingestor
// plus the journal of the reports accepted after it.
//
//   snapshot          framed state::State; names the journal that follows it
//   journal-<gen>     framed state::JournalRecord, one per accepted report
//   lock              flock()ed while a collector uses the directory
//
// Compaction, off the ingest path: when the journal passes `compact_bytes`, a
// background thread syncs the journal and creates journal-<gen+1>, then takes
// the Ingestor's lock just long enough for a copy-on-write copy of the state
// (Ingestor::Copy: one key and one pointer per agent, no agent's contents)
// and to switch the journal to the new segment; reports accepted after that
// go there, and write a clone of any agent the copy still holds. With no lock
// the ingest path takes (neither the Ingestor's nor the journal's), it then
// builds the snapshot from the copy, serializes it, writes and fsyncs it
// naming journal-<gen+1>, and deletes the segments before it. So the
// snapshot holds exactly the records of the segments before gen+1: a report
// journaled after the switch is replayed from gen+1 and is not in the
// snapshot; one before is in the snapshot and in no replayed segment. Start
// replays the snapshot, then every segment from the one it names on, in
// order. A crash at any point replays exactly the acknowledged state: before
// the new snapshot is in place the old snapshot and both segments hold
// everything; after, the new snapshot and the new segment do, and the old
// segment is deleted at the next start.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "collector/ingest/fleet_state.h"
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
  // Step 1, under the Ingestor's lock: a copy-on-write copy of the state,
  // and the journal continued in a new segment. Step 2, with no lock that
  // ingest takes: the snapshot built from the copy, serialized, written, older
  // segments deleted. Public for tests (a crash between the two).
  struct Snapshot {
    FleetState state;  // shares agents and minutes with the live state
    uint64_t journal_generation = 0;
  };
  Result<std::unique_ptr<Snapshot>> BeginCompaction();
  Status FinishCompaction(const Snapshot& snapshot);
  // Returns when no compaction is requested or running (tests).
  void WaitForCompaction();
  // Tests: `fn` runs at the start of step 2, on the compacting thread (set it
  // before any compaction can start).
  void SetBeforeSnapshotForTest(std::function<void()> fn) { before_snapshot_ = std::move(fn); }

  Status Sync() { return journal_->Sync(); }
  bool healthy() { return journal_->healthy(); }
  std::string stopped() { return journal_->stopped(); }
  std::string write_error() { return journal_->write_error(); }

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
  std::function<void()> before_snapshot_;
};

}  // namespace tlsprof::collector
