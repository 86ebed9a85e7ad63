// Needs root and a real kernel (label "bpf"). A sampler that cannot load is a
// failure here, never a skip: CI runs this as root on the target kernel.
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <limits.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/sample/forked_child_test_util.h"
#include "agent/sample/sampler.h"
#include "common/fd.h"

namespace tlsprof::sample {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kHz = 999;

// A forked child that spins until destroyed.
struct BusyChild : ForkedChild {
  BusyChild()
      : ForkedChild([] {
          volatile uint64_t spins = 0;
          for (;;) spins = spins + 1;
        }) {}
};

struct Range {
  uint64_t start;
  uint64_t end;
};

// The executable mappings of the process's own main binary.
std::vector<Range> ExecutableText(pid_t pid) {
  char exe[PATH_MAX] = {};
  ssize_t n = readlink(fmt::format("/proc/{}/exe", pid).c_str(), exe, sizeof(exe) - 1);
  if (n <= 0) return {};
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  std::vector<Range> text;
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode >> path;
    if (perms.size() < 3 || perms[2] != 'x' || path != exe) continue;
    size_t dash = range.find('-');
    text.push_back({std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16)});
  }
  return text;
}

std::unique_ptr<Sampler> StartOrFail(const SamplerOptions& options) {
  auto sampler = Sampler::Start(options);
  // Fails the test (loudly) if this machine cannot load the sampler.
  EXPECT_TRUE(sampler.ok()) << "the BPF sampler failed to start: " << sampler.error().message;
  if (!sampler.ok()) return nullptr;
  return std::move(sampler).value();
}

std::map<uint32_t, pid_counts> PidCounts(const Sampler& sampler) {
  std::map<uint32_t, pid_counts> counts;
  sampler.ForEachPid([&](uint32_t tgid, const pid_counts& c) { counts[tgid] = c; });
  return counts;
}

// CPU time the process has used so far, from its CPU-time clock.
double CpuSeconds(pid_t pid) {
  clockid_t clock;
  timespec ts{};
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One busy child per online CPU, so that no CPU idles: an idle vCPU of a
// guest is not reliably sampled (bench/README.md), so cpus x time x
// frequency holds only while every CPU is busy. The child's own expectation comes from
// its CPU-time clock, because other load may share the CPUs.
TEST(SamplerBpfTest, CountsABusyChildAndEveryCpu) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  std::vector<std::unique_ptr<BusyChild>> children;
  for (long i = 0; i < online; ++i) {
    children.push_back(std::make_unique<BusyChild>());
    ASSERT_TRUE(children.back()->ready()) << "could not start a busy child";
  }
  const BusyChild& child = *children.front();

  rlimit memlock_before{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &memlock_before), 0);
  auto sampler = StartOrFail({.frequency_hz = kHz, .target_pids = {}});
  ASSERT_NE(sampler, nullptr);
  ASSERT_EQ(sampler->period_ns(), 1'000'000'000u / kHz);
  // This machine cannot raise RLIMIT_MEMLOCK; neither we nor libbpf may touch it.
  rlimit memlock_after{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &memlock_after), 0);
  EXPECT_EQ(memlock_after.rlim_cur, memlock_before.rlim_cur);
  EXPECT_EQ(memlock_after.rlim_max, memlock_before.rlim_max);
  const double child_cpu_before = CpuSeconds(child.pid());
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double child_cpu = CpuSeconds(child.pid()) - child_cpu_before;
  sampler->Stop();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double per_cpu = seconds * 1e9 / static_cast<double>(sampler->period_ns());

  Totals totals = sampler->ReadTotals();
  const double expected_samples = per_cpu * sampler->cpu_count();
  fmt::print("{:.3f} s on {} CPUs at {} Hz: {} samples (expected {:.0f}): idle {}, kernel {}, user {}\n", seconds,
             sampler->cpu_count(), kHz, totals.samples, expected_samples, totals.idle, totals.kernel, totals.user);
  EXPECT_EQ(sampler->cpu_count(), online);
  // Busy vCPUs here get 97-99% of the nominal samples: a timer that fires
  // more than a period late (the host ran something else) loses the overrun.
  EXPECT_GE(static_cast<double>(totals.samples), 0.90 * expected_samples);
  EXPECT_LE(static_cast<double>(totals.samples), 1.03 * expected_samples);
  EXPECT_EQ(totals.idle + totals.kernel + totals.user, totals.samples);
  EXPECT_EQ(totals.dropped_ip, 0u);
  EXPECT_EQ(totals.dropped_pid, 0u);

  // The child spun for the whole window: its samples match its CPU time, and
  // that is about one CPU (less if other load shares the CPUs).
  auto counts = PidCounts(*sampler);
  ASSERT_TRUE(counts.count(static_cast<uint32_t>(child.pid()))) << "no samples for the busy child";
  const pid_counts child_counts = counts[static_cast<uint32_t>(child.pid())];
  const double child_expected = child_cpu * 1e9 / static_cast<double>(sampler->period_ns());
  fmt::print(
      "busy child {}: user {}, kernel {} samples; its CPU clock says {:.3f} s = {:.0f} samples; "
      "a whole CPU would be {:.0f}\n",
      child.pid(), child_counts.user, child_counts.kernel, child_cpu, child_expected, per_cpu);
  ASSERT_GT(child_cpu, 0);
  EXPECT_NEAR(static_cast<double>(child_counts.user + child_counts.kernel), child_expected, 0.20 * child_expected);
  EXPECT_GT(child_counts.user, 10 * child_counts.kernel) << "a user-space spin loop should sample as user";
  if (child_cpu > 0.9 * seconds) {
    EXPECT_NEAR(static_cast<double>(child_counts.user), per_cpu, 0.20 * per_cpu);
  }

  // Every user sample of the child is at an IP of its own executable.
  const std::vector<Range> text = ExecutableText(child.pid());
  ASSERT_FALSE(text.empty()) << "no executable mapping in /proc/" << child.pid() << "/maps";
  uint64_t child_ip_samples = 0;
  uint64_t outside = 0;
  uint64_t pid_sum_user = 0;
  uint64_t ip_sum = 0;
  for (const auto& [tgid, c] : counts) pid_sum_user += c.user;
  sampler->ForEachIp([&](const sample_key& key, uint64_t count) {
    ip_sum += count;
    if (key.tgid != static_cast<uint32_t>(child.pid())) return;
    child_ip_samples += count;
    bool inside = false;
    for (const Range& r : text) inside = inside || (key.user_ip >= r.start && key.user_ip < r.end);
    if (!inside) {
      outside += count;
      ADD_FAILURE() << fmt::format("child sample at {:#x}, outside its executable text", key.user_ip);
    }
  });
  EXPECT_EQ(child_ip_samples, child_counts.user);
  EXPECT_EQ(outside, 0u);
  // Without a filter, samples_by_ip and samples_by_pid cover every user sample.
  EXPECT_EQ(ip_sum, totals.user);
  EXPECT_EQ(pid_sum_user, totals.user);

  // The kernel's BPF stats: what one sample costs in the program.
  BpfRunStats stats = sampler->ReadBpfStats();
  EXPECT_TRUE(stats.enabled);
  EXPECT_GT(stats.run_count, 0u);
  EXPECT_EQ(stats.run_count, totals.samples);
  if (stats.run_count > 0) {
    fmt::print("BPF cost: {} runs, {} ns total, {:.0f} ns per sample\n", stats.run_count, stats.run_time_ns,
               static_cast<double>(stats.run_time_ns) / static_cast<double>(stats.run_count));
  }

  // Stopped: nothing more is counted, and the maps stay readable.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(sampler->ReadTotals().samples, totals.samples);
}

TEST(SamplerBpfTest, PidFilterKeepsOnlyTheTarget) {
  BusyChild target;
  BusyChild other;
  ASSERT_TRUE(target.ready() && other.ready());

  auto sampler = StartOrFail({.frequency_hz = kHz, .target_pids = {target.pid()}});
  ASSERT_NE(sampler, nullptr);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  sampler->Stop();

  auto counts = PidCounts(*sampler);
  ASSERT_EQ(counts.size(), 1u) << "entries for processes outside the filter";
  EXPECT_EQ(counts.begin()->first, static_cast<uint32_t>(target.pid()));
  EXPECT_GT(counts.begin()->second.user, 0u);
  uint64_t ip_entries = 0;
  sampler->ForEachIp([&](const sample_key& key, uint64_t) {
    ++ip_entries;
    EXPECT_EQ(key.tgid, static_cast<uint32_t>(target.pid()));
  });
  EXPECT_GT(ip_entries, 0u);
  // Totals still count the whole host, including the other busy child.
  Totals totals = sampler->ReadTotals();
  EXPECT_GT(totals.user, counts.begin()->second.user);
}

// The agent finds new processes in the ring of new tgids (Profiler::Poll):
// each pid map entry is named once, a second read names nothing, and when
// the ring overflowed a walk of the pid map names what the ring lost.
TEST(SamplerBpfTest, NewPidsComeFromTheRingAndAFullRingFallsBackToTheMap) {
  BusyChild target;
  ASSERT_TRUE(target.ready());
  const auto tgid = static_cast<uint32_t>(target.pid());
  auto sampler = StartOrFail({.frequency_hz = kHz, .target_pids = {target.pid()}});
  ASSERT_NE(sampler, nullptr);
  EXPECT_TRUE(target.RunFor(0.05)) << "the busy child got no CPU";
  auto new_pids = [&] {
    std::multiset<uint32_t> named;
    sampler->ForEachNewPid([&](uint32_t pid) { named.insert(pid); });
    return named;
  };
  EXPECT_EQ(new_pids(), std::multiset<uint32_t>{tgid});
  EXPECT_TRUE(target.RunFor(0.05)) << "the busy child got no CPU";
  EXPECT_TRUE(new_pids().empty()) << "a pid named again while its entry stayed";
  EXPECT_EQ(sampler->new_pid_walks(), 0u);

  // Every ClearCounts deletes the child's entry, and its next sample makes a
  // new one: a record each time, more than the ring holds (16 bytes a record).
  constexpr int kRecords = TLSPROF_NEW_TGIDS_RING_BYTES / 16 + 200;
  int cleared = 0;
  for (int made = 0; made < kRecords && cleared < 4 * kRecords; ++cleared) {
    sampler->ClearCounts();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the child spins on: ~3 samples
    if (!PidCounts(*sampler).empty()) ++made;
  }
  const auto named = new_pids();
  EXPECT_EQ(sampler->new_pid_walks(), 1u) << "the ring did not overflow in " << cleared << " clears";
  EXPECT_GE(named.count(tgid), static_cast<size_t>(TLSPROF_NEW_TGIDS_RING_BYTES / 16));
  EXPECT_EQ(named.size(), named.count(tgid)) << "a pid outside the filter was named";
  EXPECT_TRUE(new_pids().empty());
  EXPECT_EQ(sampler->new_pid_walks(), 1u);
}

// A profile window starts with ClearCounts: what was counted before is gone,
// and sampling goes on afterwards.
TEST(SamplerBpfTest, ClearCountsStartsOverWhileSampling) {
  BusyChild target;
  ASSERT_TRUE(target.ready());
  auto sampler = StartOrFail({.frequency_hz = kHz, .target_pids = {target.pid()}});
  ASSERT_NE(sampler, nullptr);
  // In the child's CPU time, not wall time (ForkedChild::RunFor): ~400 samples.
  EXPECT_TRUE(target.RunFor(0.4)) << "the busy child got no CPU";
  const uint64_t before = PidCounts(*sampler)[static_cast<uint32_t>(target.pid())].user;
  ASSERT_GT(before, 100u) << "the busy child got too few samples to tell";
  const uint64_t total_before = sampler->ReadTotals().samples;

  sampler->ClearCounts();
  const uint64_t right_after = PidCounts(*sampler)[static_cast<uint32_t>(target.pid())].user;
  EXPECT_LT(right_after, before / 4) << "per-pid counts survived ClearCounts";
  EXPECT_LT(sampler->ReadTotals().samples, total_before / 4) << "totals survived ClearCounts";
  uint64_t ip_samples = 0;
  sampler->ForEachIp([&](const sample_key&, uint64_t count) { ip_samples += count; });
  EXPECT_LT(ip_samples, before / 4) << "per-IP counts survived ClearCounts";

  EXPECT_TRUE(target.RunFor(0.4)) << "the busy child got no CPU";
  sampler->Stop();
  EXPECT_GT(PidCounts(*sampler)[static_cast<uint32_t>(target.pid())].user, right_after + 100)
      << "sampling stopped counting after ClearCounts";
}

// The daemon's windows: ReadWindow() while sampling runs, many times, then
// once after Stop(). The windows must add up to one long read: the totals
// (never cleared, read once at the end) against the sum of the per-window
// per-pid and per-IP counts. Without a filter every non-idle sample is in
// samples_by_pid and every user sample in samples_by_ip (or counted as
// dropped), so any sample lost between windows or counted in two breaks the
// equalities. A second child exits midway: its keys are evicted from the
// maps once it had no sample for a whole window.
TEST(SamplerBpfTest, WindowsAddUpToOneLongRead) {
  BusyChild busy;
  auto leaver = std::make_unique<BusyChild>();
  ASSERT_TRUE(busy.ready() && leaver->ready());
  const auto busy_tgid = static_cast<uint32_t>(busy.pid());
  const auto leaver_tgid = static_cast<uint32_t>(leaver->pid());
  // From Start on, not from a ClearCounts(): the maps and the totals are not
  // cleared at one instant, so samples between the two would break the sums.
  auto sampler = StartOrFail({.frequency_hz = kHz, .target_pids = {}});
  ASSERT_NE(sampler, nullptr);

  Totals window_totals;
  std::map<uint32_t, uint64_t> by_pid;  // user + kernel, summed over windows
  uint64_t pid_user = 0, pid_all = 0, ip_all = 0, busy_ip = 0, busy_user = 0;
  int windows = 0, busy_windows = 0;
  std::vector<int> leaver_evicted;  // windows in which the leaver's pid entry went
  int leaver_killed_at = -1;
  auto add = [&](const WindowCounts& w) {
    ++windows;
    window_totals += w.totals;
    bool busy_seen = false;
    for (const auto& [tgid, c] : w.pids) {
      by_pid[tgid] += c.user + c.kernel;
      pid_user += c.user;
      pid_all += c.user + c.kernel;
      if (tgid == busy_tgid) busy_user += c.user;
      busy_seen = busy_seen || (tgid == busy_tgid && c.user > 0);
    }
    busy_windows += busy_seen ? 1 : 0;
    for (const auto& [key, count] : w.ips) {
      ip_all += count;
      if (key.tgid == busy_tgid) busy_ip += count;
    }
    for (uint32_t tgid : w.idle_pids) {
      if (tgid == leaver_tgid) leaver_evicted.push_back(windows);
    }
  };
  const double busy_cpu_before = CpuSeconds(busy.pid());
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    if (leaver && Clock::now() - start > std::chrono::seconds(1)) {
      leaver.reset();  // killed and reaped
      leaver_killed_at = windows;
    }
    add(sampler->ReadWindow());
  }
  const double busy_cpu = CpuSeconds(busy.pid()) - busy_cpu_before;
  sampler->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  add(sampler->ReadWindow());
  const Totals total = sampler->ReadTotals();
  fmt::print("{} windows: {} samples ({} idle, {} user, {} kernel); pid sum {}, ip sum {}; busy child {} samples\n",
             windows, total.samples, total.idle, total.user, total.kernel, pid_all, ip_all, by_pid[busy_tgid]);

  ASSERT_GT(windows, 10);
  EXPECT_GT(busy_windows, windows / 2) << "the busy child should get samples in (nearly) every window";
  EXPECT_EQ(window_totals.samples, total.samples);
  EXPECT_EQ(window_totals.idle, total.idle);
  EXPECT_EQ(window_totals.user, total.user);
  EXPECT_EQ(window_totals.kernel, total.kernel);
  EXPECT_EQ(window_totals.dropped_pid, total.dropped_pid);
  EXPECT_EQ(window_totals.dropped_ip, total.dropped_ip);
  EXPECT_EQ(pid_all + total.dropped_pid, total.samples - total.idle);
  EXPECT_EQ(pid_user + total.dropped_pid, total.user);
  EXPECT_EQ(ip_all + total.dropped_ip, total.user);
  EXPECT_EQ(busy_ip, busy_user);
  // The busy child's samples over all windows match its CPU clock (about 3 s
  // of one CPU, less if other load shared the CPUs).
  const double busy_expected = busy_cpu * 1e9 / static_cast<double>(sampler->period_ns());
  EXPECT_NEAR(static_cast<double>(by_pid[busy_tgid]), busy_expected, 0.2 * busy_expected);
  EXPECT_GT(by_pid[leaver_tgid], 50u);
  // The leaver's pid entry goes within a few windows of its exit (a starved
  // but live process may also lose its entry for a window before that).
  ASSERT_GE(leaver_killed_at, 0);
  const bool evicted_after_exit = std::any_of(leaver_evicted.begin(), leaver_evicted.end(), [&](int at) {
    return at >= leaver_killed_at + 1 && at <= leaver_killed_at + 3;
  });
  EXPECT_TRUE(evicted_after_exit) << "an exited process stayed in the maps (killed after window " << leaver_killed_at
                                  << ")";
}

TEST(SamplerBpfTest, AcceptsTheFrequencyBounds) {
  for (uint32_t hz : {1u, 10000u}) {
    auto sampler = StartOrFail({.frequency_hz = hz, .target_pids = {}});
    ASSERT_NE(sampler, nullptr);
    EXPECT_EQ(sampler->period_ns(), 1'000'000'000u / hz);
  }
}

TEST(SamplerBpfTest, RejectsFrequencyOutOfRange) {
  for (uint32_t hz : {0u, 10001u}) {
    auto sampler = Sampler::Start({.frequency_hz = hz, .target_pids = {}});
    ASSERT_FALSE(sampler.ok()) << hz << " Hz accepted";
    EXPECT_THAT(sampler.error().message, HasSubstr("out of range"));
  }
}

// Start()'s error in a forked child once `setup` has changed the child's
// privileges (false: the child fails). Empty with a test failure if the child
// did not report.
std::string StartErrorInChild(const std::function<bool()>& setup) {
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return "";
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  pid_t pid = fork();
  if (pid == 0) {
    if (!setup()) _exit(2);
    auto sampler = Sampler::Start({.frequency_hz = kHz, .target_pids = {}});
    std::string message = sampler.ok() ? "started" : sampler.error().message;
    _exit(write(write_end.get(), message.data(), message.size()) < 0 ? 3 : 0);
  }
  write_end.reset();
  std::string message;
  char buf[1024];
  for (ssize_t n; (n = read(read_end.get(), buf, sizeof(buf))) > 0;) message.append(buf, static_cast<size_t>(n));
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  return message;
}

TEST(SamplerBpfTest, ExplainsMissingPrivileges) {
  // In a child that drops root (and with it every capability), Start() must
  // fail with the message that tells the user what to do.
  std::string message = StartErrorInChild([] {
    return setgroups(0, nullptr) == 0 && setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0;
  });
  EXPECT_THAT(message, HasSubstr("tlsprof-agent needs root (or CAP_BPF + CAP_PERFMON) to load its BPF sampler: "));
}

TEST(SamplerBpfTest, NamesASeccompFilterThatDeniesBpf) {
  // Root with every capability, under a filter that answers bpf() with EPERM
  // the way Debian 12's podman default profile does without CAP_SYS_ADMIN:
  // the message must name the filter, not ask for capabilities it has.
  std::string message = StartErrorInChild([] {
    static sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_bpf, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{.len = static_cast<unsigned short>(sizeof(code) / sizeof(code[0])), .filter = code};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
  });
  EXPECT_THAT(message, HasSubstr("tlsprof-agent has CAP_BPF and CAP_PERFMON, but a seccomp filter denies"));
  EXPECT_THAT(message, HasSubstr("Operation not permitted"));
}

TEST(SamplerBpfTest, RejectsANonexistentPid) {
  // A child that has exited and been reaped: its pid is free (pids are not
  // reused this quickly; the kernel allocates them cyclically).
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  ASSERT_GT(pid, 0);
  waitpid(pid, nullptr, 0);
  auto sampler = Sampler::Start({.frequency_hz = kHz, .target_pids = {pid}});
  ASSERT_FALSE(sampler.ok());
  EXPECT_THAT(sampler.error().message, HasSubstr("does not exist"));
}

}  // namespace
}  // namespace tlsprof::sample
