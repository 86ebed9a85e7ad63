// SPDX-License-Identifier: GPL-2.0
/* CPU sampler: one software cpu-clock perf event per online CPU runs this
 * program every period; it classifies the sample (idle, kernel, user) and
 * aggregates it in the kernel, so user space only reads the maps.
 *
 * Every sample is counted in totals. Non-idle samples of a process that
 * passes the tgid filter are counted in samples_by_pid, and user-mode ones
 * also in samples_by_ip, keyed by the interrupted user instruction.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "profile.h"

char LICENSE[] SEC("license") = "GPL";

/* Set through skel->rodata before load: when true, only the tgids in
 * target_tgids get samples_by_pid / samples_by_ip entries.
 */
const volatile bool filter_tgids = false;

/* Hash maps stay preallocated (no BPF_F_NO_PREALLOC): this program runs in
 * hard-irq context from the cpu-clock hrtimer, and insertion into a
 * preallocated map never allocates there.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TLSPROF_MAX_SAMPLE_KEYS);
	__type(key, struct sample_key);
	__type(value, __u64);
} samples_by_ip SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TLSPROF_MAX_PIDS);
	__type(key, __u32);
	__type(value, struct pid_counts);
} samples_by_pid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TOTAL_NR_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

/* Filled by user space before attach; the value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TLSPROF_MAX_TARGET_PIDS);
	__type(key, __u32);
	__type(value, __u8);
} target_tgids SEC(".maps");

/* User mode iff the interrupted code segment's privilege level is 3. The
 * verifier only allows 8-byte loads of the perf regs (pe_prog_is_valid_access),
 * so load the whole cs slot of the uapi x86-64 pt_regs (cs and its padding, or
 * csx in FRED kernels); volatile keeps clang from narrowing the load to the low byte.
 */
static __always_inline bool user_mode(struct bpf_perf_event_data *ctx)
{
	__u64 cs = *(volatile __u64 *)((void *)&ctx->regs + __builtin_offsetof(struct pt_regs, cs));

	return (cs & 3) == 3;
}

static __always_inline void total_inc(__u32 slot)
{
	__u64 *count = bpf_map_lookup_elem(&totals, &slot);

	/* Per-CPU slot, and the program cannot nest on one CPU: no atomic. */
	if (count)
		*count += 1;
}

/* Count one sample for a process. A new tgid is inserted already counted
 * with BPF_NOEXIST; if that fails, another CPU inserted it first (we add to
 * its entry) or the map is full (returns false).
 */
static __always_inline bool pid_inc(__u32 tgid, bool user)
{
	struct pid_counts *counts = bpf_map_lookup_elem(&samples_by_pid, &tgid);
	struct pid_counts init = { .user = user, .kernel = !user };

	if (!counts) {
		if (!bpf_map_update_elem(&samples_by_pid, &tgid, &init, BPF_NOEXIST))
			return true;
		counts = bpf_map_lookup_elem(&samples_by_pid, &tgid);
		if (!counts)
			return false;
	}
	if (user)
		__sync_fetch_and_add(&counts->user, 1);
	else
		__sync_fetch_and_add(&counts->kernel, 1);
	return true;
}

/* The same for one user instruction of one process. */
static __always_inline bool ip_inc(const struct sample_key *key)
{
	__u64 *count = bpf_map_lookup_elem(&samples_by_ip, key);
	__u64 one = 1;

	if (!count) {
		if (!bpf_map_update_elem(&samples_by_ip, key, &one, BPF_NOEXIST))
			return true;
		count = bpf_map_lookup_elem(&samples_by_ip, key);
		if (!count)
			return false;
	}
	__sync_fetch_and_add(count, 1);
	return true;
}

SEC("perf_event")
int sample_cpu(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	struct sample_key key;
	bool user;

	total_inc(TOTAL_SAMPLES);

	/* The idle task is the only one with pid 0 (one per CPU). */
	if ((__u32)pid_tgid == 0) {
		total_inc(TOTAL_IDLE);
		return 0;
	}

	/* The perf regs are those of the interrupted context. */
	user = user_mode(ctx);
	total_inc(user ? TOTAL_USER : TOTAL_KERNEL);

	if (filter_tgids && !bpf_map_lookup_elem(&target_tgids, &tgid))
		return 0;

	if (!pid_inc(tgid, user))
		total_inc(TOTAL_DROPPED_PID);
	if (!user)
		return 0;

	key.tgid = tgid;
	key.pad = 0;
	key.user_ip = ctx->regs.ip;
	if (!ip_inc(&key))
		total_inc(TOTAL_DROPPED_IP);
	return 0;
}
