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
// go:linkname into the vendored packages (see below); Go 1.20+ has
// crypto/ecdh for X25519, but still no public ChaCha20-Poly1305.
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
	"crypto/tls"
	_ "crypto/tls" // links the vendored x/crypto packages the linknames below name
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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

// The std's vendored x/crypto, as crypto/tls calls it (Go 1.19 only: from
// Go 1.23 the linker refuses pull-only linknames into the std by default).
//
//go:linkname x25519 vendor/golang.org/x/crypto/curve25519.X25519
func x25519(scalar, point []byte) ([]byte, error)

//go:linkname newChaCha20Poly1305 vendor/golang.org/x/crypto/chacha20poly1305.New
func newChaCha20Poly1305(key []byte) (cipher.AEAD, error)

const (
	bufferBytes = 16 * 1024
	peerKeys    = 64
	program     = "tlsprof-go-groundtruth"

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

type category struct {
	name, bucket, algorithm string
	needsWithP256           bool
	bytesPerOp              int64
	op                      func() error

	weight     float64
	batch      int
	cpuNs, ops int64
	warmCPUNs  int64
}

// primitives holds the state behind the category closures.
type primitives struct {
	in, out     []byte
	nonce       []byte
	aad         [13]byte
	counter     uint64
	gcm, chacha cipher.AEAD
	cbc         cipher.BlockMode
	rsaKey      *rsa.PrivateKey
	ecdsaKey    *ecdsa.PrivateKey
	digest      [32]byte
	x25519Priv  []byte
	x25519Peers [][]byte
	p256Priv    []byte
	p256Peers   [][]byte // uncompressed points, unmarshalled per op as crypto/tls does
	peerIndex   int
	secretSink  byte
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
	key := make([]byte, 32)
	if _, err := rand.Read(p.in); err != nil {
		return err
	}
	if _, err := rand.Read(key); err != nil {
		return err
	}
	block, err := aes.NewCipher(key[:16])
	if err != nil {
		return err
	}
	if p.gcm, err = cipher.NewGCM(block); err != nil {
		return err
	}
	if p.chacha, err = newChaCha20Poly1305(key); err != nil {
		return err
	}
	p.cbc = cipher.NewCBCEncrypter(block, make([]byte, aes.BlockSize))
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

func (p *primitives) categories() []*category {
	return []*category{
		{name: "aes_gcm", bucket: "cipher", algorithm: "AES-GCM", bytesPerOp: bufferBytes,
			op: func() error { return p.seal(p.gcm) }},
		{name: "chacha20_poly1305", bucket: "cipher", algorithm: "ChaCha20-Poly1305", bytesPerOp: bufferBytes,
			op: func() error { return p.seal(p.chacha) }},
		{name: "aes_cbc", bucket: "cipher", algorithm: "AES-CBC", bytesPerOp: bufferBytes,
			// The mode keeps chaining across calls, like a CBC record stream.
			op: func() error { p.cbc.CryptBlocks(p.out[:bufferBytes], p.in); return nil }},
		{name: "sha256", bucket: "hash", algorithm: "SHA-256", bytesPerOp: bufferBytes,
			op: func() error { s := sha256.Sum256(p.in); p.secretSink ^= s[0]; return nil }},
		{name: "sha1", bucket: "hash", algorithm: "SHA-1", bytesPerOp: bufferBytes,
			op: func() error { s := sha1.Sum(p.in); p.secretSink ^= s[0]; return nil }},
		// RSA-2048 PSS/SHA-256, salt = hash length, as TLS 1.3 signs.
		{name: "rsa", bucket: "signature", algorithm: "RSA", op: func() error {
			p.digest[0]++
			_, err := rsa.SignPSS(rand.Reader, p.rsaKey, crypto.SHA256, p.digest[:],
				&rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
			return err
		}},
		{name: "x25519", bucket: "key_exchange", algorithm: "X25519", op: func() error {
			s, err := x25519(p.x25519Priv, p.x25519Peers[p.nextPeer(len(p.x25519Peers))])
			if err == nil {
				p.secretSink ^= s[0]
			}
			return err
		}},
		{name: "ecdsa_p256", bucket: "signature", algorithm: "ECDSA-P256", needsWithP256: true, op: func() error {
			p.digest[0]++
			_, err := ecdsa.SignASN1(rand.Reader, p.ecdsaKey, p.digest[:])
			return err
		}},
		// What crypto/tls 1.19 does for a P-256 key share (there is no
		// crypto/ecdh before Go 1.20): unmarshal the peer, scalar-multiply.
		{name: "ecdhe_p256", bucket: "key_exchange", algorithm: "ECDHE-P256", needsWithP256: true, op: func() error {
			curve := elliptic.P256()
			x, y := elliptic.Unmarshal(curve, p.p256Peers[p.nextPeer(len(p.p256Peers))])
			if x == nil {
				return errors.New("bad P-256 peer point")
			}
			sx, _ := curve.ScalarMult(x, y, p.p256Priv)
			p.secretSink ^= byte(sx.Bit(0))
			return nil
		}},
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

// calibrate sizes each batch to about 200 us (see groundtruth_runner.cc).
func calibrate(cats []*category) error {
	for _, c := range cats {
		if c.weight <= 0 {
			continue
		}
		for i := 0; i < 3; i++ {
			if err := c.op(); err != nil {
				return fmt.Errorf("warm-up of %s: %w", c.name, err)
			}
		}
		t0 := nowNanos(clockThreadCPUTime)
		n := 0
		for nowNanos(clockThreadCPUTime)-t0 < 5_000_000 {
			if err := c.op(); err != nil {
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
	var ops int64
	for t1-t0 < w.sliceNs {
		for i := 0; i < c.batch; i++ {
			if err := c.op(); err != nil {
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
}

type windowJSON struct {
	StartUnixNs      int64 `json:"start_unix_ns"`
	EndUnixNs        int64 `json:"end_unix_ns"`
	StartMonotonicNs int64 `json:"start_monotonic_ns"`
	EndMonotonicNs   int64 `json:"end_monotonic_ns"`
}

type reportJSON struct {
	Pid                  int            `json:"pid"`
	Tid                  int            `json:"tid"`
	Library              string         `json:"library"`
	WallSeconds          float64        `json:"wall_seconds"`
	ThreadCPUSeconds     float64        `json:"thread_cpu_seconds"`
	ProcessCPUSeconds    float64        `json:"process_cpu_seconds"`
	Window               windowJSON     `json:"window"`
	Timeline             [][2]int64     `json:"timeline"`
	SliceMs              float64        `json:"slice_ms"`
	BufferBytes          int            `json:"buffer_bytes"`
	Categories           []categoryJSON `json:"categories"`
	MeasuredCPUSeconds   float64        `json:"measured_cpu_seconds"`
	UnmeasuredCPUSeconds float64        `json:"unmeasured_cpu_seconds"`
	OK                   bool           `json:"ok"`
}

var tlsHandshake = (*tls.Conn).Handshake

func main() {
	duration := flag.Float64("duration", 20, "Measured window in seconds (after warm-up); 0 = until SIGTERM")
	warmup := flag.Float64("warmup", 1, "Seconds of unmeasured mix before the window")
	sliceMs := flag.Float64("slice-ms", 20, "Thread CPU per slice of one category")
	mix := flag.String("mix", "", "Target CPU shares, name=weight,... (unlisted = off). Names: aes_gcm, "+
		"chacha20_poly1305, aes_cbc, sha256, sha1, rsa, x25519, ecdsa_p256, ecdhe_p256")
	withP256 := flag.Bool("with-p256", false, "Add ecdsa_p256 and ecdhe_p256 to the default mix")
	output := flag.String("output", "", "JSON written at exit")
	readyFile := flag.String("ready-file", "", "Written (content: pid) when the measured window starts")
	flag.Parse()
	// Link crypto/tls's connection code in, as in every Go TLS server:
	// tlsprof recognises a Go binary's crypto as TLS library code only when
	// crypto/tls is there.
	if tlsHandshake == nil {
		os.Exit(1)
	}
	if flag.NArg() != 0 || *duration < 0 || *warmup < 0 || !(*sliceMs > 0) {
		fmt.Fprintf(os.Stderr, "%s: bad arguments (see --help)\n", program)
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	p := &primitives{}
	cats := p.categories()
	for _, c := range cats {
		c.weight = 1
		if c.needsWithP256 && !*withP256 {
			c.weight = 0
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
	for _, c := range cats {
		totalW += c.weight
		enabled[c.name] = c.weight > 0
	}
	if totalW <= 0 {
		fmt.Fprintln(os.Stderr, "--mix: at least one category needs a weight > 0")
		os.Exit(2)
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

	rep := reportJSON{Pid: os.Getpid(), Tid: w.tid, Library: "go",
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
			float64(c.cpuNs) * 1e-9, c.ops, c.ops * c.bytesPerOp})
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
