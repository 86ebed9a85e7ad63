// ProcessRegistry: which processes run which binaries, and which of those
// binaries carry a TLS library (OpenSSL, BoringSSL, Go crypto/tls).
//
// Snapshots are taken while a profile runs (for every process that gets
// samples), so a process that exits before the report is still symbolized
// from its last snapshot, and one that starts during the profile is picked up
// the first time it is sampled. Each file is opened once per dev:inode,
// through the guarded opener (guard/guarded_file.h), and that open file is
// what every later reader of it uses (unwind tables, usage probes, system-call
// checks): nothing is opened again by a path that may name another file by
// then. Its image is loaded once per file (and once per content across
// containers, via symbols::ImageCache); a file changed in place since (same
// dev:inode, other size or times: an upgrade that rewrote the file) is loaded
// again. A pid that now names another process (pid reuse) or another program
// (exec) is told apart by its ProcessIdentity.
// Not thread-safe: one thread owns a registry.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/classify/classify.h"
#include "agent/discovery/cgroup_identity.h"
#include "agent/discovery/proc_maps.h"
#include "agent/guard/deadline.h"
#include "agent/guard/guarded_file.h"
#include "agent/guard/memory_budget.h"
#include "agent/symbols/binary_image.h"
#include "common/result.h"

namespace tlsprof::discovery {

// The TLS library an ELF file carries.
struct TlsLibrary {
  classify::LibraryKind kind;
  // A shared libssl/libcrypto: every address in it is TLS library code, named
  // or not (Debian's libcrypto.so.3 is stripped). Otherwise (node, a Go
  // binary, a static link) only addresses inside TLS symbols are.
  bool whole_file_is_tls = false;
};

// What tells two contents of one dev:inode apart: a file rewritten in place
// (cp over it) keeps its inode but not its size, mtime and ctime.
struct FileVersion {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;

  bool operator==(const FileVersion&) const = default;
};

// One ELF file as the agent knows it.
struct ImageInfo {
  std::string path;  // as first seen, inside the process's mount namespace
  FileVersion version;
  // The file itself, open (guard::OpenMapping): its later readers use this,
  // never its path. Held while a snapshot maps it (PruneImages).
  std::shared_ptr<const guard::GuardedFile> file;
  std::shared_ptr<const symbols::BinaryImage> image;
  std::optional<TlsLibrary> tls;
};

struct ProcessSnapshot {
  struct ExecMapping {
    Mapping mapping;
    std::shared_ptr<const ImageInfo> image;  // null when the file could not be read
  };
  pid_t pid = 0;
  ProcessIdentity identity;  // as read with the maps; all 0 if it could not be read
  std::string comm;
  std::string cgroup;                 // the process's cgroup v2 path (/proc/PID/cgroup's "0::" line), "" if unknown
  ContainerIdentity container;        // from every line of /proc/PID/cgroup (cgroup_identity.h); empty on the host
  std::vector<ExecMapping> mappings;  // executable file mappings, sorted by start
  bool exited = false;                // the last refresh found the process gone
  // Unique to this read of the process in its registry (never reused): what
  // is derived from the snapshot's mappings and images can be kept under it
  // (aggregate::StackCache).
  uint64_t generation = 0;

  const ExecMapping* Find(uint64_t ip) const;
  bool has_tls() const;
};

struct RegistryStats {
  uint64_t refreshes = 0;
  uint64_t images_loaded = 0;
  uint64_t image_failures = 0;
  uint64_t processes_gone = 0;
  uint64_t images_changed = 0;      // a dev:inode whose content changed in place, loaded again
  uint64_t processes_replaced = 0;  // Replaced() answers: pid reuse or exec
  uint64_t maps_cut = 0;            // reads of /proc/PID/maps cut at a guard cap
};

class ProcessRegistry {
 public:
  // `debug`: where separate debug files and static archives are looked up for
  // stripped images (symbols::DebugSearch; its defaults suit a Debian host).
  explicit ProcessRegistry(std::string proc_root = "/proc", symbols::DebugSearch debug = {});

  // Reads the process's maps and loads the images of its executable mappings
  // (cached). When the process is gone, or exiting (a zombie: no address
  // space left to read), the last snapshot is kept and marked exited; the
  // Error says so. A process is never fatal to the agent.
  Status Refresh(pid_t pid);
  const ProcessSnapshot* Get(pid_t pid) const;
  const std::map<pid_t, ProcessSnapshot>& processes() const { return processes_; }
  const RegistryStats& stats() const { return stats_; }
  // Files known by dev:inode, and images held by the cache (by build-id).
  size_t image_count() const { return by_inode_.size() + retired_.size(); }
  size_t cached_image_count() const { return cache_->size(); }

  // Whether `pid` names another process, or another program, than its
  // snapshot: its identity (start time, executable) changed
  // (ProcessIdentity::ReplacedBy). False when there is no snapshot or the
  // process cannot be read (gone), or is exiting. The caller
  // then Refresh()es it: a snapshot of the old process would symbolize (and
  // unwind) the new one with the old one's files.
  bool Replaced(pid_t pid);

  // Forgets a process (it exited): its snapshot goes, and with it its hold on
  // its images. A long-running agent calls this, and PruneImages(), so that
  // memory follows the processes alive, not every process ever seen.
  void Forget(pid_t pid);
  // Drops the images no snapshot (and nobody else) holds any more, and what
  // was cached about them. Returns how many went.
  size_t PruneImages();

  // Whether `ip` (in `mapping`) is right after a `syscall` instruction
  // (bytes 0f 05). A user-mode sample there is kernel time: the timer fired
  // during the system call and was delivered on its return
  // (docs/attribution.md, "System-call returns"). Reads the two bytes from
  // the image's open file on first use and caches the answer per image and
  // address; false when they cannot be read.
  bool IsSyscallReturn(const ProcessSnapshot::ExecMapping& mapping, uint64_t ip) const;
  static constexpr std::chrono::milliseconds kSyscallCheckWait{100};

  // The agent's memory cap (guard/memory_budget.h): past it, files are not
  // loaded (their mappings get no image, as for an unreadable file) until
  // memory is free again. What a load needs is computed from the file's own
  // headers (symbols::AdmitFn), for every file. Null: no cap.
  void SetMemoryBudget(std::shared_ptr<guard::MemoryBudget> budget) { budget_ = std::move(budget); }

  // Opening and loading a file (which a tenant can make block: a FUSE file,
  // a debuginfod server) runs on `worker`, waited for up to `wait`
  // (guard/deadline.h). A load still running then leaves that mapping
  // without an image for now; when it ends, TakeLoaded() names the
  // processes to Refresh() again. Null (the default): loads run inline.
  void SetDeadlineWorker(guard::DeadlineWorker* worker, std::chrono::milliseconds wait) {
    worker_ = worker;
    wait_ = wait;
  }
  // The processes whose late loads have ended since the last call, each once.
  std::vector<pid_t> TakeLoaded();
  // Waits until every late load a process waits for has ended, or until
  // `deadline` (the window's close: what ends by then is named by the
  // TakeLoaded that follows, the rest at a later one). Each load is waited
  // for by one call only: a load that never ends (a tenant's FUSE file)
  // holds up one close, not every one.
  void WaitForLoads(std::chrono::steady_clock::time_point deadline);
  // Waits end by `deadline` too (the caller's: the window's close), but last
  // at least guard::kMinWait, which a load the cache answers needs.
  void SetDeadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

 private:
  // `root`: the process's root, opened once per Refresh (debug files and
  // archives beside a library are looked up in it); `opened`: the files this
  // Refresh opened already, by dev:inode (a file mapped many times is opened
  // once).
  std::shared_ptr<const ImageInfo> LoadImage(pid_t pid, const Mapping& mapping,
                                             const std::shared_ptr<const guard::ProcessRoot>& root,
                                             std::unordered_map<std::string, std::shared_ptr<const ImageInfo>>& opened);

  // What a load on the worker produces; the loop thread applies it.
  struct LoadResult {
    std::shared_ptr<const guard::GuardedFile> file;
    std::shared_ptr<const symbols::BinaryImage> image;
    std::string error;
    bool refused = false;  // by the memory budget: not remembered, tried again
    std::atomic<bool> done{false};
  };
  std::shared_ptr<const ImageInfo> ApplyLoad(pid_t pid, const Mapping& mapping, const std::string& key,
                                             const LoadResult& result);

  std::string proc_root_;
  std::shared_ptr<symbols::ImageCache> cache_;  // shared with loads still running on the worker
  // dev:inode → image, so a library mapped by 500 nginx workers is opened once.
  std::unordered_map<std::string, std::shared_ptr<const ImageInfo>> by_inode_;
  // Images of files changed in place since (by_inode_ holds the new content):
  // kept until no snapshot holds them, so that PruneImages() drops what was
  // cached about them (syscall_returns_ is keyed by their address).
  std::vector<std::shared_ptr<const ImageInfo>> retired_;
  std::map<pid_t, ProcessSnapshot> processes_;
  RegistryStats stats_;
  mutable std::map<std::pair<const ImageInfo*, uint64_t>, bool> syscall_returns_;  // (image, file offset)
  std::shared_ptr<guard::MemoryBudget> budget_;
  guard::DeadlineWorker* worker_ = nullptr;
  std::chrono::milliseconds wait_{0};
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  // Loads that were late, by dev:inode, with the processes that wait for them.
  struct PendingLoad {
    std::shared_ptr<LoadResult> result;
    std::set<pid_t> pids;
    bool close_waited = false;  // a WaitForLoads waited for it already
  };
  std::map<std::string, PendingLoad> pending_loads_;
};

// The contents of /proc/PID/cgroup, "" when it cannot be read (the process is
// gone). CgroupV2Path() and IdentityFromCgroupFile() (cgroup_identity.h) read it.
std::string ReadCgroupFile(pid_t pid, const std::string& proc_root = "/proc");

// Decides whether an image carries a TLS library (exposed for tests).
std::optional<TlsLibrary> DetectTlsLibrary(const symbols::BinaryImage& image, std::string_view path);

}  // namespace tlsprof::discovery
