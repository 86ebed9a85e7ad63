#include "agent/profiler/profiler.h"

#include <sys/resource.h>
#include <sys/sysmacros.h>

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <fstream>
#include <map>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/profiler/steady_state.h"
#include "common/self_cpu.h"

namespace tlsprof::profiler {
namespace {

using Clock = std::chrono::steady_clock;

// A process that exited (and was reaped): its pid answers ESRCH.
bool Exited(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// Where each executable mapping starts, and its file and image: two snapshots
// that differ here need another unwind registration (a dlopen, or a library
// mapped at another address).
using MappedFile = std::tuple<uint64_t, uint64_t, const discovery::ImageInfo*>;
std::vector<MappedFile> MappedFiles(const discovery::ProcessSnapshot& snap) {
  std::vector<MappedFile> out;
  out.reserve(snap.mappings.size());
  for (const auto& m : snap.mappings) out.emplace_back(m.mapping.start, m.mapping.inode, m.image.get());
  return out;
}

// Resident memory now (/proc/WHO/statm: "self" or a pid), not the peak; 0
// for a process that is gone.
uint64_t ProcessResidentBytes(const std::string& who) {
  auto text = guard::ReadProcText("/proc/" + who + "/statm", guard::kMaxProcFileBytes);
  std::istringstream statm(text ? text->text : std::string());
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t MaxResidentBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

std::string MachineId() {
  std::ifstream in("/etc/machine-id");  // guarded-io: the host's own file
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace

// How long ago a process started, from its start time (clock ticks after
// boot, /proc/PID/stat) and /proc/uptime; a large value when unknown.
static double ProcessAgeSeconds(uint64_t start_ticks) {
  std::ifstream uptime("/proc/uptime");  // guarded-io: the kernel's, not a process's
  double now = 0;
  if (start_ticks == 0 || !(uptime >> now)) return 1e9;
  static const long ticks = sysconf(_SC_CLK_TCK);
  return now - static_cast<double>(start_ticks) / static_cast<double>(ticks > 0 ? ticks : 100);
}

static constexpr double kYoungProcessSeconds = 2.0;

void Profiler::AttachUsage(const discovery::ProcessSnapshot& snap) {
  std::vector<usage::FileRef> files;
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (const auto& m : snap.mappings) {
    if (!m.image || !m.image->tls || !m.mapping.is_file()) continue;
    const uint64_t dev = makedev(m.mapping.dev_major, m.mapping.dev_minor);
    if (!seen.insert({dev, m.mapping.inode}).second) continue;
    // The file the registry opened (the mapped inode, in a container of
    // either kind, or replaced on disk since).
    if (!m.image->file) continue;
    files.push_back({m.image->file, m.mapping.path, dev, m.mapping.inode,
                     std::string(classify::LibraryKindName(m.image->tls->kind))});
  }
  if (files.empty()) return;
  if (auto st = usage_->AttachProcess(files); !st.ok()) spdlog::debug("process {}: {}", snap.pid, st.error().message);
}

int64_t Profiler::UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Profiler::~Profiler() { loader_.WaitIdle(kLoaderDrain); }

Profiler::Profiler(const Options& options, std::unique_ptr<sample::Sampler> sampler)
    : options_(options),
      sampler_(std::move(sampler)),
      budget_(std::make_shared<guard::MemoryBudget>(
          options.sampling.memory_limit_bytes,
          options.sampling.memory_limit_bytes == 0
              ? 0
              : sample::WindowMemoryBound(sampler_->max_pids(), sampler_->max_sample_keys(),
                                          sampler_->max_stack_keys()))),
      registry_("/proc", [&options] {
        symbols::DebugSearch debug;
        debug.debug_roots.insert(debug.debug_roots.begin(), options.sampling.debug_dirs.begin(),
                                 options.sampling.debug_dirs.end());
        return debug;
      }()) {
  if (budget_->limited()) {
    registry_.SetMemoryBudget(budget_);
    const uint64_t resident = guard::MemoryBudget::ResidentBytes();
    spdlog::info("memory limit {} MiB: {} MiB resident at start, {} MiB kept for the window's map reads",
                 budget_->limit_bytes() >> 20, resident >> 20, budget_->reserve_bytes() >> 20);
    if (resident + budget_->reserve_bytes() >= budget_->limit_bytes()) {
      spdlog::warn(
          "memory limit {} MiB leaves no room to load symbols or unwind tables ({} MiB resident, {} MiB "
          "kept for the window): raise --memory-limit or lower --max-stack-keys/--max-sample-keys",
          budget_->limit_bytes() >> 20, resident >> 20, budget_->reserve_bytes() >> 20);
    }
  }
  if (options_.sampling.stacks) registrar_.emplace(*sampler_, budget_->limited() ? budget_ : nullptr);
  // Reading files runs on the loader thread, waited for up to kLoadWait.
  registry_.SetDeadlineWorker(&loader_, kLoadWait);
  if (registrar_) registrar_->SetDeadlineWorker(&loader_, kLoadWait);
}

Result<std::unique_ptr<Profiler>> Profiler::Start(const Options& options) {
  const double cpu_at_start = SelfCpuSeconds();
  sample::SamplerOptions sampler_options;
  sampler_options.frequency_hz = options.sampling.frequency_hz;
  sampler_options.target_pids = options.sampling.pids;
  sampler_options.max_sample_keys = options.sampling.max_sample_keys;
  sampler_options.max_stack_keys = options.sampling.max_stack_keys;
  auto sampler = sample::Sampler::Start(sampler_options);
  if (!sampler.ok()) return sampler.error();
  std::unique_ptr<usage::UsageProbes> usage_probes;
  if (options.sampling.usage) {
    auto started = usage::UsageProbes::Start();
    if (!started.ok()) return started.error();
    usage_probes = std::move(started).value();
  }
  // The last step that needed CAP_BPF + CAP_PERFMON is done (but for usage
  // probes attached later).
  if (options.drop_capabilities) {
    if (auto st = DropToSteadyState(**sampler, options.sampling.usage); !st.ok()) return st.error();
  }
  // The duty cycle's thread, after the drop: it keeps the steady state's
  // capabilities (attaching uprobes needs CAP_SYS_ADMIN here, docs/usage.md).
  if (usage_probes && options.sampling.usage_budget_share > 0) {
    usage_probes->EnableBudget(options.sampling.usage_budget_share * static_cast<double>((*sampler)->cpu_count()));
  }
  if (options.after_setup) {
    if (auto st = options.after_setup(); !st.ok()) return st.error();
  }
  std::unique_ptr<Profiler> p(new Profiler(options, std::move(sampler).value()));
  p->usage_ = std::move(usage_probes);
  p->cpu_at_start_ = cpu_at_start;
  p->hostname_ = HostName();
  p->machine_id_ = MachineId();
  // Processes that exist now are snapshotted before the window, so their
  // symbol loading is not on the first window's critical path and their
  // stacks are unwound from the first sample on. Later ones are found as
  // they get samples (Poll).
  const std::vector<pid_t> initial = options.sampling.pids.empty() ? discovery::ListPids() : options.sampling.pids;
  for (pid_t pid : initial) {
    if (pid == getpid()) continue;
    p->seen_.insert(static_cast<uint32_t>(pid));
    p->Discover(pid);
  }
  p->RestartWindow();
  return p;
}

// Snapshots a process and, if it maps a TLS library, registers it with the
// BPF unwinder. Failures concern one process and are never fatal.
void Profiler::Discover(pid_t pid) {
  auto status = registry_.Refresh(pid);
  if (!status.ok()) {
    spdlog::debug("{}", status.error().message);
    return;
  }
  const auto* snap = registry_.Get(pid);
  if (snap == nullptr || !snap->has_tls()) {
    // A process read right after its exec may not have its libraries mapped
    // yet (the dynamic loader runs after exec returns): with usage probes,
    // whose counts start only once its libraries are probed, read it again
    // at the next Poll while it is young.
    if (usage_ && snap != nullptr && ProcessAgeSeconds(snap->identity.start_time) < kYoungProcessSeconds) {
      read_again_.push_back(static_cast<uint32_t>(pid));
    }
    return;
  }
  if (usage_) AttachUsage(*snap);
  Register(pid, *snap);
}

void Profiler::Register(pid_t pid, const discovery::ProcessSnapshot& snap) {
  if (!registrar_) return;
  const auto scope = phases_.Enter(AgentPhase::kUnwindRegistration);
  auto registered = registrar_->Register(pid, snap);
  if (!registered.ok()) spdlog::debug("process {}: {}", pid, registered.error().message);
}

void Profiler::Poll(Clock::time_point deadline) {
  const auto scope = phases_.Enter(AgentPhase::kDiscovery);
  SetDeadline(deadline);
  if (usage_) usage_->CheckFiles();
  // Processes whose files were late to load, or whose unwind tables were
  // late to build, are read (and registered) again now that they are done.
  QueueLoaded();
  if (registrar_) {
    for (pid_t pid : registrar_->TakeBuilt()) {
      if (const auto* snap = registry_.Get(pid); snap != nullptr && !snap->exited) Register(pid, *snap);
    }
  }
  for (uint32_t tgid : std::exchange(read_again_, {})) {
    if (pending_set_.insert(tgid).second) pending_.push_back(tgid);
  }
  sampler_->ForEachNewPid([&](uint32_t tgid) {
    if (tgid != 0 && seen_.insert(tgid).second) {
      pending_.push_back(tgid);
      pending_set_.insert(tgid);
    }
  });
  while (!pending_.empty() && Clock::now() < deadline) {
    const uint32_t tgid = pending_.front();
    pending_.pop_front();
    if (pending_set_.erase(tgid) != 0) Discover(static_cast<pid_t>(tgid));
  }
}

void Profiler::QueueLoaded() {
  for (pid_t pid : registry_.TakeLoaded()) {
    const auto tgid = static_cast<uint32_t>(pid);
    if (pending_set_.insert(tgid).second) pending_.push_back(tgid);
  }
}

void Profiler::SetDeadline(Clock::time_point deadline) {
  registry_.SetDeadline(deadline);
  if (registrar_) registrar_->SetDeadline(deadline);
}

void Profiler::RestartWindow() {
  // The samples taken during the set-up are dropped, or they would count
  // without being part of the window's duration.
  sampler_->ClearCounts();
  if (usage_) usage_mark_ = usage_->Snapshot();
  window_start_ = Clock::now();
  window_start_unix_ns_ = UnixNowNs();
  cpu_mark_ = SelfCpuSeconds();
  bpf_mark_ = sampler_->ReadBpfStats();
  phases_.Take();  // the set-up and what the restart dropped are no window's
  stopped_at_.reset();
}

void Profiler::Stop() {
  sampler_->Stop();
  stopped_at_.emplace(Clock::now(), UnixNowNs());
}

Window Profiler::CloseWindow() {
  Window window;
  sample::WindowCounts counts;
  {
    const auto scope = phases_.Enter(AgentPhase::kMapRead);
    counts = sampler_->ReadWindow();
    MarkWindowEnd(window);
  }
  window.totals = counts.totals;
  std::set<uint32_t> sampled;
  for (const auto& [tgid, c] : counts.pids) {
    if (tgid != 0) sampled.insert(tgid);
  }
  {
    const auto scope = phases_.Enter(AgentPhase::kDiscovery);
    // Files a tenant makes slow hold the close up for kCloseLoadWait at most.
    const auto close_deadline = Clock::now() + kCloseLoadWait;
    SetDeadline(close_deadline);
    // Loads still running for processes found in the window (a slow
    // library, a debuginfod answer) are waited for up to the same deadline;
    // those that end are applied below (ReadAgain reads pending processes).
    registry_.WaitForLoads(close_deadline);
    QueueLoaded();
    window.health.forgotten_processes = ForgetExited(sampled);
    ReadAgain(sampled, counts);
  }
  {
    const auto scope = phases_.Enter(AgentPhase::kAttribution);
    window.attribution = Attribute(counts, window.cost);
  }
  {
    const auto scope = phases_.Enter(AgentPhase::kDescribe);
    Describe(window);
  }
  window.cost.phases = phases_.Take();
  return window;
}

// The window's end: its clocks, the probes' counts since its start, the
// agent's own CPU and BPF time in it; the next window starts here.
void Profiler::MarkWindowEnd(Window& window) {
  if (usage_) {
    usage::UsageSnapshot now = usage_->Snapshot();
    window.usage.emplace();
    window.usage->counts = usage::Subtract(now, usage_mark_);
    usage_mark_ = std::move(now);
  }
  const auto end = stopped_at_ ? stopped_at_->first : Clock::now();
  window.end_unix_ns = stopped_at_ ? stopped_at_->second : UnixNowNs();
  auto monotonic_ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  window.start_monotonic_ns = monotonic_ns(window_start_);
  window.end_monotonic_ns = monotonic_ns(end);
  window.start_unix_ns = window_start_unix_ns_;
  window_start_ = end;
  window_start_unix_ns_ = window.end_unix_ns;
  const double cpu = SelfCpuSeconds();
  window.cost.window_cpu_seconds = cpu - cpu_mark_;
  cpu_mark_ = cpu;
  const sample::BpfRunStats bpf = sampler_->ReadBpfStats();
  window.cost.bpf_seconds = static_cast<double>(bpf.run_time_ns - bpf_mark_.run_time_ns) / 1e9;
  window.cost.bpf_runs = bpf.run_count - bpf_mark_.run_count;
  window.cost.bpf_stats_enabled = bpf.enabled;
  bpf_mark_ = bpf;
}

// Processes that exited and had no sample in this window are forgotten:
// snapshot, unwind registration, and the images only they mapped. Returns
// how many.
size_t Profiler::ForgetExited(const std::set<uint32_t>& sampled) {
  std::vector<pid_t> gone;
  for (const auto& [pid, snap] : registry_.processes()) {
    if (!sampled.contains(static_cast<uint32_t>(pid)) && Exited(pid)) gone.push_back(pid);
  }
  for (pid_t pid : gone) {
    registry_.Forget(pid);
    if (usage_) usage_->ForgetProcess(static_cast<uint32_t>(pid));
    if (registrar_) registrar_->Unregister(pid);
    seen_.erase(static_cast<uint32_t>(pid));
  }
  // Tried but never snapshotted (kernel threads' maps are empty, not
  // missing, so these are processes that were gone when first seen).
  for (auto it = seen_.begin(); it != seen_.end();) {
    const auto pid = static_cast<pid_t>(*it);
    if (registry_.Get(pid) == nullptr && !sampled.contains(*it) && Exited(pid)) {
      pending_set_.erase(*it);
      it = seen_.erase(it);
    } else {
      ++it;
    }
  }
  if (!gone.empty()) registry_.PruneImages();
  return gone.size();
}

// Brings the snapshots of the sampled processes up to date before their
// samples are attributed.
void Profiler::ReadAgain(const std::set<uint32_t>& sampled, const sample::WindowCounts& counts) {
  // A sampled pid that now names another process (its pid was reused) or
  // another program (exec): its snapshot and unwind registration are the old
  // one's, which would name (and unwind) the new code with the old files.
  for (uint32_t tgid : sampled) {
    const auto pid = static_cast<pid_t>(tgid);
    if (!registry_.Replaced(pid)) continue;
    spdlog::debug("process {} is another process or program than at its snapshot; reading it again", pid);
    if (registrar_) registrar_->Unregister(pid);
    seen_.insert(tgid);
    Discover(pid);
  }
  if (options_.refresh_all_sampled) {
    // Processes sampled since the last poll, and processes that mapped new
    // code since their snapshot (dlopen), are read once more. Processes that
    // exited keep their last snapshot.
    for (uint32_t tgid : sampled) {
      seen_.insert(tgid);
      pending_set_.erase(tgid);
      auto status = registry_.Refresh(static_cast<pid_t>(tgid));
      if (!status.ok()) spdlog::debug("{}", status.error().message);
      // A process read before the dynamic loader mapped its libraries.
      const auto* snap = registry_.Get(static_cast<pid_t>(tgid));
      if (status.ok() && usage_ && snap != nullptr && snap->has_tls()) AttachUsage(*snap);
    }
    return;
  }
  // Sampled processes not read yet, including those Poll left pending:
  // their samples are attributed with their snapshot.
  for (uint32_t tgid : sampled) {
    const bool fresh = seen_.insert(tgid).second;
    if (pending_set_.erase(tgid) != 0 || fresh) Discover(static_cast<pid_t>(tgid));
  }
  // Pending entries already read or forgotten.
  while (!pending_.empty() && !pending_set_.contains(pending_.front())) pending_.pop_front();
  if (pending_.size() > 2 * pending_set_.size() + 64) {
    std::erase_if(pending_, [this](uint32_t tgid) { return !pending_set_.contains(tgid); });
  }
  ReadStale(counts);
}

// A process with user samples outside every mapping it had at its snapshot
// mapped new code (dlopen), or JIT code: read again, at most once per
// process per window.
void Profiler::ReadStale(const sample::WindowCounts& counts) {
  std::set<uint32_t> stale;
  for (const auto& [key, count] : counts.ips) {
    if (stale.contains(key.tgid)) continue;
    const auto* snap = registry_.Get(static_cast<pid_t>(key.tgid));
    if (snap != nullptr && !snap->exited && snap->Find(key.user_ip) == nullptr) stale.insert(key.tgid);
  }
  for (uint32_t tgid : stale) {
    const auto* before = registry_.Get(static_cast<pid_t>(tgid));
    const std::vector<MappedFile> mappings_before = before ? MappedFiles(*before) : std::vector<MappedFile>{};
    auto status = registry_.Refresh(static_cast<pid_t>(tgid));
    const auto* after = registry_.Get(static_cast<pid_t>(tgid));
    if (status.ok() && usage_ && after != nullptr && after->has_tls()) AttachUsage(*after);
    if (status.ok() && after != nullptr && after->has_tls() && MappedFiles(*after) != mappings_before) {
      Register(static_cast<pid_t>(tgid), *after);
    }
  }
}

aggregate::Attribution Profiler::Attribute(sample::WindowCounts& counts, AgentCost& cost) {
  stack_cache_.NextWindow();
  const uint64_t hits = stack_cache_.hits(), misses = stack_cache_.misses();
  aggregate::Attributor attributor(registry_, &stack_cache_, options_.keep_stacks);
  for (const auto& [tgid, c] : counts.pids) {
    if (tgid != 0) attributor.AddProcess(tgid, c.user, c.kernel);
  }
  // Stacks first: the samples they cover are taken out of the leaf counts.
  for (const auto& [key, count] : counts.stacks) {
    const uint32_t n = std::min<uint32_t>(key.nr_frames, TLSPROF_UNWIND_MAX_FRAMES);
    std::array<uint64_t, TLSPROF_UNWIND_MAX_FRAMES> ips{};  // __u64 is not uint64_t's type
    std::copy_n(key.ips, n, ips.begin());
    attributor.AddStack(key.tgid, std::span<const uint64_t>(ips.data(), n), count);
    // The last frame of a walk that stopped outside every mapping is a word
    // of the user stack (docs/attribution.md, "Privacy"): not kept around.
    explicit_bzero(ips.data(), sizeof(ips));
  }
  for (const auto& [key, count] : counts.ips) attributor.AddUserSamples(key.tgid, key.user_ip, count);
  if (options_.sampling.pids.empty()) {
    attributor.SetScopeSamples(counts.totals.samples - counts.totals.idle);
  } else {
    uint64_t scope = 0;
    for (const auto& [tgid, c] : counts.pids) scope += c.user + c.kernel;
    attributor.SetScopeSamples(scope);
  }
  if (!counts.stacks.empty()) explicit_bzero(counts.stacks.data(), counts.stacks.size() * sizeof(counts.stacks[0]));
  cost.stack_cache_hits = stack_cache_.hits() - hits;
  cost.stack_cache_misses = stack_cache_.misses() - misses;
  cost.stack_cache_entries = stack_cache_.size();
  return attributor.Finish();
}

// A process as the sinks label it: from its snapshot, else (`read_proc`:
// it has usage rows) from /proc while it lives.
ProcessInfo Profiler::DescribeProcess(uint32_t tgid, bool read_proc) const {
  ProcessInfo info;
  if (const auto* snap = registry_.Get(static_cast<pid_t>(tgid))) {
    info.comm = snap->comm;
    info.cgroup = snap->cgroup;
    info.container = snap->container;
    info.snapshotted = true;
  } else if (read_proc) {
    info.comm = discovery::ReadComm(static_cast<pid_t>(tgid));
    if (!info.comm.empty()) {
      const std::string cgroup = discovery::ReadCgroupFile(static_cast<pid_t>(tgid));
      info.cgroup = discovery::CgroupV2Path(cgroup);
      info.container = discovery::IdentityFromCgroupFile(cgroup);
    }
  }
  return info;
}

// Everything else a sink needs, read now: the processes the window names,
// the host, the probes' set-up, the agent's state and cost.
void Profiler::Describe(Window& window) const {
  for (const auto& [pid, p] : window.attribution.processes) {
    window.processes.emplace(static_cast<uint32_t>(pid), DescribeProcess(static_cast<uint32_t>(pid), false));
  }
  if (window.usage) {
    const usage::UsageSnapshot& counts = window.usage->counts;
    auto add = [&](uint32_t tgid) {
      if (!window.processes.contains(tgid)) window.processes.emplace(tgid, DescribeProcess(tgid, true));
    };
    for (const auto& h : counts.handshakes) add(h.key.tgid);
    for (const auto& op : counts.operations) add(op.key.tgid);
    for (const auto& c : counts.connections) {
      add(c.tgid);
      window.processes[c.tgid].resident_bytes = ProcessResidentBytes(std::to_string(c.tgid));
    }
    window.usage->files = usage_->files();
    window.usage->probe_overhead_ns = usage_->probe_overhead_ns();
    window.usage->call_cost_ns = usage_->call_cost_ns();
    window.usage->budget_cpu_per_second = usage_->budget();
    window.usage->budget_share = usage_->budget() > 0 ? options_.sampling.usage_budget_share : 0;
  }
  HostInfo& host = window.host;
  host.hostname = hostname_;
  host.machine_id = machine_id_;
  host.cpus = sampler_->cpu_count();
  host.frequency_hz = options_.sampling.frequency_hz;
  host.period_ns = sampler_->period_ns();
  host.scope_pids = options_.sampling.pids;
  host.agent_pid = getpid();

  AgentHealth& health = window.health;
  health.tracked_processes = registry_.processes().size();
  health.pending_processes = pending();
  health.images = registry_.image_count();
  health.cached_images = registry_.cached_image_count();
  health.images_changed = registry_.stats().images_changed;
  health.processes_replaced = registry_.stats().processes_replaced;
  health.memory_limit_bytes = budget_->limit_bytes();
  health.images_skipped = budget_->skipped(guard::MemoryBudget::kImage);
  health.tables_skipped = budget_->skipped(guard::MemoryBudget::kUnwindTable);
  const auto refused = guard::RefusalCounts();
  for (size_t i = 0; i < refused.size(); ++i) {
    if (refused[i] != 0) health.refused[std::string(guard::ReasonName(static_cast<guard::Reason>(i)))] = refused[i];
  }
  if (registrar_) health.unwind = registrar_->stats();

  AgentCost& cost = window.cost;
  cost.cpu_seconds = SelfCpuSeconds() - cpu_at_start_;
  cost.max_rss_bytes = MaxResidentBytes();
  cost.resident_bytes = ProcessResidentBytes("self");
  const auto end = Clock::time_point(std::chrono::nanoseconds(window.end_monotonic_ns));
  cost.report_latency_seconds = std::chrono::duration<double>(Clock::now() - end).count();
}

}  // namespace tlsprof::profiler
