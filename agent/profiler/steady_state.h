// The agent's capabilities after set-up (docs/fleet.md, "Capabilities").
//
// Set-up is the only step that needs CAP_BPF + CAP_PERFMON: loading the BPF
// programs, creating the maps and opening the per-CPU perf events (plus
// CAP_SYS_ADMIN for bpf_enable_stats(), which is optional). After it, the
// agent reads /proc/PID/maps, /proc/PID/root/... and /proc/PID/map_files of
// processes of any user (CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH; packaging/README.md
// says which access needs which) and reads and writes its maps through fds it already
// holds, which needs no capability on Linux 6.5+ ("bpf: Move unprivileged
// checks into map_create() and bpf_prog_load()"), but CAP_BPF before 6.5 when
// kernel.unprivileged_bpf_disabled is set (Debian's default). Nothing at
// steady state creates BPF objects or perf events: per-process unwind tables
// are rows written into the existing maps, debuginfod is HTTP, and the
// metrics server and the shipper are sockets.
#pragma once

#include "agent/sample/sampler.h"
#include "common/result.h"

namespace tlsprof::profiler {

// With `attach_uprobes` (usage telemetry), also keeps CAP_BPF, CAP_PERFMON and
// CAP_SYS_ADMIN (uprobe perf events)
// to attach uprobes to TLS library files found later.
// Keeps CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and (if it has it)
// CAP_CHECKPOINT_RESTORE for /proc/PID/map_files, and CAP_BPF only if a map
// read through `sampler`'s fds fails without it (probed here); drops every
// other capability from every set, sets PR_SET_NO_NEW_PRIVS, and logs the
// result once (info). Must run before the process starts a second thread.
// An error means the drop itself failed: the caller stops.
Status DropToSteadyState(const sample::Sampler& sampler, bool attach_uprobes = false);

}  // namespace tlsprof::profiler
