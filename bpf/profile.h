/* Shared between bpf/profile.bpf.c and user space: plain C structs and
 * constants only. A map's name says what it counts; a key struct's fields are
 * its labels, in order.
 */
#ifndef TLSPROF_BPF_PROFILE_H
#define TLSPROF_BPF_PROFILE_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define TLSPROF_MAX_SAMPLE_KEYS 131072
#define TLSPROF_MAX_PIDS 32768
#define TLSPROF_MAX_TARGET_PIDS 1024

/* Key of the samples_by_ip map: samples that landed in user mode at one
 * instruction of one process. Kernel-mode samples of a process are counted
 * in samples_by_pid only; they are busy CPU but never TLS library time.
 */
struct sample_key {
	__u32 tgid;
	__u32 pad;
	__u64 user_ip;
};

/* Value of samples_by_pid: what one process (tgid) spent, in samples. */
struct pid_counts {
	__u64 user;
	__u64 kernel;
};

/* Slots of the per-CPU totals array. The busy CPU of the host is
 * TOTAL - IDLE; with a pid filter, the scope's busy CPU is the sum of
 * samples_by_pid over the target pids. Idle CPUs are not reliably sampled on
 * every (virtual) machine, so TOTAL can fall short of cpus x time x rate:
 * take utilisation against wall time, not against TOTAL.
 */
enum total_slot {
	TOTAL_SAMPLES = 0,
	TOTAL_IDLE,        /* the idle task (pid 0) was on CPU */
	TOTAL_KERNEL,      /* a task was in kernel mode */
	TOTAL_USER,        /* a task was in user mode */
	TOTAL_DROPPED_IP,  /* samples_by_ip was full: sample kept in pid counts only */
	TOTAL_DROPPED_PID, /* samples_by_pid was full */
	TOTAL_NR_SLOTS,
};

#endif /* TLSPROF_BPF_PROFILE_H */
