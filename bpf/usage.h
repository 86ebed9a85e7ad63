/* Shared between bpf/usage.bpf.c and user space (agent/usage): plain C
 * structs and constants only. A map's name says what it counts; a key
 * struct's fields are its labels, in order.
 *
 * Usage telemetry: low-rate uprobes on what runs once per handshake or per
 * public-key operation (never per record). docs/usage.md has the design.
 */
#ifndef TLSPROF_BPF_USAGE_H
#define TLSPROF_BPF_USAGE_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define USAGE_MAX_LIBS 256            /* attached library files (layouts) */
#define USAGE_MAX_HANDSHAKE_KEYS 4096 /* handshakes_by_params */
#define USAGE_MAX_OP_KEYS 1024        /* op_latency */
#define USAGE_MAX_INFLIGHT 16384      /* threads inside a probed function */
#define USAGE_MAX_OPEN_HANDSHAKES 16384
#define USAGE_MAX_LIVE_CONNECTIONS 262144 /* live_connections */
#define USAGE_MAX_LIVE_PROCESSES 16384    /* live_by_process */
/* An operation still in flight after this long is taken as abandoned. */
#define USAGE_STALE_NS (10ull * 1000 * 1000 * 1000)

/* Latency histograms: exp2 octaves of nanoseconds, each split into
 * USAGE_SUB_BUCKETS linear sub-buckets, so a percentile read from them is
 * within 1/USAGE_SUB_BUCKETS/2 (6%) of the true value, where plain exp2
 * buckets would be within 41%. Octave 0 holds [0, 2^USAGE_SUB_BITS) ns;
 * values past the last octave are clamped into the last bucket.
 */
#define USAGE_SUB_BITS 3
#define USAGE_SUB_BUCKETS (1 << USAGE_SUB_BITS)
#define USAGE_OCTAVES 32 /* up to 2^34 ns, ~17 s */
#define USAGE_HIST_SLOTS (USAGE_OCTAVES * USAGE_SUB_BUCKETS)

/* A field reached from a pointer argument by a chain of loads:
 * p = arg; for i < n: p = *(p + off[i]), the last load `width` bytes wide
 * (1, 2, 4 or 8), the others 8. n == 0: unknown, the field reads as
 * USAGE_UNKNOWN. The chains come from the library's own accessors
 * (agent/usage/accessors.h), e.g. SSL_version() for the version.
 * A bit field of the last load (BoringSSL's SSL_is_server(), ...): when
 * shift or bits is set, v = (v >> shift) & ((1 << bits) - 1) (bits 0: all
 * that is left); then v = !v when `invert`.
 * `type_guard`: the chain applies only where the 32-bit word at +0 of the
 * start pointer is 0 (OpenSSL 3.2+: ssl_st.type of a TLS connection; a QUIC
 * object's is not), else the field reads as USAGE_UNKNOWN.
 */
#define USAGE_MAX_LOADS 4
struct field_path {
	__s32 off[USAGE_MAX_LOADS];
	__u8 n;
	__u8 width;
	__u8 shift;
	__u8 bits;
	__u8 invert;
	__u8 type_guard;
	__u8 pad[2];
};

#define USAGE_UNKNOWN 0xffffffffu
/* read_field_or()'s answer where a pointer on the way (after the first load)
 * is NULL: e.g. an EVP_PKEY_CTX with no key. BPF-side only.
 */
#define USAGE_NO_OBJECT 0xfffffffeu

enum usage_field {
	FIELD_SSL_VERSION = 0,  /* SSL*: the negotiated protocol version (0x0304) */
	FIELD_SSL_STATE,        /* SSL*: the handshake state, 0 before it starts */
	FIELD_SSL_RESUMED,      /* SSL*: nonzero when the session was resumed */
	FIELD_SSL_IS_SERVER,    /* SSL*: nonzero on the server side */
	FIELD_SSL_CIPHER,       /* SSL*: the cipher suite's IANA id (0x1301) */
	FIELD_SSL_KEY_TYPE,     /* SSL*: the own certificate key's EVP_PKEY id */
	FIELD_MDCTX_KEY_TYPE,   /* EVP_MD_CTX*: its key's EVP_PKEY id */
	FIELD_PKEYCTX_KEY_TYPE, /* EVP_PKEY_CTX*: its key's EVP_PKEY id */
	FIELD_SSL_GROUP,        /* SSL*: the key exchange's group, IANA id (29 X25519), 0: none */
	FIELD_SSL_IN_INIT, /* SSL*: 1 while a handshake runs (BoringSSL, which has no state field) */
	FIELD_NR,
};

/* Per attached library file, indexed by the probe's cookie. */
struct lib_layout {
	struct field_path field[FIELD_NR];
};

/* Probed functions, in the cookie's kind byte. */
enum usage_probe {
	PROBE_HANDSHAKE = 0, /* the state machine (or SSL_do_handshake) (SSL *) -> 1 when done */
	PROBE_DIGEST_SIGN,   /* EVP_DigestSign(MD_CTX *, sig, size_t *siglen, ..) */
	PROBE_PKEY_SIGN,     /* EVP_PKEY_sign(PKEY_CTX *, sig, size_t *siglen, ..) */
	PROBE_DIGEST_VERIFY, /* EVP_DigestVerify(MD_CTX *, sig, size_t siglen, ..) */
	PROBE_PKEY_VERIFY,   /* EVP_PKEY_verify(PKEY_CTX *, sig, size_t siglen, ..) */
	PROBE_DERIVE,        /* EVP_PKEY_derive(PKEY_CTX *, key, size_t *keylen) */
	PROBE_CALIBRATE,     /* the agent's own empty function: the probes' cost */
	/* Go crypto/tls (usage_go): a uprobe at the entry and one at every RET
	 * instruction, never a uretprobe (Go moves goroutine stacks, and a
	 * uretprobe's hijacked return address would be copied with them). Calls
	 * are matched by goroutine (the g in R14, ABIInternal) and process.
	 */
	PROBE_GO_HANDSHAKE, /* (*Conn).serverHandshake / clientHandshake (c *Conn) error */
	PROBE_GO_SIGN,      /* a crypto.Signer's Sign(...) ([]byte, error) */
	PROBE_GO_VERIFY,    /* ecdsa.VerifyASN1, rsa.VerifyPKCS1v15 / VerifyPSS, ed25519.Verify */
	PROBE_GO_DERIVE,    /* (*x25519Parameters / *nistParameters).SharedKey(peer) []byte */
	PROBE_GO_CALIBRATE, /* the agent's own function, probed the Go way */
	/* The end of a connection, entry only (usage_close): SSL_free(SSL *),
	 * Go's (*Conn).Close (c *Conn). Duty-cycled with the rest: the live
	 * set starts over after a pause (docs/usage.md, "Live connections").
	 */
	PROBE_CLOSE,
	PROBE_GO_CLOSE,
	/* BoringSSL's X25519(out, private, peer) -> 1: a key exchange with no
	 * EVP context (its TLS key shares call it directly); X25519, 32 bytes.
	 */
	PROBE_X25519,
	/* OpenSSL 3.x's KEM entry points, a key exchange by encapsulation (TLS
	 * 1.3's ML-KEM groups, OpenSSL 3.5+): the server's
	 * EVP_PKEY_encapsulate(PKEY_CTX *, ct, size_t *ctlen, secret, size_t *)
	 * and the client's EVP_PKEY_decapsulate(PKEY_CTX *, secret, size_t *,
	 * ct, size_t ctlen). Timed as USAGE_OP_DERIVE with key type
	 * USAGE_KEY_KEM and the ciphertext's length, which names the KEM (a
	 * hybrid's holds its ML-KEM and ECDH parts, whose own calls nest inside
	 * and are not timed apart).
	 */
	PROBE_ENCAPSULATE,
	PROBE_DECAPSULATE,
	/* BoringSSL's Kyber768 (Android's BoringSSL 14: the X25519Kyber and
	 * P256Kyber groups): KYBER_encap(ciphertext, secret, public) and
	 * KYBER_decap(secret, private, ciphertext), both void: a call is one
	 * Kyber768 half of a hybrid key exchange, key type USAGE_KEY_KYBER,
	 * its ciphertext 1088 bytes.
	 */
	PROBE_KYBER,
	PROBE_NR,
};

/* Go's ABIInternal (amd64) integer argument and result registers, in order;
 * a cookie names one of them (USAGE_COOKIE_REG) where a length is read.
 */
enum usage_go_reg {
	GO_REG_NONE = 0,
	GO_REG_AX,
	GO_REG_BX,
	GO_REG_CX,
	GO_REG_DI,
	GO_REG_SI,
	GO_REG_R8,
	GO_REG_R9,
	GO_REG_R10,
	GO_REG_R11,
	GO_REG_NR,
};

/* How the kernel runs a probed function's first instruction, which sets the
 * probe pair's own share of each timed call: x86 uprobes emulate `push reg`
 * (and some others) but single-step most instructions out of line, one more
 * trap, about twice the cost per call (docs/usage.md, "On-CPU latency"). User space calibrates each
 * class at start (probe_overhead_ns) and the programs take it off.
 */
enum usage_insn_class {
	INSN_EMULATED_PUSH = 0, /* push reg */
	INSN_ENDBR64,           /* endbr64 (CET builds) */
	INSN_SINGLE_STEPPED,    /* anything else */
	INSN_GO, /* Go: entry on the stack check's jump (emulated), a uprobe on RET */
	INSN_NR,
};

/* The cookie of every usage probe: which layout, which function, and the
 * class of the function's first instruction.
 */
#define USAGE_COOKIE(lib, probe, insn) \
	(((__u64)(insn) << 24) | ((__u64)(probe) << 16) | (__u64)(lib))
#define USAGE_COOKIE_LIB(c) ((__u32)((c)&0xffff))
#define USAGE_COOKIE_PROBE(c) ((__u32)(((c) >> 16) & 0xff))
#define USAGE_COOKIE_INSN(c) ((__u32)(((c) >> 24) & 0xff))
/* Go probes carry more in the upper half: the key type the function serves
 * (an EVP_PKEY id, as OpenSSL names them: RSA 6, EC 408, X25519 1034,
 * Ed25519 1087), the register that holds a length at the entry (a verify's
 * signature), and flags.
 */
#define USAGE_GO_COOKIE(lib, probe, insn, key_type, reg, flags)                              \
	(USAGE_COOKIE(lib, probe, insn) | ((__u64)(key_type) << 32) | ((__u64)(reg) << 48) | \
	 ((__u64)(flags) << 56))
#define USAGE_COOKIE_KEY_TYPE(c) ((__u32)(((c) >> 32) & 0xffff))
#define USAGE_COOKIE_REG(c) ((__u32)(((c) >> 48) & 0xff))
#define USAGE_COOKIE_FLAGS(c) ((__u32)(((c) >> 56) & 0xff))
#define USAGE_GO_RETURN 1 /* this probe is on one of the function's RET instructions */
#define USAGE_GO_SERVER 2 /* the handshake function is the server's */
/* A KEM (Go 1.24's ML-KEM encapsulate/decapsulate, PROBE_GO_DERIVE): the
 * operation's key type is USAGE_KEY_KEM, and the cookie's key-type bits hold
 * the KEM's ciphertext length (1088: ML-KEM-768), which its results do not.
 */
#define USAGE_GO_KEM 4
/* With USAGE_GO_KEM: the KEM is Go 1.23's crypto/internal/mlkem768, the
 * ML-KEM draft its X25519Kyber768Draft00 (0x6399) runs: key type
 * USAGE_KEY_KYBER, so the group is named by the draft.
 */
#define USAGE_GO_KYBER 8

/* What an operation is, as counted in op_latency and in handshakes. */
enum usage_op {
	USAGE_OP_NONE = 0,
	USAGE_OP_SIGN,
	USAGE_OP_VERIFY,
	USAGE_OP_DERIVE,
	USAGE_OP_CALIBRATE, /* the probe pair's own time, measured at start */
	USAGE_OP_NR,
};

/* Key of op_latency: completed operations of one process, by what they did.
 * key_type is the EVP_PKEY id (6 RSA, 408 EC, 1034 X25519, 1087 Ed25519, ...,
 * USAGE_UNKNOWN), len the signature or shared secret's length in bytes,
 * which tells the key's size (RSA-2048: 256; ECDSA-P256: <= 72; P-384 ECDHE:
 * 48).
 */
struct op_key {
	__u32 tgid;
	__u16 lib;
	__u8 op; /* enum usage_op */
	__u8 in_handshake;
	__u32 key_type;
	__u32 len;
};

/* Counts come with a weighted count: each event adds the duty cycle's
 * scale at that moment (USAGE_SCALE_ONE = 1; 10 * USAGE_SCALE_ONE while the
 * probes are on a tenth of the time), so weighted / USAGE_SCALE_ONE is the
 * estimate of all events (agent/usage/duty_cycle.h).
 */
#define USAGE_SCALE_ONE 1000

struct handshake_count {
	__u64 count;
	__u64 weighted;
};

struct op_latency {
	__u64 count;
	__u64 weighted;
	__u64 cpu_ns; /* on-CPU time: switched-out time is taken away */
	__u64 wall_ns;
	__u64 slots[USAGE_HIST_SLOTS]; /* on-CPU ns */
};

/* The EVP_PKEY id of X25519 as OpenSSL numbers it (NID_X25519), for the
 * key exchanges PROBE_X25519 times.
 */
#define USAGE_KEY_X25519 1034
/* OpenSSL's EVP_PKEY_EC (NID_X9_62_id_ecPublicKey): ECDSA and ECDH keys. */
#define USAGE_KEY_EC 408
/* The key type of a KEM operation (PROBE_ENCAPSULATE/DECAPSULATE), not an
 * EVP_PKEY id: ML-KEM keys are a provider's only (EVP_PKEY_get_id answers
 * -1). The ciphertext's length tells the KEM: 768, 1088, 1568 ML-KEM-512,
 * -768, -1024; 1120 X25519MLKEM768, 1153 SecP256r1MLKEM768, 1665
 * SecP384r1MLKEM1024 (agent/usage/names.h).
 */
#define USAGE_KEY_KEM 0x7fff0001u
/* The key type of BoringSSL's draft Kyber768 (PROBE_KYBER), the ML-KEM
 * draft its experimental hybrid groups use; named apart from ML-KEM. Its
 * ciphertext is 1088 bytes too.
 */
#define USAGE_KEY_KYBER 0x7fff0002u

/* handshake_key.kx_type when no key derivation was seen but the library
 * says the group (FIELD_SSL_GROUP): this bit, and the group's IANA id in the
 * low 16 bits.
 */
#define USAGE_KX_TLS_GROUP 0x80000000u

/* Key of handshakes_by_params: completed handshakes of one process. */
struct handshake_key {
	__u32 tgid;
	__u16 lib;
	__u16 version;   /* 0x0303 TLS 1.2, 0x0304 TLS 1.3; 0xffff unknown */
	__u16 cipher;    /* IANA id; 0xffff unknown */
	__u8 is_server;  /* 0, 1; 0xff unknown */
	__u8 resumed;    /* 0, 1; 0xff unknown */
	__u32 kx_type;   /* the key exchange's EVP_PKEY id, or USAGE_KX_TLS_GROUP; 0: none seen */
	__u32 kx_len;    /* its shared secret's length */
	__u32 cert_type; /* own key (server) or peer's verified key (client) */
	__u32 sig_len;   /* the handshake's signature length, 0: none */
};

/* Live TLS connections: one entry per connection whose handshake the
 * probes saw complete, until its SSL_free / Close. `weighted` is the duty
 * cycle's weight when it was counted (USAGE_SCALE_ONE units), so that
 * live_by_process, the sum of its process's, estimates all live
 * connections.
 */
struct live_key {
	__u32 tgid;
	__u32 pad;
	__u64 conn; /* SSL * or Go *Conn */
};

struct live_connection {
	__u64 weighted;
	__u16 lib;
	__u16 pad[3];
};

struct live_process_key {
	__u32 tgid;
	__u16 lib;
	__u16 pad;
};

/* Slots of the per-CPU usage_totals array: the probes' own accounting. */
enum usage_total_slot {
	UTOTAL_HITS = 0,        /* probe and return-probe runs */
	UTOTAL_HANDSHAKE_CALLS, /* SSL_do_handshake calls */
	UTOTAL_HANDSHAKES,      /* ... that completed a handshake */
	UTOTAL_OPS,             /* operations timed */
	UTOTAL_NESTED,          /* probed calls inside a timed one (not timed) */
	UTOTAL_DROPPED_KEYS,    /* a full map refused a new key */
	UTOTAL_READ_ERRORS,     /* a field's chain could not be read */
	UTOTAL_GO_UNMATCHED,    /* a Go RET without its entry (attached in between, or evicted) */
	UTOTAL_GO_MIGRATED,     /* a Go operation that ended on another thread than it began */
	/* Probed calls (an entry and its return), by enum usage_insn_class, in
	 * that order: with the calibrated cost of each, what the probes cost.
	 */
	UTOTAL_CALLS_PUSH,
	UTOTAL_CALLS_ENDBR64,
	UTOTAL_CALLS_SINGLE_STEPPED,
	UTOTAL_CALLS_GO,
	UTOTAL_CLOSE_CALLS,  /* connection-end probes (entry only: about half a call's cost) */
	UTOTAL_LIVE_FULL,    /* a handshaken connection live_connections had no room for */
	UTOTAL_OUTSIDE_GATE, /* began outside the duty cycle's counting window: not counted */
	UTOTAL_HANDSHAKES_WEIGHTED, /* the handshakes counted, by what each stands for (USAGE_SCALE_ONE units) */
	UTOTAL_SWITCHES, /* sched_switch runs (their cost is the probes' too) */
	UTOTAL_NR_SLOTS,
};

#endif /* TLSPROF_BPF_USAGE_H */
