#include "collector/store/state_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tlsprof::collector {
namespace {

constexpr char kSnapshot[] = "snapshot";
constexpr char kJournalPrefix[] = "journal-";

// Reads a single framed record (the snapshot); an empty optional when absent.
Result<std::optional<std::string>> ReadSnapshot(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::optional<std::string>();
    return MakeError("{}: cannot read: {}", path, std::strerror(errno));
  }
  std::stringstream s;
  s << in.rdbuf();
  const std::string data = s.str();
  // The snapshot is renamed into place only after its fsync, so it is whole
  // or absent; a bad frame means the disk or someone else changed it.
  std::optional<std::string> payload;
  const uint32_t length = data.size() >= 8 ? static_cast<uint32_t>(static_cast<unsigned char>(data[0])) |
                                                 static_cast<uint32_t>(static_cast<unsigned char>(data[1])) << 8 |
                                                 static_cast<uint32_t>(static_cast<unsigned char>(data[2])) << 16 |
                                                 static_cast<uint32_t>(static_cast<unsigned char>(data[3])) << 24
                                           : 0;
  Status framed = OkStatus();
  if (data.size() < 8 || length != data.size() - 8) {
    framed = MakeError("its length does not match the file's {} bytes", data.size());
  } else if (FrameRecord(std::string_view(data).substr(8)) != data) {
    framed = MakeError("CRC mismatch");
  } else {
    payload = data.substr(8);
  }
  if (!framed.ok()) {
    return MakeError("{}: corrupt snapshot ({}); move it away to start with empty counters", path,
                     framed.error().message);
  }
  return payload;
}

}  // namespace

Result<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir, uint64_t compact_bytes,
                                                     Ingestor& ingestor) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return MakeError("--state-dir {}: cannot create the directory: {}", dir, ec.message());
  std::unique_ptr<StateStore> store(new StateStore());
  store->dir_ = dir;
  store->compact_bytes_ = compact_bytes;

  const std::string lock_path = dir + "/lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (store->lock_fd_ < 0) return MakeError("--state-dir {}: cannot open {}: {}", dir, lock_path, std::strerror(errno));
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return MakeError("--state-dir {}: another collector is using it ({})", dir, std::strerror(errno));
  }

  Result<std::optional<std::string>> snapshot = ReadSnapshot(dir + "/" + kSnapshot);
  if (!snapshot.ok()) return snapshot.error();
  if (snapshot->has_value()) {
    state::State s;
    if (!s.ParseFromString(**snapshot)) return MakeError("{}/{}: not a collector snapshot", dir, kSnapshot);
    Status restored = ingestor.Restore(s);
    if (!restored.ok()) return MakeError("{}/{}: {}", dir, kSnapshot, restored.error().message);
    store->generation_ = s.journal_generation();
    spdlog::info("state: snapshot restored ({} reports counted, {} agents)", s.reports(), s.agents_size());
  }

  Result<std::unique_ptr<Journal>> journal =
      Journal::Open(store->JournalPath(store->generation_), [&](std::string_view payload) -> Status {
        state::JournalRecord record;
        if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return MakeError("not a journal record");
        }
        ingestor.Replay(record);
        return OkStatus();
      });
  if (!journal.ok()) return journal.error();
  store->journal_ = std::move(*journal);
  spdlog::info("state: {} journal records replayed from {}", store->journal_->records_replayed(),
               store->journal_->path());

  // Journals no snapshot names are left over from a compaction cut short.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kJournalPrefix, 0) == 0 && entry.path().string() != store->journal_->path()) {
      spdlog::info("state: removing {} (compacted into the snapshot)", entry.path().string());
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return store;
}

StateStore::~StateStore() {
  journal_.reset();  // syncs
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string StateStore::JournalPath(uint64_t generation) const {
  return fmt::format("{}/{}{}", dir_, kJournalPrefix, generation);
}

void StateStore::MaybeCompact(Ingestor& ingestor) {
  if (compact_bytes_ == 0 || journal_->bytes() < compact_bytes_) return;
  std::unique_lock lock(compact_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (journal_->bytes() < compact_bytes_) return;
  Status compacted = Compact(ingestor);
  if (!compacted.ok()) spdlog::error("state: compaction failed: {}", compacted.error().message);
}

Status StateStore::Compact(Ingestor& ingestor) {
  Status status = OkStatus();
  const uint64_t before = journal_->bytes();
  ingestor.Checkpoint([&](state::State& s) {
    // Under the Ingestor's lock: nothing is applied (or enqueued) meanwhile,
    // so the snapshot holds exactly what the old journal holds.
    status = journal_->Sync();
    if (!status.ok()) return;
    const uint64_t next = generation_ + 1;
    s.set_journal_generation(next);
    status = WriteFileDurably(dir_ + "/" + kSnapshot, FrameRecord(s.SerializeAsString()));
    if (!status.ok()) return;
    const std::string old_path = journal_->path();
    status = journal_->Rotate(JournalPath(next));
    if (!status.ok()) {
      // The snapshot now names a journal that is not being written: accepting
      // more reports would lose them at the next start.
      journal_->Fail(status.error().message);
      return;
    }
    generation_ = next;
    std::error_code ec;
    std::filesystem::remove(old_path, ec);
  });
  if (status.ok()) spdlog::info("state: compacted a {} byte journal into the snapshot", before);
  return status;
}

}  // namespace tlsprof::collector
