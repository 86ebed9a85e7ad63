// SPDX-License-Identifier: GPL-2.0
/* CPU sampler: one software cpu-clock perf event per online CPU runs this
 * program every period; it classifies the sample (idle, kernel, user) and
 * aggregates it in the kernel, so user space only reads the maps.
 *
 * Every sample is counted in totals. Non-idle samples of a process that
 * passes the tgid filter are counted in samples_by_pid, and user-mode ones
 * also in samples_by_ip (one of two sets by window, below), keyed by the
 * interrupted user instruction.
 *
 * User-mode samples of a process that user space put in unwind_procs are also
 * unwound (DWARF CFI rows or frame pointers, see unwind.h) and, if the stack
 * touches TLS code, counted in samples_by_stack.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "sampler.h"
#include "unwind.h"

char LICENSE[] SEC("license") = "GPL";

/* Set through skel->rodata before load: when true, only the tgids in
 * target_tgids get samples_by_pid / samples_by_ip entries.
 */
const volatile bool filter_tgids = false;

/* Hash maps stay preallocated (no BPF_F_NO_PREALLOC): this program runs in
 * hard-irq context from the cpu-clock hrtimer, and insertion into a
 * preallocated map never allocates there.
 *
 * The per-window maps come in two sets, samples_by_ip_N and
 * samples_by_stack_N: a sample is counted in set window_set, read once per
 * run. At a window's close user space flips window_set, waits for an RCU
 * grace period (every run that read the old value has returned) and drains
 * the old set with batched lookup-and-delete (agent/sample/sampler.cc). So no
 * key is deleted while a run may hold a pointer to its value, and none is
 * deleted one system call at a time.
 */
__u32 window_set = 0;

/* A per-window map of sample counts (u64) by key. */
#define SAMPLE_COUNTS(name, key_type, entries)   \
	struct {                                 \
		__uint(type, BPF_MAP_TYPE_HASH); \
		__uint(max_entries, entries);    \
		__type(key, key_type);           \
		__type(value, __u64);            \
	} name SEC(".maps")
SAMPLE_COUNTS(samples_by_ip_0, struct sample_key, TLSPROF_MAX_SAMPLE_KEYS);
SAMPLE_COUNTS(samples_by_ip_1, struct sample_key, TLSPROF_MAX_SAMPLE_KEYS);

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

/* Every tgid that gets a samples_by_pid entry, once per entry (a tgid
 * whose idle entry user space evicted shows up again): user space finds new
 * processes by reading this ring, which costs nothing while it is empty,
 * instead of walking samples_by_pid's buckets. Records are written without a
 * wakeup (no one sleeps on it); when the ring is full, new_tgids_lost counts
 * the record instead and user space walks samples_by_pid once.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TLSPROF_NEW_TGIDS_RING_BYTES);
} new_tgids SEC(".maps");

__u64 new_tgids_lost = 0;

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

static __always_inline void total_add(__u32 slot, __u64 n)
{
	__u64 *count = bpf_map_lookup_elem(&totals, &slot);

	/* Per-CPU slot, and the program cannot nest on one CPU: no atomic. */
	if (count)
		*count += n;
}

static __always_inline void total_inc(__u32 slot)
{
	total_add(slot, 1);
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
		if (!bpf_map_update_elem(&samples_by_pid, &tgid, &init, BPF_NOEXIST)) {
			if (bpf_ringbuf_output(&new_tgids, &tgid, sizeof(tgid), BPF_RB_NO_WAKEUP))
				__sync_fetch_and_add(&new_tgids_lost, 1);
			return true;
		}
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

/* Count one sample under a key of a u64-valued hash map (one user
 * instruction, or one stack, of one process): the same insert-or-add.
 */
static __always_inline bool key_inc(void *map, const void *key)
{
	__u64 *count = bpf_map_lookup_elem(map, key);
	__u64 one = 1;

	if (!count) {
		if (!bpf_map_update_elem(map, key, &one, BPF_NOEXIST))
			return true;
		count = bpf_map_lookup_elem(map, key);
		if (!count)
			return false;
	}
	__sync_fetch_and_add(count, 1);
	return true;
}

/* ---- User-stack unwinding ------------------------------------------------
 *
 * The same algorithm as the reference tlsprof::unwind::UnwindWithReason()
 * (agent/unwind/unwind.cc); keep the two in step.
 */

/* The rows of every table, one after another. User space appends a table
 * once per build-id and never moves it (agent/sample/sampler.h); a
 * mapping names its table by [table_start, table_start + table_len).
 * 2^21 rows x 16 B = 32 MiB, created without trouble here (memcg-accounted).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TLSPROF_UNWIND_MAX_ROWS);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* unwind_rows[b << TLSPROF_UNWIND_INDEX_SHIFT].pc for every bucket b that
 * user space wrote rows into (see unwind.h).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TLSPROF_UNWIND_INDEX_LEN);
	__type(key, __u32);
	__type(value, __u32);
} unwind_row_index SEC(".maps");

/* The processes to unwind, keyed by tgid: their mappings sorted by start. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TLSPROF_UNWIND_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* Samples per user stack of a process (leaf first), in two sets like
 * samples_by_ip_N. Preallocated, like the other hash maps.
 */
SAMPLE_COUNTS(samples_by_stack_0, struct stack_key, TLSPROF_MAX_STACK_KEYS);
SAMPLE_COUNTS(samples_by_stack_1, struct stack_key, TLSPROF_MAX_STACK_KEYS);

/* A per-CPU cache of recent row lookups: TLS stacks repeat the same return
 * addresses, and a hit costs one slot instead of the searches of the row
 * index and of a bucket (each step a likely cache and TLB miss under nested
 * virtualisation; bench/README.md). Direct-mapped by (table, 64-byte block
 * of the address); a slot holds a row and where the next row starts, and
 * answers for any address in between. A slot is valid for the row-array
 * generation it was filled in: user space bumps unwind_rows_gen after every
 * upload (agent/sample/sampler.cc), so a range that was written again is
 * never served from the cache. Generation 0 (nothing uploaded yet) turns the
 * cache off.
 */
#define UNWIND_ROW_CACHE_SLOTS 4096
#define UNWIND_ROW_CACHE_GROUP 1024    /* slots per map element: 32 KiB, the per-CPU value limit */
#define UNWIND_ROW_CACHE_BLOCK_SHIFT 6 /* addresses of one 64-byte block share a slot */
struct row_cache_slot {
	__u32 row_end; /* the next row's pc: the slot answers for [row.pc, row_end) */
	__u32 table_start;
	__u32 gen;
	__u32 pad;
	struct unwind_row row;
};

struct row_cache_group {
	struct row_cache_slot slots[UNWIND_ROW_CACHE_GROUP];
};

/* Slots in groups: a few per-CPU values of 32 KiB (the largest allowed)
 * rather than 4096 small per-CPU allocations.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UNWIND_ROW_CACHE_SLOTS / UNWIND_ROW_CACHE_GROUP);
	__type(key, __u32);
	__type(value, struct row_cache_group);
} unwind_row_cache SEC(".maps");

__u32 unwind_rows_gen = 0;

/* The walk's state: the stack key alone (264 B) would not fit the 512-byte
 * BPF stack next to the rest. Per CPU, and the program cannot nest on one
 * CPU, so one slot per CPU is enough.
 */
struct ustack_walk {
	struct stack_key key;
	__u64 ip;
	__u64 ra_slot; /* where ip was read from (0 for frame 0) */
	__u64 sp;
	__u64 bp;
	__u32 bp_known; /* false after an RBP_LOST frame */
	__u32 tls;      /* a frame so far is in a TLS or TLS_SYMBOLS mapping */
	__u32 stop;     /* enum total_slot: why the walk ended; 0 while walking */
	__u32 gap;      /* consecutive non-TLS frames since the last TLS frame */
	__u64 map0;     /* start of frame 0's mapping (CFA_REG at frame 1) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ustack_walk);
} unwind_scratch SEC(".maps");

/* Bound on the uretprobe return instances searched per lookup (the kernel
 * keeps up to 64 per task; nested probed calls are rarely more than a few).
 */
#define UNWIND_MAX_HIJACKED 16

/* The original return address of a frame whose return-address slot a
 * uretprobe took over, or 0. A uretprobe replaces the probed call's return
 * address on the user stack with its trampoline (in the [uprobes] page, in
 * no file mapping); the kernel keeps, per task, one return_instance per
 * hijacked call, newest first, with the slot it rewrote (`stack`: sp at the
 * call's entry) and the address it replaced (`orig_ret_vaddr`, the real one
 * even for a chained instance). Any tool's uretprobes are there, the usage
 * probes' (usage.bpf.c) and another tracer's alike. The sample interrupted
 * the task in user mode, so its list is not changing under this read.
 */
static __always_inline __u64 hijacked_return(__u64 slot)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct return_instance *ri;

	if (slot == 0)
		return 0;
	ri = BPF_CORE_READ(task, utask, return_instances);
	for (int i = 0; i < UNWIND_MAX_HIJACKED; i++) {
		if (!ri)
			break;
		if (BPF_CORE_READ(ri, stack) == slot)
			return BPF_CORE_READ(ri, orig_ret_vaddr);
		ri = BPF_CORE_READ(ri, next);
	}
	return 0;
}

/* bpf_loop's callback context, on the program's stack. */
struct ustack_walk_ctx {
	struct ustack_walk *st;
	const struct unwind_proc *proc;
	struct bpf_perf_event_data *ctx; /* the sample's registers (CFA_REG) */
};

/* Binary-search steps: enough for ranges of up to 2^(n-1) entries. */
#define UNWIND_MAPPING_SEARCH_STEPS 5 /* 16 mappings */
#define UNWIND_BUCKET_SEARCH_STEPS 9  /* 256 rows (one index bucket) */
#define UNWIND_INDEX_SEARCH_STEPS 14  /* 2^13 index entries */

_Static_assert(TLSPROF_UNWIND_MAX_MAPPINGS == 1 << (UNWIND_MAPPING_SEARCH_STEPS - 1),
               "mapping search steps");
_Static_assert(TLSPROF_UNWIND_INDEX_BUCKET <= 1 << (UNWIND_BUCKET_SEARCH_STEPS - 1),
               "bucket search steps");
_Static_assert(TLSPROF_UNWIND_INDEX_LEN <= 1 << (UNWIND_INDEX_SEARCH_STEPS - 1),
               "index search steps");
_Static_assert(sizeof(struct unwind_row) == 16, "unwind_row layout");
_Static_assert(sizeof(struct row_cache_group) <= 32768, "per-CPU value limit");
_Static_assert(UNWIND_ROW_CACHE_SLOTS == 1 << 12, "the slot hash keeps 12 bits");
_Static_assert((UNWIND_ROW_CACHE_GROUP & (UNWIND_ROW_CACHE_GROUP - 1)) == 0,
               "slots are indexed with a mask");
_Static_assert((TLSPROF_UNWIND_MAX_FRAMES & (TLSPROF_UNWIND_MAX_FRAMES - 1)) == 0,
               "ips[] is indexed with a mask");

/* The mapping of the process that contains ip, or NULL. */
static __always_inline const struct unwind_mapping *find_mapping(const struct unwind_proc *proc,
                                                                 __u64 ip)
{
	const struct unwind_mapping *m;
	__u32 lo = 0, hi = proc->nr_mappings, mid;
	int k;

	if (hi > TLSPROF_UNWIND_MAX_MAPPINGS)
		hi = TLSPROF_UNWIND_MAX_MAPPINGS;
	/* The first mapping that starts above ip is mappings[lo]. */
	for (k = 0; k < UNWIND_MAPPING_SEARCH_STEPS && lo < hi; k++) {
		mid = (lo + hi) / 2;
		if (proc->mappings[mid & (TLSPROF_UNWIND_MAX_MAPPINGS - 1)].start <= ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	m = &proc->mappings[(lo - 1) & (TLSPROF_UNWIND_MAX_MAPPINGS - 1)];
	return ip < m->end ? m : NULL;
}

#define UNWIND_NO_ROW 0xffffffffu

/* The index of the last row with pc <= vaddr among rows [start, start + len),
 * or UNWIND_NO_ROW; len is at most one index bucket.
 */
static __always_inline __u32 search_row(__u32 start, __u32 len, __u64 vaddr)
{
	__u32 lo = start, hi = start + len, mid;
	const struct unwind_row *row;
	int k;

	if (vaddr > 0xffffffffULL || hi < lo || len > TLSPROF_UNWIND_INDEX_BUCKET)
		return UNWIND_NO_ROW;
	for (k = 0; k < UNWIND_BUCKET_SEARCH_STEPS && lo < hi; k++) {
		mid = lo + (hi - lo) / 2;
		row = bpf_map_lookup_elem(&unwind_rows, &mid);
		if (!row)
			return UNWIND_NO_ROW;
		if (row->pc <= vaddr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == start)
		return UNWIND_NO_ROW;
	return lo - 1;
}

/* The same for a whole table, rows [start, start + len): the index entries
 * of the buckets that start inside the table say which bucket (or the
 * table's head, before its first bucket) holds the row, and only those at
 * most 256 rows are searched.
 */
static __always_inline __u32 search_table(__u32 start, __u32 len, __u64 vaddr)
{
	__u32 end = start + len, first, lo, hi, mid;
	const __u32 *pc;
	int k;

	if (end < start || vaddr > 0xffffffffULL)
		return UNWIND_NO_ROW;
	/* The first bucket that starts inside the table. */
	first = (start + TLSPROF_UNWIND_INDEX_BUCKET - 1) >> TLSPROF_UNWIND_INDEX_SHIFT;
	if (first << TLSPROF_UNWIND_INDEX_SHIFT >= end)
		return search_row(start, len, vaddr); /* no bucket starts inside: < 256 rows */
	/* The last such bucket whose first row has pc <= vaddr. */
	lo = first;
	hi = (end + TLSPROF_UNWIND_INDEX_BUCKET - 1) >> TLSPROF_UNWIND_INDEX_SHIFT;
	for (k = 0; k < UNWIND_INDEX_SEARCH_STEPS && lo < hi; k++) {
		mid = lo + (hi - lo) / 2;
		pc = bpf_map_lookup_elem(&unwind_row_index, &mid);
		if (!pc)
			return UNWIND_NO_ROW;
		if (*pc <= vaddr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == first) {
		/* Before the first bucket: the table's head, if it has one. */
		lo = start;
		hi = first << TLSPROF_UNWIND_INDEX_SHIFT;
	} else {
		lo = (lo - 1) << TLSPROF_UNWIND_INDEX_SHIFT;
		hi = lo + TLSPROF_UNWIND_INDEX_BUCKET;
		if (hi > end)
			hi = end;
	}
	return search_row(lo, hi - lo, vaddr);
}

/* search_table() through the per-CPU cache: copies the row to *out and
 * returns 1, or returns 0. A global function, so the verifier checks it once
 * on its own instead of inside every path of the walk's step (inlined there,
 * the searches and the cache multiplied the program's load time by four).
 */
__noinline int find_row(__u32 start, __u32 len, __u64 vaddr, struct unwind_row *out)
{
	struct row_cache_slot *slot = NULL;
	struct row_cache_group *group;
	const struct unwind_row *row, *next_row;
	__u32 gen = unwind_rows_gen, idx, g, found, next, end;

	if (!out)
		return 0;
	if (vaddr <= 0xffffffffULL && gen != 0) {
		/* Fibonacci hashing of (table, 64-byte block of the address) to a
		 * slot, which answers for its row's whole range: a leaf's IP that
		 * moves through a hot loop from sample to sample hits it.
		 */
		idx = (__u32)((((vaddr >> UNWIND_ROW_CACHE_BLOCK_SHIFT) | (__u64)start << 32) *
		               0x9E3779B97F4A7C15ULL) >>
		              52);
		g = idx / UNWIND_ROW_CACHE_GROUP;
		group = bpf_map_lookup_elem(&unwind_row_cache, &g);
		if (group)
			slot = &group->slots[idx & (UNWIND_ROW_CACHE_GROUP - 1)];
		if (slot && slot->gen == gen && slot->table_start == start &&
		    slot->row.pc <= vaddr && vaddr < slot->row_end) {
			*out = slot->row;
			return 1;
		}
	}
	total_inc(TOTAL_UNWIND_ROW_SEARCHES);
	found = search_table(start, len, vaddr);
	if (found == UNWIND_NO_ROW)
		return 0;
	row = bpf_map_lookup_elem(&unwind_rows, &found);
	if (!row)
		return 0;
	*out = *row;
	if (slot) {
		/* The row holds up to the next one of its table, or to the end. */
		end = 0xffffffff;
		next = found + 1;
		if (next < start + len) {
			next_row = bpf_map_lookup_elem(&unwind_rows, &next);
			if (!next_row)
				return 1;
			end = next_row->pc;
		}
		slot->row_end = end;
		slot->table_start = start;
		slot->gen = gen;
		slot->row = *row;
	}
	return 1;
}

static __always_inline bool read_user_word(__u64 addr, __u64 *out)
{
	return bpf_probe_read_user(out, sizeof(*out), (const void *)addr) == 0;
}

/* The saved RBP at addr and the return address above it, in one read: the
 * common frame (push rbp, or frame pointers) costs one helper call, not two.
 */
static __always_inline bool read_user_bp_ra(__u64 addr, __u64 *bp, __u64 *ra)
{
	__u64 pair[2];

	if (bpf_probe_read_user(pair, sizeof(pair), (const void *)addr))
		return false;
	*bp = pair[0];
	*ra = pair[1];
	return true;
}

/* A general register of the sample by x86-64 DWARF number (0 rax, 1 rdx,
 * 2 rcx, 3 rbx, 4 rsi, 5 rdi, 8-15 r8-r15); false for any other number.
 * The verifier only takes 8-byte perf-reg loads at a constant offset from
 * the unmodified ctx pointer; clang would merge the cases into one load
 * from ctx + variable, so each case is its own load in inline asm.
 */
#define SAMPLE_REG(field)                                                                       \
	({                                                                                      \
		__u64 __v;                                                                      \
		asm volatile("%[v] = *(u64 *)(%[c] + %[off])"                                   \
		             : [v] "=r"(__v)                                                    \
		             : [c] "r"(ctx), [off] "i"(__builtin_offsetof(                      \
		                                     struct bpf_perf_event_data, regs.field))); \
		__v;                                                                            \
	})
static __always_inline bool sample_reg(struct bpf_perf_event_data *ctx, __u32 reg, __u64 *out)
{
	switch (reg) {
	case 0:
		*out = SAMPLE_REG(ax);
		break;
	case 1:
		*out = SAMPLE_REG(dx);
		break;
	case 2:
		*out = SAMPLE_REG(cx);
		break;
	case 3:
		*out = SAMPLE_REG(bx);
		break;
	case 4:
		*out = SAMPLE_REG(si);
		break;
	case 5:
		*out = SAMPLE_REG(di);
		break;
	case 8:
		*out = SAMPLE_REG(r8);
		break;
	case 9:
		*out = SAMPLE_REG(r9);
		break;
	case 10:
		*out = SAMPLE_REG(r10);
		break;
	case 11:
		*out = SAMPLE_REG(r11);
		break;
	case 12:
		*out = SAMPLE_REG(r12);
		break;
	case 13:
		*out = SAMPLE_REG(r13);
		break;
	case 14:
		*out = SAMPLE_REG(r14);
		break;
	case 15:
		*out = SAMPLE_REG(r15);
		break;
	default:
		return false;
	}
	return true;
}
#undef SAMPLE_REG

static __always_inline long unwind_stop(struct ustack_walk *st, __u32 reason)
{
	st->stop = reason;
	return 1; /* ends bpf_loop */
}

/* One frame: records st->ip, then finds the caller's registers. */
/* Called for a frame that is not TLS code; true when the walk should stop.
 * Before any TLS frame: after the first walk's frames (the sample needs no
 * stack). After TLS frames: once TLSPROF_UNWIND_GAP frames in a row are
 * outside TLS code, the walk has left the library (into nginx, node, the
 * application), and nothing further out changes bucket, algorithm or phase;
 * short gaps (libc's qsort calling back into libcrypto) are crossed.
 */
static __always_inline bool outside_tls(struct ustack_walk *st, __u32 n)
{
	if (!st->tls)
		return n + 1 >= TLSPROF_UNWIND_FIRST_WALK;
	st->gap++;
	return st->gap > TLSPROF_UNWIND_GAP;
}

static long unwind_step(__u32 i, struct ustack_walk_ctx *w)
{
	struct ustack_walk *st = w->st;
	const struct unwind_proc *proc = w->proc;
	const struct unwind_mapping *m;
	const struct unwind_row *row;
	struct unwind_row row_buf;
	__u64 lookup, cfa, ra, bp, slot = 0;
	__u32 n;

	if (!st || !proc)
		return 1;
	if (st->ip == 0)
		return unwind_stop(st, TOTAL_UNWIND_STOP_ZERO_IP);
	n = st->key.nr_frames;
	if (n >= TLSPROF_UNWIND_MAX_FRAMES)
		return unwind_stop(st, TOTAL_UNWIND_STOP_MAX_FRAMES);
	st->key.ips[n & (TLSPROF_UNWIND_MAX_FRAMES - 1)] = st->ip;
	st->key.nr_frames = n + 1;

	/* A return address points after the call, maybe past the caller's end. */
	lookup = n == 0 ? st->ip : st->ip - 1;
	m = find_mapping(proc, lookup);
	if (!m) {
		/* A uretprobe's trampoline: the call's real return address. */
		__u64 ret = hijacked_return(st->ra_slot);

		if (!ret)
			return unwind_stop(st, TOTAL_UNWIND_STOP_NO_MAPPING);
		st->ip = ret;
		st->key.ips[n & (TLSPROF_UNWIND_MAX_FRAMES - 1)] = ret;
		lookup = ret - 1;
		m = find_mapping(proc, lookup);
		if (!m)
			return unwind_stop(st, TOTAL_UNWIND_STOP_NO_MAPPING);
	}
	/* Only samples that need a stack get one: past the first walk, a stack
	 * with no TLS frame yet is abandoned.
	 */
	if (m->flags & UNWIND_MAPPING_TLS) {
		st->tls = 1;
		st->gap = 0;
	} else if ((m->flags & UNWIND_MAPPING_TLS_SYMBOLS) &&
	           (m->table_len == 0 || (m->flags & UNWIND_MAPPING_FP))) {
		st->tls = 1; /* Go: no rows to tell TLS symbols apart */
		st->gap = 0;
	} else if (!(m->flags & UNWIND_MAPPING_TLS_SYMBOLS) && outside_tls(st, n)) {
		return unwind_stop(st, st->tls ? TOTAL_UNWIND_STOP_END : TOTAL_UNWIND_NOT_TLS);
	}

	bp = st->bp;
	if (m->table_len == 0 || (m->flags & UNWIND_MAPPING_FP)) {
		if (!st->bp_known)
			return unwind_stop(st, TOTAL_UNWIND_STOP_BP_UNKNOWN);
		if (!read_user_bp_ra(st->bp, &bp, &ra))
			return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
		cfa = st->bp + 16;
		slot = st->bp + 8;
	} else {
		row = find_row(m->table_start, m->table_len, lookup - m->bias, &row_buf) ? &row_buf
		                                                                         : NULL;
		if (!row)
			return unwind_stop(st, TOTAL_UNWIND_STOP_NO_ROW);
		/* A static link (node): only rows inside TLS symbols are TLS code,
		 * so node's own code gets the cheap first walk, not a full one.
		 */
		if (m->flags & UNWIND_MAPPING_TLS_SYMBOLS) {
			if (row->flags & UNWIND_ROW_TLS) {
				st->tls = 1;
				st->gap = 0;
			} else if (!st->tls) {
				/* The application's own code (node, V8's builtins),
				 * not a library leaf called from TLS code: no walk.
				 */
				return unwind_stop(st, TOTAL_UNWIND_NOT_TLS);
			} else if (outside_tls(st, n)) {
				return unwind_stop(st, st->tls ? TOTAL_UNWIND_STOP_END
				                               : TOTAL_UNWIND_NOT_TLS);
			}
		}
		switch (row->cfa_kind) {
		case CFA_RSP:
			cfa = st->sp + (__s64)row->cfa_off;
			break;
		case CFA_RBP:
			if (!st->bp_known)
				return unwind_stop(st, TOTAL_UNWIND_STOP_BP_UNKNOWN);
			cfa = st->bp + (__s64)row->cfa_off;
			break;
		case CFA_RSP_DEREF:
			/* The slot may lie below RSP (perlasm uses the red zone). */
			if (!read_user_word(st->sp + (__s64)row->cfa_off, &cfa))
				return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
			cfa += (__s64)row->deref_add;
			break;
		case CFA_PLT:
			cfa = st->sp + 8 + ((st->ip & 15) >= 11 ? 8 : 0);
			break;
		case CFA_REG:
			/* The sample's register holds at frame 0, and at frame 1
			 * below a leaf of the same file (perlasm convention).
			 */
			if (!(n == 0 || (n <= UNWIND_CFA_REG_MAX_FRAME && m->start == st->map0)) ||
			    !w->ctx || !sample_reg(w->ctx, row->reg, &cfa))
				return unwind_stop(st, TOTAL_UNWIND_STOP_REG_UNKNOWN);
			cfa += (__s64)row->cfa_off;
			if (cfa <= st->sp || cfa - st->sp > UNWIND_CFA_REG_MAX_DIST || (cfa & 7))
				return unwind_stop(st, TOTAL_UNWIND_STOP_REG_UNKNOWN);
			break;
		case CFA_RSP_REG_DEREF: {
			__u64 index;

			if (!(n == 0 || (n <= UNWIND_CFA_REG_MAX_FRAME && m->start == st->map0)) ||
			    !w->ctx || !sample_reg(w->ctx, row->reg, &index))
				return unwind_stop(st, TOTAL_UNWIND_STOP_REG_UNKNOWN);
			if (!read_user_word(st->sp + (__s64)row->cfa_off + index * 8, &cfa))
				return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
			cfa += (__s64)row->deref_add;
			if (cfa <= st->sp || cfa - st->sp > UNWIND_CFA_REG_MAX_DIST || (cfa & 7))
				return unwind_stop(st, TOTAL_UNWIND_STOP_REG_UNKNOWN);
			break;
		}
		case CFA_END:
			return unwind_stop(st, TOTAL_UNWIND_STOP_END);
		default:
			return unwind_stop(st, TOTAL_UNWIND_STOP_CFA_NONE);
		}
		slot = cfa - 8;
		if (row->rbp_kind == RBP_AT_CFA && row->rbp_off == -16) {
			if (!read_user_bp_ra(cfa - 16, &bp, &ra))
				return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
			st->bp_known = 1;
		} else {
			if (!read_user_word(cfa - 8, &ra))
				return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
			if (row->rbp_kind == RBP_AT_CFA) {
				if (!read_user_word(cfa + (__s64)row->rbp_off, &bp))
					return unwind_stop(st, TOTAL_UNWIND_STOP_UNREADABLE);
				st->bp_known = 1;
			} else if (row->rbp_kind == RBP_LOST) {
				st->bp_known = 0;
			}
		}
	}
	/* A non-growing SP would loop. */
	if (cfa <= st->sp)
		return unwind_stop(st, TOTAL_UNWIND_STOP_NOT_GROWING);
	if (n == 0)
		st->map0 = m->start;
	st->ip = ra;
	st->ra_slot = slot;
	st->sp = cfa;
	st->bp = bp;
	return 0;
}

/* Walks the stack of a user-mode sample of a registered process and counts
 * it; returns the frames visited.
 */
static __always_inline __u32 walk_and_count(struct bpf_perf_event_data *ctx, __u32 tgid,
                                            const struct unwind_proc *proc, __u32 set)
{
	bool counted;
	struct ustack_walk_ctx walk;
	struct ustack_walk *st;
	__u32 zero = 0;

	st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!st)
		return 0;
	/* Equal stacks must give equal keys: unused ips are zero. */
	__builtin_memset(&st->key, 0, sizeof(st->key));
	st->key.tgid = tgid;
	st->ip = ctx->regs.ip;
	st->ra_slot = 0;
	st->sp = ctx->regs.sp;
	st->bp = ctx->regs.bp;
	st->bp_known = 1;
	st->tls = 0;
	st->gap = 0;
	st->stop = 0;
	st->map0 = 0;

	walk.st = st;
	walk.proc = proc;
	walk.ctx = ctx;
	/* One more step than frames: the last one only finds out that more
	 * frames were left (TOTAL_UNWIND_STOP_MAX_FRAMES).
	 */
	bpf_loop(TLSPROF_UNWIND_MAX_FRAMES + 1, unwind_step, &walk, 0);

	if (!st->tls) {
		total_inc(TOTAL_UNWIND_NOT_TLS);
		return st->key.nr_frames;
	}
	counted = set ? key_inc(&samples_by_stack_1, &st->key)
	              : key_inc(&samples_by_stack_0, &st->key);
	if (!counted) {
		total_inc(TOTAL_DROPPED_STACK);
		return st->key.nr_frames;
	}
	total_inc(TOTAL_UNWOUND);
	if (st->stop)
		total_inc(st->stop);
	return st->key.nr_frames;
}

/* Unwinds a user-mode sample of tgid if user space registered the process,
 * and accounts for the walk's cost.
 */
static __always_inline void unwind_sample(struct bpf_perf_event_data *ctx, __u32 tgid, __u32 set)
{
	const struct unwind_proc *proc = bpf_map_lookup_elem(&unwind_procs, &tgid);
	__u64 t0;
	__u32 frames;

	if (!proc)
		return;
	t0 = bpf_ktime_get_ns();
	frames = walk_and_count(ctx, tgid, proc, set);
	total_add(TOTAL_UNWIND_NS, bpf_ktime_get_ns() - t0);
	total_inc(TOTAL_UNWIND_WALKS);
	total_add(TOTAL_UNWIND_FRAMES, frames);
}

SEC("perf_event")
int sample_cpu(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	/* Once per run: the whole sample goes to one set (see window_set). */
	__u32 set = *(volatile __u32 *)&window_set & 1;
	struct sample_key key;
	bool user, counted;

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
	counted = set ? key_inc(&samples_by_ip_1, &key) : key_inc(&samples_by_ip_0, &key);
	if (!counted)
		total_inc(TOTAL_DROPPED_IP);
	unwind_sample(ctx, tgid, set);
	return 0;
}
