// The agent's state directory and its spool (docs/fleet.md, "Agent daemon").
//
//   STATE_DIR/lock           flock()ed while an agent uses the directory
//   STATE_DIR/instance       agent_instance: 16 random bytes, as 32 hex digits
//   STATE_DIR/next_sequence  the next sequence to assign, decimal
//   STATE_DIR/spool/NNNNNNNNNNNNNNNNNNNN.batch   one sealed batch per file
//   STATE_DIR/spool/NNNNNNNNNNNNNNNNNNNN.pin     the collector the batch was
//                            sent to, written before the first attempt: the
//                            batch goes to no other (docs/fleet.md, "Several
//                            collectors")
//   STATE_DIR/spool/corrupt/ batch files that did not parse (bounded)
//
// Every file is written tmp → fsync → rename → fsync(dir), so after a crash
// a file is either complete or absent. A batch file is a small header (magic,
// payload length, CRC-32 of the payload) followed by the serialized
// tlsprof.v1.AgentReport.
//
// Not thread-safe: the Shipper serializes access.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/result.h"
#include "tlsprof/v1/report.pb.h"

namespace tlsprof::ship {

// Writes `data` to dir/name durably: dir/.name.tmp, fsync, rename, fsync(dir).
// On failure the tmp file is removed (nothing torn is left) and `*err`, when
// given, is the errno (ENOSPC: the disk is full).
Status WriteFileDurably(const std::string& dir, const std::string& name, std::string_view data, int* err = nullptr);

// True for the errors that freeing disk space can cure (ENOSPC, EDQUOT).
bool IsNoSpace(int err);

// Encodes/decodes the batch file format. Decode checks the magic, length and
// checksum and that the report parses; it says what was wrong otherwise.
std::string EncodeBatch(const v1::AgentReport& report);
Result<v1::AgentReport> DecodeBatch(std::string_view bytes);

// instance, next_sequence and the directory lock.
class StateDir {
 public:
  // Creates the directory (and spool/) if needed, takes the lock, loads or
  // creates the instance id and loads next_sequence (1 when absent). A
  // next_sequence file that cannot be parsed is replaced together with a new
  // instance id: a fresh instance never collides with batches shipped before.
  static Result<StateDir> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string spool_dir() const { return dir_ + "/spool"; }
  const std::string& instance() const { return instance_; }  // 16 raw bytes
  uint64_t next_sequence() const { return next_sequence_; }
  std::string instance_hex() const;

  // Persists `next` as the next sequence (durably) when it is larger than
  // the current one. Used at start with (max spooled sequence + 1).
  Status AdvanceTo(uint64_t next);
  // Hands out the next sequence: persists next_sequence + 1 first, so a
  // sequence is never handed out twice, whatever crashes afterwards. `*err`
  // as for WriteFileDurably.
  Result<uint64_t> Take(int* err = nullptr);

 private:
  std::string dir_;
  UniqueFd lock_;
  std::string instance_;
  uint64_t next_sequence_ = 1;
};

class Spool {
 public:
  struct Loaded {
    uint64_t quarantined = 0;  // files moved to corrupt/ while loading
  };

  // Indexes dir's batch files. Files that do not decode, or whose sequence
  // differs from their name, are moved to dir/corrupt/ with an error log;
  // stale tmp files are removed. At most `max_quarantined` files are kept in
  // corrupt/.
  static Result<Spool> Open(const std::string& dir, uint32_t max_quarantined, Loaded* loaded = nullptr);

  // Writes the batch file durably (named by report.sequence()); touches only
  // the disk, so it may run while another thread uses the index. Returns the
  // file's size. Add() then indexes it; Put() does both.
  // `*err` as for WriteFileDurably.
  Result<uint64_t> Write(const v1::AgentReport& report, int* err = nullptr) const;
  void Add(uint64_t sequence, uint64_t size);
  Result<uint64_t> Put(const v1::AgentReport& report);
  // Reads and decodes a batch. An unreadable or undecodable file is moved to
  // corrupt/ and un-indexed, and the error says so.
  Result<v1::AgentReport> Load(uint64_t sequence);
  // Deletes a batch's file and its pin (when present) and un-indexes them.
  void Remove(uint64_t sequence);

  // Pins a batch to the collector `target` before it is first sent there:
  // once an attempt's outcome is unknown (the collector may have counted
  // it), the batch may only be resent to the same collector, which answers
  // DUPLICATE if it did. WritePin() is durable and touches only the disk;
  // AddPin() indexes it. `*err` as for WriteFileDurably.
  Status WritePin(uint64_t sequence, const std::string& target, int* err = nullptr) const;
  void AddPin(uint64_t sequence, const std::string& target);
  // Forgets a pin (its collector is no longer configured): the batch is
  // placed again.
  void Unpin(uint64_t sequence);
  const std::map<uint64_t, std::string>& pins() const { return pins_; }

  // Oldest sequence waiting, optionally skipping one (in flight).
  std::optional<uint64_t> Oldest(std::optional<uint64_t> skip = std::nullopt) const;
  // Oldest sequence waiting that is not pinned.
  std::optional<uint64_t> OldestUnpinned() const;
  std::optional<uint64_t> Newest() const;
  bool contains(uint64_t sequence) const { return batches_.count(sequence) != 0; }
  size_t batches() const { return batches_.size(); }
  uint64_t bytes() const { return bytes_; }
  const std::string& dir() const { return dir_; }

  static std::string FileName(uint64_t sequence);
  static std::string PinFileName(uint64_t sequence);

 private:
  void Quarantine(const std::string& name, const std::string& reason);
  bool LoadPins(const std::vector<std::pair<uint64_t, std::string>>& files);

  std::string dir_;
  uint32_t max_quarantined_ = 32;
  std::map<uint64_t, uint64_t> batches_;  // sequence → file size
  std::map<uint64_t, std::string> pins_;  // sequence → collector; only of batches in batches_
  uint64_t bytes_ = 0;
};

}  // namespace tlsprof::ship
