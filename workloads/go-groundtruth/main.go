// tlsprof-go-groundtruth: the ground truth of tlsprof-groundtruth on Go
// 1.19's crypto, with the same flags, scheduling and JSON.
//
// One worker goroutine, locked to its OS thread (runtime.LockOSThread), runs
// short slices (default 20 ms of thread CPU) of one primitive at a time,
// picking next the category furthest below its target share, and measures
// each slice with clock_gettime(CLOCK_THREAD_CPUTIME_ID). Keys, peers and
// buffers are made before the measured window; a warm-up runs the same mix
// unmeasured. At exit (duration or SIGTERM) it writes JSON with the CPU it
// measured per category.
//
// Every primitive is the code crypto/tls itself runs. Two of them are not
// importable from the standard library in Go 1.19: ChaCha20-Poly1305 and
// X25519 live only in the std's vendored golang.org/x/crypto (which crypto/tls
// uses), and x/crypto cannot be downloaded here. They are reached with
// go:linkname into the vendored packages (tls.go, x25519_go119.go). Go 1.20+
// has crypto/ecdh, which its crypto/tls runs X25519 and P-256 ECDHE through
// (ecdh_go120.go), but still no public ChaCha20-Poly1305 (the linkname then
// needs -ldflags=-checklinkname=0, Go 1.23+). Go 1.24 adds crypto/mlkem, the
// ML-KEM-768 of X25519MLKEM768 (mlkem_go124.go). Which of them a build has is
// the toolchain's: the builds here use Debian 12's Go 1.19, the trixie root's
// tests Go 1.24.
//
// Built three ways with Go 1.19 (workloads/go-groundtruth/CMakeLists.txt): with symbols,
// with -ldflags=-s -w, and with -tags notls (tlsprof-go-crypto: crypto/*
// without crypto/tls, as a JWT signer or a key server links it; notls.go).
// A category the build lacks is never run and never in the JSON.
//
// --seed N draws the mix and each category's share of fresh-context
// operations with the same algorithm, bit for bit, as the C runner
// (workloads/common/groundtruth_runner.cc), so one seed is one mix in every
// ground truth.
package main

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"math"
	"math/big"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The program's name in messages and the JSON; each build sets its own
// (go build -ldflags=-X main.program=NAME).
var program = "tlsprof-go-groundtruth"

const (
	bufferBytes = 16 * 1024
	peerKeys    = 64

	clockProcessCPUTime = 2 // CLOCK_PROCESS_CPUTIME_ID
	clockThreadCPUTime  = 3 // CLOCK_THREAD_CPUTIME_ID
)

// nowNanos reads a CPU clock of the calling thread or process. RawSyscall,
// not Syscall: the call never blocks, so there is no need to hand the P to
// another thread (and a slice's clock reads stay cheap).
func nowNanos(clock uintptr) int64 {
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clock, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		panic("clock_gettime: " + e.Error())
	}
	return ts.Nano()
}

// The primitives a build may lack: nil when it does (notls.go, and the
// files of each Go release).
var (
	// x25519 returns scalar * point on Curve25519.
	x25519 func(scalar, point []byte) ([]byte, error)
	// p256ECDH returns a byte of the shared secret of the P-256 private
	// scalar and the peer's uncompressed point, as crypto/ecdh computes it
	// (Go 1.20+); nil: crypto/elliptic's ScalarMult, as Go 1.19's crypto/tls.
	p256ECDH func(priv, peer []byte) (byte, error)
	// mlKem768 runs one ML-KEM-768 key exchange, both ends of it: key
	// generation and decapsulation (a client's), encapsulation (a server's).
	mlKem768 func() (byte, error)
)

type category struct {
	name, bucket, algorithm string
	needsWithP256           bool
	// notDefault: in the mix only by --mix or --seed (the post-quantum ones,
	// as in the C runner).
	notDefault bool
	bytesPerOp int64
	// absent: this build does not have the primitive (notls.go).
	absent bool
	// op runs one operation; fresh: with a context made for it alone, as a
	// caller that keeps nothing does (the same as reused where Go has no
	// context object).
	op func(fresh bool) error

	weight     float64
	freshShare float64 // fraction of operations run fresh (--seed), in [0, 1)
	freshAcc   float64 // accumulates freshShare per op; an op is fresh when it reaches 1
	batch      int
	cpuNs, ops int64
	freshOps   int64
	warmCPUNs  int64
}

// nextFresh says whether the category's next operation is a fresh one: an
// accumulator, so fresh operations are spread evenly at freshShare.
func (c *category) nextFresh() bool {
	c.freshAcc += c.freshShare
	if c.freshAcc >= 1 {
		c.freshAcc--
		return true
	}
	return false
}

// primitives holds the state behind the category closures.
type primitives struct {
	in, out      []byte
	nonce        []byte
	aad          [13]byte
	counter      uint64
	key          []byte // the symmetric key; fresh contexts are made from it per op
	iv           []byte
	gcm, chacha  cipher.AEAD
	cbc          cipher.BlockMode
	sha256, sha1 hash.Hash // reused: Reset per op
	sum          [64]byte
	rsaKey       *rsa.PrivateKey
	ecdsaKey     *ecdsa.PrivateKey
	hashed       [32]byte // the "message digest" that is signed
	x25519Priv   []byte
	x25519Peers  [][]byte
	p256Priv     []byte
	p256Peers    [][]byte // uncompressed points, unmarshalled per op as crypto/tls does
	peerIndex    int
	secretSink   byte
}

// seal encrypts one 16 KiB record with a fresh nonce and 13-byte AAD, as a
// TLS record does.
func (p *primitives) seal(a cipher.AEAD) error {
	p.counter++
	binary.BigEndian.PutUint64(p.nonce[4:], p.counter)
	copy(p.aad[:], p.nonce)
	p.out = a.Seal(p.out[:0], p.nonce, p.in, p.aad[:])
	return nil
}

func (p *primitives) nextPeer(n int) int {
	p.peerIndex = (p.peerIndex + 1) % n
	return p.peerIndex
}

// setup makes keys, peers, contexts and buffers for the enabled categories.
func (p *primitives) setup(enabled func(string) bool) error {
	p.in, p.out, p.nonce = make([]byte, bufferBytes), make([]byte, 0, bufferBytes+64), make([]byte, 12)
	p.key, p.iv = make([]byte, 32), make([]byte, aes.BlockSize)
	if _, err := rand.Read(p.in); err != nil {
		return err
	}
	if _, err := rand.Read(p.key); err != nil {
		return err
	}
	block, err := aes.NewCipher(p.key[:16])
	if err != nil {
		return err
	}
	if p.gcm, err = cipher.NewGCM(block); err != nil {
		return err
	}
	if enabled("chacha20_poly1305") {
		if p.chacha, err = newChaCha20Poly1305(p.key); err != nil {
			return err
		}
	}
	p.cbc = cipher.NewCBCEncrypter(block, p.iv)
	p.sha256, p.sha1 = sha256.New(), sha1.New()
	if enabled("rsa") {
		if p.rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			return fmt.Errorf("RSA-2048 keygen: %w", err)
		}
	}
	if enabled("ecdsa_p256") {
		if p.ecdsaKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return fmt.Errorf("P-256 keygen: %w", err)
		}
	}
	if enabled("x25519") {
		p.x25519Priv = make([]byte, 32)
		rand.Read(p.x25519Priv)
		for i := 0; i < peerKeys; i++ {
			priv := make([]byte, 32)
			rand.Read(priv)
			pub, err := x25519(priv, curve25519Basepoint)
			if err != nil {
				return fmt.Errorf("X25519 peer keygen: %w", err)
			}
			p.x25519Peers = append(p.x25519Peers, pub)
		}
	}
	if enabled("ecdhe_p256") {
		curve := elliptic.P256()
		if p.p256Priv, _, _, err = elliptic.GenerateKey(curve, rand.Reader); err != nil {
			return fmt.Errorf("P-256 keygen: %w", err)
		}
		for i := 0; i < peerKeys; i++ {
			_, x, y, err := elliptic.GenerateKey(curve, rand.Reader)
			if err != nil {
				return fmt.Errorf("P-256 peer keygen: %w", err)
			}
			p.p256Peers = append(p.p256Peers, elliptic.Marshal(curve, x, y))
		}
	}
	return nil
}

var curve25519Basepoint = append([]byte{9}, make([]byte, 31)...)

// digest hashes one buffer with h (reused: Reset first; fresh: a new h).
func (p *primitives) digest(h hash.Hash) error {
	h.Write(p.in)
	p.secretSink ^= h.Sum(p.sum[:0])[0]
	return nil
}

// The categories in report order (the C runner's StandardCategories). The
// public-key categories have no fresh variant: Go's rsa, ecdsa, elliptic and
// x/crypto/curve25519 take the key per call and keep no context object, so
// every call is already what a caller that keeps nothing runs.
func (p *primitives) categories() []*category {
	return []*category{
		{name: "aes_gcm", bucket: "cipher", algorithm: "AES-GCM", bytesPerOp: bufferBytes,
			op: func(fresh bool) error {
				if !fresh {
					return p.seal(p.gcm)
				}
				block, err := aes.NewCipher(p.key[:16])
				if err != nil {
					return err
				}
				gcm, err := cipher.NewGCM(block)
				if err != nil {
					return err
				}
				return p.seal(gcm)
			}},
		{name: "chacha20_poly1305", bucket: "cipher", algorithm: "ChaCha20-Poly1305", bytesPerOp: bufferBytes,
			absent: newChaCha20Poly1305 == nil, op: func(fresh bool) error {
				if !fresh {
					return p.seal(p.chacha)
				}
				a, err := newChaCha20Poly1305(p.key)
				if err != nil {
					return err
				}
				return p.seal(a)
			}},
		{name: "aes_cbc", bucket: "cipher", algorithm: "AES-CBC", bytesPerOp: bufferBytes,
			op: func(fresh bool) error {
				// Reused, the mode keeps chaining across calls, like a CBC
				// record stream; fresh, a new cipher and mode per buffer.
				mode := p.cbc
				if fresh {
					block, err := aes.NewCipher(p.key[:16])
					if err != nil {
						return err
					}
					mode = cipher.NewCBCEncrypter(block, p.iv)
				}
				mode.CryptBlocks(p.out[:bufferBytes], p.in)
				return nil
			}},
		{name: "sha256", bucket: "hash", algorithm: "SHA-256", bytesPerOp: bufferBytes,
			op: func(fresh bool) error {
				if fresh {
					return p.digest(sha256.New())
				}
				p.sha256.Reset()
				return p.digest(p.sha256)
			}},
		{name: "sha1", bucket: "hash", algorithm: "SHA-1", bytesPerOp: bufferBytes,
			op: func(fresh bool) error {
				if fresh {
					return p.digest(sha1.New())
				}
				p.sha1.Reset()
				return p.digest(p.sha1)
			}},
		// RSA-2048 PSS/SHA-256, salt = hash length, as TLS 1.3 signs.
		{name: "rsa", bucket: "signature", algorithm: "RSA", op: func(bool) error {
			p.hashed[0]++
			_, err := rsa.SignPSS(rand.Reader, p.rsaKey, crypto.SHA256, p.hashed[:],
				&rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
			return err
		}},
		{name: "x25519", bucket: "key_exchange", algorithm: "X25519", absent: x25519 == nil, op: func(bool) error {
			s, err := x25519(p.x25519Priv, p.x25519Peers[p.nextPeer(len(p.x25519Peers))])
			if err == nil {
				p.secretSink ^= s[0]
			}
			return err
		}},
		{name: "ecdsa_p256", bucket: "signature", algorithm: "ECDSA-P256", needsWithP256: true, op: func(bool) error {
			p.hashed[0]++
			_, err := ecdsa.SignASN1(rand.Reader, p.ecdsaKey, p.hashed[:])
			return err
		}},
		// What crypto/tls does for a P-256 key share: 1.19 (no crypto/ecdh)
		// unmarshals the peer and scalar-multiplies, as a key server does;
		// 1.20+ goes through crypto/ecdh.
		{name: "ecdhe_p256", bucket: "key_exchange", algorithm: "ECDHE-P256", needsWithP256: true, op: func(bool) error {
			peer := p.p256Peers[p.nextPeer(len(p.p256Peers))]
			if p256ECDH != nil {
				b, err := p256ECDH(p.p256Priv, peer)
				p.secretSink ^= b
				return err
			}
			curve := elliptic.P256()
			x, y := elliptic.Unmarshal(curve, peer)
			if x == nil {
				return errors.New("bad P-256 peer point")
			}
			sx, _ := curve.ScalarMult(x, y, p.p256Priv)
			p.secretSink ^= byte(sx.Bit(0))
			return nil
		}},
		// The post-quantum ones, last, as the C runner's: ML-KEM-768 from Go
		// 1.24 (crypto/mlkem); no ML-DSA in any Go release here.
		{name: "ml_kem_768", bucket: "key_exchange", algorithm: "ML-KEM", notDefault: true, absent: mlKem768 == nil,
			op: func(bool) error {
				b, err := mlKem768()
				p.secretSink ^= b
				return err
			}},
		{name: "ml_dsa_65", bucket: "signature", algorithm: "ML-DSA", notDefault: true, absent: true,
			op: func(bool) error { return errors.New("no ML-DSA in Go's standard library") }},
	}
}

// applyMix parses "name=weight,..."; names not listed get weight 0.
func applyMix(mix string, cats []*category) error {
	for _, c := range cats {
		c.weight = 0
	}
	for _, item := range strings.Split(mix, ",") {
		if item == "" {
			continue
		}
		name, w, hasW := strings.Cut(item, "=")
		weight := 1.0
		if hasW {
			var err error
			if weight, err = strconv.ParseFloat(w, 64); err != nil || !(weight >= 0) {
				return fmt.Errorf("--mix: weight for '%s' must be a number >= 0", name)
			}
		}
		found := false
		for _, c := range cats {
			if c.name == name {
				if c.absent && weight > 0 {
					return fmt.Errorf("--mix: '%s' is not in %s (built without crypto/tls, whose vendored "+
						"x/crypto it needs, or by a Go release without it); give it weight 0 or leave it out",
						name, program)
				}
				c.weight, found = weight, true
			}
		}
		if !found {
			var known []string
			for _, c := range cats {
				known = append(known, c.name)
			}
			return fmt.Errorf("--mix: unknown category '%s'; known: %s", name, strings.Join(known, " "))
		}
	}
	return nil
}

// splitmix64 (Steele, Lea and Flood 2014; the C runner's generator): a seed
// gives the same sequence in every ground truth.
type splitmix64 struct{ state uint64 }

func (r *splitmix64) next() uint64 {
	r.state += 0x9E3779B97F4A7C15
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// uniform is a double in [0, 1) from the top 53 bits.
func (r *splitmix64) uniform() float64 { return float64(r.next()>>11) * (1.0 / (1 << 53)) }

// Drawn mixes: a weight log-uniform in [minDrawnWeight, maxDrawnWeight], a
// category dropped with probability dropChance, at least minKept kept.
const (
	minDrawnWeight = 0.25
	drawnRange     = 16.0 // max/min weight
	dropChance     = 0.2
	minKept        = 2
)

// pow16 is 16^u for u in [0, 1), correctly rounded. Go's math.Pow is not
// correctly rounded (it differs from glibc's pow, which the C runner calls,
// in the last bit of about 1 draw in 120); computed to 192 bits and rounded
// once, it differs from glibc's in about 1 draw in 1,300 (where glibc's is
// off by one ulp), and never by more than one ulp.
func pow16(u float64) float64 {
	const prec = 192
	num := func(i int64) *big.Float { return new(big.Float).SetPrec(prec).SetInt64(i) }
	// ln 2 = sum over k >= 1 of 1/(k 2^k), 1 bit per term.
	ln2 := num(0)
	for k := 1; k <= prec+16; k++ {
		t := num(1)
		t.SetMantExp(t, -k)
		ln2.Add(ln2, t.Quo(t, num(int64(k))))
	}
	// 16^u = 2^(4u) = 2^i * e^(f ln 2) with 4u = i + f exactly (u < 1).
	i, f := math.Modf(4 * u)
	y := new(big.Float).SetPrec(prec).SetFloat64(f)
	y.Mul(y, ln2)
	sum, term := num(1), num(1)
	for n := int64(1); n < 80; n++ { // y < 0.7: 0.7^80/80! is far below 2^-192
		term.Mul(term, y)
		term.Quo(term, num(n))
		sum.Add(sum, term)
	}
	r, _ := sum.SetMantExp(sum, int(i)).Float64()
	return r
}

// drawMix draws every standard category's weight and fresh share from seed,
// in report order, absent ones included, so the sequence does not depend on
// the build; then absent categories get weight 0 and, if fewer than minKept
// of the rest are kept, dropped ones come back in report order.
func drawMix(seed uint64, cats []*category) {
	rng := splitmix64{state: seed}
	dropped := make([]bool, len(cats))
	for i, c := range cats {
		u1, u2, u3 := rng.uniform(), rng.uniform(), rng.uniform()
		c.weight = minDrawnWeight * pow16(u1)
		dropped[i] = u2 < dropChance
		c.freshShare = u3
	}
	kept := 0
	for i, c := range cats {
		if !c.absent && !dropped[i] {
			kept++
		}
	}
	for i, c := range cats {
		if kept >= minKept {
			break
		}
		if !c.absent && dropped[i] {
			dropped[i] = false
			kept++
		}
	}
	for i, c := range cats {
		if c.absent || dropped[i] {
			c.weight = 0
		}
	}
}

// calibrate sizes each batch to about 200 us (see groundtruth_runner.cc).
func calibrate(cats []*category) error {
	for _, c := range cats {
		if c.weight <= 0 {
			continue
		}
		for i := 0; i < 3; i++ {
			if err := c.op(c.nextFresh()); err != nil {
				return fmt.Errorf("warm-up of %s: %w", c.name, err)
			}
		}
		t0 := nowNanos(clockThreadCPUTime)
		n := 0
		for nowNanos(clockThreadCPUTime)-t0 < 5_000_000 {
			if err := c.op(c.nextFresh()); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			n++
		}
		c.batch = int(200_000 / (5e6 / float64(n)))
		if c.batch < 1 {
			c.batch = 1
		}
	}
	return nil
}

type window struct {
	startUnixNs, endUnixNs, startMonoNs, endMonoNs int64
	threadCPUNs, processCPUNs                      int64
	// [CLOCK_MONOTONIC ns, measured category CPU ns so far] about every
	// timelineStepNs: a profile of a sub-window is compared with the truth
	// of that same sub-window.
	timeline [][2]int64
}

const timelineStepNs = 100_000_000

var monoBase = time.Now()

// monoNanos is CLOCK_MONOTONIC-based but not its absolute value; the JSON's
// *_monotonic_ns come from clock_gettime directly.
func monotonicNs() int64 {
	var ts syscall.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

type worker struct {
	cats     []*category
	sliceNs  int64
	warmup   time.Duration
	stop     atomic.Bool
	failed   atomic.Bool
	tid      int
	win      window
	warmDone chan struct{}
	done     chan struct{}
}

func (w *worker) runSlice(c *category, measuring bool) int64 {
	t0 := nowNanos(clockThreadCPUTime)
	t1 := t0
	var ops, freshOps int64
	for t1-t0 < w.sliceNs {
		for i := 0; i < c.batch; i++ {
			fresh := c.nextFresh()
			if fresh {
				freshOps++
			}
			if err := c.op(fresh); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %s failed: %v\n", program, c.name, err)
				w.failed.Store(true)
				w.stop.Store(true)
				break
			}
		}
		ops += int64(c.batch)
		t1 = nowNanos(clockThreadCPUTime)
		if w.stop.Load() {
			break
		}
	}
	if measuring {
		c.ops += ops
		c.freshOps += freshOps
	}
	return t1 - t0
}

// pick is deficit scheduling: the category with the least CPU per weight.
func (w *worker) pick(measuring bool) *category {
	var best *category
	var bestV float64
	for _, c := range w.cats {
		if c.weight <= 0 {
			continue
		}
		used := c.warmCPUNs
		if measuring {
			used = c.cpuNs
		}
		if v := float64(used) / c.weight; best == nil || v < bestV {
			best, bestV = c, v
		}
	}
	return best
}

func (w *worker) run() {
	// One OS thread for the whole run, so CLOCK_THREAD_CPUTIME_ID and the
	// profile's tid both mean this goroutine's work.
	runtime.LockOSThread()
	defer close(w.done)
	w.tid = syscall.Gettid()
	// Name the thread like the C++ worker (prctl PR_SET_NAME, comm of this
	// thread only), so a profile can find it by name as well as by tid.
	name := []byte("tlsprof-gt-wrk\x00")
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0)
	// Calibrate on the locked thread: its CPU clock is only meaningful there.
	if err := calibrate(w.cats); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
		w.failed.Store(true)
		return
	}
	warmEnd := time.Now().Add(w.warmup)
	for !w.stop.Load() && time.Now().Before(warmEnd) {
		c := w.pick(false)
		c.warmCPUNs += w.runSlice(c, false)
	}
	w.win.startMonoNs = monotonicNs()
	w.win.startUnixNs = time.Now().UnixNano()
	cpu0 := nowNanos(clockThreadCPUTime)
	pcpu0 := nowNanos(clockProcessCPUTime)
	close(w.warmDone)
	var measuredNs int64
	w.win.timeline = append(w.win.timeline, [2]int64{w.win.startMonoNs, 0})
	for !w.stop.Load() {
		c := w.pick(true)
		used := w.runSlice(c, true)
		c.cpuNs += used
		measuredNs += used
		if now := monotonicNs(); now-w.win.timeline[len(w.win.timeline)-1][0] >= timelineStepNs {
			w.win.timeline = append(w.win.timeline, [2]int64{now, measuredNs})
		}
	}
	w.win.threadCPUNs = nowNanos(clockThreadCPUTime) - cpu0
	w.win.processCPUNs = nowNanos(clockProcessCPUTime) - pcpu0
	w.win.endMonoNs = monotonicNs()
	w.win.endUnixNs = time.Now().UnixNano()
}

func writeFileAtomically(path string, data []byte) error {
	// Only a regular file (or a new one) is replaced by rename: renaming over
	// /dev/null or a FIFO would replace the node itself.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return os.WriteFile(path, data, 0o644)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

type categoryJSON struct {
	Name        string  `json:"name"`
	Bucket      string  `json:"bucket"`
	Algorithm   string  `json:"algorithm"`
	TargetShare float64 `json:"target_share"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	Ops         int64   `json:"ops"`
	Bytes       int64   `json:"bytes"`
	FreshShare  float64 `json:"fresh_share"`
	FreshOps    int64   `json:"fresh_ops"`
}

type windowJSON struct {
	StartUnixNs      int64 `json:"start_unix_ns"`
	EndUnixNs        int64 `json:"end_unix_ns"`
	StartMonotonicNs int64 `json:"start_monotonic_ns"`
	EndMonotonicNs   int64 `json:"end_monotonic_ns"`
}

type reportJSON struct {
	Pid                  int                `json:"pid"`
	Tid                  int                `json:"tid"`
	Library              string             `json:"library"`
	Program              string             `json:"program"`
	Seed                 *uint64            `json:"seed"` // null without --seed
	Mix                  map[string]float64 `json:"mix"`  // the weights used, enabled categories
	WallSeconds          float64            `json:"wall_seconds"`
	ThreadCPUSeconds     float64            `json:"thread_cpu_seconds"`
	ProcessCPUSeconds    float64            `json:"process_cpu_seconds"`
	Window               windowJSON         `json:"window"`
	Timeline             [][2]int64         `json:"timeline"`
	SliceMs              float64            `json:"slice_ms"`
	BufferBytes          int                `json:"buffer_bytes"`
	Categories           []categoryJSON     `json:"categories"`
	MeasuredCPUSeconds   float64            `json:"measured_cpu_seconds"`
	UnmeasuredCPUSeconds float64            `json:"unmeasured_cpu_seconds"`
	OK                   bool               `json:"ok"`
}

func main() {
	duration := flag.Float64("duration", 20, "Measured window in seconds (after warm-up); 0 = until SIGTERM")
	warmup := flag.Float64("warmup", 1, "Seconds of unmeasured mix before the window")
	sliceMs := flag.Float64("slice-ms", 20, "Thread CPU per slice of one category")
	mix := flag.String("mix", "", "Target CPU shares, name=weight,... (unlisted = off). Names: aes_gcm, "+
		"chacha20_poly1305, aes_cbc, sha256, sha1, rsa, x25519, ecdsa_p256, ecdhe_p256, ml_kem_768 (Go 1.24+), ml_dsa_65 (none)")
	withP256 := flag.Bool("with-p256", false, "Add ecdsa_p256 and ecdhe_p256 to the default mix")
	seedText := flag.String("seed", "", "Draw the mix and each category's share of fresh-context ops from this "+
		"uint64 (decimal), as the C ground truths do; implies --with-p256. With --mix, its weights replace "+
		"the drawn ones")
	output := flag.String("output", "", "JSON written at exit")
	readyFile := flag.String("ready-file", "", "Written (content: pid) when the measured window starts")
	flag.Parse()
	// The TLS build links crypto/tls's connection code in, as every Go TLS
	// server does (tls.go); the no-TLS build links none (notls.go).
	if !linkTLS() {
		os.Exit(1)
	}
	if flag.NArg() != 0 || *duration < 0 || *warmup < 0 || !(*sliceMs > 0) {
		fmt.Fprintf(os.Stderr, "%s: bad arguments (see --help)\n", program)
		os.Exit(2)
	}
	var seed *uint64
	if *seedText != "" {
		s, err := strconv.ParseUint(*seedText, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: --seed '%s' is not a decimal uint64 (0 to 18446744073709551615)\n",
				program, *seedText)
			os.Exit(2)
		}
		seed = &s
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	p := &primitives{}
	cats := p.categories()
	if seed != nil {
		drawMix(*seed, cats)
	} else {
		for _, c := range cats {
			c.weight = 1
			if c.absent || c.notDefault || (c.needsWithP256 && !*withP256) {
				c.weight = 0
			}
		}
	}
	if *mix != "" {
		if err := applyMix(*mix, cats); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	totalW := 0.0
	enabled := map[string]bool{}
	mixUsed := map[string]float64{}
	var mixText []string
	for _, c := range cats {
		totalW += c.weight
		enabled[c.name] = c.weight > 0
		if c.weight > 0 {
			mixUsed[c.name] = c.weight
			mixText = append(mixText, fmt.Sprintf("%s=%s", c.name, strconv.FormatFloat(c.weight, 'g', -1, 64)))
		}
	}
	if totalW <= 0 {
		fmt.Fprintln(os.Stderr, "--mix: at least one category needs a weight > 0")
		os.Exit(2)
	}
	// The mix on stderr as --mix would take it, so a run can be replayed or
	// read without its JSON.
	if seed != nil {
		var fresh []string
		for _, c := range cats {
			if c.weight > 0 {
				fresh = append(fresh, fmt.Sprintf("%s=%.3f", c.name, c.freshShare))
			}
		}
		fmt.Fprintf(os.Stderr, "%s: seed %d, mix %s, fresh shares %s\n", program, *seed,
			strings.Join(mixText, ","), strings.Join(fresh, ","))
	} else {
		fmt.Fprintf(os.Stderr, "%s: seed none, mix %s\n", program, strings.Join(mixText, ","))
	}
	if err := p.setup(func(n string) bool { return enabled[n] }); err != nil {
		fmt.Fprintf(os.Stderr, "%s: setup failed: %v\n", program, err)
		os.Exit(1)
	}

	w := &worker{cats: cats, sliceNs: int64(*sliceMs * 1e6), warmup: time.Duration(*warmup * float64(time.Second)),
		warmDone: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	select {
	case <-w.warmDone:
		if *readyFile != "" {
			if err := writeFileAtomically(*readyFile, []byte(fmt.Sprintf("%d\n", os.Getpid()))); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
				w.failed.Store(true)
				break
			}
		}
		var timeout <-chan time.Time
		if *duration > 0 {
			left := time.Duration(*duration*1e9) - time.Duration(monotonicNs()-w.win.startMonoNs)
			timeout = time.After(left)
		}
		select {
		case <-sigs:
		case <-timeout:
		case <-w.done:
		}
	case <-sigs:
	case <-w.done:
	}
	w.stop.Store(true)
	<-w.done

	rep := reportJSON{Pid: os.Getpid(), Tid: w.tid, Library: "go", Program: program, Seed: seed, Mix: mixUsed,
		WallSeconds:       float64(w.win.endMonoNs-w.win.startMonoNs) * 1e-9,
		ThreadCPUSeconds:  float64(w.win.threadCPUNs) * 1e-9,
		ProcessCPUSeconds: float64(w.win.processCPUNs) * 1e-9,
		Window:            windowJSON{w.win.startUnixNs, w.win.endUnixNs, w.win.startMonoNs, w.win.endMonoNs},
		Timeline:          w.win.timeline,
		SliceMs:           *sliceMs, BufferBytes: bufferBytes, Categories: []categoryJSON{}, OK: !w.failed.Load()}
	var sumNs int64
	for _, c := range cats {
		if c.weight <= 0 {
			continue
		}
		sumNs += c.cpuNs
		rep.Categories = append(rep.Categories, categoryJSON{c.name, c.bucket, c.algorithm, c.weight / totalW,
			float64(c.cpuNs) * 1e-9, c.ops, c.ops * c.bytesPerOp, c.freshShare, c.freshOps})
	}
	rep.MeasuredCPUSeconds = float64(sumNs) * 1e-9
	rep.UnmeasuredCPUSeconds = float64(w.win.threadCPUNs-sumNs) * 1e-9
	text, _ := json.MarshalIndent(rep, "", "  ")
	text = append(text, '\n')
	if *output != "" {
		if err := writeFileAtomically(*output, text); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
			os.Exit(1)
		}
	} else {
		os.Stdout.Write(text)
	}
	status := ""
	if w.failed.Load() {
		status = " (FAILED, see above)"
	}
	fmt.Fprintf(os.Stderr, "%s: window %.2fs, thread cpu %.3fs, measured %.3fs%s\n", program,
		rep.WallSeconds, rep.ThreadCPUSeconds, rep.MeasuredCPUSeconds, status)
	if w.failed.Load() {
		os.Exit(1)
	}
}
