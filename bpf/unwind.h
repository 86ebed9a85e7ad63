/* Shared between bpf/ and user space: the compact unwind tables that the
 * agent builds from DWARF CFI (.eh_frame / .debug_frame) and the BPF
 * unwinder walks, and the stack aggregation key. Plain C only.
 *
 * x86-64 only. For every instruction range of a binary a row says how to
 * find the canonical frame address (CFA) and the caller's RBP; the return
 * address is always at CFA - 8 on x86-64.
 */
#ifndef TLSPROF_BPF_UNWIND_H
#define TLSPROF_BPF_UNWIND_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define TLSPROF_UNWIND_MAX_FRAMES 32      /* frames kept per stack */
#define TLSPROF_UNWIND_MAX_ROWS (1 << 21) /* rows in the global row array */
/* The row index: entry b is the pc of row b << TLSPROF_UNWIND_INDEX_SHIFT
 * (a bucket of 256 rows, 4 KiB). A lookup in a table searches the index
 * entries of the buckets inside it first, then at most 256 rows: a few pages
 * touched instead of one per step of a search over the whole table.
 */
#define TLSPROF_UNWIND_INDEX_SHIFT 8
#define TLSPROF_UNWIND_INDEX_BUCKET (1 << TLSPROF_UNWIND_INDEX_SHIFT)
#define TLSPROF_UNWIND_INDEX_LEN (TLSPROF_UNWIND_MAX_ROWS >> TLSPROF_UNWIND_INDEX_SHIFT)
#define TLSPROF_UNWIND_MAX_MAPPINGS 16 /* unwindable mappings per process */
#define TLSPROF_UNWIND_MAX_PROCS 8192
#define TLSPROF_UNWIND_FIRST_WALK 3 /* frames tried to find TLS code above a non-TLS leaf */
/* Non-TLS frames crossed above TLS code before the walk stops (the first of
 * them is kept in the stack: it says who called the library). */
#define TLSPROF_UNWIND_GAP 1
#define TLSPROF_MAX_STACK_KEYS 32768 /* per samples_by_stack set (one per window) */

/* How to compute the CFA at a row. */
enum unwind_cfa_kind {
	CFA_RSP = 0,       /* CFA = RSP + cfa_off */
	CFA_RBP = 1,       /* CFA = RBP + cfa_off */
	CFA_RSP_DEREF = 2, /* CFA = *(RSP + cfa_off) + deref_add (perlasm's realigned stacks) */
	CFA_PLT = 3,       /* PLT stub: CFA = RSP + 8, + 8 more when (RIP & 15) >= 11 */
	CFA_END = 4,       /* outermost frame (return address undefined): stop */
	CFA_NONE = 5,      /* no CFI covers this range: fall back to RBP if allowed, else stop */
	CFA_REG = 6,       /* CFA = <DWARF register `reg`> + cfa_off (perlasm: rax, r9, rsi, r11) */
	/* CFA = *(RSP + cfa_off + <register `reg`> * 8) + deref_add: perlasm's
	 * bn_mul_mont family (`.cfi_cfa_expression %rsp+8,%r9,8,mul,plus,deref,+8`),
	 * whose frame size is the limb count in r9. The register is the sample's,
	 * under CFA_REG's rules. */
	CFA_RSP_REG_DEREF = 7,
};
#define UNWIND_CFA_NR_KINDS 8

/* CFA_REG: the register's value is only known from the sample itself, so
 * the unwinders accept such a row at frame 0, and at frame 1 when frame 0 is
 * in the same mapping (an OpenSSL perlasm leaf such as _aesni_ctr32_ghash_6x
 * keeps its caller's CFA register intact). The CFA must then be plausible:
 * above SP, at most UNWIND_CFA_REG_MAX_DIST above it, and 8-byte aligned.
 */
#define UNWIND_CFA_REG_MAX_DIST (1 << 20)
#define UNWIND_CFA_REG_MAX_FRAME 1

/* Where the caller's RBP is. */
enum unwind_rbp_kind {
	RBP_SAME = 0,   /* unchanged in this frame */
	RBP_AT_CFA = 1, /* saved at CFA + rbp_off */
	RBP_LOST =
	        2, /* not recoverable (expression we do not model): unwinding continues with RBP unknown */
};

/* One row: applies from `pc` (ELF virtual address) up to the next row's pc.
 * Rows of one table are sorted by pc.
 */
struct unwind_row {
	__u32 pc;
	__u8 cfa_kind;
	__u8 rbp_kind;
	__u8 reg; /* CFA_REG, CFA_RSP_REG_DEREF: x86-64 DWARF register number (0 rax .. 15 r15); else 0 */
	__u8 flags; /* UNWIND_ROW_* */
	__s32 cfa_off;
	__s16 deref_add;
	__s16 rbp_off;
};

/* Row flags. */
#define UNWIND_ROW_TLS 1 /* inside a TLS symbol of a UNWIND_MAPPING_TLS_SYMBOLS mapping */

enum unwind_mapping_flags {
	UNWIND_MAPPING_TLS = 1 << 0, /* code of a TLS library: a frame here makes the sample TLS */
	UNWIND_MAPPING_FP = 1 << 1,  /* walk frame pointers (Go; or no CFI table) */
	UNWIND_MAPPING_TLS_SYMBOLS =
	        1 << 2, /* TLS only inside TLS symbols (static link): user space decides */
};

/* An executable mapping of a process that the unwinder knows. */
struct unwind_mapping {
	__u64 start; /* runtime address range [start, end) */
	__u64 end;
	__u64 bias;        /* runtime address - ELF virtual address */
	__u32 table_start; /* first row in unwind_rows */
	__u32 table_len;   /* rows; 0 = no table (FP only) */
	__u32 flags;       /* enum unwind_mapping_flags */
	__u32 pad;
};

/* Value of the unwind_procs map, keyed by tgid. Mappings sorted by start. */
struct unwind_proc {
	__u32 nr_mappings;
	__u32 pad;
	struct unwind_mapping mappings[TLSPROF_UNWIND_MAX_MAPPINGS];
};

/* Key of the samples_by_stack map: one user stack of one process, leaf
 * first. Unused ips are zero, so equal stacks give equal keys.
 */
struct stack_key {
	__u32 tgid;
	__u32 nr_frames;
	__u64 ips[TLSPROF_UNWIND_MAX_FRAMES];
};

#endif /* TLSPROF_BPF_UNWIND_H */
