// The collector's state directory (--state-dir): a snapshot of the Ingestor
// plus the journal of the reports accepted after it.
//
//   snapshot          framed state::State; names the journal that follows it
//   journal-<gen>     framed state::JournalRecord, one per accepted report
//   lock              flock()ed while a collector uses the directory
//
// Compaction: when the journal passes `compact_bytes`, the state is written as
// a new snapshot naming journal-<gen+1>, and the journal continues there. A
// crash between the two steps leaves a snapshot whose journal is missing
// (empty) or an old journal no snapshot names (deleted at the next start):
// never a report counted twice.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "agent/common/result.h"
#include "collector/ingest/ingestor.h"
#include "collector/store/journal.h"

namespace tlsprof::collector {

class StateStore {
 public:
  // Creates `dir` if needed, takes its lock, restores `ingestor` from the
  // snapshot and replays the journal into it.
  static Result<std::unique_ptr<StateStore>> Open(const std::string& dir, uint64_t compact_bytes, Ingestor& ingestor);
  ~StateStore();

  // Called under the Ingestor's lock (Apply's commit callback).
  uint64_t Enqueue(std::string record) { return journal_->Enqueue(record); }
  Status WaitDurable(uint64_t ticket) { return journal_->WaitDurable(ticket); }
  // Compacts when the journal is over its bound (one caller at a time; the
  // others go on). Blocks Submit for as long as the snapshot takes to write.
  void MaybeCompact(Ingestor& ingestor);
  // Writes a snapshot now and starts an empty journal.
  Status Compact(Ingestor& ingestor);
  Status Sync() { return journal_->Sync(); }
  bool healthy() { return journal_->healthy(); }

  uint64_t journal_bytes() const { return journal_->bytes(); }
  uint64_t generation() const { return generation_; }

 private:
  StateStore() = default;
  std::string JournalPath(uint64_t generation) const;

  std::string dir_;
  uint64_t compact_bytes_ = 0;
  int lock_fd_ = -1;
  uint64_t generation_ = 0;
  std::unique_ptr<Journal> journal_;
  std::mutex compact_mu_;
};

}  // namespace tlsprof::collector
