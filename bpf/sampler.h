/* Shared between bpf/sampler.bpf.c and user space: plain C structs and
 * constants only. A map's name says what it counts; a key struct's fields are
 * its labels, in order.
 */
#ifndef TLSPROF_BPF_SAMPLER_H
#define TLSPROF_BPF_SAMPLER_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* Entries of each of the two samples_by_ip sets (one per window, see
 * bpf/sampler.bpf.c): the keys one window can hold.
 */
#define TLSPROF_MAX_SAMPLE_KEYS 65536
#define TLSPROF_MAX_PIDS 32768
#define TLSPROF_MAX_TARGET_PIDS 1024
/* The ring of new tgids (bpf/sampler.bpf.c): a power of two of pages; a
 * record takes 16 bytes, so 1024 new processes between two reads.
 */
#define TLSPROF_NEW_TGIDS_RING_BYTES 16384

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
	/* Stack unwinding (bpf/unwind.bpf.h), for user samples of the processes
	 * in unwind_procs only. Every sample that gets a stack ends with exactly
	 * one TOTAL_UNWIND_STOP_* reason (the same as tlsprof::unwind::UnwindStop).
	 */
	TOTAL_UNWOUND,                 /* sample counted in samples_by_stack */
	TOTAL_DROPPED_STACK,           /* samples_by_stack was full: stack lost */
	TOTAL_UNWIND_NOT_TLS,          /* first walk found no TLS mapping: no stack, by design */
	TOTAL_UNWIND_STOP_ZERO_IP,     /* return address 0: a complete stack */
	TOTAL_UNWIND_STOP_END,         /* CFA_END (outermost frame): a complete stack */
	TOTAL_UNWIND_STOP_MAX_FRAMES,  /* TLSPROF_UNWIND_MAX_FRAMES kept, more above */
	TOTAL_UNWIND_STOP_NO_MAPPING,  /* ip in no mapping of the process */
	TOTAL_UNWIND_STOP_NO_ROW,      /* ip before the first row of its table */
	TOTAL_UNWIND_STOP_CFA_NONE,    /* CFA_NONE: no CFI (or a rule not modelled) */
	TOTAL_UNWIND_STOP_BP_UNKNOWN,  /* RBP needed after an RBP_LOST frame */
	TOTAL_UNWIND_STOP_UNREADABLE,  /* a stack word could not be read */
	TOTAL_UNWIND_STOP_NOT_GROWING, /* the caller's SP is not above the callee's */
	TOTAL_UNWIND_STOP_REG_UNKNOWN, /* CFA_REG past frame 0/1, or an implausible CFA */
	/* The unwinder's own cost (bench/unwind_cost.py), over every walk
	 * started, whether or not it found TLS code.
	 */
	TOTAL_UNWIND_WALKS,  /* user samples of a process in unwind_procs: walks started */
	TOTAL_UNWIND_FRAMES, /* frames visited by those walks */
	TOTAL_UNWIND_NS, /* bpf_ktime_get_ns() time in the walks, samples_by_stack update included */
	TOTAL_UNWIND_ROW_SEARCHES, /* row lookups not served by the per-CPU row cache */
	TOTAL_NR_SLOTS,
};

#endif /* TLSPROF_BPF_SAMPLER_H */
