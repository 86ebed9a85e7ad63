// SPDX-License-Identifier: GPL-2.0
/* Usage telemetry: handshake counts by negotiated parameters, and the on-CPU
 * latency of public-key operations. Every program here is a uprobe (or
 * uretprobe) on a function that runs once per handshake call or once per
 * signature / key exchange, attached once per library file for every process
 * (pid -1), never on a per-record function. The cookie of each attachment
 * says which library layout (where the fields are) and which function.
 *
 * On-CPU time: sched_switch marks when a thread inside a timed operation is
 * switched out and back in, and that time is taken off the operation's.
 *
 * Nothing read here is secret: protocol version, cipher suite id, key type
 * ids and output lengths. Signature, key and secret bytes are never read.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "usage.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, USAGE_MAX_LIBS);
	__type(key, __u32);
	__type(value, struct lib_layout);
} lib_layouts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_HANDSHAKE_KEYS);
	__type(key, struct handshake_key);
	__type(value, struct handshake_count);
} handshakes_by_params SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_OP_KEYS);
	__type(key, struct op_key);
	__type(value, struct op_latency);
} op_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UTOTAL_NR_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} usage_totals SEC(".maps");

/* A thread inside a timed operation (by tid). */
struct inflight_op {
	__u64 start_ns;
	__u64 off_cpu_ns;
	__u64 switched_out_ns; /* 0 while on CPU */
	__u64 ctx;             /* the MD_CTX / PKEY_CTX argument */
	__u64 out;             /* output buffer (NULL: a size query) */
	__u64 len;             /* the size_t * (sign, derive) or the length */
	__u64 g;               /* Go: the goroutine (R14); its operation is in go_ops */
	__u64 weight;          /* what it stands for, taken at its start (0: outside the gate) */
	__u32 depth;           /* nested probed calls inside this one */
	__u16 lib;
	__u8 probe;
	__u8 insn; /* enum usage_insn_class */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_INFLIGHT);
	__type(key, __u32);
	__type(value, struct inflight_op);
} inflight_ops SEC(".maps");

/* Threads inside SSL_do_handshake (by tid): which SSL. */
struct thread_handshake {
	__u64 ssl;
	__u32 depth;
	__u16 lib;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_INFLIGHT);
	__type(key, __u32);
	__type(value, struct thread_handshake);
} thread_handshakes SEC(".maps");

/* Handshakes under way, across the SSL_do_handshake calls of a non-blocking
 * server: what their operations showed. LRU, so handshakes that never end
 * (a client that went away) age out.
 */
struct open_handshake_key {
	__u32 tgid;
	__u32 pad;
	__u64 ssl;
};

struct open_handshake {
	__u32 kx_type;
	__u32 kx_len;
	__u32 peer_type; /* the key a verify in the handshake used */
	__u32 sig_len;   /* of the handshake's sign (server) or verify (client) */
	__u32 started;   /* a step of it began in the state before any handshake */
	__u32 sign_type; /* the key a sign in the handshake used (Go: the server's own) */
	__u64 weight;    /* what it stands for, taken when it began (0: outside the gate) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, USAGE_MAX_OPEN_HANDSHAKES);
	__type(key, struct open_handshake_key);
	__type(value, struct open_handshake);
} open_handshakes SEC(".maps");

/* Go handshakes under way, by goroutine: which Conn. A goroutine parks and
 * moves between threads during its handshake (network reads), so the g
 * pointer (R14) is the key, not the thread. LRU: a goroutine that panicked
 * out of a handshake never reaches a RET.
 */
struct go_key {
	__u32 tgid;
	__u32 pad;
	__u64 g;
};

struct go_handshake {
	__u64 conn;
	__u16 lib;
	__u8 is_server;
	__u8 pad[5];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, USAGE_MAX_OPEN_HANDSHAKES);
	__type(key, struct go_key);
	__type(value, struct go_handshake);
} go_handshakes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_LIVE_CONNECTIONS);
	__type(key, struct live_key);
	__type(value, struct live_connection);
} live_connections SEC(".maps");

/* The sum of live_connections' weights by process and library. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_LIVE_PROCESSES);
	__type(key, struct live_process_key);
	__type(value, __s64);
} live_by_process SEC(".maps");

/* Operations in flight on the whole host: sched_switch does nothing while
 * this is zero, which is nearly always.
 */
__u64 inflight_count = 0;

/* The probe pair's own time inside each timed call, by the class of the
 * function's first instruction; set by user space after calibrating (0
 * while it calibrates).
 */
__u64 probe_overhead_ns[INSN_NR] = {};

/* What an event counted now stands for, in USAGE_SCALE_ONE units: set by
 * user space from the duty cycle's share (1 / share).
 */
__u64 scale_milli = USAGE_SCALE_ONE;

/* The duty cycle's counting window (bpf_ktime_get_ns): events that begin
 * outside it are not counted, even when the probes are still attached (the
 * grace after a phase, a detach late because the agent's thread waited for
 * a CPU), so each cycle counts exactly the time its weight is for. Always
 * open without a budget.
 */
__u64 gate_open_ns = 0;
__u64 gate_close_ns = ~0ull;

static __always_inline bool gate_open(void)
{
	__u64 now = bpf_ktime_get_ns();

	return now >= gate_open_ns && now < gate_close_ns;
}

/* What a handshake or an operation beginning now stands for: 0 outside the
 * gate. Taken at the start, so that one begun inside the on-phase counts
 * even when it ends after the phase's close (the probes stay attached a
 * grace period beyond it), and one begun before the probes came on never
 * does: each counts by when it began, with no loss at the phase's edges.
 */
static __always_inline __u64 gate_weight(void)
{
	return gate_open() ? scale_milli : 0;
}

/* A new op_latency value: too big for the BPF stack. Never written. */
const volatile struct op_latency zero_latency = {};

static __always_inline void add_total(__u32 slot, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&usage_totals, &slot);

	if (v)
		*v += n;
}

static __always_inline void count_total(__u32 slot)
{
	add_total(slot, 1);
}

_Static_assert(UTOTAL_CALLS_GO - UTOTAL_CALLS_PUSH == INSN_GO && INSN_GO + 1 == INSN_NR,
               "one slot per class");

/* A probed call's entry: counted by the class of its first instruction. */
static __always_inline void count_call(__u32 insn)
{
	if (insn < INSN_NR)
		count_total(UTOTAL_CALLS_PUSH + insn);
}

/* Follows a field_path from `base`; USAGE_UNKNOWN when the path is unknown,
 * `base` is NULL or a pointer on the way is unreadable; `if_null` where a
 * pointer on the way (loaded from the object) is NULL.
 */
static __always_inline __u32 read_field_or(const struct lib_layout *layout, __u32 field, __u64 base,
                                           __u32 if_null)
{
	const struct field_path *path;
	__u64 p = base;
	__u32 n;

	if (!layout || field >= FIELD_NR)
		return USAGE_UNKNOWN;
	path = &layout->field[field];
	n = path->n;
	if (n == 0 || n > USAGE_MAX_LOADS)
		return USAGE_UNKNOWN;
	if (path->type_guard) {
		__u32 type = 1;

		if (base == 0)
			return USAGE_UNKNOWN;
		if (bpf_probe_read_user(&type, sizeof(type), (void *)base)) {
			count_total(UTOTAL_READ_ERRORS);
			return USAGE_UNKNOWN;
		}
		if (type != 0)
			return USAGE_UNKNOWN;
	}
#pragma unroll
	for (__u32 i = 0; i < USAGE_MAX_LOADS; i++) {
		bool last = i + 1 == n;

		if (i >= n)
			break;
		if (p == 0)
			return i == 0 ? USAGE_UNKNOWN : if_null;
		p += (__s64)path->off[i];
		if (last) {
			__u64 v = 0;
			long err;

			switch (path->width) {
			case 1:
				err = bpf_probe_read_user(&v, 1, (void *)p);
				break;
			case 2:
				err = bpf_probe_read_user(&v, 2, (void *)p);
				break;
			case 4:
				err = bpf_probe_read_user(&v, 4, (void *)p);
				break;
			default:
				err = bpf_probe_read_user(&v, 8, (void *)p);
				break;
			}
			if (err) {
				count_total(UTOTAL_READ_ERRORS);
				return USAGE_UNKNOWN;
			}
			if (path->shift || path->bits) {
				v >>= path->shift & 63;
				if (path->bits)
					v &= (1ull << (path->bits & 63)) - 1;
			}
			if (path->invert)
				v = !v;
			return (__u32)v;
		}
		if (bpf_probe_read_user(&p, sizeof(p), (void *)p)) {
			count_total(UTOTAL_READ_ERRORS);
			return USAGE_UNKNOWN;
		}
	}
	return USAGE_UNKNOWN;
}

/* Follows a field_path from `base`; USAGE_UNKNOWN when the path is unknown
 * or a pointer on the way is NULL or unreadable.
 */
static __always_inline __u32 read_field(const struct lib_layout *layout, __u32 field, __u64 base)
{
	return read_field_or(layout, field, base, USAGE_UNKNOWN);
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xffffffff) << 5;
	v >>= shift;
	r |= shift;
	shift = (v > 0xffff) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xff) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xf) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

/* The histogram slot of `ns` (see USAGE_SUB_BITS in usage.h). */
static __always_inline __u32 hist_slot(__u64 ns)
{
	__u32 octave, sub, slot;

	if (ns < USAGE_SUB_BUCKETS)
		return (__u32)ns;
	octave = log2_u64(ns) - USAGE_SUB_BITS + 1;
	sub = (ns >> (octave - 1)) & (USAGE_SUB_BUCKETS - 1);
	slot = octave * USAGE_SUB_BUCKETS + sub;
	if (slot >= USAGE_HIST_SLOTS)
		slot = USAGE_HIST_SLOTS - 1;
	return slot;
}

/* The length of an ECDH public share on the wire, from the key type and the
 * shared secret's length: X25519 32, P-256 65, P-384 97 (uncompressed
 * points); 0 for others.
 */
static __always_inline __u32 ecdh_share_len(__u32 type, __u32 secret_len)
{
	if (type == USAGE_KEY_X25519)
		return 32;
	if (type == USAGE_KEY_EC)
		return secret_len == 32 ? 65 : secret_len == 48 ? 97 : 0;
	return 0;
}

/* A pure ML-KEM (or Kyber) ciphertext's length (-512, -768, -1024). */
static __always_inline bool ml_kem_ciphertext(__u32 len)
{
	return len == 768 || len == 1088 || len == 1568;
}

static __always_inline bool is_kem(__u32 type)
{
	return type == USAGE_KEY_KEM || type == USAGE_KEY_KYBER;
}

/* What a key exchange tells its handshake: the group. A library that runs
 * a hybrid group's halves as separate calls (Go: ML-KEM-768's encapsulate
 * and X25519's ECDH, in either order) gives a handshake an ML-KEM and an
 * ECDH: its group is their hybrid, named as a KEM whose ciphertext holds
 * both (1088 + 32: X25519MLKEM768; + 65: SecP256r1MLKEM768; BoringSSL's
 * Kyber draft likewise). OpenSSL's hybrid is one KEM call already (its
 * halves nest inside, untimed).
 */
static __always_inline void handshake_key_exchange(struct open_handshake *open, __u32 type,
                                                   __u32 len)
{
	__u32 share;

	if (is_kem(type) && ml_kem_ciphertext(len) && open->kx_type && !is_kem(open->kx_type)) {
		share = ecdh_share_len(open->kx_type, open->kx_len);
		if (share) {
			open->kx_type = type;
			open->kx_len = len + share;
			return;
		}
	}
	if (!is_kem(type) && is_kem(open->kx_type) && ml_kem_ciphertext(open->kx_len)) {
		share = ecdh_share_len(type, len);
		if (share) {
			open->kx_len += share;
			return;
		}
	}
	open->kx_type = type;
	open->kx_len = len;
}

/* Counts one completed operation in op_latency, and in the handshake it
 * belongs to (`handshake`: its SSL * or Go Conn, 0 for none): a derive gives
 * the handshake's group, a sign the key it signed with, a verify the peer's.
 */
static __always_inline void account_op(struct op_key *key, __u64 cpu, __u64 wall, __u64 handshake,
                                       __u64 weight)
{
	struct op_latency *lat;
	__u32 slot;

	/* What the handshake learns from it counts whenever the operation ran
	 * (the handshake may have begun inside the gate); the operation itself
	 * only if it began inside.
	 */
	if (handshake) {
		struct open_handshake_key okey = { .tgid = key->tgid, .ssl = handshake };
		struct open_handshake *open, fresh = {};

		key->in_handshake = 1;
		open = bpf_map_lookup_elem(&open_handshakes, &okey);
		if (!open) {
			bpf_map_update_elem(&open_handshakes, &okey, &fresh, BPF_NOEXIST);
			open = bpf_map_lookup_elem(&open_handshakes, &okey);
		}
		if (open) {
			if (key->op == USAGE_OP_DERIVE) {
				handshake_key_exchange(open, key->key_type, key->len);
			} else if (key->op == USAGE_OP_SIGN) {
				open->sign_type = key->key_type;
				open->sig_len = key->len;
			} else {
				open->peer_type = key->key_type;
				open->sig_len = key->len;
			}
		}
	}
	if (!weight) {
		count_total(UTOTAL_OUTSIDE_GATE);
		return;
	}

	lat = bpf_map_lookup_elem(&op_latency, key);
	if (!lat) {
		bpf_map_update_elem(&op_latency, key, (const void *)&zero_latency, BPF_NOEXIST);
		lat = bpf_map_lookup_elem(&op_latency, key);
		if (!lat) {
			count_total(UTOTAL_DROPPED_KEYS);
			return;
		}
	}
	slot = hist_slot(cpu);
	__sync_fetch_and_add(&lat->count, 1);
	__sync_fetch_and_add(&lat->weighted, weight);
	__sync_fetch_and_add(&lat->cpu_ns, cpu);
	__sync_fetch_and_add(&lat->wall_ns, wall);
	if (slot < USAGE_HIST_SLOTS)
		__sync_fetch_and_add(&lat->slots[slot], 1);
}

/* A connection whose handshake completed is live until its end probe. */
static __always_inline void connection_begins(__u32 tgid, __u32 lib, __u64 conn, __u64 weight)
{
	struct live_key key = { .tgid = tgid, .conn = conn };
	struct live_connection value = { .weighted = weight, .lib = lib };
	struct live_process_key pkey = { .tgid = tgid, .lib = lib };
	__s64 *sum, first;

	/* An object that handshakes again (a TLS 1.2 renegotiation, a reused
	 * SSL) is one connection.
	 */
	if (bpf_map_update_elem(&live_connections, &key, &value, BPF_NOEXIST)) {
		if (!bpf_map_lookup_elem(&live_connections, &key))
			count_total(UTOTAL_LIVE_FULL);
		return;
	}
	sum = bpf_map_lookup_elem(&live_by_process, &pkey);
	if (sum) {
		__sync_fetch_and_add(sum, (__s64)value.weighted);
		return;
	}
	first = (__s64)value.weighted;
	if (bpf_map_update_elem(&live_by_process, &pkey, &first, BPF_NOEXIST)) {
		sum = bpf_map_lookup_elem(&live_by_process, &pkey);
		if (sum)
			__sync_fetch_and_add(sum, (__s64)value.weighted);
	}
}

/* Counts a completed handshake of `ssl` (an SSL * or a Go Conn) by its
 * negotiated parameters: the fields the layout says where to read, and what
 * its operations showed (`open`, may be NULL). `is_server`: 0 or 1 when the
 * probed function says it, else USAGE_UNKNOWN (read the field).
 */
static __always_inline void count_handshake(__u32 tgid, __u32 lib, __u64 ssl,
                                            const struct lib_layout *layout,
                                            const struct open_handshake *open, __u32 is_server)
{
	struct handshake_key key = {};
	struct handshake_count *count, first = { .count = 1 };
	__u32 v;

	/* Seen from its start: the weight then; else (a library whose state
	 * is unknown) whether it completes inside the gate.
	 */
	first.weighted = open && open->started ? open->weight : gate_weight();
	if (!first.weighted) {
		count_total(UTOTAL_OUTSIDE_GATE);
		return;
	}
	count_total(UTOTAL_HANDSHAKES);
	add_total(UTOTAL_HANDSHAKES_WEIGHTED, first.weighted);
	connection_begins(tgid, lib, ssl, first.weighted);
	key.tgid = tgid;
	key.lib = lib;
	v = read_field(layout, FIELD_SSL_VERSION, ssl);
	key.version = v == USAGE_UNKNOWN ? 0xffff : (__u16)v;
	v = read_field(layout, FIELD_SSL_CIPHER, ssl);
	key.cipher = v == USAGE_UNKNOWN ? 0xffff : (__u16)v;
	v = is_server == USAGE_UNKNOWN ? read_field(layout, FIELD_SSL_IS_SERVER, ssl) : is_server;
	key.is_server = v == USAGE_UNKNOWN ? 0xff : (v != 0);
	v = read_field(layout, FIELD_SSL_RESUMED, ssl);
	key.resumed = v == USAGE_UNKNOWN ? 0xff : (v != 0);
	if (open) {
		key.kx_type = open->kx_type;
		key.kx_len = open->kx_len;
		key.sig_len = open->sig_len;
	}
	/* No key derivation seen (BoringSSL's P-256 key shares derive with no
	 * probed function): the group the library says it negotiated. Not for
	 * a TLS 1.2 resumption, which exchanges no key (BoringSSL answers the
	 * group of the handshake that made the session).
	 */
	if (!key.kx_type && layout && layout->field[FIELD_SSL_GROUP].n &&
	    (key.resumed == 0 || key.version == 0x0304)) {
		v = read_field(layout, FIELD_SSL_GROUP, ssl);
		if (v != USAGE_UNKNOWN && v != 0)
			key.kx_type = USAGE_KX_TLS_GROUP | (v & 0xffff);
	}
	if (key.is_server == 1) {
		/* The library's own key where the layout reaches it (OpenSSL);
		 * else the key the handshake signed with (Go; none if resumed).
		 */
		if (layout && layout->field[FIELD_SSL_KEY_TYPE].n)
			key.cert_type = read_field(layout, FIELD_SSL_KEY_TYPE, ssl);
		else if (open)
			key.cert_type = open->sign_type;
	} else if (open && open->peer_type) {
		key.cert_type = open->peer_type;
	}

	count = bpf_map_lookup_elem(&handshakes_by_params, &key);
	if (count) {
		__sync_fetch_and_add(&count->count, 1);
		__sync_fetch_and_add(&count->weighted, first.weighted);
	} else if (bpf_map_update_elem(&handshakes_by_params, &key, &first, BPF_NOEXIST)) {
		count = bpf_map_lookup_elem(&handshakes_by_params, &key);
		if (count) {
			__sync_fetch_and_add(&count->count, 1);
			__sync_fetch_and_add(&count->weighted, first.weighted);
		} else {
			count_total(UTOTAL_DROPPED_KEYS);
		}
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(usage_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct inflight_op *op;
	__u32 tid;
	__u64 now;

	count_total(UTOTAL_SWITCHES);
	if (inflight_count == 0)
		return 0;
	now = bpf_ktime_get_ns();
	tid = prev->pid;
	op = bpf_map_lookup_elem(&inflight_ops, &tid);
	if (op && op->switched_out_ns == 0)
		op->switched_out_ns = now;
	tid = next->pid;
	op = bpf_map_lookup_elem(&inflight_ops, &tid);
	if (op && op->switched_out_ns) {
		op->off_cpu_ns += now - op->switched_out_ns;
		op->switched_out_ns = 0;
	}
	return 0;
}

static __always_inline int handshake_enter(struct pt_regs *ctx, void *ssl)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_handshake *cur, fresh = {};

	const struct lib_layout *layout;
	__u32 lib;

	count_total(UTOTAL_HITS);
	count_total(UTOTAL_HANDSHAKE_CALLS);
	count_call(USAGE_COOKIE_INSN(cookie));
	cur = bpf_map_lookup_elem(&thread_handshakes, &tid);
	if (cur && cur->ssl == (__u64)ssl) {
		/* SSL_accept and SSL_connect tail-call SSL_do_handshake (OpenSSL
		 * 3.0): both probes fire, on the same SSL. Another SSL means the
		 * entry is stale (the thread left the call without returning).
		 */
		cur->depth++;
		return 0;
	}
	fresh.ssl = (__u64)ssl;
	fresh.lib = USAGE_COOKIE_LIB(cookie);
	bpf_map_update_elem(&thread_handshakes, &tid, &fresh, BPF_ANY);

	/* A step that starts from the state before any handshake begins a new
	 * one (a reused SSL, or one at a freed one's address, starts afresh).
	 * Steps that start later, e.g. an SSL_read taking in a TLS 1.3 session
	 * ticket after the handshake, complete nothing new.
	 */
	lib = fresh.lib;
	layout = bpf_map_lookup_elem(&lib_layouts, &lib);
	if (read_field(layout, FIELD_SSL_STATE, (__u64)ssl) == 0) {
		struct open_handshake_key okey = { .tgid = bpf_get_current_pid_tgid() >> 32,
			                           .ssl = (__u64)ssl };
		struct open_handshake begun = { .started = 1, .weight = gate_weight() };

		bpf_map_update_elem(&open_handshakes, &okey, &begun, BPF_ANY);
	} else if (read_field(layout, FIELD_SSL_IN_INIT, (__u64)ssl) == 1) {
		/* BoringSSL (no state field): a step while the handshake runs
		 * (a new SSL is in init from the start); the first one begins
		 * it, the later ones keep what it saw.
		 */
		struct open_handshake_key okey = { .tgid = bpf_get_current_pid_tgid() >> 32,
			                           .ssl = (__u64)ssl };
		struct open_handshake begun = { .started = 1, .weight = gate_weight() }, *open;

		open = bpf_map_lookup_elem(&open_handshakes, &okey);
		if (open && !open->started) {
			open->started = 1;
			open->weight = begun.weight;
		} else if (!open)
			bpf_map_update_elem(&open_handshakes, &okey, &begun, BPF_NOEXIST);
	}
	return 0;
}

static __always_inline int handshake_exit(struct pt_regs *ctx, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct open_handshake_key okey = {};
	struct open_handshake *open;
	struct thread_handshake *cur;
	const struct lib_layout *layout;
	__u32 lib;
	__u64 ssl;

	count_total(UTOTAL_HITS);
	cur = bpf_map_lookup_elem(&thread_handshakes, &tid);
	if (!cur)
		return 0;
	if (cur->depth) {
		cur->depth--;
		return 0;
	}
	ssl = cur->ssl;
	lib = cur->lib;
	bpf_map_delete_elem(&thread_handshakes, &tid);
	okey.tgid = id >> 32;
	okey.ssl = ssl;
	if (ret != 1)
		return 0; /* not done yet (WANT_READ) or failed */

	layout = bpf_map_lookup_elem(&lib_layouts, &lib);
	/* BoringSSL returns 1 before the end when it lets the caller go on
	 * early (False Start, 0-RTT): still in init, it is not complete yet.
	 */
	if (read_field(layout, FIELD_SSL_IN_INIT, ssl) == 1)
		return 0;
	open = bpf_map_lookup_elem(&open_handshakes, &okey);
	/* With the state known, only a handshake seen from its start counts:
	 * a state-machine call on an established connection (post-handshake
	 * messages) returns 1 too. Without it, every 1 counts (SSL_do_handshake).
	 */
	if (layout && (layout->field[FIELD_SSL_STATE].n || layout->field[FIELD_SSL_IN_INIT].n) &&
	    !(open && open->started)) {
		if (open)
			bpf_map_delete_elem(&open_handshakes, &okey);
		return 0;
	}
	count_handshake(id >> 32, lib, ssl, layout, open, USAGE_UNKNOWN);
	if (open)
		bpf_map_delete_elem(&open_handshakes, &okey);
	return 0;
}

/* The length argument an operation's probe keeps: the third (a size_t *,
 * or a verify's signature length), but a decapsulation's ciphertext
 * length, its fifth.
 */
static __always_inline __u64 op_length_arg(struct pt_regs *ctx, __u64 third)
{
	if (USAGE_COOKIE_PROBE(bpf_get_attach_cookie(ctx)) == PROBE_DECAPSULATE)
		return PT_REGS_PARM5(ctx);
	return third;
}

static __always_inline int op_enter(struct pt_regs *ctx, void *op_ctx, void *out, __u64 len)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct inflight_op *cur, fresh = {};

	count_total(UTOTAL_HITS);
	count_call(USAGE_COOKIE_INSN(cookie));
	cur = bpf_map_lookup_elem(&inflight_ops, &tid);
	if (cur && bpf_ktime_get_ns() - cur->start_ns < USAGE_STALE_NS) {
		/* e.g. EVP_DigestSign of a legacy key calling EVP_PKEY_sign: only
		 * the outermost call is timed.
		 */
		cur->depth++;
		count_total(UTOTAL_NESTED);
		return 0;
	}
	fresh.ctx = (__u64)op_ctx;
	fresh.out = (__u64)out;
	fresh.len = len;
	fresh.lib = USAGE_COOKIE_LIB(cookie);
	fresh.probe = USAGE_COOKIE_PROBE(cookie);
	fresh.insn = USAGE_COOKIE_INSN(cookie);
	fresh.start_ns = bpf_ktime_get_ns();
	fresh.weight = gate_weight();
	/* A stale entry (its thread never returned: killed, longjmp) is
	 * replaced and keeps its place in inflight_count.
	 */
	if (bpf_map_update_elem(&inflight_ops, &tid, &fresh, BPF_ANY) == 0 && !cur)
		__sync_fetch_and_add(&inflight_count, 1);
	return 0;
}

static __always_inline int op_exit(struct pt_regs *ctx, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, lib, field;
	struct inflight_op *cur;
	struct op_key key = {};
	struct thread_handshake *hs;
	const struct lib_layout *layout;
	__u64 now = bpf_ktime_get_ns(), wall, cpu, length = 0, weight;
	__u8 probe;
	bool query;

	count_total(UTOTAL_HITS);
	cur = bpf_map_lookup_elem(&inflight_ops, &tid);
	if (!cur)
		return 0;
	if (cur->depth) {
		cur->depth--;
		return 0;
	}
	wall = now - cur->start_ns;
	cpu = wall > cur->off_cpu_ns ? wall - cur->off_cpu_ns : 0;
	if (cur->insn < INSN_NR) {
		__u64 own = probe_overhead_ns[cur->insn];

		cpu = cpu > own ? cpu - own : 0;
		wall = wall > own ? wall - own : 0;
	}
	lib = cur->lib;
	probe = cur->probe;
	key.op = USAGE_OP_NONE;
	switch (probe) {
	case PROBE_DIGEST_SIGN:
	case PROBE_PKEY_SIGN:
		key.op = USAGE_OP_SIGN;
		break;
	case PROBE_DIGEST_VERIFY:
	case PROBE_PKEY_VERIFY:
		key.op = USAGE_OP_VERIFY;
		break;
	case PROBE_DERIVE:
	case PROBE_X25519:
	case PROBE_ENCAPSULATE:
	case PROBE_DECAPSULATE:
	case PROBE_KYBER:
		key.op = USAGE_OP_DERIVE;
		break;
	case PROBE_CALIBRATE:
		key.op = USAGE_OP_CALIBRATE;
		break;
	}
	field = probe == PROBE_DIGEST_SIGN || probe == PROBE_DIGEST_VERIFY ? FIELD_MDCTX_KEY_TYPE
	                                                                   : FIELD_PKEYCTX_KEY_TYPE;
	/* Sign, derive and encapsulate take a size_t * (read after the call);
	 * verify and decapsulate the length itself. A NULL output buffer is a
	 * size query.
	 */
	query = cur->out == 0;
	if (key.op == USAGE_OP_VERIFY || probe == PROBE_DECAPSULATE)
		length = cur->len;
	else if (probe == PROBE_X25519)
		length = 32; /* X25519(out[32], private[32], peer[32]) */
	else if (probe == PROBE_KYBER)
		length = 1088; /* KYBER_CIPHERTEXT_BYTES */
	else if (cur->len)
		bpf_probe_read_user(&length, sizeof(length), (void *)cur->len);
	layout = bpf_map_lookup_elem(&lib_layouts, &lib);
	if (probe == PROBE_X25519)
		key.key_type = USAGE_KEY_X25519;
	else if (probe == PROBE_KYBER)
		key.key_type = USAGE_KEY_KYBER;
	else if (probe == PROBE_ENCAPSULATE || probe == PROBE_DECAPSULATE)
		key.key_type = USAGE_KEY_KEM;
	else
		key.key_type = read_field_or(layout, field, cur->ctx, USAGE_NO_OBJECT);
	weight = cur->weight;
	bpf_map_delete_elem(&inflight_ops, &tid);
	__sync_fetch_and_add(&inflight_count, -1);

	/* Count what did the work: a sign or derive that returned 1 with an
	 * output buffer, a verify that returned (valid or not).
	 */
	/* KYBER_encap/decap return nothing: every call did the work. */
	if (probe == PROBE_KYBER) {
		query = false;
		ret = 1;
	}
	if (key.op == USAGE_OP_NONE || query || (key.op == USAGE_OP_VERIFY ? ret < 0 : ret != 1))
		return 0;
	/* A derive from an EVP_PKEY_CTX with no key is a KDF, not a key
	 * exchange: OpenSSL 1.1's TLS 1.3 key schedule (HKDF) and TLS 1.2 PRF
	 * run through EVP_PKEY_derive, 13-16 times a handshake (3.x's through
	 * EVP_KDF). Neither an operation nor the handshake's group.
	 */
	if (key.key_type == USAGE_NO_OBJECT) {
		if (key.op == USAGE_OP_DERIVE)
			return 0;
		key.key_type = USAGE_UNKNOWN;
	}
	if (key.op != USAGE_OP_CALIBRATE)
		count_total(UTOTAL_OPS);
	key.tgid = id >> 32;
	key.lib = lib;
	key.len = length > 0xffffffff ? 0xffffffff : (__u32)length;

	hs = bpf_map_lookup_elem(&thread_handshakes, &tid);
	account_op(&key, cpu, wall, hs ? hs->ssl : 0, weight);
	return 0;
}

/* The value of a Go ABIInternal register (enum usage_go_reg). Every
 * register is loaded first (the verifier allows only constant offsets into
 * the context, and a switch over loads would be folded into a computed one).
 */
#define GO_LOAD(field)                        \
	({                                    \
		__u64 __v = ctx->field;       \
		asm volatile("" : "+r"(__v)); \
		__v;                          \
	})
static __always_inline __u64 go_reg(struct pt_regs *ctx, __u32 reg)
{
	__u64 ax = GO_LOAD(ax), bx = GO_LOAD(bx), cx = GO_LOAD(cx), di = GO_LOAD(di),
	      si = GO_LOAD(si);
	__u64 r8 = GO_LOAD(r8), r9 = GO_LOAD(r9), r10 = GO_LOAD(r10), r11 = GO_LOAD(r11);

	switch (reg) {
	case GO_REG_AX:
		return ax;
	case GO_REG_BX:
		return bx;
	case GO_REG_CX:
		return cx;
	case GO_REG_DI:
		return di;
	case GO_REG_SI:
		return si;
	case GO_REG_R8:
		return r8;
	case GO_REG_R9:
		return r9;
	case GO_REG_R10:
		return r10;
	case GO_REG_R11:
		return r11;
	}
	return 0;
}

/* Go's handshake: at the entry (c *Conn in AX) the goroutine's handshake
 * begins; at a RET, AX is the returned error's type word: 0 means nil, a
 * completed handshake, whose fields are read from the Conn then.
 */
static __always_inline void go_handshake(struct pt_regs *ctx, __u64 cookie, struct go_key *gkey)
{
	struct open_handshake_key okey = { .tgid = gkey->tgid };
	struct open_handshake begun = { .started = 1, .weight = gate_weight() }, *open;
	const struct lib_layout *layout;
	struct go_handshake *hs, fresh = {};
	__u32 lib;

	if (!(USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_RETURN)) {
		hs = bpf_map_lookup_elem(&go_handshakes, gkey);
		if (hs && hs->conn == ctx->ax)
			return; /* restarted after its stack grew (go_op) */
		count_total(UTOTAL_HANDSHAKE_CALLS);
		fresh.conn = ctx->ax;
		fresh.lib = USAGE_COOKIE_LIB(cookie);
		fresh.is_server = (USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_SERVER) != 0;
		bpf_map_update_elem(&go_handshakes, gkey, &fresh, BPF_ANY);
		okey.ssl = fresh.conn;
		bpf_map_update_elem(&open_handshakes, &okey, &begun, BPF_ANY);
		return;
	}
	hs = bpf_map_lookup_elem(&go_handshakes, gkey);
	if (!hs)
		return;
	okey.ssl = hs->conn;
	lib = hs->lib;
	if (ctx->ax == 0) {
		layout = bpf_map_lookup_elem(&lib_layouts, &lib);
		open = bpf_map_lookup_elem(&open_handshakes, &okey);
		count_handshake(gkey->tgid, lib, hs->conn, layout, open, hs->is_server);
	}
	bpf_map_delete_elem(&open_handshakes, &okey);
	bpf_map_delete_elem(&go_handshakes, gkey);
}

/* Go operations in flight, by goroutine. A goroutine can be preempted and
 * resumed on another thread inside a sign, and its g is reused once it has
 * ended, so calls are matched by g, never by thread. For the on-CPU time the
 * thread it started on also has it in inflight_ops (sched_switch's map), as
 * long as no other goroutine's operation took that thread's entry.
 */
struct go_op {
	__u64 start_ns;
	__u64 len;      /* a verify's signature length (the cookie's register) */
	__u32 tid;      /* the thread it started on */
	__u32 key_type; /* from the cookie */
	__u32 depth;    /* nested probed calls inside this one */
	__u16 lib;
	__u8 probe;
	__u8 insn;
	__u64 weight; /* taken at its start (0: outside the gate) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, USAGE_MAX_INFLIGHT);
	__type(key, struct go_key);
	__type(value, struct go_op);
} go_ops SEC(".maps");

/* Takes `tid`'s inflight_ops entry if it is this goroutine's: its off-CPU
 * time so far, or 0.
 */
static __always_inline __u64 take_thread_entry(__u32 tid, __u64 g, __u64 now)
{
	struct inflight_op *t = bpf_map_lookup_elem(&inflight_ops, &tid);
	__u64 off;

	if (!t || t->g != g)
		return 0;
	off = t->off_cpu_ns;
	if (t->switched_out_ns)
		off += now - t->switched_out_ns;
	if (bpf_map_delete_elem(&inflight_ops, &tid) == 0)
		__sync_fetch_and_add(&inflight_count, -1);
	return off;
}

/* A Go operation, from its entry to a RET of the same goroutine. The
 * length: a sign's or derive's result slice (BX at the RET), a verify's
 * signature (the cookie's register at the entry).
 */
static __always_inline void go_op(struct pt_regs *ctx, __u64 cookie, struct go_key *gkey, __u32 tid)
{
	struct inflight_op thread_entry = {};
	struct go_op *cur, fresh = {};
	struct go_handshake *hs;
	struct op_key key = {};
	__u64 now = bpf_ktime_get_ns(), wall, cpu, off, weight;
	__u32 probe = USAGE_COOKIE_PROBE(cookie);
	bool had;

	cur = bpf_map_lookup_elem(&go_ops, gkey);
	if (!(USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_RETURN)) {
		if (cur && now - cur->start_ns < USAGE_STALE_NS) {
			/* The same function's entry again: the goroutine's stack grew
			 * (runtime.morestack copies it and restarts the function from
			 * its entry). Another probed function: a nested call.
			 */
			if (cur->probe != probe) {
				cur->depth++;
				count_total(UTOTAL_NESTED);
			}
			return;
		}
		fresh.start_ns = now;
		fresh.tid = tid;
		fresh.lib = USAGE_COOKIE_LIB(cookie);
		fresh.probe = probe;
		fresh.insn = USAGE_COOKIE_INSN(cookie);
		fresh.key_type = USAGE_COOKIE_KEY_TYPE(cookie);
		fresh.len = go_reg(ctx, USAGE_COOKIE_REG(cookie));
		fresh.weight = gate_weight();
		bpf_map_update_elem(&go_ops, gkey, &fresh, BPF_ANY);
		/* The thread's entry for sched_switch; another goroutine's entry
		 * there (it moved away) is replaced, keeping its place in
		 * inflight_count.
		 */
		thread_entry.start_ns = now;
		thread_entry.g = gkey->g;
		had = bpf_map_lookup_elem(&inflight_ops, &tid) != NULL;
		if (bpf_map_update_elem(&inflight_ops, &tid, &thread_entry, BPF_ANY) == 0 && !had)
			__sync_fetch_and_add(&inflight_count, 1);
		return;
	}
	if (!cur || cur->probe != probe) {
		count_total(UTOTAL_GO_UNMATCHED);
		return;
	}
	if (cur->depth) {
		cur->depth--;
		return;
	}
	wall = now - cur->start_ns;
	off = take_thread_entry(tid, gkey->g, now);
	if (cur->tid != tid) {
		/* Resumed on another thread: the first thread's share only. */
		off = take_thread_entry(cur->tid, gkey->g, now);
		count_total(UTOTAL_GO_MIGRATED);
	}
	cpu = wall > off ? wall - off : 0;
	if (cur->insn < INSN_NR) {
		__u64 own = probe_overhead_ns[cur->insn];

		cpu = cpu > own ? cpu - own : 0;
		wall = wall > own ? wall - own : 0;
	}
	key.tgid = gkey->tgid;
	key.lib = cur->lib;
	key.key_type = cur->key_type;
	switch (probe) {
	case PROBE_GO_SIGN:
		key.op = USAGE_OP_SIGN;
		key.len = ctx->bx;
		break;
	case PROBE_GO_VERIFY:
		key.op = USAGE_OP_VERIFY;
		key.len = cur->len > 0xffffffff ? 0xffffffff : (__u32)cur->len;
		break;
	case PROBE_GO_DERIVE:
		key.op = USAGE_OP_DERIVE;
		key.len = ctx->bx;
		if (USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_KEM) {
			key.key_type = USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_KYBER ? USAGE_KEY_KYBER
			                                                           : USAGE_KEY_KEM;
			key.len = cur->key_type;
		}
		break;
	default:
		key.op = USAGE_OP_CALIBRATE;
		break;
	}
	weight = cur->weight;
	bpf_map_delete_elem(&go_ops, gkey);
	/* What did the work: a sign whose error (DI) is nil, a derive that
	 * returned a secret, any verify (valid or not).
	 */
	if ((probe == PROBE_GO_SIGN && ctx->di != 0) || (probe == PROBE_GO_DERIVE && ctx->bx == 0))
		return;
	if (key.op != USAGE_OP_CALIBRATE)
		count_total(UTOTAL_OPS);
	hs = bpf_map_lookup_elem(&go_handshakes, gkey);
	account_op(&key, cpu, wall, hs ? hs->conn : 0, weight);
}

static __always_inline int go_probe(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 id = bpf_get_current_pid_tgid();
	struct go_key gkey = { .tgid = id >> 32, .g = ctx->r14 };

	count_total(UTOTAL_HITS);
	if (!(USAGE_COOKIE_FLAGS(cookie) & USAGE_GO_RETURN))
		count_call(INSN_GO);
	if (USAGE_COOKIE_PROBE(cookie) == PROBE_GO_HANDSHAKE)
		go_handshake(ctx, cookie, &gkey);
	else
		go_op(ctx, cookie, &gkey, (__u32)id);
	return 0;
}

/* The programs. Each comes twice: one attached per probe through a perf
 * event (any kernel with uprobes), one attached with every probe of a file
 * in one uprobe_multi link (Linux 6.6+; user space sets its expected attach
 * type before load), which detaches in one step: the duty cycle's toggles
 * (usage_probes.cc).
 */
SEC("uprobe")
int BPF_KPROBE(usage_handshake_enter, void *ssl)
{
	return handshake_enter(ctx, ssl);
}

SEC("uprobe")
int BPF_KPROBE(usage_handshake_enter_multi, void *ssl)
{
	return handshake_enter(ctx, ssl);
}

SEC("uretprobe")
int BPF_KRETPROBE(usage_handshake_exit, long ret)
{
	return handshake_exit(ctx, ret);
}

SEC("uretprobe")
int BPF_KRETPROBE(usage_handshake_exit_multi, long ret)
{
	return handshake_exit(ctx, ret);
}

SEC("uprobe")
int BPF_KPROBE(usage_op_enter, void *op_ctx, void *out, __u64 len)
{
	return op_enter(ctx, op_ctx, out, op_length_arg(ctx, len));
}

SEC("uprobe")
int BPF_KPROBE(usage_op_enter_multi, void *op_ctx, void *out, __u64 len)
{
	return op_enter(ctx, op_ctx, out, op_length_arg(ctx, len));
}

SEC("uretprobe")
int BPF_KRETPROBE(usage_op_exit, long ret)
{
	return op_exit(ctx, ret);
}

SEC("uretprobe")
int BPF_KRETPROBE(usage_op_exit_multi, long ret)
{
	return op_exit(ctx, ret);
}

SEC("uprobe")
int usage_go(struct pt_regs *ctx)
{
	return go_probe(ctx);
}

SEC("uprobe")
int usage_go_multi(struct pt_regs *ctx)
{
	return go_probe(ctx);
}

/* The end of a connection: SSL_free(SSL *) (RDI) or Go's (*Conn).Close (c in
 * AX). Called more than once for one object (Close twice, SSL_free of a
 * shared reference) it ends it once; one whose handshake was never seen
 * is not in the map.
 */
static __always_inline int close_probe(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct live_key key = { .tgid = bpf_get_current_pid_tgid() >> 32 };
	struct live_process_key pkey = { .tgid = key.tgid };
	struct open_handshake_key okey = { .tgid = key.tgid };
	struct live_connection *live;
	__s64 *sum, weighted;

	count_total(UTOTAL_HITS);
	count_total(UTOTAL_CLOSE_CALLS);
	key.conn = USAGE_COOKIE_PROBE(cookie) == PROBE_GO_CLOSE ? GO_LOAD(ax) : GO_LOAD(di);
	/* A handshake it never finished: a later object at this address
	 * must not inherit what it saw.
	 */
	okey.ssl = key.conn;
	bpf_map_delete_elem(&open_handshakes, &okey);
	live = bpf_map_lookup_elem(&live_connections, &key);
	if (!live)
		return 0;
	weighted = (__s64)live->weighted;
	pkey.lib = live->lib;
	if (bpf_map_delete_elem(&live_connections, &key))
		return 0; /* another thread ended it first */
	sum = bpf_map_lookup_elem(&live_by_process, &pkey);
	if (sum)
		__sync_fetch_and_add(sum, -weighted);
	return 0;
}

SEC("uprobe")
int usage_close(struct pt_regs *ctx)
{
	return close_probe(ctx);
}

SEC("uprobe")
int usage_close_multi(struct pt_regs *ctx)
{
	return close_probe(ctx);
}
