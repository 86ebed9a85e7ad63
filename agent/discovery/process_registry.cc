#include "agent/discovery/process_registry.h"

#include <spdlog/spdlog.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <thread>
#include <unordered_set>

namespace tlsprof::discovery {
namespace {

// What says a file is the one loaded (FileVersion): its stat at open.
FileVersion VersionOf(const guard::GuardedFile& f) { return {f.size(), f.mtime_ns(), f.ctime_ns()}; }

std::string_view BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// libssl.so.3, libcrypto.so.1.1, android's libcrypto.so.0 ... A name proves
// nothing about what a file is; it only says how much of a TLS library file
// is TLS code (DetectTlsLibrary).
bool IsSharedTlsLibraryName(std::string_view name) {
  return name.starts_with("libssl.so") || name.starts_with("libcrypto.so");
}

symbols::LoadOptions MakeLoadOptions(symbols::DebugSearch debug) {
  symbols::LoadOptions options;
  options.debug = std::move(debug);
  // Keep only TLS library code: node's 100 MB binary then costs a few hundred
  // kilobytes of symbols instead of tens of megabytes. Names select it; the
  // link's layout adds the library's helpers whose names are generic.
  options.keep = [](std::string_view name) { return classify::IsTlsSymbol(name); };
  options.keep_whole_objects = true;
  return options;
}

}  // namespace

const ProcessSnapshot::ExecMapping* ProcessSnapshot::Find(uint64_t ip) const {
  auto it = std::upper_bound(mappings.begin(), mappings.end(), ip,
                             [](uint64_t addr, const ExecMapping& m) { return addr < m.mapping.start; });
  if (it == mappings.begin()) return nullptr;
  --it;
  return it->mapping.contains(ip) ? &*it : nullptr;
}

bool ProcessSnapshot::has_tls() const {
  return std::any_of(mappings.begin(), mappings.end(),
                     [](const ExecMapping& m) { return m.image && m.image->tls.has_value(); });
}

std::optional<TlsLibrary> DetectTlsLibrary(const symbols::BinaryImage& image, std::string_view path) {
  std::unordered_set<std::string_view> names;
  names.reserve(image.symbols.size());
  for (const auto& sym : image.symbols.all()) names.insert(sym.name);
  auto has_symbol = [&names](std::string_view name) { return names.contains(name); };
  // Asked only of Go binaries, a few times: a scan of the kept (TLS-gated)
  // symbols is cheap enough.
  auto has_symbol_prefix = [&image](std::string_view prefix) {
    for (const auto& sym : image.symbols.all()) {
      if (sym.name.starts_with(prefix)) return true;
    }
    return false;
  };
  std::string_view file_name = BaseName(path);
  auto kind = classify::DetectLibrary(has_symbol, image.soname, file_name, image.is_go, has_symbol_prefix);
  if (!kind) return std::nullopt;
  TlsLibrary lib;
  lib.kind = *kind;
  lib.whole_file_is_tls = !image.is_go && (IsSharedTlsLibraryName(image.soname) || IsSharedTlsLibraryName(file_name));
  return lib;
}

ProcessRegistry::ProcessRegistry(std::string proc_root, symbols::DebugSearch debug)
    : proc_root_(std::move(proc_root)),
      cache_(std::make_shared<symbols::ImageCache>(MakeLoadOptions(std::move(debug)))) {}

bool ProcessRegistry::IsSyscallReturn(const ProcessSnapshot::ExecMapping& m, uint64_t ip) const {
  if (!m.image || !m.image->file || !m.mapping.contains(ip)) return false;
  const uint64_t offset = ip - m.mapping.start + m.mapping.offset;
  if (offset < 2 || offset > m.image->file->size()) return false;
  const auto key = std::make_pair(m.image.get(), offset);
  if (auto it = syscall_returns_.find(key); it != syscall_returns_.end()) return it->second;
  // Two bytes, but of a file a tenant may make block (FUSE): read on the
  // worker, waited for briefly; a late answer is no answer (not cached).
  // One on a block device is read here: a new leaf address every few
  // samples would otherwise cost a thread hand-off each.
  auto bytes = std::make_shared<std::array<uint8_t, 2>>();
  auto read = std::make_shared<std::atomic<bool>>(false);
  auto job = [file = m.image->file, offset, bytes, read] { *read = file->ReadExact(offset - 2, *bytes).ok(); };
  if (worker_ == nullptr || m.image->file->on_block_device()) {
    job();
  } else if (!worker_->Run(job, kSyscallCheckWait, fmt::format("reading the code of {}", m.mapping.path))) {
    return false;
  }
  const bool answer = *read && (*bytes)[0] == 0x0f && (*bytes)[1] == 0x05;
  syscall_returns_.emplace(key, answer);
  return answer;
}

const ProcessSnapshot* ProcessRegistry::Get(pid_t pid) const {
  auto it = processes_.find(pid);
  return it == processes_.end() ? nullptr : &it->second;
}

std::shared_ptr<const ImageInfo> ProcessRegistry::LoadImage(
    pid_t pid, const Mapping& mapping, const std::shared_ptr<const guard::ProcessRoot>& root,
    std::unordered_map<std::string, std::shared_ptr<const ImageInfo>>& opened) {
  std::string key = fmt::format("{}:{}:{}", mapping.dev_major, mapping.dev_minor, mapping.inode);
  if (auto it = opened.find(key); it != opened.end()) return it->second;
  if (auto pending = pending_loads_.find(key); pending != pending_loads_.end()) {
    if (!pending->second.result->done) {
      pending->second.pids.insert(pid);
      return opened[key] = nullptr;  // still loading: no image for now
    }
    std::shared_ptr<LoadResult> result = std::move(pending->second.result);
    pending_loads_.erase(pending);
    return opened[key] = ApplyLoad(pid, mapping, key, *result);
  }
  // A file known, on a block device: opened here through map_files alone
  // (a path of the process could cross a tenant's FUSE mount), and when it
  // is the version loaded, that image, with no hand-off to the worker. Any
  // other file, a new version, or a range unmapped since is loaded on the
  // worker.
  if (worker_ != nullptr && guard::GuardedFile::OnBlockDevice(makedev(mapping.dev_major, mapping.dev_minor))) {
    if (auto known = by_inode_.find(key); known != by_inode_.end()) {
      auto file = guard::OpenMappedInode(MappedFileOf(pid, mapping), proc_root_);
      if (file.ok() && known->second->version == VersionOf(*file)) {
        return opened[key] = known->second;
      }
    }
  }
  // The load: open the mapped file through the guard, then its image (the
  // cache answers at once for a file it holds). It only touches what it
  // owns, the cache and the budget, so it may outlive this call.
  auto result = std::make_shared<LoadResult>();
  symbols::ImageOrigin origin{mapping.path, root};
  if (root) {
    if (auto inside = root->InsidePath(mapping.path)) origin.path = *inside;
  }
  auto load = [result, ref = MappedFileOf(pid, mapping), proc_root = proc_root_, origin = std::move(origin),
               cache = cache_, budget = budget_] {
    auto file = guard::OpenMapping(ref, proc_root);
    if (!file.ok()) {
      result->error = file.error().message;
    } else {
      result->file = std::make_shared<const guard::GuardedFile>(std::move(file).value());
      // Over the memory cap nothing is loaded; what a load needs comes from
      // the file's headers.
      symbols::AdmitFn admit;
      if (budget) {
        admit = [&result, &budget](uint64_t bytes, std::string_view what) {
          if (budget->Admit(bytes)) return true;
          budget->Skipped(guard::MemoryBudget::kImage, what, bytes);
          result->refused = true;
          return false;
        };
      }
      auto image = cache->Get(*result->file, origin, admit);
      if (budget) budget->AfterLoad(result->file->size());
      if (image.ok()) {
        result->image = std::move(image).value();
      } else {
        result->error = image.error().message;
      }
    }
    result->done = true;
  };
  if (worker_ == nullptr) {
    load();
  } else if (!worker_->Run(load, guard::WaitUntil(deadline_, wait_),
                           fmt::format("loading {} of process {}", mapping.path, pid))) {
    pending_loads_[key].result = result;
    pending_loads_[key].pids.insert(pid);
    return opened[key] = nullptr;
  }
  return opened[key] = ApplyLoad(pid, mapping, key, *result);
}

std::vector<pid_t> ProcessRegistry::TakeLoaded() {
  std::vector<pid_t> out;
  for (auto& [key, pending] : pending_loads_) {
    if (!pending.result->done || pending.pids.empty()) continue;
    out.insert(out.end(), pending.pids.begin(), pending.pids.end());
    pending.pids.clear();  // the entry stays until a Refresh applies it
  }
  // Several late loads of one process end together: it is named once.
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void ProcessRegistry::WaitForLoads(std::chrono::steady_clock::time_point deadline) {
  std::vector<std::shared_ptr<LoadResult>> waited;
  for (auto& [key, pending] : pending_loads_) {
    if (pending.pids.empty() || pending.close_waited || pending.result->done) continue;
    pending.close_waited = true;
    waited.push_back(pending.result);
  }
  // A poll, not a condition variable: the loads signal nothing, and a close
  // waits for them at most once per window.
  constexpr auto kStep = std::chrono::milliseconds(5);
  for (;;) {
    const bool running = std::any_of(waited.begin(), waited.end(), [](const auto& r) { return !r->done; });
    const auto now = std::chrono::steady_clock::now();
    if (!running || now >= deadline) return;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(kStep, deadline - now));
  }
}

std::shared_ptr<const ImageInfo> ProcessRegistry::ApplyLoad(pid_t pid, const Mapping& mapping, const std::string& key,
                                                            const LoadResult& result) {
  auto known = by_inode_.find(key);
  if (!result.file) {
    // The process is gone (or the file unreadable, or refused): what is known
    // of this inode is the best guess. Not cached: the next process mapping
    // this inode may still be readable.
    if (known != by_inode_.end()) return known->second;
    ++stats_.image_failures;
    spdlog::debug("process {}: {}", pid, result.error);
    return nullptr;
  }
  const FileVersion version = VersionOf(*result.file);
  if (known != by_inode_.end()) {
    if (known->second->version == version) return known->second;
    // Rewritten in place since it was loaded (an upgrade by cp, or an inode
    // number the filesystem gave to a new file): its symbols and unwind
    // table are another file's. Processes that mapped the old content keep
    // their image.
    ++stats_.images_changed;
    spdlog::debug("process {}: {} changed on disk since it was loaded; loading it again", pid, mapping.path);
    retired_.push_back(std::move(known->second));
    by_inode_.erase(known);
  }
  auto info = std::make_shared<ImageInfo>();
  info->path = mapping.path;
  info->version = version;
  info->file = result.file;
  if (result.image) {
    info->image = result.image;
    info->tls = DetectTlsLibrary(*info->image, mapping.path);
    ++stats_.images_loaded;
    if (info->tls) {
      spdlog::debug("process {}: {} carries {} ({} symbols from {})", pid, mapping.path,
                    classify::LibraryKindName(info->tls->kind), info->image->symbols.size(),
                    symbols::SymbolSourceName(info->image->symbol_source));
    }
  } else {
    ++stats_.image_failures;
    spdlog::debug("process {}: cannot read {}: {}", pid, mapping.path, result.error);
    // Refused by the memory budget: not remembered, tried again when
    // another process maps the file.
    if (result.refused) return nullptr;
  }
  by_inode_.emplace(key, info);
  return info;
}

bool ProcessRegistry::Replaced(pid_t pid) {
  const ProcessSnapshot* snap = Get(pid);
  if (snap == nullptr) return false;
  auto identity = ReadProcessIdentity(pid, proc_root_);
  if (!identity.ok() || !snap->identity.ReplacedBy(*identity)) return false;
  ++stats_.processes_replaced;
  return true;
}

std::string ReadCgroupFile(pid_t pid, const std::string& proc_root) {
  auto text = guard::ReadProcText(fmt::format("{}/{}/cgroup", proc_root, pid), guard::kMaxProcFileBytes);
  return text ? std::move(text->text) : std::string();
}

void ProcessRegistry::Forget(pid_t pid) { processes_.erase(pid); }

size_t ProcessRegistry::PruneImages() {
  std::unordered_set<const ImageInfo*> gone;
  for (auto it = by_inode_.begin(); it != by_inode_.end();) {
    if (it->second.use_count() > 1) {
      ++it;
      continue;
    }
    gone.insert(it->second.get());
    it = by_inode_.erase(it);
  }
  std::erase_if(retired_, [&gone](const std::shared_ptr<const ImageInfo>& image) {
    if (image.use_count() > 1) return false;
    gone.insert(image.get());
    return true;
  });
  // Keys hold the images' addresses: they go before another image can be
  // allocated there. The cache is a cache: past its bound it starts over.
  constexpr size_t kMaxSyscallReturns = 1 << 16;
  if (syscall_returns_.size() > kMaxSyscallReturns) {
    syscall_returns_.clear();
  } else if (!gone.empty()) {
    std::erase_if(syscall_returns_, [&gone](const auto& entry) { return gone.contains(entry.first.first); });
  }
  if (!gone.empty()) cache_->Prune();
  return gone.size();
}

Status ProcessRegistry::Refresh(pid_t pid) {
  ++stats_.refreshes;
  // Read before the maps: if the pid is reused in between, the snapshot holds
  // the older identity with the newer maps, and the next Replaced() asks for
  // a new one (the other order would hide the newer process for good).
  auto identity = ReadProcessIdentity(pid, proc_root_);
  auto maps = ReadExecMaps(pid, proc_root_);
  auto prev = processes_.find(pid);
  // An exiting process (a zombie until reaped) reads as empty maps: its
  // snapshot is what its samples of this window are attributed with.
  const bool exiting = maps.ok() && maps->mappings.empty() && identity.ok() && !identity->has_exe() &&
                       prev != processes_.end() && !prev->second.mappings.empty() &&
                       !prev->second.identity.ReplacedBy(*identity);
  if (!maps.ok() || exiting) {
    ++stats_.processes_gone;
    if (prev != processes_.end()) prev->second.exited = true;
    if (exiting) return MakeError("process {} is exiting; its last snapshot is kept", pid);
    return maps.error();
  }
  ProcessSnapshot snap;
  snap.pid = pid;
  snap.generation = stats_.refreshes;
  if (identity.ok()) snap.identity = *identity;
  snap.comm = ReadComm(pid, proc_root_);
  const std::string cgroups = ReadCgroupFile(pid, proc_root_);
  snap.cgroup = CgroupV2Path(cgroups);
  snap.container = IdentityFromCgroupFile(cgroups);
  if (maps->cut) ++stats_.maps_cut;
  std::shared_ptr<const guard::ProcessRoot> root;
  if (auto r = guard::ProcessRoot::Open(pid, proc_root_))
    root = std::make_shared<const guard::ProcessRoot>(std::move(*r));
  std::unordered_map<std::string, std::shared_ptr<const ImageInfo>> opened;
  for (const Mapping& m : maps->mappings) snap.mappings.push_back({m, LoadImage(pid, m, root, opened)});
  std::sort(snap.mappings.begin(), snap.mappings.end(),
            [](const auto& a, const auto& b) { return a.mapping.start < b.mapping.start; });
  // A process whose maps could be read but whose comm vanished in between is
  // still usable; keep the previous name if we had one (of this process).
  if (snap.comm.empty()) {
    if (const ProcessSnapshot* old = Get(pid); old != nullptr && old->identity == snap.identity) snap.comm = old->comm;
  }
  processes_[pid] = std::move(snap);
  return OkStatus();
}

}  // namespace tlsprof::discovery
