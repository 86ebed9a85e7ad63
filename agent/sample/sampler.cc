#include "agent/sample/sampler.h"

#include <linux/capability.h>
#include <linux/membarrier.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "agent/guard/guarded_file.h"
#include "agent/guard/limits.h"
#include "agent/sample/cpu_list.h"
#include "agent/sample/map_window.h"
#include "common/fd.h"
#include "common/proc_status.h"
#include "sampler.skel.h"

namespace tlsprof::sample {
namespace {

constexpr uint32_t kMinFrequencyHz = 1;
constexpr uint32_t kMaxFrequencyHz = 10000;
constexpr uint64_t kNsPerSecond = 1'000'000'000;

// Owners of the skeleton and its links (destroying a link detaches it).
using SkelPtr = std::unique_ptr<sampler, decltype([](sampler* skel) { sampler__destroy(skel); })>;
using LinkPtr = std::unique_ptr<bpf_link, decltype([](bpf_link* link) { bpf_link__destroy(link); })>;
using RingPtr = std::unique_ptr<ring_buffer, decltype([](ring_buffer* ring) { ring_buffer__free(ring); })>;

std::string ErrnoText(int err) { return std::strerror(err < 0 ? -err : err); }

int LibbpfPrint(enum libbpf_print_level level, const char* format, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n < 0) return n;
  std::string msg(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(msg.data(), msg.size(), format, args);
  msg.resize(static_cast<size_t>(n));
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  // Most libbpf messages already start with "libbpf: "; the verifier log doesn't.
  if (msg.rfind("libbpf: ", 0) != 0) msg.insert(0, "libbpf: ");
  switch (level) {
    case LIBBPF_WARN:
      spdlog::warn("{}", msg);
      break;
    case LIBBPF_INFO:
      spdlog::info("{}", msg);
      break;
    case LIBBPF_DEBUG:
      spdlog::debug("{}", msg);
      break;
  }
  return n;
}

void SetUpLibbpfOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    libbpf_set_print(LibbpfPrint);
    // RLIMIT_MEMLOCK: libbpf 1.x tries setrlimit(RLIMIT_MEMLOCK, infinity)
    // before its first map or program, unless the kernel accounts BPF memory
    // to the memcg (5.11+, probed by loading a tiny program), as 6.x does.
    // libbpf_set_strict_mode() is a no-op since 1.0 and cannot turn that off,
    // and libbpf_set_memlock_rlim(0), which can, is declared but not exported
    // by libbpf 1.1.2 (later releases add LIBBPF_API). So this relies on the memcg
    // probe; on an older kernel libbpf's setrlimit failure (no
    // CAP_SYS_RESOURCE) is only a warning. sampler_bpf_test checks the limit
    // is left alone.
  });
}

// True if the effective capabilities allow loading a perf_event BPF program
// and opening system-wide perf events.
bool HasBpfCapabilities() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return geteuid() == 0;
  auto has = [&](int cap) { return (data[cap / 32].effective & (1u << (cap % 32))) != 0; };
  return has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
}

// Wraps a failure of a privileged step. EPERM is always a missing privilege;
// EACCES is one only if we lack the capabilities, because the verifier also
// answers EACCES when it rejects a program (its log is printed by libbpf).
// EPERM with the capabilities held comes from a filter above them: the
// message names it, since "needs CAP_BPF" would send the user the wrong way.
Error PrivilegedStepError(const std::string& what, int err) {
  err = err < 0 ? -err : err;
  std::string reason = fmt::format("{}: {}", what, ErrnoText(err));
  if (err == EPERM && HasBpfCapabilities()) {
    if (ProcSelfStatusNumber("Seccomp:") == 2) {
      return MakeError(
          "tlsprof-agent has CAP_BPF and CAP_PERFMON, but a seccomp filter denies the calls of its BPF sampler "
          "(Seccomp: 2 in /proc/self/status): a container runtime's default profile that allows bpf and "
          "perf_event_open only with CAP_SYS_ADMIN (Debian 12's podman, CRI-O) needs the Localhost profile of "
          "packaging/README.md, \"The images\": {}",
          reason);
    }
    return MakeError(
        "tlsprof-agent has CAP_BPF and CAP_PERFMON and no seccomp filter, but the kernel denies its BPF sampler: "
        "a Linux security module (lockdown, SELinux, AppArmor) is the likely cause: {}",
        reason);
  }
  if (err == EPERM || (err == EACCES && !HasBpfCapabilities())) {
    return MakeError("tlsprof-agent needs root (or CAP_BPF + CAP_PERFMON) to load its BPF sampler: {}", reason);
  }
  if (err == EACCES) {
    return MakeError("{} (the kernel's verifier rejected the program; its log is above)", reason);
  }
  return Error{reason};
}

Status ValidateFrequency(uint32_t frequency_hz) {
  if (frequency_hz < kMinFrequencyHz || frequency_hz > kMaxFrequencyHz) {
    return MakeError("sampling frequency {} Hz is out of range: use {}..{} Hz (999 is the usual choice)", frequency_hz,
                     kMinFrequencyHz, kMaxFrequencyHz);
  }
  return OkStatus();
}

// The filter is by tgid, so a target must be a live process id, not a thread id.
Status ValidateTargetPid(pid_t pid) {
  if (pid <= 0) return MakeError("target pid {} is not a valid process id", pid);
  if (kill(pid, 0) != 0 && errno == ESRCH) {
    return MakeError("target pid {} does not exist (no such process); check it with `ps -p {}`", pid, pid);
  }
  auto status = guard::ReadProcText(fmt::format("/proc/{}/status", pid), guard::kMaxProcFileBytes);
  std::istringstream lines(status ? status->text : std::string());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("Tgid:", 0) != 0) continue;
    pid_t tgid = static_cast<pid_t>(std::strtol(line.c_str() + 5, nullptr, 10));
    if (tgid > 0 && tgid != pid) {
      return MakeError("target pid {} is a thread of process {}: pass the process id {}", pid, tgid, tgid);
    }
    break;
  }
  return OkStatus();
}

// The Totals field of a totals slot.
uint64_t* TotalsField(Totals& t, uint32_t slot) {
  switch (static_cast<total_slot>(slot)) {
    case TOTAL_SAMPLES:
      return &t.samples;
    case TOTAL_IDLE:
      return &t.idle;
    case TOTAL_KERNEL:
      return &t.kernel;
    case TOTAL_USER:
      return &t.user;
    case TOTAL_DROPPED_IP:
      return &t.dropped_ip;
    case TOTAL_DROPPED_PID:
      return &t.dropped_pid;
    case TOTAL_UNWOUND:
      return &t.unwound;
    case TOTAL_DROPPED_STACK:
      return &t.dropped_stack;
    case TOTAL_UNWIND_NOT_TLS:
      return &t.unwind_not_tls;
    case TOTAL_UNWIND_STOP_ZERO_IP:
      return &t.unwind_stop.zero_ip;
    case TOTAL_UNWIND_STOP_END:
      return &t.unwind_stop.end;
    case TOTAL_UNWIND_STOP_MAX_FRAMES:
      return &t.unwind_stop.max_frames;
    case TOTAL_UNWIND_STOP_NO_MAPPING:
      return &t.unwind_stop.no_mapping;
    case TOTAL_UNWIND_STOP_NO_ROW:
      return &t.unwind_stop.no_row;
    case TOTAL_UNWIND_STOP_CFA_NONE:
      return &t.unwind_stop.cfa_none;
    case TOTAL_UNWIND_STOP_BP_UNKNOWN:
      return &t.unwind_stop.bp_unknown;
    case TOTAL_UNWIND_STOP_UNREADABLE:
      return &t.unwind_stop.unreadable;
    case TOTAL_UNWIND_STOP_NOT_GROWING:
      return &t.unwind_stop.not_growing;
    case TOTAL_UNWIND_STOP_REG_UNKNOWN:
      return &t.unwind_stop.reg_unknown;
    case TOTAL_UNWIND_WALKS:
      return &t.unwind_walks;
    case TOTAL_UNWIND_FRAMES:
      return &t.unwind_frames;
    case TOTAL_UNWIND_NS:
      return &t.unwind_ns;
    case TOTAL_UNWIND_ROW_SEARCHES:
      return &t.unwind_row_searches;
    case TOTAL_NR_SLOTS:
      break;
  }
  return nullptr;
}

uint64_t TotalsValue(const Totals& t, uint32_t slot) {
  Totals copy = t;
  const uint64_t* field = TotalsField(copy, slot);
  return field ? *field : 0;
}

int PerfEventOpen(perf_event_attr* attr, pid_t pid, int cpu) {
  return static_cast<int>(syscall(SYS_perf_event_open, attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC));
}

}  // namespace

struct Sampler::Impl {
  // Declaration order is destruction order in reverse: the links go first
  // (each one disables and closes its perf event), then the stats fd and the
  // ring's mappings, then the skeleton with its maps and program.
  SkelPtr skel;
  RingPtr new_tgids;
  // What ForEachNewPid hands each record of the ring to, while it reads it.
  const std::function<void(uint32_t)>* on_new_tgid = nullptr;
  uint64_t new_tgids_lost_seen = 0;
  UniqueFd stats_fd;
  std::vector<int> cpus;
  std::vector<LinkPtr> links;
};

// What ReadWindow() keeps between reads: the pid map's and the totals'
// baselines, and how many keys the previous drains returned (the next
// drains' first batch size).
struct Sampler::WindowState {
  MapWindow<uint32_t, pid_counts> pids;
  Totals totals;
  size_t last_ips = 0;
  size_t last_stacks = 0;
};

namespace {

// The two sets of a per-window map (bpf/sampler.bpf.c, window_set).
template <typename Skel>
std::array<const bpf_map*, 2> IpSets(const Skel& skel) {
  return {skel.maps.samples_by_ip_0, skel.maps.samples_by_ip_1};
}
template <typename Skel>
std::array<const bpf_map*, 2> StackSets(const Skel& skel) {
  return {skel.maps.samples_by_stack_0, skel.maps.samples_by_stack_1};
}

// Returns once every run of the BPF program that started before the call
// has returned: MEMBARRIER_CMD_GLOBAL is an RCU grace period
// (synchronize_rcu), and the program runs in the perf event's interrupt, an
// RCU read-side section. Without membarrier (nohz_full CPUs refuse it), a
// sleep thousands of times a run's length, with a warning once.
void WaitForRunsInFlight() {
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0) return;
  static std::once_flag warned;
  const int err = errno;
  std::call_once(warned, [err] {
    spdlog::warn("membarrier(MEMBARRIER_CMD_GLOBAL) failed ({}); windows hand over after a 20 ms sleep instead",
                 ErrnoText(err));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

Sampler::Sampler(std::unique_ptr<Impl> impl, uint64_t period_ns)
    : impl_(std::move(impl)), window_(std::make_unique<WindowState>()), period_ns_(period_ns) {}

Sampler::~Sampler() = default;

Result<std::unique_ptr<Sampler>> Sampler::Start(const SamplerOptions& options) {
  if (auto st = ValidateFrequency(options.frequency_hz); !st) return st.error();
  if (options.target_pids.size() > TLSPROF_MAX_TARGET_PIDS) {
    return MakeError("{} target pids given; at most {} are supported", options.target_pids.size(),
                     TLSPROF_MAX_TARGET_PIDS);
  }
  for (pid_t pid : options.target_pids) {
    if (auto st = ValidateTargetPid(pid); !st) return st.error();
  }
  auto cpus = ReadCpuList(kOnlineCpusPath);
  if (!cpus) return MakeError("cannot find the online CPUs: {}", cpus.error().message);
  const uint64_t period_ns = kNsPerSecond / options.frequency_hz;

  SetUpLibbpfOnce();
  auto impl = std::make_unique<Impl>();

  // Open: parse the embedded BPF object; nothing reaches the kernel yet.
  impl->skel.reset(sampler__open());
  if (!impl->skel) {
    return MakeError("cannot open the embedded BPF sampler object: {}", ErrnoText(errno));
  }

  // Set rodata: knobs are constants to the verifier, so set them before load.
  impl->skel->rodata->filter_tgids = !options.target_pids.empty();

  // Map sizes: also set before load; both sets of a per-window map alike.
  const std::pair<bpf_map*, uint32_t> sizes[] = {{impl->skel->maps.samples_by_ip_0, options.max_sample_keys},
                                                 {impl->skel->maps.samples_by_ip_1, options.max_sample_keys},
                                                 {impl->skel->maps.samples_by_stack_0, options.max_stack_keys},
                                                 {impl->skel->maps.samples_by_stack_1, options.max_stack_keys},
                                                 {impl->skel->maps.samples_by_pid, options.max_pids}};
  for (const auto& [map, entries] : sizes) {
    if (entries == 0) continue;
    if (int err = bpf_map__set_max_entries(map, entries); err != 0) {
      return MakeError("cannot size the BPF map {} to {} entries: {}", bpf_map__name(map), entries, ErrnoText(-err));
    }
  }

  // Load: create the maps and verify and load the program.
  if (int err = sampler__load(impl->skel.get()); err != 0) {
    return PrivilegedStepError("loading the BPF sampler into the kernel failed", err);
  }

  // The ring is mapped now, while the agent may still map BPF objects.
  impl->new_tgids.reset(ring_buffer__new(bpf_map__fd(impl->skel->maps.new_tgids), OnNewTgid, impl.get(), nullptr));
  if (!impl->new_tgids) {
    return PrivilegedStepError("mapping the BPF ring of new processes failed", errno);
  }

  const uint8_t present = 1;
  for (pid_t pid : options.target_pids) {
    uint32_t tgid = static_cast<uint32_t>(pid);
    if (bpf_map__update_elem(impl->skel->maps.target_tgids, &tgid, sizeof(tgid), &present, sizeof(present), BPF_ANY) !=
        0) {
      return MakeError("cannot add pid {} to the BPF pid filter: {}", pid, ErrnoText(errno));
    }
  }

  // The kernel keeps per-program run time and count only while someone holds
  // a stats fd; hold one for the life of the Sampler. Not fatal without it.
  int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (stats_fd < 0) {
    spdlog::warn("BPF run-time stats unavailable ({}); the sampler's own cost will read as 0", ErrnoText(errno));
  } else {
    impl->stats_fd.reset(stats_fd);
  }

  // Attach: one cpu-clock event per online CPU, counting every pid. Period
  // mode (not frequency mode) so every sample stands for exactly period_ns
  // of CPU time.
  for (int cpu : *cpus) {
    perf_event_attr attr{};
    attr.size = sizeof(attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.sample_period = period_ns;
    attr.freq = 0;
    attr.disabled = 1;  // libbpf enables it once the program is attached
    UniqueFd pfd(PerfEventOpen(&attr, -1, cpu));
    if (!pfd.valid()) {
      int err = errno;
      if (err == ENODEV) {  // went offline since we read the online list
        spdlog::warn("CPU {} went offline; not sampling it", cpu);
        continue;
      }
      return PrivilegedStepError(fmt::format("opening the cpu-clock perf event on CPU {} failed", cpu), err);
    }
    bpf_link* link = bpf_program__attach_perf_event(impl->skel->progs.sample_cpu, pfd.get());
    if (!link) {
      return PrivilegedStepError(fmt::format("attaching the BPF sampler to CPU {} failed", cpu), errno);
    }
    // The link now owns the perf event fd: bpf_link__destroy() closes it.
    pfd.release();
    impl->links.emplace_back(link);
    impl->cpus.push_back(cpu);
  }
  if (impl->cpus.empty()) return MakeError("no online CPU could be sampled");

  spdlog::info("BPF sampler running at {} Hz (period {} ns) on {} CPUs{}", options.frequency_hz, period_ns,
               impl->cpus.size(),
               options.target_pids.empty() ? "" : fmt::format(", {} target processes", options.target_pids.size()));
  return std::unique_ptr<Sampler>(new Sampler(std::move(impl), period_ns));
}

int Sampler::cpu_count() const { return static_cast<int>(impl_->cpus.size()); }

int Sampler::OnNewTgid(void* ctx, void* data, size_t size) {
  const auto* impl = static_cast<const Impl*>(ctx);
  uint32_t tgid = 0;
  if (size < sizeof(tgid) || impl->on_new_tgid == nullptr) return 0;
  std::memcpy(&tgid, data, sizeof(tgid));
  (*impl->on_new_tgid)(tgid);
  return 0;
}

void Sampler::ForEachNewPid(const std::function<void(uint32_t tgid)>& fn) {
  impl_->on_new_tgid = &fn;
  ring_buffer__consume(impl_->new_tgids.get());
  impl_->on_new_tgid = nullptr;
  // Read after the ring: a record lost before this read has its map entry
  // already, so the walk below finds it; one lost later moves the count again.
  const uint64_t lost = __atomic_load_n(&impl_->skel->bss->new_tgids_lost, __ATOMIC_ACQUIRE);
  if (lost == impl_->new_tgids_lost_seen) return;
  impl_->new_tgids_lost_seen = lost;
  ++new_pid_walks_;
  ForEachPid([&](uint32_t tgid, const pid_counts&) { fn(tgid); });
}

void Sampler::Stop() { impl_->links.clear(); }

namespace {

// Deletes every key of a hash map: keys are collected first, since deleting
// while walking could restart or skip the walk.
template <typename Key>
void DeleteAllKeys(const bpf_map* map) {
  std::vector<Key> keys;
  Key key{};
  Key next{};
  const Key* prev = nullptr;
  while (bpf_map__get_next_key(map, prev, &next, sizeof(next)) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }
  for (const Key& k : keys) bpf_map__delete_elem(map, &k, sizeof(k), 0);
}

}  // namespace

void Sampler::ClearCounts() {
  *window_ = WindowState{};
  DeleteAllKeys<uint32_t>(impl_->skel->maps.samples_by_pid);
  for (const bpf_map* map : IpSets(*impl_->skel)) DeleteAllKeys<sample_key>(map);
  for (const bpf_map* map : StackSets(*impl_->skel)) DeleteAllKeys<stack_key>(map);
  const int ncpus = libbpf_num_possible_cpus();
  if (ncpus <= 0) return;
  const std::vector<uint64_t> zeros(static_cast<size_t>(ncpus), 0);
  for (uint32_t slot = 0; slot < TOTAL_NR_SLOTS; ++slot) {
    bpf_map__update_elem(impl_->skel->maps.totals, &slot, sizeof(slot), zeros.data(), zeros.size() * sizeof(uint64_t),
                         BPF_ANY);
  }
}

void Sampler::ForEachPid(const std::function<void(uint32_t tgid, const pid_counts&)>& fn) const {
  // One batch read (a few system calls however many pids): Poll falls back
  // to this when the ring of new pids overflowed.
  MapWindow<uint32_t, pid_counts>::ForEach(bpf_map__fd(impl_->skel->maps.samples_by_pid), 4096, fn);
}

void Sampler::ForEachIp(const std::function<void(const sample_key&, uint64_t count)>& fn) const {
  // Both sets: the window's, and the one a ReadWindow() drained.
  for (const bpf_map* map : IpSets(*impl_->skel)) {
    MapWindow<sample_key, uint64_t>::ForEach(bpf_map__fd(map), 4096, fn);
  }
}

std::vector<Totals> Sampler::ReadTotalsPerCpu() const {
  const bpf_map* map = impl_->skel->maps.totals;
  int ncpus = libbpf_num_possible_cpus();
  if (ncpus <= 0) return {};
  const auto cpus = static_cast<size_t>(ncpus);
  std::vector<Totals> per_cpu(cpus);
  // Every slot in one batch (per-CPU arrays take batch lookups since 5.6),
  // else one lookup per slot.
  std::array<uint32_t, TOTAL_NR_SLOTS> slots{};
  std::vector<uint64_t> values(TOTAL_NR_SLOTS * cpus);
  uint32_t count = TOTAL_NR_SLOTS, token = 0;
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  const int err = bpf_map_lookup_batch(bpf_map__fd(map), nullptr, &token, slots.data(), values.data(), &count, &opts);
  if ((err != 0 && errno != ENOENT) || count != TOTAL_NR_SLOTS) {
    for (uint32_t slot = 0; slot < TOTAL_NR_SLOTS; ++slot) {
      slots[slot] = slot;
      if (bpf_map__lookup_elem(map, &slot, sizeof(slot), &values[slot * cpus], cpus * sizeof(uint64_t), 0) != 0) {
        std::fill_n(&values[slot * cpus], cpus, 0);
      }
    }
  }
  for (uint32_t i = 0; i < TOTAL_NR_SLOTS; ++i) {
    for (size_t cpu = 0; cpu < cpus; ++cpu) {
      if (uint64_t* field = TotalsField(per_cpu[cpu], slots[i])) *field = values[i * cpus + cpu];
    }
  }
  return per_cpu;
}

Totals& operator+=(Totals& a, const Totals& b) {
  for (uint32_t slot = 0; slot < TOTAL_NR_SLOTS; ++slot) {
    *TotalsField(a, slot) += TotalsValue(b, slot);
  }
  return a;
}

Totals Sampler::ReadTotals() const {
  Totals sum;
  for (const Totals& t : ReadTotalsPerCpu()) sum += t;
  return sum;
}

WindowCounts Sampler::ReadWindow() {
  WindowCounts w;
  std::vector<uint32_t> idle;
  // The window's sample sets are handed over: new samples go to the other
  // set, and once no run can still write the old one it is drained whole,
  // exactly (no sample lost or counted twice, none deleted under a run).
  uint32_t* set = &impl_->skel->bss->window_set;
  const uint32_t closed = __atomic_load_n(set, __ATOMIC_RELAXED) & 1;
  __atomic_store_n(set, closed ^ 1, __ATOMIC_SEQ_CST);
  WaitForRunsInFlight();
  auto hint = [](size_t last) { return static_cast<uint32_t>(std::min<size_t>(last + last / 4 + 16, 4096)); };
  // In the reverse of the order the BPF program counts a sample in (totals,
  // pid, ip, stack): what a map shows here, the maps read after it show too,
  // so a window never has more TLS samples than busy samples for a process.
  MapWindow<stack_key, uint64_t>::ForEach(
      bpf_map__fd(StackSets(*impl_->skel)[closed]), hint(window_->last_stacks),
      [&](const stack_key& key, uint64_t count) { w.stacks.emplace_back(key, count); }, /*drain=*/true);
  MapWindow<sample_key, uint64_t>::ForEach(
      bpf_map__fd(IpSets(*impl_->skel)[closed]), hint(window_->last_ips),
      [&](const sample_key& key, uint64_t count) { w.ips.emplace_back(key, count); }, /*drain=*/true);
  window_->last_stacks = w.stacks.size();
  window_->last_ips = w.ips.size();
  w.pids = window_->pids.Read(bpf_map__fd(impl_->skel->maps.samples_by_pid), &idle);
  Totals now = ReadTotals();
  for (uint32_t slot = 0; slot < TOTAL_NR_SLOTS; ++slot) {
    *TotalsField(w.totals, slot) = TotalsValue(now, slot) - TotalsValue(window_->totals, slot);
  }
  window_->totals = now;
  w.idle_pids = std::move(idle);
  return w;
}

BpfRunStats Sampler::ReadBpfStats() const {
  BpfRunStats stats;
  stats.enabled = impl_->stats_fd.valid();
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(bpf_program__fd(impl_->skel->progs.sample_cpu), &info, &len) == 0) {
    stats.run_time_ns = info.run_time_ns;
    stats.run_count = info.run_cnt;
  }
  return stats;
}

Status Sampler::CheckMapAccess() const {
  const uint32_t slot = 0;
  std::vector<uint64_t> values(static_cast<size_t>(std::max(libbpf_num_possible_cpus(), 1)));
  if (bpf_map__lookup_elem(impl_->skel->maps.totals, &slot, sizeof(slot), values.data(),
                           values.size() * sizeof(uint64_t), 0) != 0) {
    return MakeError("reading the BPF map 'totals' through its fd: {}", ErrnoText(errno));
  }
  return OkStatus();
}

uint32_t Sampler::max_rows() const { return bpf_map__max_entries(impl_->skel->maps.unwind_rows); }
uint32_t Sampler::max_pids() const { return bpf_map__max_entries(impl_->skel->maps.samples_by_pid); }
uint32_t Sampler::max_sample_keys() const { return bpf_map__max_entries(impl_->skel->maps.samples_by_ip_0); }
uint32_t Sampler::max_stack_keys() const { return bpf_map__max_entries(impl_->skel->maps.samples_by_stack_0); }

uint64_t WindowMemoryBound(uint32_t max_pids, uint32_t max_sample_keys, uint32_t max_stack_keys) {
  // Per key of a map with key K and value V, at the peak of ReadWindow():
  // a drained set, the entries read (a vector while it grows: its old and
  // its new buffer, 3 (K + V)); the pid map also the gains (a vector, up to
  // 2 (K + V)) and the baseline (hash nodes with their next pointer, cached
  // hash, malloc header and bucket: K + V + 40).
  auto drained = [](uint64_t kv) { return 3 * kv; };
  auto windowed = [](uint64_t kv) { return 2 * kv + kv + 40; };
  return max_pids * windowed(sizeof(uint32_t) + sizeof(pid_counts)) +
         max_sample_keys * drained(sizeof(sample_key) + sizeof(uint64_t)) +
         max_stack_keys * drained(sizeof(stack_key) + sizeof(uint64_t));
}

Result<uint32_t> Sampler::AllocateRows(uint32_t count) {
  if (count > max_rows() - next_row_) {
    return MakeError("the BPF unwind row array is full ({} of {} rows used, {} more asked): that file is not unwound",
                     next_row_, max_rows(), count);
  }
  uint32_t first = next_row_;
  next_row_ += count;
  return first;
}

Status Sampler::UploadRows(uint32_t first_row, std::span<const unwind_row> rows) {
  const uint32_t max = max_rows();
  if (first_row > max || rows.size() > max - first_row) {
    return MakeError("unwind rows [{}, {}) do not fit the BPF row array of {} rows", first_row,
                     uint64_t{first_row} + rows.size(), max);
  }
  // Batches bound the key array we build; BPF_MAP_UPDATE_BATCH on an array
  // map exists since Linux 5.6.
  constexpr size_t kBatch = 65536;
  std::vector<uint32_t> keys;
  const int fd = bpf_map__fd(impl_->skel->maps.unwind_rows);
  for (size_t done = 0; done < rows.size();) {
    const size_t n = std::min(kBatch, rows.size() - done);
    keys.resize(n);
    for (size_t i = 0; i < n; ++i) keys[i] = first_row + static_cast<uint32_t>(done + i);
    uint32_t count = static_cast<uint32_t>(n);
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    if (bpf_map_update_batch(fd, keys.data(), rows.data() + done, &count, &opts) != 0) {
      const int err = errno;
      BumpRowsGeneration();  // some rows may have changed
      return MakeError("cannot upload unwind rows [{}, {}) to the kernel: {}", first_row + done, first_row + done + n,
                       ErrnoText(err));
    }
    done += n;
  }
  // The row index: the pc of every bucket's first row among those written.
  std::vector<uint32_t> buckets;
  std::vector<uint32_t> pcs;
  constexpr uint32_t kShift = TLSPROF_UNWIND_INDEX_SHIFT;
  const uint64_t end = uint64_t{first_row} + rows.size();
  for (uint64_t row = (uint64_t{first_row} + TLSPROF_UNWIND_INDEX_BUCKET - 1) >> kShift << kShift; row < end;
       row += TLSPROF_UNWIND_INDEX_BUCKET) {
    buckets.push_back(static_cast<uint32_t>(row >> kShift));
    pcs.push_back(rows[row - first_row].pc);
  }
  if (!buckets.empty()) {
    uint32_t count = static_cast<uint32_t>(buckets.size());
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    if (bpf_map_update_batch(bpf_map__fd(impl_->skel->maps.unwind_row_index), buckets.data(), pcs.data(), &count,
                             &opts) != 0) {
      const int err = errno;
      BumpRowsGeneration();
      return MakeError("cannot upload the unwind row index for rows [{}, {}): {}", first_row, end, ErrnoText(err));
    }
  }
  BumpRowsGeneration();
  return OkStatus();
}

void Sampler::BumpRowsGeneration() {
  // The BPF row cache keeps a lookup only for the generation it was made in
  // (bpf/sampler.bpf.c); 0 means "cache off", so it is skipped on wrap.
  uint32_t* gen = &impl_->skel->bss->unwind_rows_gen;
  if (__atomic_add_fetch(gen, 1, __ATOMIC_RELEASE) == 0) __atomic_add_fetch(gen, 1, __ATOMIC_RELEASE);
}

Status Sampler::SetProcess(uint32_t tgid, const unwind_proc& proc) {
  if (proc.nr_mappings > TLSPROF_UNWIND_MAX_MAPPINGS) {
    return MakeError("process {}: {} unwind mappings given, at most {} are supported", tgid, proc.nr_mappings,
                     TLSPROF_UNWIND_MAX_MAPPINGS);
  }
  const uint32_t max = max_rows();
  for (uint32_t i = 0; i < proc.nr_mappings; ++i) {
    const unwind_mapping& m = proc.mappings[i];
    if (m.start >= m.end) return MakeError("process {}: unwind mapping {} is empty or reversed", tgid, i);
    if (i > 0 && m.start < proc.mappings[i - 1].end) {
      return MakeError("process {}: unwind mappings must be sorted by start and disjoint (mapping {})", tgid, i);
    }
    if (m.table_start > max || m.table_len > max - m.table_start) {
      return MakeError("process {}: unwind mapping {} names rows [{}, {}) outside the row array of {}", tgid, i,
                       m.table_start, uint64_t{m.table_start} + m.table_len, max);
    }
  }
  if (bpf_map__update_elem(impl_->skel->maps.unwind_procs, &tgid, sizeof(tgid), &proc, sizeof(proc), BPF_ANY) != 0) {
    return MakeError("cannot register process {} for stack unwinding: {}", tgid, ErrnoText(errno));
  }
  return OkStatus();
}

void Sampler::RemoveProcess(uint32_t tgid) {
  bpf_map__delete_elem(impl_->skel->maps.unwind_procs, &tgid, sizeof(tgid), 0);
}

void Sampler::ForEachStack(const std::function<void(const stack_key&, uint64_t count)>& fn) const {
  for (const bpf_map* map : StackSets(*impl_->skel)) {
    MapWindow<stack_key, uint64_t>::ForEach(bpf_map__fd(map), 4096, fn);
  }
}

}  // namespace tlsprof::sample
