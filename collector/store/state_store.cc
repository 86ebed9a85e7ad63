#include "collector/store/state_store.h"

#include <fcntl.h>
#include <google/protobuf/arena.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

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

// The generation of a journal segment's file (journal-<gen>), if it is one.
std::optional<uint64_t> SegmentGeneration(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  if (name.rfind(kJournalPrefix, 0) != 0) return std::nullopt;
  const std::string number = name.substr(std::strlen(kJournalPrefix));
  if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(number);
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
  store->ingestor_ = &ingestor;

  const std::string lock_path = dir + "/lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (store->lock_fd_ < 0) return MakeError("--state-dir {}: cannot open {}: {}", dir, lock_path, std::strerror(errno));
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return MakeError("--state-dir {}: another collector is using it ({})", dir, std::strerror(errno));
  }

  uint64_t first = 0;  // the segment the snapshot names
  Result<std::optional<std::string>> snapshot = ReadSnapshot(dir + "/" + kSnapshot);
  if (!snapshot.ok()) return snapshot.error();
  if (snapshot->has_value()) {
    state::State s;
    if (!s.ParseFromString(**snapshot)) return MakeError("{}/{}: not a collector snapshot", dir, kSnapshot);
    Status restored = RestoreSnapshot(s, ingestor);
    if (!restored.ok()) return MakeError("{}/{}: {}", dir, kSnapshot, restored.error().message);
    first = s.journal_generation();
    spdlog::info("state: snapshot restored ({} reports counted, {} agents)", s.reports(), s.agents_size());
  }

  // Segments before `first` are in the snapshot (a compaction whose last
  // step, deleting them, was cut short); the others are replayed in order.
  std::set<uint64_t> segments = {first};
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::optional<uint64_t> generation = SegmentGeneration(entry.path());
    if (!generation) continue;
    if (*generation < first) {
      stale.push_back(entry.path());
    } else {
      segments.insert(*generation);
    }
  }
  uint64_t replayed = 0;
  for (uint64_t generation : segments) {
    Result<std::unique_ptr<Journal>> journal =
        Journal::Open(store->JournalPath(generation), [&](std::string_view payload) -> Status {
          state::JournalRecord record;
          if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
            return MakeError("not a journal record");
          }
          Result<ApplyResult> applied = ReplayRecord(record, ingestor);
          if (!applied.ok()) return applied.error();
          return OkStatus();
        });
    if (!journal.ok()) return journal.error();
    replayed += (*journal)->records_replayed();
    store->journal_ = std::move(*journal);  // the last one is continued
    store->generation_ = generation;
  }
  spdlog::info("state: {} journal records replayed from {} segment(s), continuing {}", replayed, segments.size(),
               store->journal_->path());
  for (const std::filesystem::path& path : stale) {
    spdlog::info("state: removing {} (compacted into the snapshot)", path.string());
    std::filesystem::remove(path, ec);
  }
  store->worker_ = std::thread([s = store.get()] { s->CompactionLoop(); });
  return store;
}

StateStore::~StateStore() {
  if (worker_.joinable()) {
    {
      std::lock_guard lock(worker_mu_);
      stopping_ = true;
    }
    worker_cv_.notify_all();
    worker_.join();
  }
  journal_.reset();  // syncs
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string StateStore::JournalPath(uint64_t generation) const {
  return fmt::format("{}/{}{}", dir_, kJournalPrefix, generation);
}

void StateStore::MaybeCompact() {
  if (compact_bytes_ == 0 || journal_->bytes() < compact_bytes_) return;
  {
    std::lock_guard lock(worker_mu_);
    if (requested_ || running_) return;
    requested_ = true;
  }
  worker_cv_.notify_all();
}

void StateStore::WaitForCompaction() {
  std::unique_lock lock(worker_mu_);
  worker_cv_.wait(lock, [&] { return !requested_ && !running_; });
}

void StateStore::CompactionLoop() {
  // Below the ingest threads (nice 10, this thread only): building and writing
  // a snapshot is a few hundred ms of CPU at 20,000 agents, and on a busy
  // machine it would delay replies; the journal only grows a little longer.
  // The shipped unit's SystemCallFilter= denies @resources (setpriority among
  // them) with EPERM: that is expected there, and only costs the ordering.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10) != 0) {
    const int error = errno;
    if (error == EPERM) {
      spdlog::info("state: the compaction thread keeps the ingest threads' priority (setpriority: {})",
                   std::strerror(error));
    } else {
      spdlog::warn("state: cannot lower the compaction thread's priority: {}", std::strerror(error));
    }
  }
  std::unique_lock lock(worker_mu_);
  for (;;) {
    worker_cv_.wait(lock, [&] { return requested_ || stopping_; });
    if (!requested_) return;  // stopping, nothing asked for
    requested_ = false;
    running_ = true;
    lock.unlock();
    if (journal_->bytes() >= compact_bytes_) {
      Status compacted = Compact();
      if (!compacted.ok()) spdlog::error("state: compaction failed: {}", compacted.error().message);
    }
    lock.lock();
    running_ = false;
    worker_cv_.notify_all();
  }
}

Status StateStore::Compact() {
  std::lock_guard compacting(compact_mu_);
  const uint64_t before = journal_->bytes();
  const auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Snapshot>> snapshot = BeginCompaction();
  if (!snapshot.ok()) return snapshot.error();
  const auto switched = std::chrono::steady_clock::now();
  Status finished = FinishCompaction(**snapshot);
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  if (finished.ok()) {
    spdlog::info(
        "state: compacted a {} byte journal into the snapshot ({:.1f} ms flushing, copying, switching, {:.1f} ms "
        "building and writing it)",
        before, ms(switched - start), ms(std::chrono::steady_clock::now() - switched));
  }
  return finished;
}

Result<std::unique_ptr<StateStore::Snapshot>> StateStore::BeginCompaction() {
  Status status = OkStatus();
  auto snapshot = std::make_unique<Snapshot>();
  // Outside the ingest lock: flush what is queued, and create the next segment
  // (an empty segment after the current one replays as nothing).
  const uint64_t next = generation_ + 1;
  Status synced = journal_->Sync();
  if (!synced.ok()) return synced.error();
  Result<int> fd = Journal::CreateSegment(JournalPath(next));
  if (!fd.ok()) return fd.error();
  const auto before_lock = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point copied;
  snapshot->state = ingestor_->Copy([&] {
    copied = std::chrono::steady_clock::now();
    // Under the Ingestor's lock: nothing is applied (or enqueued) meanwhile,
    // so the copy holds exactly what the segments up to this one hold.
    status = journal_->Rotate(JournalPath(next), *fd);
    // A failed Rotate changed nothing: the journal goes on in its segment
    // (the empty next one replays as nothing), and compaction is tried again
    // later.
    if (!status.ok()) return;
    generation_ = next;
    snapshot->journal_generation = next;
  });
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  spdlog::info("state: compaction: {:.1f} ms to take the ingest lock and copy the state, {:.1f} ms to switch segments",
               ms(copied - before_lock), ms(std::chrono::steady_clock::now() - copied));
  if (!status.ok()) return status.error();
  return snapshot;
}

Status StateStore::FinishCompaction(const Snapshot& pending) {
  if (before_snapshot_) before_snapshot_();
  // No lock: the copy's agents and minutes are never written (the live state
  // clones them first), and its other containers are its own.
  google::protobuf::Arena arena;
  state::State& snapshot = *google::protobuf::Arena::CreateMessage<state::State>(&arena);
  StateToProto(pending.state, snapshot);
  snapshot.set_journal_generation(pending.journal_generation);
  // Until the rename inside, the old snapshot and every segment since it
  // replay the same state; a failure here leaves them in place.
  Status written = WriteFileDurably(dir_ + "/" + kSnapshot, FrameRecord(snapshot.SerializeAsString()));
  if (!written.ok()) return written;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::optional<uint64_t> generation = SegmentGeneration(entry.path());
    if (generation && *generation < pending.journal_generation) std::filesystem::remove(entry.path(), ec);
  }
  return OkStatus();
}

}  // namespace tlsprof::collector
