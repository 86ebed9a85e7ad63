#include "agent/ship/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace tlsprof::ship {
namespace {

constexpr std::string_view kMagic = "TLSPSPL1";
constexpr size_t kHeaderSize = 8 + 8 + 4;  // magic, payload length, CRC-32
constexpr std::string_view kBatchSuffix = ".batch";
constexpr std::string_view kPinSuffix = ".pin";
constexpr size_t kSequenceDigits = 20;  // UINT64_MAX has 20 digits
// A report is a few KB; anything far larger is not one of ours.
constexpr uint64_t kMaxBatchBytes = 256ull << 20;

uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t GetLe(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

// `*err` gets the errno of a failed open (ENOENT: absent), 0 otherwise.
Result<std::string> ReadWholeFile(const std::string& path, int* err = nullptr) {
  if (err != nullptr) *err = 0;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));  // guarded-io: the agent's state dir
  if (!fd.valid()) {
    int e = errno;
    if (err != nullptr) *err = e;
    return MakeError("cannot open {}: {}", path, std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return MakeError("cannot stat {}: {}", path, std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) > kMaxBatchBytes) {
    return MakeError("{} is {} bytes, more than any batch could be", path, st.st_size);
  }
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return MakeError("cannot read {}: {}", path, std::strerror(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));  // guarded-io: the agent's state dir
  if (!fd.valid()) return MakeError("cannot open directory {}: {}", dir, std::strerror(errno));
  if (::fsync(fd.get()) != 0) return MakeError("cannot fsync directory {}: {}", dir, std::strerror(errno));
  return OkStatus();
}

Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return MakeError("{} exists but is not a directory", dir);
    }
    return OkStatus();
  }
  return MakeError("cannot create directory {}: {}", dir, std::strerror(errno));
}

// mkdir -p: the state directory's parents may not exist yet (first run).
Status MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos < dir.size(); ++pos) {
    if (dir[pos] != '/') continue;
    std::string parent = dir.substr(0, pos);
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      return MakeError("cannot create directory {}: {}", parent, std::strerror(errno));
    }
  }
  return MakeDir(dir);
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xF]);
  }
  return out;
}

std::optional<std::string> Unhex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

std::string_view TrimNewline(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > kSequenceDigits) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// "00000000000000000042.batch" → 42.
std::optional<uint64_t> SequenceOfName(std::string_view name, std::string_view suffix = kBatchSuffix) {
  if (name.size() != kSequenceDigits + suffix.size() || !name.ends_with(suffix)) return std::nullopt;
  return ParseDecimal(name.substr(0, kSequenceDigits));
}

Result<std::string> NewInstance() {
  std::string bytes(16, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::getrandom(bytes.data() + done, bytes.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return MakeError("getrandom failed: {}", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return bytes;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

bool IsNoSpace(int err) { return err == ENOSPC || err == EDQUOT; }

Status WriteFileDurably(const std::string& dir, const std::string& name, std::string_view data, int* err_out) {
  int scratch = 0;
  int& err = err_out != nullptr ? *err_out : scratch;
  err = 0;
  std::string tmp = dir + "/." + name + ".tmp";
  std::string path = dir + "/" + name;
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));  // guarded-io: state dir
    if (!fd.valid()) {
      err = errno;
      return MakeError("cannot create {}: {}", tmp, std::strerror(err));
    }
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        ::unlink(tmp.c_str());
        return MakeError("cannot write {}: {}", tmp, std::strerror(err));
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      err = errno;
      ::unlink(tmp.c_str());
      return MakeError("cannot fsync {}: {}", tmp, std::strerror(err));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return MakeError("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  return FsyncDir(dir);
}

std::string EncodeBatch(const v1::AgentReport& report) {
  std::string payload = report.SerializeAsString();
  std::string out(kMagic);
  PutLe(out, payload.size(), 8);
  PutLe(out, Crc32(payload), 4);
  out += payload;
  return out;
}

Result<v1::AgentReport> DecodeBatch(std::string_view bytes) {
  if (bytes.size() < kHeaderSize) return MakeError("truncated: {} bytes, less than the header", bytes.size());
  if (bytes.substr(0, kMagic.size()) != kMagic) return MakeError("not a tlsprof spool batch (bad magic)");
  uint64_t length = GetLe(bytes.substr(8), 8);
  uint32_t crc = static_cast<uint32_t>(GetLe(bytes.substr(16), 4));
  std::string_view payload = bytes.substr(kHeaderSize);
  if (payload.size() != length) {
    return MakeError("truncated: payload is {} bytes, header says {}", payload.size(), length);
  }
  if (Crc32(payload) != crc) return MakeError("checksum mismatch");
  v1::AgentReport report;
  if (!report.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return MakeError("payload is not a tlsprof.v1.AgentReport");
  }
  return report;
}

// ---------------------------------------------------------------- StateDir

Result<StateDir> StateDir::Open(const std::string& dir) {
  if (dir.empty()) return MakeError("no state directory given");
  StateDir s;
  s.dir_ = dir;
  while (s.dir_.size() > 1 && s.dir_.back() == '/') s.dir_.pop_back();
  if (auto st = MakeDirs(s.dir_); !st) return st.error();
  if (auto st = MakeDir(s.spool_dir()); !st) return st.error();

  // Two agents sharing a state directory would hand out the same sequences.
  std::string lock_path = s.dir_ + "/lock";
  s.lock_ = UniqueFd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));  // guarded-io: state dir
  if (!s.lock_.valid()) return MakeError("cannot open {}: {}", lock_path, std::strerror(errno));
  if (::flock(s.lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return MakeError("state directory {} is in use by another tlsprof-agent; give each agent its own --state-dir",
                       s.dir_);
    }
    return MakeError("cannot lock {}: {}", lock_path, std::strerror(errno));
  }

  const std::string instance_path = s.dir_ + "/instance";
  const std::string sequence_path = s.dir_ + "/next_sequence";
  // 0 = absent or invalid (sequences start at 1).
  uint64_t next = 0;
  int err = 0;
  if (auto text = ReadWholeFile(sequence_path, &err); text.ok()) {
    next = ParseDecimal(TrimNewline(*text)).value_or(0);
    if (next == 0) {
      spdlog::error(
          "ship: {} holds no valid sequence ({:?}); starting a new agent instance so that no sequence is reused",
          sequence_path, std::string(TrimNewline(*text)).substr(0, 32));
    }
  } else if (err != ENOENT) {
    spdlog::error("ship: {}; starting a new agent instance so that no sequence is reused", text.error().message);
  }

  std::optional<std::string> instance;
  if (auto text = ReadWholeFile(instance_path); text.ok()) {
    instance = Unhex(TrimNewline(*text));
    if (!instance || instance->size() != 16) {
      spdlog::error("ship: {} is not 32 hex digits; starting a new agent instance", instance_path);
      instance.reset();
    }
  }
  // A counter without its instance (or the reverse) cannot prove a sequence
  // unused under that instance: start a new instance at the counter's value
  // (or 1). Sequences stay monotonic in the logs either way.
  if (!instance || next == 0) {
    auto fresh = NewInstance();
    if (!fresh) return fresh.error();
    s.instance_ = std::move(*fresh);
    s.next_sequence_ = std::max<uint64_t>(next, 1);
    if (auto st = WriteFileDurably(s.dir_, "next_sequence", fmt::format("{}\n", s.next_sequence_)); !st) {
      return st.error();
    }
    if (auto st = WriteFileDurably(s.dir_, "instance", Hex(s.instance_) + "\n"); !st) return st.error();
    spdlog::info("ship: new agent instance {} in {}", Hex(s.instance_), s.dir_);
  } else {
    s.instance_ = std::move(*instance);
    s.next_sequence_ = next;
  }
  return s;
}

std::string StateDir::instance_hex() const { return Hex(instance_); }

Status StateDir::AdvanceTo(uint64_t next) {
  if (next <= next_sequence_) return OkStatus();
  if (auto st = WriteFileDurably(dir_, "next_sequence", fmt::format("{}\n", next)); !st) return st;
  next_sequence_ = next;
  return OkStatus();
}

Result<uint64_t> StateDir::Take(int* err) {
  uint64_t sequence = next_sequence_;
  if (auto st = WriteFileDurably(dir_, "next_sequence", fmt::format("{}\n", sequence + 1), err); !st) {
    return st.error();
  }
  next_sequence_ = sequence + 1;
  return sequence;
}

// ------------------------------------------------------------------- Spool

std::string Spool::FileName(uint64_t sequence) { return fmt::format("{:020d}{}", sequence, kBatchSuffix); }

Result<Spool> Spool::Open(const std::string& dir, uint32_t max_quarantined, Loaded* loaded) {
  Spool s;
  s.dir_ = dir;
  s.max_quarantined_ = max_quarantined;
  if (auto st = MakeDir(dir); !st) return st.error();
  uint64_t quarantined = 0;
  bool changed = false;
  std::vector<std::pair<uint64_t, std::string>> pin_files;
  for (const std::string& name : ListDir(dir)) {
    std::string path = dir + "/" + name;
    if (name == "corrupt") continue;
    if (std::optional<uint64_t> pinned = SequenceOfName(name, kPinSuffix)) {
      pin_files.emplace_back(*pinned, path);
      continue;
    }
    if (name.starts_with(".") && name.ends_with(".tmp")) {
      // Never renamed: its Seal() did not return, so nothing refers to it.
      ::unlink(path.c_str());
      changed = true;
      continue;
    }
    std::optional<uint64_t> sequence = SequenceOfName(name);
    if (!sequence) {
      spdlog::warn("ship: ignoring {} in the spool: not a batch file", path);
      continue;
    }
    auto data = ReadWholeFile(path);
    if (!data) {
      s.Quarantine(name, data.error().message);
      ++quarantined;
      changed = true;
      continue;
    }
    auto report = DecodeBatch(*data);
    if (!report) {
      s.Quarantine(name, report.error().message);
      ++quarantined;
      changed = true;
      continue;
    }
    if (report->sequence() != *sequence) {
      s.Quarantine(name, fmt::format("holds sequence {}, not the one in its name", report->sequence()));
      ++quarantined;
      changed = true;
      continue;
    }
    s.batches_[*sequence] = data->size();
    s.bytes_ += data->size();
  }
  changed |= s.LoadPins(pin_files);
  if (changed) {
    if (auto st = FsyncDir(dir); !st) spdlog::warn("ship: {}", st.error().message);
  }
  if (loaded != nullptr) loaded->quarantined = quarantined;
  return s;
}

void Spool::Quarantine(const std::string& name, const std::string& reason) {
  std::string corrupt = dir_ + "/corrupt";
  std::string from = dir_ + "/" + name;
  if (max_quarantined_ == 0 || !MakeDir(corrupt).ok()) {
    spdlog::error("ship: spool file {} is corrupt ({}); deleting it", from, reason);
    ::unlink(from.c_str());
    return;
  }
  auto now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string to = fmt::format("{}/{}.{}", corrupt, name, now_ns);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    spdlog::error("ship: spool file {} is corrupt ({}); cannot move it to {} ({}), deleting it", from, reason, to,
                  std::strerror(errno));
    ::unlink(from.c_str());
    return;
  }
  spdlog::error("ship: spool file {} is corrupt ({}); moved to {}", from, reason, to);
  // Bounded: the oldest files go first, by modification time (rename keeps
  // it: when the batch was written), then by name (sequence).
  std::vector<std::string> kept = ListDir(corrupt);
  std::sort(kept.begin(), kept.end(), [&](const std::string& a, const std::string& b) {
    struct stat sa {
    }, sb{};
    ::stat((corrupt + "/" + a).c_str(), &sa);
    ::stat((corrupt + "/" + b).c_str(), &sb);
    if (sa.st_mtim.tv_sec != sb.st_mtim.tv_sec) return sa.st_mtim.tv_sec < sb.st_mtim.tv_sec;
    if (sa.st_mtim.tv_nsec != sb.st_mtim.tv_nsec) return sa.st_mtim.tv_nsec < sb.st_mtim.tv_nsec;
    return a < b;
  });
  for (size_t i = 0; i + max_quarantined_ < kept.size(); ++i) {
    ::unlink((corrupt + "/" + kept[i]).c_str());
  }
}

// A pin without its batch is left from a Remove() cut short: deleted. A pin
// that cannot be read names no collector: deleted too, and its batch is
// placed again (logged; the one case where a batch may reach a second
// collector, after a disk error).
bool Spool::LoadPins(const std::vector<std::pair<uint64_t, std::string>>& files) {
  bool changed = false;
  for (const auto& [sequence, path] : files) {
    if (batches_.count(sequence) == 0) {
      ::unlink(path.c_str());
      changed = true;
      continue;
    }
    auto text = ReadWholeFile(path);
    std::string target = text ? std::string(TrimNewline(*text)) : std::string();
    if (target.empty() || target.find('\n') != std::string::npos) {
      spdlog::error("ship: pin file {} is unreadable or empty ({}); deleting it, its batch is placed again", path,
                    text ? "no collector in it" : text.error().message);
      ::unlink(path.c_str());
      changed = true;
      continue;
    }
    pins_[sequence] = std::move(target);
  }
  return changed;
}

std::string Spool::PinFileName(uint64_t sequence) { return fmt::format("{:020d}{}", sequence, kPinSuffix); }

Status Spool::WritePin(uint64_t sequence, const std::string& target, int* err) const {
  return WriteFileDurably(dir_, PinFileName(sequence), target + "\n", err);
}

void Spool::AddPin(uint64_t sequence, const std::string& target) {
  if (batches_.count(sequence) != 0) pins_[sequence] = target;
}

void Spool::Unpin(uint64_t sequence) {
  if (pins_.erase(sequence) == 0) return;
  std::string path = dir_ + "/" + PinFileName(sequence);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("ship: cannot delete {}: {}", path, std::strerror(errno));
  }
}

Result<uint64_t> Spool::Write(const v1::AgentReport& report, int* err) const {
  std::string data = EncodeBatch(report);
  if (auto st = WriteFileDurably(dir_, FileName(report.sequence()), data, err); !st) return st.error();
  return static_cast<uint64_t>(data.size());
}

void Spool::Add(uint64_t sequence, uint64_t size) {
  auto [it, inserted] = batches_.try_emplace(sequence, size);
  if (!inserted) {
    bytes_ -= it->second;
    it->second = size;
  }
  bytes_ += size;
}

Result<uint64_t> Spool::Put(const v1::AgentReport& report) {
  auto size = Write(report);
  if (size) Add(report.sequence(), *size);
  return size;
}

Result<v1::AgentReport> Spool::Load(uint64_t sequence) {
  std::string name = FileName(sequence);
  int err = 0;
  auto data = ReadWholeFile(dir_ + "/" + name, &err);
  if (!data) {
    if (err == ENOENT) {
      Remove(sequence);
      return MakeError("spool file {}/{} vanished", dir_, name);
    }
    std::string reason = data.error().message;
    Quarantine(name, reason);
    Remove(sequence);
    return MakeError("spool file {}/{} is unreadable: {}", dir_, name, reason);
  }
  auto report = DecodeBatch(*data);
  if (!report || report->sequence() != sequence) {
    std::string reason = report ? fmt::format("holds sequence {}", report->sequence()) : report.error().message;
    Quarantine(name, reason);
    Remove(sequence);
    return MakeError("spool file {}/{} is corrupt: {}", dir_, name, reason);
  }
  return report;
}

void Spool::Remove(uint64_t sequence) {
  Unpin(sequence);
  auto it = batches_.find(sequence);
  std::string path = dir_ + "/" + FileName(sequence);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("ship: cannot delete {}: {}", path, std::strerror(errno));
  }
  if (it != batches_.end()) {
    bytes_ -= it->second;
    batches_.erase(it);
  }
}

std::optional<uint64_t> Spool::Oldest(std::optional<uint64_t> skip) const {
  for (const auto& [sequence, size] : batches_) {
    if (skip && sequence == *skip) continue;
    return sequence;
  }
  return std::nullopt;
}

std::optional<uint64_t> Spool::OldestUnpinned() const {
  for (const auto& [sequence, size] : batches_) {
    if (pins_.count(sequence) == 0) return sequence;
  }
  return std::nullopt;
}

std::optional<uint64_t> Spool::Newest() const {
  if (batches_.empty()) return std::nullopt;
  return batches_.rbegin()->first;
}

}  // namespace tlsprof::ship
