#include "agent/profiler/steady_state.h"

#include <spdlog/spdlog.h>

#include <vector>

#include "common/privilege/privilege.h"

namespace tlsprof::profiler {
namespace {

// Does reading a map through an open fd need CAP_BPF (or CAP_SYS_ADMIN, which
// also makes the kernel's bpf_capable() true)? Both are cleared from the
// effective set for one map read, then restored.
bool MapAccessNeedsCapBpf(const sample::Sampler& sampler) {
  const bool had_bpf = privilege::HasEffective(CAP_BPF);
  const bool had_admin = privilege::HasEffective(CAP_SYS_ADMIN);
  if (!had_bpf && !had_admin) return false;  // it already works without (or never will)
  if (had_bpf && !privilege::SetEffective(CAP_BPF, false).ok()) return true;
  if (had_admin && !privilege::SetEffective(CAP_SYS_ADMIN, false).ok()) return true;
  const Status access = sampler.CheckMapAccess();
  if (had_bpf) (void)privilege::SetEffective(CAP_BPF, true);
  if (had_admin) (void)privilege::SetEffective(CAP_SYS_ADMIN, true);
  if (!access.ok()) spdlog::debug("without CAP_BPF: {}; keeping CAP_BPF", access.error().message);
  return !access.ok();
}

}  // namespace

Status DropToSteadyState(const sample::Sampler& sampler, bool attach_uprobes) {
  spdlog::debug("capabilities at set-up: {}", privilege::Describe());
  // CAP_CHECKPOINT_RESTORE (when the agent has it): /proc/PID/map_files, the
  // only way to open a binary that was deleted or replaced after the process
  // started (upgrades); without it the kernel asks for CAP_SYS_ADMIN.
  std::vector<cap_value_t> keep = {CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE};
  if (attach_uprobes) {
    // Usage probes (agent/usage) are attached when a process maps a TLS
    // library file not probed yet. Attaching a BPF program needs CAP_BPF and
    // CAP_PERFMON, and creating a uprobe perf event for every process needs
    // CAP_SYS_ADMIN (Linux 6.18 answers EACCES with CAP_BPF and
    // CAP_PERFMON alone). So --usage keeps all three (docs/usage.md,
    // "Privileges"); a privileged helper that only opens uprobe events would
    // let the agent drop CAP_SYS_ADMIN again.
    keep.push_back(CAP_BPF);
    keep.push_back(CAP_PERFMON);
    keep.push_back(CAP_SYS_ADMIN);
  } else if (MapAccessNeedsCapBpf(sampler)) {
    keep.push_back(CAP_BPF);
  }
  if (auto st = privilege::KeepOnly(keep); !st.ok()) {
    return MakeError("cannot drop the capabilities the agent no longer needs: {}", st.error().message);
  }
  // The drop must not have cut the agent off its maps.
  if (auto st = sampler.CheckMapAccess(); !st.ok()) {
    return MakeError("after dropping capabilities: {}", st.error().message);
  }
  spdlog::info("capabilities after set-up: {}", privilege::Describe());
  return OkStatus();
}

}  // namespace tlsprof::profiler
