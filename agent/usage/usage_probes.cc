#include "agent/usage/usage_probes.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "agent/usage/boringssl_plan.h"
#include "agent/usage/duty_cycle.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/go_plan.h"
#include "agent/usage/probe_plan.h"
#include "common/fd.h"
#include "common/self_cpu.h"
#include "usage.skel.h"

namespace tlsprof::usage {
namespace {

// Owners of the skeleton and its links (destroying a link detaches it).
using SkelPtr = std::unique_ptr<::usage, decltype([](::usage* skel) { usage__destroy(skel); })>;
using LinkPtr = std::unique_ptr<bpf_link, decltype([](bpf_link* link) { bpf_link__destroy(link); })>;

std::string ErrnoText(int err) { return std::strerror(err < 0 ? -err : err); }

constexpr uint16_t kCalibrationLib = 0xffff;  // no layout: key types read as unknown
constexpr int kCalibrationCalls = 2000;

// Where `addr` (code of this process) is in its file: /proc/self/maps's
// mapping that holds it, as (path, file offset).
std::optional<std::pair<std::string, uint64_t>> FileOffsetOf(uintptr_t addr) {
  std::ifstream maps("/proc/self/maps");  // guarded-io: the agent's own
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t start = 0, end = 0, offset = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %*s %*s %n", &start, &end, perms, &offset, &path_at) < 4) continue;
    if (addr < start || addr >= end || path_at <= 0) continue;
    std::string path = line.substr(static_cast<size_t>(path_at));
    if (path.empty() || path[0] != '/') return std::nullopt;
    return std::make_pair(path, addr - start + offset);
  }
  return std::nullopt;
}

}  // namespace

// The calibration targets: operations that do nothing, one per class of
// first instruction (bpf/usage.h, enum usage_insn_class), timed by the same
// probe pair as the library's (PROBE_CALIBRATE). What the probes measure for
// them is their own share of every timed call of that class.
asm(R"(
  .pushsection .text
  .globl tlsprof_usage_calibrate_push
  .type tlsprof_usage_calibrate_push, @function
tlsprof_usage_calibrate_push:
  push %rbx
  mov $1, %eax
  pop %rbx
  ret
  .size tlsprof_usage_calibrate_push, .-tlsprof_usage_calibrate_push
  .globl tlsprof_usage_calibrate_endbr
  .type tlsprof_usage_calibrate_endbr, @function
tlsprof_usage_calibrate_endbr:
  endbr64
  mov $1, %eax
  ret
  .size tlsprof_usage_calibrate_endbr, .-tlsprof_usage_calibrate_endbr
  .globl tlsprof_usage_calibrate_step
  .type tlsprof_usage_calibrate_step, @function
tlsprof_usage_calibrate_step:
  sub $8, %rsp
  mov $1, %eax
  add $8, %rsp
  ret
  .size tlsprof_usage_calibrate_step, .-tlsprof_usage_calibrate_step
  .globl tlsprof_usage_calibrate_go
  .type tlsprof_usage_calibrate_go, @function
tlsprof_usage_calibrate_go:
  cmp $0, %rsp
  .globl tlsprof_usage_calibrate_go_entry
tlsprof_usage_calibrate_go_entry:
  jbe 1f
  mov $1, %eax
  .globl tlsprof_usage_calibrate_go_ret
tlsprof_usage_calibrate_go_ret:
  ret
1:
  ud2
  .size tlsprof_usage_calibrate_go, .-tlsprof_usage_calibrate_go
  .popsection
)");
extern "C" int tlsprof_usage_calibrate_push(void* ctx, void* out, size_t* len);
extern "C" int tlsprof_usage_calibrate_endbr(void* ctx, void* out, size_t* len);
extern "C" int tlsprof_usage_calibrate_step(void* ctx, void* out, size_t* len);
// Probed the Go way (INSN_GO): a uprobe on the jump of a Go-like stack
// check (GoEntryProbeAddress) and one on its RET.
extern "C" int tlsprof_usage_calibrate_go(void* ctx, void* out, size_t* len);
extern "C" char tlsprof_usage_calibrate_go_entry[];
extern "C" char tlsprof_usage_calibrate_go_ret[];

namespace {

// Calls visit(key) for every key of a BPF hash map (keys may come and go
// meanwhile: the walk is best effort, as any read of a live map).
template <typename Key, typename Visit>
void ForEachKey(int fd, Visit visit) {
  Key key{}, next{};
  const Key* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    visit(next);
    key = next;
    prev = &key;
  }
}

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The kernel's uprobe_multi link (Linux 6.6+): every probe of one program
// on one file in one link, attached and detached in one step. Debian 12's
// libbpf (1.1) predates it, so the link is made with the bpf() syscall;
// the attribute layout is the kernel's (include/uapi/linux/bpf.h).
constexpr uint32_t kTraceUprobeMulti = 48;  // enum bpf_attach_type BPF_TRACE_UPROBE_MULTI
constexpr uint32_t kUprobeMultiReturn = 1;  // BPF_F_UPROBE_MULTI_RETURN
struct UprobeMultiAttr {
  uint32_t prog_fd;
  uint32_t target_fd;
  uint32_t attach_type;
  uint32_t flags;
  uint64_t path;
  uint64_t offsets;
  uint64_t ref_ctr_offsets;
  uint64_t cookies;
  uint32_t cnt;
  uint32_t multi_flags;
  uint32_t pid;
  uint32_t pad;
};
static_assert(sizeof(UprobeMultiAttr) == 64);

// A link fd, or -1 with errno set.
int UprobeMultiLink(int prog_fd, const std::string& path, const std::vector<uint64_t>& offsets,
                    const std::vector<uint64_t>& cookies, bool retprobe, int pid) {
  UprobeMultiAttr attr{};
  attr.prog_fd = static_cast<uint32_t>(prog_fd);
  attr.attach_type = kTraceUprobeMulti;
  attr.path = reinterpret_cast<uint64_t>(path.c_str());
  attr.offsets = reinterpret_cast<uint64_t>(offsets.data());
  attr.cookies = reinterpret_cast<uint64_t>(cookies.data());
  attr.cnt = static_cast<uint32_t>(offsets.size());
  attr.multi_flags = retprobe ? kUprobeMultiReturn : 0;
  attr.pid = static_cast<uint32_t>(pid);
  return static_cast<int>(syscall(__NR_bpf, BPF_LINK_CREATE, &attr, sizeof(attr)));
}

// The probes of one program on one file, as they are attached again after
// a pause of the duty cycle: the file by an fd the agent holds (through
// /proc/self/fd, so it still resolves when the process the agent first
// found it in is gone). One uprobe_multi link where the kernel has them,
// else a perf-event link per probe.
struct Group {
  bpf_program* prog = nullptr;        // attached through perf events
  bpf_program* multi_prog = nullptr;  // attached through uprobe_multi; null: not loaded
  std::shared_ptr<UniqueFd> file;
  std::pair<uint64_t, uint64_t> file_key;  // dev, inode
  std::vector<uint64_t> offsets, cookies;
  bool retprobe = false;
  bool entry = true;  // attached after every return probe, detached before them
  UniqueFd multi_link;
  std::vector<LinkPtr> links;

  std::string Path() const { return fmt::format("/proc/self/fd/{}", file->get()); }
  bool Attached() const { return multi_link.valid() || !links.empty(); }
  // pid -1 (0 for uprobe_multi): every process that maps the file, now or later.
  Status Attach() {
    if (multi_prog) {
      multi_link = UniqueFd(UprobeMultiLink(bpf_program__fd(multi_prog), Path(), offsets, cookies, retprobe, 0));
      if (multi_link.valid()) return OkStatus();
      return MakeError("uprobe_multi: {}", ErrnoText(errno));
    }
    for (size_t i = 0; i < offsets.size(); ++i) {
      LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookies[i], .retprobe = retprobe);
      bpf_link* link = bpf_program__attach_uprobe_opts(prog, -1, Path().c_str(), offsets[i], &opts);
      if (!link) {
        const int err = errno;
        links.clear();
        return MakeError("offset {:#x}: {}", offsets[i], ErrnoText(err));
      }
      links.emplace_back(link);
    }
    return OkStatus();
  }
  void Detach() {
    multi_link = UniqueFd();
    links.clear();
  }
};

// One probe a plan asks for.
struct PlannedProbe {
  std::string function;
  bpf_program* prog = nullptr;
  bpf_program* multi_prog = nullptr;
  uint64_t offset = 0;
  uint64_t cookie = 0;
  bool retprobe = false;
  bool entry = true;
};

// The probes of one library file's plan, `lib` its index in lib_layouts:
// a close probe is an entry probe only; every other site has a return probe
// and an entry probe, the return first. A call whose entry is seen must have
// its return seen too (AttachPlanned attaches in this order), or the thread
// would look inside an operation until the entry goes stale (and every later
// call would count as nested). A return without an entry is ignored.
std::vector<PlannedProbe> ProbesOf(const FilePlan& plan, uint16_t lib, const ::usage& skel) {
  std::vector<PlannedProbe> probes;
  for (const ProbeSite& site : plan.sites) {
    const bool handshake = site.probe == PROBE_HANDSHAKE;
    if (site.probe == PROBE_CLOSE) {
      PlannedProbe p;
      p.function = site.function;
      p.prog = skel.progs.usage_close;
      p.multi_prog = skel.progs.usage_close_multi;
      p.offset = site.file_offset;
      p.cookie = USAGE_COOKIE(lib, site.probe, site.insn);
      probes.push_back(std::move(p));
      continue;
    }
    for (bool entry : {false, true}) {
      PlannedProbe p;
      p.function = site.function;
      p.prog = entry ? (handshake ? skel.progs.usage_handshake_enter : skel.progs.usage_op_enter)
                     : (handshake ? skel.progs.usage_handshake_exit : skel.progs.usage_op_exit);
      p.multi_prog = entry ? (handshake ? skel.progs.usage_handshake_enter_multi : skel.progs.usage_op_enter_multi)
                           : (handshake ? skel.progs.usage_handshake_exit_multi : skel.progs.usage_op_exit_multi);
      p.offset = site.file_offset;
      p.cookie = USAGE_COOKIE(lib, site.probe, site.insn);
      p.retprobe = !entry;
      p.entry = entry;
      probes.push_back(std::move(p));
    }
  }
  return probes;
}

}  // namespace

struct UsageProbes::Impl {
  SkelPtr skel;
  // sched_switch, for the operations' on-CPU time: attached with the
  // probes (it runs on every context switch of the host, so it is
  // duty-cycled and paid from the budget like them; CalibrateSwitches).
  LinkPtr switch_link;
  double switch_cost = 0;                            // CPU-s per run, calibrated
  std::set<std::pair<uint64_t, uint64_t>> attached;  // dev, inode
  uint16_t next_lib = 0;
  bool multi = false;  // the uprobe_multi programs loaded

  // Guards what the duty cycle's thread touches: the groups and their
  // links, the cycle's state.
  mutable std::mutex mu;
  std::vector<Group> groups;
  bool on = true;
  std::optional<DutyCycle> duty;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex stop_mu;  // with stop_cv: the thread's sleep ends at a stop
  std::condition_variable stop_cv;

  // When the live connections were last started over (the probes came back
  // after an off-phase); 0: since the start.
  double connections_since = 0;
  void ClearLive() {
    for (bpf_map* map : {skel->maps.live_connections, skel->maps.live_by_process}) {
      const int fd = bpf_map__fd(map);
      std::vector<uint8_t> key(bpf_map__key_size(map));
      while (bpf_map_get_next_key(fd, nullptr, key.data()) == 0) {
        if (bpf_map_delete_elem(fd, key.data()) != 0) break;
      }
    }
  }

  // The calibrated cost of one probed call (its entry and return hits) by
  // class of first instruction, in CPU-seconds of the probed thread.
  std::array<double, INSN_NR> call_cost{};

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(stop_mu);
      stop = true;
    }
    stop_cv.notify_all();
    if (thread.joinable()) thread.join();
    for (bool entry : {true, false}) {
      for (Group& g : groups) {
        if (g.entry == entry) g.Detach();
      }
    }
  }
  // New probes (one program on one file): attached now unless the duty
  // cycle has the probes off.
  Status AddGroup(Group&& group) {
    std::lock_guard<std::mutex> lock(mu);
    if (on) {
      if (auto st = group.Attach(); !st.ok()) return st;
    }
    groups.push_back(std::move(group));
    return OkStatus();
  }
  // Attaches a file's planned probes, one group per program (return probes
  // first); a group the kernel refuses is tried probe by probe, and a
  // function any of whose probes fails is left out whole (its entry and
  // returns go together). Returns the functions whose entries are attached.
  std::vector<std::string> AttachPlanned(const std::shared_ptr<UniqueFd>& file, std::pair<uint64_t, uint64_t> file_key,
                                         const std::vector<PlannedProbe>& plan, std::string* errors) {
    Watch(file, file_key);
    std::set<std::string> failed;
    auto group_of = [&](const std::vector<const PlannedProbe*>& probes, bool with_multi) {
      Group g;
      g.prog = probes[0]->prog;
      g.multi_prog = with_multi ? probes[0]->multi_prog : nullptr;
      g.file = file;
      g.file_key = file_key;
      g.retprobe = probes[0]->retprobe;
      g.entry = probes[0]->entry;
      for (const PlannedProbe* p : probes) {
        g.offsets.push_back(p->offset);
        g.cookies.push_back(p->cookie);
      }
      return g;
    };
    for (bool entry : {false, true}) {
      std::map<bpf_program*, std::vector<const PlannedProbe*>> by_prog;
      for (const PlannedProbe& p : plan) {
        if (p.entry == entry && !failed.count(p.function)) by_prog[p.prog].push_back(&p);
      }
      for (const auto& [prog, probes] : by_prog) {
        if (multi && AddGroup(group_of(probes, true)).ok()) continue;
        for (const PlannedProbe* p : probes) {
          if (failed.count(p->function)) continue;
          if (auto st = AddGroup(group_of({p}, false)); !st.ok()) {
            *errors += fmt::format("attaching to {} failed: {}; ", p->function, st.error().message);
            failed.insert(p->function);
          }
        }
      }
    }
    std::vector<std::string> attached;
    for (const PlannedProbe& p : plan) {
      if (p.entry && !failed.count(p.function) &&
          std::find(attached.begin(), attached.end(), p.function) == attached.end()) {
        attached.push_back(p.function);
      }
    }
    return attached;
  }
  // The probed files as they were when planned: one rewritten in place
  // (same inode, new bytes) must lose its probes at once, since the kernel
  // would put them at the old offsets into the new code.
  struct Watched {
    std::shared_ptr<UniqueFd> fd;
    struct stat st {};
  };
  std::map<std::pair<uint64_t, uint64_t>, Watched> watched;
  void Watch(const std::shared_ptr<UniqueFd>& file, std::pair<uint64_t, uint64_t> key) {
    Watched w{file, {}};
    if (fstat(file->get(), &w.st) == 0) watched.emplace(key, std::move(w));
  }
  size_t ProbeCount() const {
    size_t n = 0;
    for (const Group& g : groups) n += g.offsets.size();
    return n;
  }
  // Every usage_totals slot, summed over the CPUs: one batch read of the
  // map (the duty cycle reads it at each tick, up to every 20 ms; a lookup
  // per slot was 21 system calls each time), else a lookup per slot.
  using Slots = std::array<uint64_t, UTOTAL_NR_SLOTS>;
  Slots ReadSlots() const {
    Slots out{};
    const int fd = bpf_map__fd(skel->maps.usage_totals);
    const int ncpus = libbpf_num_possible_cpus();
    if (ncpus <= 0) return out;
    const auto per_slot = static_cast<size_t>(ncpus);
    std::array<uint32_t, UTOTAL_NR_SLOTS> keys{};
    std::vector<uint64_t> values(UTOTAL_NR_SLOTS * per_slot);
    uint32_t count = UTOTAL_NR_SLOTS;
    uint32_t next = 0;
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    const int err = bpf_map_lookup_batch(fd, nullptr, &next, keys.data(), values.data(), &count, &opts);
    if ((err == 0 || errno == ENOENT) && count == UTOTAL_NR_SLOTS) {
      for (uint32_t i = 0; i < count; ++i) {
        if (keys[i] >= UTOTAL_NR_SLOTS) continue;
        for (size_t c = 0; c < per_slot; ++c) out[keys[i]] += values[i * per_slot + c];
      }
      return out;
    }
    for (uint32_t slot = 0; slot < UTOTAL_NR_SLOTS; ++slot) {
      if (bpf_map_lookup_elem(fd, &slot, values.data()) != 0) continue;
      for (size_t c = 0; c < per_slot; ++c) out[slot] += values[c];
    }
    return out;
  }
  // The handshakes counted so far, by what each stands for.
  static double WeightedHandshakes(const Slots& slots) {
    return static_cast<double>(slots[UTOTAL_HANDSHAKES_WEIGHTED]) / USAGE_SCALE_ONE;
  }
  // What the probes have cost so far: calls by class x their cost, the
  // connection ends (an entry probe alone, about half a single-stepped
  // call's pair: SSL_free starts with endbr64 in Debian's build), and the
  // sched_switch program's runs.
  double CostSeconds(const Slots& slots) const {
    double cost = 0;
    for (uint32_t insn = 0; insn < INSN_NR; ++insn) {
      cost += static_cast<double>(slots[UTOTAL_CALLS_PUSH + insn]) * call_cost[insn];
    }
    cost += static_cast<double>(slots[UTOTAL_CLOSE_CALLS]) * call_cost[INSN_SINGLE_STEPPED] / 2;
    return cost + static_cast<double>(slots[UTOTAL_SWITCHES]) * switch_cost;
  }
  // The duty cycle's thread: ticks when DutyCycle::next_tick() says (a
  // toggle due, a share-1 cycle's spending watched, at least once a second);
  // a stop wakes it.
  void Run() {
    double next = MonotonicSeconds() + 0.02;
    while (!stop.load()) {
      const double wait = std::max(next - MonotonicSeconds(), 0.001);  // next_tick() is at most 1 s away
      {
        std::unique_lock<std::mutex> lock(stop_mu);
        stop_cv.wait_for(lock, std::chrono::duration<double>(wait), [this] { return stop.load(); });
      }
      if (stop.load()) break;
      const Slots slots = ReadSlots();
      std::lock_guard<std::mutex> lock(mu);
      const DutyCycle::Action action = duty->Tick(MonotonicSeconds(), CostSeconds(slots), WeightedHandshakes(slots));
      if (action != DutyCycle::Action::kNone) {
        const bool want = action == DutyCycle::Action::kAttach;
        const double began = MonotonicSeconds();
        const Toggle t = SetOn(want);
        duty->Toggled(t.effective, want, t.cpu);
        spdlog::debug("usage probes: {} {} probes in {:.1f} ms ({:.1f} ms CPU) at {:.3f} CPU-s/s measured",
                      want ? "attached" : "detached", ProbeCount(), (MonotonicSeconds() - began) * 1e3, t.cpu * 1e3,
                      duty->rate());
        // Connections that began or ended while the probes were off were
        // not seen: the live set starts over (docs/usage.md, "Live connections").
        if (want) {
          ClearLive();
          connections_since = t.effective;
        }
      }
      SetGate(duty->gate(MonotonicSeconds()));
      next = duty->next_tick();
    }
  }
  // The BPF side's counting window and weight (DutyCycle::Gate).
  void SetGate(const DutyCycle::Gate& g) {
    auto ns = [](double seconds) {
      return seconds >= 1.8e10 ? ~0ull : static_cast<uint64_t>(std::max(0.0, seconds) * 1e9);
    };
    skel->data->scale_milli = static_cast<uint64_t>(g.weight * USAGE_SCALE_ONE + 0.5);
    skel->bss->gate_open_ns = ns(g.open);
    skel->data->gate_close_ns = ns(g.close);
  }
  // What a toggle took: the agent's CPU for it, and when it took effect
  // (the last entry probe attached, or detached).
  struct Toggle {
    double cpu = 0;
    double effective = 0;
  };
  // Return probes first on the way in, entry probes first on the way out,
  // so no call's entry is seen without its return. Called with mu held.
  Toggle SetOn(bool want) {
    Toggle t;
    const double cpu = ThreadCpuSeconds();
    if (want && !switch_link) {
      if (bpf_link* link = bpf_program__attach(skel->progs.usage_sched_switch); link) {
        switch_link.reset(link);
      } else {
        spdlog::debug("usage probes: attaching sched_switch again failed: {}", ErrnoText(errno));
      }
    }
    for (bool entry : want ? std::array{false, true} : std::array{true, false}) {
      for (Group& g : groups) {
        if (g.entry != entry) continue;
        if (!want) {
          g.Detach();
        } else if (!g.Attached()) {
          if (auto st = g.Attach(); !st.ok())
            spdlog::debug("usage probes: attaching again failed: {}", st.error().message);
        }
      }
      if (entry) t.effective = MonotonicSeconds();
    }
    if (!want) switch_link.reset();
    on = want;
    t.cpu = ThreadCpuSeconds() - cpu;
    return t;
  }
};

UsageProbes::UsageProbes(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UsageProbes::~UsageProbes() = default;

Result<std::unique_ptr<UsageProbes>> UsageProbes::Start() {
  auto impl = std::make_unique<Impl>();
  // Open, set up, load; with the uprobe_multi programs first, and without
  // them on a kernel that refuses them (before 6.6).
  for (bool multi : {true, false}) {
    // Open: parse the object embedded in the skeleton.
    impl->skel.reset(usage__open());
    if (!impl->skel) return MakeError("opening the usage BPF object failed: {}", ErrnoText(errno));
    for (bpf_program* prog :
         {impl->skel->progs.usage_handshake_enter_multi, impl->skel->progs.usage_handshake_exit_multi,
          impl->skel->progs.usage_op_enter_multi, impl->skel->progs.usage_op_exit_multi,
          impl->skel->progs.usage_go_multi, impl->skel->progs.usage_close_multi}) {
      if (multi) {
        bpf_program__set_expected_attach_type(prog, static_cast<bpf_attach_type>(kTraceUprobeMulti));
      } else {
        bpf_program__set_autoload(prog, false);
      }
    }
    // Load: create the maps and verify the programs.
    const int err = usage__load(impl->skel.get());
    if (err == 0) {
      impl->multi = multi;
      break;
    }
    if (!multi) {
      return MakeError("loading the usage BPF programs failed: {} (needs root, or CAP_BPF + CAP_PERFMON)",
                       ErrnoText(err));
    }
    spdlog::info("usage probes: no uprobe_multi links on this kernel ({}); one perf-event link per probe",
                 ErrnoText(err));
  }
  // Attach: sched_switch now; the uprobes per file, in AttachProcess().
  bpf_link* link = bpf_program__attach(impl->skel->progs.usage_sched_switch);
  if (!link) return MakeError("attaching the usage sched_switch program failed: {}", ErrnoText(errno));
  impl->switch_link.reset(link);
  std::unique_ptr<UsageProbes> probes(new UsageProbes(std::move(impl)));
  probes->Calibrate();
  return probes;
}

void UsageProbes::Calibrate() {
  using Target = int (*)(void*, void*, size_t*);
  const std::array<Target, INSN_NR> targets = {tlsprof_usage_calibrate_push, tlsprof_usage_calibrate_endbr,
                                               tlsprof_usage_calibrate_step, tlsprof_usage_calibrate_go};
  static_assert(INSN_EMULATED_PUSH == 0 && INSN_ENDBR64 == 1 && INSN_SINGLE_STEPPED == 2 && INSN_GO == 3);
  for (uint32_t insn = 0; insn < INSN_NR; ++insn) {
    const bool go = insn == INSN_GO;
    auto where = FileOffsetOf(go ? reinterpret_cast<uintptr_t>(tlsprof_usage_calibrate_go_entry)
                                 : reinterpret_cast<uintptr_t>(targets[insn]));
    auto ret_where = FileOffsetOf(reinterpret_cast<uintptr_t>(tlsprof_usage_calibrate_go_ret));
    if (!where || !ret_where) {
      spdlog::warn("usage probes: no calibration function in /proc/self/maps; latencies include the probes' time");
      return;
    }
    std::vector<LinkPtr> links;
    for (bool entry : {false, true}) {
      const uint16_t lib = kCalibrationLib - insn;
      const uint64_t cookie =
          go ? USAGE_GO_COOKIE(lib, PROBE_GO_CALIBRATE, insn, 0, GO_REG_NONE, entry ? 0 : USAGE_GO_RETURN)
             : USAGE_COOKIE(lib, PROBE_CALIBRATE, insn);
      LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookie, .retprobe = !entry && !go);
      bpf_program* prog = go      ? impl_->skel->progs.usage_go
                          : entry ? impl_->skel->progs.usage_op_enter
                                  : impl_->skel->progs.usage_op_exit;
      bpf_link* link = bpf_program__attach_uprobe_opts(prog, getpid(), where->first.c_str(),
                                                       go && !entry ? ret_where->second : where->second, &opts);
      if (!link) {
        spdlog::warn("usage probes: calibration probe failed ({}); latencies include the probes' own time",
                     ErrnoText(errno));
        return;
      }
      links.emplace_back(link);
    }
    size_t len = 0;
    int sink = 0;
    const double probed_start = ThreadCpuSeconds();
    for (int i = 0; i < kCalibrationCalls; ++i) sink += targets[insn](&len, &sink, &len);
    const double probed = ThreadCpuSeconds() - probed_start;
    links.clear();
    const double bare_start = ThreadCpuSeconds();
    for (int i = 0; i < kCalibrationCalls; ++i) sink += targets[insn](&len, &sink, &len);
    const double bare = ThreadCpuSeconds() - bare_start;
    // What a probed call costs the probed thread: the traps, the programs.
    impl_->call_cost[insn] = std::max(0.0, probed - bare) / kCalibrationCalls;
  }
  CalibrateSwitches();
  // Measured with no overhead taken off (probe_overhead_ns still 0); set now.
  for (const OperationStats& op : ReadOperations()) {
    if (op.key.op != USAGE_OP_CALIBRATE || op.key.tgid != static_cast<uint32_t>(getpid())) continue;
    const uint32_t insn = kCalibrationLib - op.key.lib;
    if (insn >= INSN_NR) continue;
    probe_overhead_ns_[insn] = HistogramQuantile(op.slots, 0.5);
    impl_->skel->bss->probe_overhead_ns[insn] = static_cast<uint64_t>(probe_overhead_ns_[insn]);
  }
  spdlog::info(
      "usage probes: the probes' own time in each timed call, by first instruction: push {:.1f} us, "
      "endbr64 {:.1f} us, single-stepped {:.1f} us, Go (entry + RET) {:.1f} us (p50 of {} calls each); taken off",
      probe_overhead_ns_[0] / 1e3, probe_overhead_ns_[1] / 1e3, probe_overhead_ns_[2] / 1e3,
      probe_overhead_ns_[3] / 1e3, kCalibrationCalls);
  for (uint32_t insn = 0; insn < INSN_NR; ++insn) call_cost_ns_[insn] = impl_->call_cost[insn] * 1e9;
  spdlog::info(
      "usage probes: a probed call costs the caller push {:.1f} us, endbr64 {:.1f} us, single-stepped {:.1f} us, "
      "Go {:.1f} us (CPU, entry and return)",
      call_cost_ns_[0] / 1e3, call_cost_ns_[1] / 1e3, call_cost_ns_[2] / 1e3, call_cost_ns_[3] / 1e3);
}

// What a run of the sched_switch program costs: its run time per run from
// BPF stats (held on for the measurement only, BPF_ENABLE_STATS), over
// context switches made on purpose (two threads passing a byte through
// pipes). Without stats (kernel.bpf_stats_enabled's fd refused): a fixed
// 0.5 us, an idle machine's figure (bench/README.md).
void UsageProbes::CalibrateSwitches() {
  constexpr double kFallback = 0.5e-6;
  impl_->switch_cost = kFallback;
  const int prog_fd = bpf_program__fd(impl_->skel->progs.usage_sched_switch);
  auto prog_stats = [&](uint64_t* ns, uint64_t* runs) {
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) return false;
    *ns = info.run_time_ns;
    *runs = info.run_cnt;
    return true;
  };
  UniqueFd stats(bpf_enable_stats(BPF_STATS_RUN_TIME));
  uint64_t ns0 = 0, runs0 = 0, ns1 = 0, runs1 = 0;
  if (!stats.valid() || !prog_stats(&ns0, &runs0)) {
    spdlog::info("usage probes: no BPF stats ({}); a context switch's probe cost taken as {:.2f} us", ErrnoText(errno),
                 kFallback * 1e6);
    return;
  }
  int there[2], back[2];
  if (pipe(there) != 0) return;
  if (pipe(back) != 0) {
    close(there[0]);
    close(there[1]);
    return;
  }
  constexpr int kRounds = 2000;
  std::thread echo([&] {
    char c;
    for (int i = 0; i < kRounds; ++i) {
      if (::read(there[0], &c, 1) != 1 || ::write(back[1], &c, 1) != 1) break;
    }
  });
  char c = 0;
  for (int i = 0; i < kRounds; ++i) {
    if (::write(there[1], &c, 1) != 1 || ::read(back[0], &c, 1) != 1) break;
  }
  echo.join();
  for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
  if (prog_stats(&ns1, &runs1) && runs1 > runs0 + 1000) {
    impl_->switch_cost = static_cast<double>(ns1 - ns0) / static_cast<double>(runs1 - runs0) * 1e-9;
  }
  spdlog::info("usage probes: a context switch costs the sched_switch program {:.2f} us ({} runs measured)",
               impl_->switch_cost * 1e6, runs1 > runs0 ? runs1 - runs0 : 0);
}

void UsageProbes::EnableBudget(double cpu_seconds_per_second) {
  if (cpu_seconds_per_second <= 0) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->duty) return;
  DutyCycle::Options options;
  options.budget = cpu_seconds_per_second;
  impl_->duty.emplace(options, MonotonicSeconds());
  budget_ = cpu_seconds_per_second;
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] {
    pthread_setname_np(pthread_self(), "tlsprof-usage");  // top -H, /proc/PID/task/*/comm
    impl->Run();
  });
}

UsageClock UsageProbes::ReadClock() const {
  UsageClock c;
  const Impl::Slots slots = impl_->ReadSlots();
  std::lock_guard<std::mutex> lock(impl_->mu);
  c.at = MonotonicSeconds();
  c.connections_since = impl_->connections_since;
  if (impl_->duty) {
    c.on = impl_->duty->on_seconds(c.at);
    c.counted = impl_->duty->counted_seconds(c.at);
    c.variance = impl_->duty->variance();
    c.pending_variance = impl_->duty->pending_variance(c.at, Impl::WeightedHandshakes(slots));
    c.cost = impl_->duty->cost_seconds();
    c.allowed = impl_->duty->allowed_seconds(c.at);
    c.toggles = impl_->duty->toggles();
  } else {
    c.on = c.counted = c.at;
    c.cost = impl_->CostSeconds(slots);
  }
  return c;
}

Status UsageProbes::AttachProcess(const std::vector<FileRef>& files) {
  const std::vector<std::string_view> wanted = WantedFunctions();
  const std::vector<std::string_view> boringssl_wanted = BoringSslWantedFunctions();
  struct Loaded {
    const FileRef* ref;
    std::shared_ptr<UniqueFd> fd;
    std::unique_ptr<guard::ElfFile> elf;
    std::map<std::string, FunctionCode, std::less<>> functions;
    std::vector<FoundFunction> state_machine;
    bool boringssl = false;  // planned by boringssl_plan.h
  };
  // Most calls find every file probed already: nothing to read then.
  if (std::all_of(files.begin(), files.end(), [&](const FileRef& ref) {
        return impl_->attached.count({ref.dev, ref.inode}) != 0;
      })) {
    return OkStatus();
  }
  std::vector<Loaded> loaded;
  std::string errors;
  bool any_new = false;
  for (const FileRef& ref : files) {
    if (ref.library == "go") {
      if (auto st = AttachGoFile(ref); !st.ok()) errors += st.error().message + "; ";
      continue;
    }
    if (!ref.file) {
      errors += fmt::format("{}: not open; ", ref.display_path);
      continue;
    }
    auto elf = guard::ElfFile::Open(*ref.file);
    if (!elf) {
      errors += fmt::format("{}: {}; ", ref.display_path, elf.error().message);
      continue;
    }
    const bool boringssl = ref.library == kBoringSslLibrary;
    auto functions = FindFunctions(*elf, boringssl ? boringssl_wanted : wanted);
    if (!functions) {
      errors += fmt::format("{}: {}; ", ref.display_path, functions.error().message);
      continue;
    }
    if (!impl_->attached.count({ref.dev, ref.inode})) any_new = true;
    std::vector<FoundFunction> state_machine;
    if (!boringssl) state_machine = FindHandshakeStateMachine(*elf, *functions);
    loaded.push_back({&ref, ref.file->shared_fd(), std::make_unique<guard::ElfFile>(std::move(*elf)),
                      std::move(*functions), std::move(state_machine), boringssl});
  }
  if (!any_new) {
    if (!errors.empty()) return MakeError("usage probes: {}", errors);
    return OkStatus();
  }
  std::vector<const std::map<std::string, FunctionCode, std::less<>>*> all;
  std::vector<BoringSslFile> boringssl_files;
  for (const Loaded& l : loaded) {
    if (l.boringssl) {
      boringssl_files.push_back({l.elf.get(), &l.functions});
    } else {
      all.push_back(&l.functions);
    }
  }
  const ProcessPlan openssl_layout = PlanLayout(all);
  const ProcessPlan boringssl_layout = PlanBoringSslLayout(boringssl_files);

  for (const Loaded& l : loaded) {
    const FileRef& ref = *l.ref;
    if (impl_->attached.count({ref.dev, ref.inode})) continue;
    const ProcessPlan& layout = l.boringssl ? boringssl_layout : openssl_layout;
    const FilePlan plan = l.boringssl ? PlanBoringSslFile(l.functions) : PlanFile(l.functions, l.state_machine);
    impl_->attached.insert({ref.dev, ref.inode});  // tried once, whatever the outcome
    if (plan.sites.empty()) continue;
    if (impl_->next_lib >= USAGE_MAX_LIBS) {
      errors += fmt::format("{}: more than {} library files probed, not probed; ", ref.display_path, USAGE_MAX_LIBS);
      continue;
    }
    const uint16_t lib = impl_->next_lib++;
    const uint32_t key = lib;
    if (bpf_map_update_elem(bpf_map__fd(impl_->skel->maps.lib_layouts), &key, &layout.layout, BPF_ANY) != 0) {
      errors += fmt::format("{}: writing its layout failed: {}; ", ref.display_path, ErrnoText(errno));
      continue;
    }
    AttachedFile attached{ref.display_path, ref.dev, ref.inode, lib, ref.library, {}, layout.fields};
    const std::vector<PlannedProbe> probes = ProbesOf(plan, lib, *impl_->skel);
    std::string file_errors;
    attached.functions = impl_->AttachPlanned(l.fd, {ref.dev, ref.inode}, probes, &file_errors);
    if (!file_errors.empty()) errors += fmt::format("{}: {}", ref.display_path, file_errors);
    spdlog::info("usage probes: {} ({}:{}), {} functions, version {}, cipher {}, key type {}", ref.display_path,
                 major(ref.dev), minor(ref.dev), attached.functions.size(), layout.fields.at("ssl.version"),
                 layout.fields.at("ssl.cipher"), layout.fields.at("ssl.key_type"));
    files_.push_back(std::move(attached));
  }
  if (!errors.empty()) return MakeError("usage probes: {}", errors);
  return OkStatus();
}

Status UsageProbes::AttachGoFile(const FileRef& ref) {
  if (!impl_->attached.insert({ref.dev, ref.inode}).second) return OkStatus();  // tried once, whatever the outcome
  if (!ref.file) return MakeError("{}: not open", ref.display_path);
  std::shared_ptr<UniqueFd> fd = ref.file->shared_fd();
  auto plan = PlanGoFile(*ref.file, ref.display_path);
  if (!plan.ok()) return plan.error();
  if (impl_->next_lib >= USAGE_MAX_LIBS) {
    return MakeError("{}: more than {} library files probed, not probed", ref.display_path, USAGE_MAX_LIBS);
  }
  const uint16_t lib = impl_->next_lib++;
  const uint32_t key = lib;
  if (bpf_map_update_elem(bpf_map__fd(impl_->skel->maps.lib_layouts), &key, &plan->layout, BPF_ANY) != 0) {
    return MakeError("{}: writing its layout failed: {}", ref.display_path, ErrnoText(errno));
  }
  std::map<std::string, std::string> fields = plan->fields;
  fields["go.version"] = plan->go_version.empty() ? "unknown" : plan->go_version;
  AttachedFile attached{ref.display_path, ref.dev, ref.inode, lib, ref.library, {}, std::move(fields)};
  // RET sites before entries (AttachPlanned), as for uretprobes: a call
  // whose entry is seen must have its returns probed already.
  std::vector<PlannedProbe> probes;
  for (const GoProbeSite& site : plan->sites) {
    PlannedProbe p;
    p.function = site.function;
    const bool close = USAGE_COOKIE_PROBE(site.cookie_bits) == PROBE_GO_CLOSE;
    p.prog = close ? impl_->skel->progs.usage_close : impl_->skel->progs.usage_go;
    p.multi_prog = close ? impl_->skel->progs.usage_close_multi : impl_->skel->progs.usage_go_multi;
    p.offset = site.file_offset;
    p.cookie = site.cookie_bits | lib;
    p.entry = !site.ret;
    probes.push_back(std::move(p));
  }
  std::string errors;
  attached.functions = impl_->AttachPlanned(fd, {ref.dev, ref.inode}, probes, &errors);
  spdlog::info("usage probes: {} ({}:{}), Go {}, {} functions at {} sites, version {}, cipher {}, resumed {}",
               ref.display_path, major(ref.dev), minor(ref.dev), plan->go_version, attached.functions.size(),
               plan->sites.size(), plan->fields.at("ssl.version"), plan->fields.at("ssl.cipher"),
               plan->fields.at("ssl.resumed"));
  files_.push_back(std::move(attached));
  if (!errors.empty()) return MakeError("usage probes: {}", errors);
  return OkStatus();
}

size_t UsageProbes::CheckFiles() {
  auto same = [](const struct stat& a, const struct stat& b) {
    return a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
           a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
  };
  size_t dropped = 0;
  for (auto it = impl_->watched.begin(); it != impl_->watched.end();) {
    struct stat now {};
    if (fstat(it->second.fd->get(), &now) == 0 && same(now, it->second.st)) {
      ++it;
      continue;
    }
    const auto key = it->first;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      // Entry probes first, as in a pause.
      for (bool entry : {true, false}) {
        for (Group& g : impl_->groups) {
          if (g.file_key == key && g.entry == entry) g.Detach();
        }
      }
      std::erase_if(impl_->groups, [&](const Group& g) { return g.file_key == key; });
    }
    impl_->attached.erase(key);  // planned again when a process maps it
    for (AttachedFile& f : files_) {
      if (f.dev == key.first && f.inode == key.second) f.functions.clear();
    }
    spdlog::warn("usage probes: {}:{} inode {} changed in place; its probes are off until a process maps it again",
                 major(key.first), minor(key.first), key.second);
    it = impl_->watched.erase(it);
    ++dropped;
  }
  return dropped;
}

size_t UsageProbes::link_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  size_t n = impl_->switch_link ? 1 : 0;
  for (const Group& g : impl_->groups) n += g.multi_link.valid() ? 1 : g.links.size();
  return n;
}

std::vector<HandshakeCount> UsageProbes::ReadHandshakes() const {
  std::vector<HandshakeCount> out;
  const int fd = bpf_map__fd(impl_->skel->maps.handshakes_by_params);
  ForEachKey<handshake_key>(fd, [&](const handshake_key& key) {
    handshake_count count{};
    if (bpf_map_lookup_elem(fd, &key, &count) == 0) {
      out.push_back({key, count.count, static_cast<double>(count.weighted) / USAGE_SCALE_ONE});
    }
  });
  return out;
}

std::vector<OperationStats> UsageProbes::ReadOperations() const {
  std::vector<OperationStats> out;
  const int fd = bpf_map__fd(impl_->skel->maps.op_latency);
  auto value = std::make_unique<op_latency>();
  ForEachKey<op_key>(fd, [&](const op_key& key) {
    if (bpf_map_lookup_elem(fd, &key, value.get()) == 0) {
      OperationStats stats{key,
                           value->count,
                           value->cpu_ns,
                           value->wall_ns,
                           std::vector<uint64_t>(value->slots, value->slots + USAGE_HIST_SLOTS),
                           static_cast<double>(value->weighted) / USAGE_SCALE_ONE};
      out.push_back(std::move(stats));
    }
  });
  return out;
}

std::vector<ConnectionCount> UsageProbes::ReadConnections() const {
  std::vector<ConnectionCount> out;
  const int fd = bpf_map__fd(impl_->skel->maps.live_by_process);
  ForEachKey<live_process_key>(fd, [&](const live_process_key& key) {
    int64_t weighted = 0;
    if (bpf_map_lookup_elem(fd, &key, &weighted) == 0 && weighted > 0) {
      out.push_back({key.tgid, key.lib, static_cast<double>(weighted) / USAGE_SCALE_ONE});
    }
  });
  return out;
}

void UsageProbes::ForgetProcess(uint32_t tgid) {
  // Its connections' entries, then its sums: a process that exited ends
  // its connections without SSL_free.
  const int live = bpf_map__fd(impl_->skel->maps.live_connections);
  std::vector<live_key> gone;
  ForEachKey<live_key>(live, [&](const live_key& key) {
    if (key.tgid == tgid) gone.push_back(key);
  });
  for (const live_key& k : gone) bpf_map_delete_elem(live, &k);
  const int sums = bpf_map__fd(impl_->skel->maps.live_by_process);
  for (const AttachedFile& f : files_) {
    live_process_key pkey{};
    pkey.tgid = tgid;
    pkey.lib = f.lib;
    bpf_map_delete_elem(sums, &pkey);
  }
}

UsageTotals UsageProbes::ReadTotals() const {
  const Impl::Slots slots = impl_->ReadSlots();
  UsageTotals totals;
  totals.hits = slots[UTOTAL_HITS];
  totals.handshake_calls = slots[UTOTAL_HANDSHAKE_CALLS];
  totals.handshakes = slots[UTOTAL_HANDSHAKES];
  totals.ops = slots[UTOTAL_OPS];
  totals.nested = slots[UTOTAL_NESTED];
  totals.dropped_keys = slots[UTOTAL_DROPPED_KEYS];
  totals.read_errors = slots[UTOTAL_READ_ERRORS];
  totals.go_unmatched = slots[UTOTAL_GO_UNMATCHED];
  totals.go_migrated = slots[UTOTAL_GO_MIGRATED];
  totals.closes = slots[UTOTAL_CLOSE_CALLS];
  totals.live_full = slots[UTOTAL_LIVE_FULL];
  return totals;
}

UsageSnapshot Subtract(const UsageSnapshot& end, const UsageSnapshot& start) {
  UsageSnapshot out;
  for (const HandshakeCount& h : end.handshakes) {
    uint64_t before = 0;
    for (const HandshakeCount& s : start.handshakes) {
      if (std::memcmp(&s.key, &h.key, sizeof(h.key)) == 0) before = s.count;
    }
    double weighted_before = 0;
    for (const HandshakeCount& s : start.handshakes) {
      if (std::memcmp(&s.key, &h.key, sizeof(h.key)) == 0) weighted_before = s.estimated;
    }
    if (h.count > before) out.handshakes.push_back({h.key, h.count - before, h.estimated - weighted_before});
  }
  for (const OperationStats& op : end.operations) {
    OperationStats delta = op;
    for (const OperationStats& s : start.operations) {
      if (std::memcmp(&s.key, &op.key, sizeof(op.key)) != 0) continue;
      delta.count -= std::min(delta.count, s.count);
      delta.estimated -= std::min(delta.estimated, s.estimated);
      delta.cpu_ns -= std::min(delta.cpu_ns, s.cpu_ns);
      delta.wall_ns -= std::min(delta.wall_ns, s.wall_ns);
      for (size_t i = 0; i < delta.slots.size() && i < s.slots.size(); ++i) {
        delta.slots[i] -= std::min(delta.slots[i], s.slots[i]);
      }
    }
    if (delta.count > 0) out.operations.push_back(std::move(delta));
  }
  auto minus = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
  out.totals.hits = minus(end.totals.hits, start.totals.hits);
  out.totals.handshake_calls = minus(end.totals.handshake_calls, start.totals.handshake_calls);
  out.totals.handshakes = minus(end.totals.handshakes, start.totals.handshakes);
  out.totals.ops = minus(end.totals.ops, start.totals.ops);
  out.totals.nested = minus(end.totals.nested, start.totals.nested);
  out.totals.dropped_keys = minus(end.totals.dropped_keys, start.totals.dropped_keys);
  out.totals.read_errors = minus(end.totals.read_errors, start.totals.read_errors);
  out.totals.go_unmatched = minus(end.totals.go_unmatched, start.totals.go_unmatched);
  out.totals.go_migrated = minus(end.totals.go_migrated, start.totals.go_migrated);
  out.totals.closes = minus(end.totals.closes, start.totals.closes);
  out.totals.live_full = minus(end.totals.live_full, start.totals.live_full);
  // The duty cycle over the window, and the counts scaled by it.
  const double span = end.clock.at - start.clock.at;
  UsageBudget& b = out.budget;
  b.toggles = end.clock.toggles - std::min(end.clock.toggles, start.clock.toggles);
  // Live connections are exact only if the probes never paused since the
  // window began (a pause starts the live set over): else unknown.
  out.connections_known = end.clock.connections_since <= start.clock.at && b.toggles == 0;
  out.connections = out.connections_known ? end.connections : std::vector<ConnectionCount>{};
  b.duty_cycle = span > 0 ? std::clamp((end.clock.counted - start.clock.counted) / span, 0.0, 1.0) : 1.0;
  b.attached = span > 0 ? std::clamp((end.clock.on - start.clock.on) / span, 0.0, 1.0) : 1.0;
  b.probe_cpu_seconds = std::max(0.0, end.clock.cost - start.clock.cost);
  b.budget_cpu_seconds = std::max(0.0, end.clock.allowed - start.clock.allowed);
  // The estimate's 95% error: the duty cycle's variance of the weighted
  // handshake count over the cycles the window completed, plus the one
  // under way at its end (DutyCycle); 0 while always on.
  uint64_t seen = 0;
  double estimated = 0;
  for (const HandshakeCount& h : out.handshakes) {
    seen += h.count;
    estimated += h.estimated;
  }
  const double w = seen ? estimated / static_cast<double>(seen) : 1.0;
  if (seen == 0 && b.duty_cycle < 1.0) {
    b.relative_error = std::numeric_limits<double>::quiet_NaN();  // probes off all window: unknown (null)
  } else {
    const double variance =
        std::max(0.0, end.clock.variance - start.clock.variance) + std::max(0.0, end.clock.pending_variance);
    b.relative_error = w <= 1.0001 || estimated <= 0 ? 0.0 : 1.96 * std::sqrt(variance) / estimated;
  }
  return out;
}

std::pair<uint64_t, uint64_t> SlotBounds(uint32_t slot) {
  if (slot < USAGE_SUB_BUCKETS) return {slot, slot + 1};
  const uint32_t octave = slot / USAGE_SUB_BUCKETS;
  const uint64_t sub = slot % USAGE_SUB_BUCKETS;
  return {(USAGE_SUB_BUCKETS + sub) << (octave - 1), (USAGE_SUB_BUCKETS + sub + 1) << (octave - 1)};
}

double HistogramQuantile(const std::vector<uint64_t>& slots, double q) {
  uint64_t total = 0;
  for (uint64_t v : slots) total += v;
  if (total == 0) return 0;
  const double rank = std::max(1.0, std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (uint32_t i = 0; i < slots.size(); ++i) {
    seen += slots[i];
    if (static_cast<double>(seen) >= rank) {
      auto [lo, hi] = SlotBounds(i);
      return (static_cast<double>(lo) + static_cast<double>(hi)) / 2;
    }
  }
  auto [lo, hi] = SlotBounds(static_cast<uint32_t>(slots.size() - 1));
  return (static_cast<double>(lo) + static_cast<double>(hi)) / 2;
}

}  // namespace tlsprof::usage
