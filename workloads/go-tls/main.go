// tlsprof-go-tls: a Go crypto/tls server and a load client, for profiling
// Go's TLS stack (full symbols, frame pointers).
//
//	tlsprof-go-tls server --addr 127.0.0.1:0 --cert rsa|ecdsa --ready-file F [--duration S]
//	                      [--handshake-only] [--tickets=false] [--stats-file F] [--default-curves]
//	tlsprof-go-tls client --addr HOST:PORT [--duration S] [--handshake-rate N] [--bulk-conns N] [--bulk-mibps N]
//	tlsprof-go-tls handshakes --addr HOST:PORT [--duration S] [--rate N] [--concurrency N] [--resume] [--output F]
//
// `server --handshake-only` with `handshakes` is the handshake-only load of
// the Go crypto/tls study tlsprof's usage telemetry is checked against
// (bench/usage_handshake_cost.py): each client connection handshakes, sends
// one byte and waits for the server to close; the server reads the byte and
// closes. `handshakes` keeps its own count (full and resumed, from the
// connection state) and writes it as JSON.
//
// The ground truth of a handshake's cost: with --stats-file, the server
// times each (*Conn).Handshake on its own thread (the goroutine locked to
// it for the call: the thread's CPU clock is then the goroutine's), less
// the time in the connection's Read and Write (the system calls, and the
// scheduler while the goroutine waits): what crypto/tls itself spent, in
// user mode, which is what tlsprof's sampled TLS CPU of the handshake phase
// measures. The file gets it as JSON at the stop: {"handshakes",
// "resumed", "failed_conns", "handshake_cpu_seconds": {"full", "resumed"}}.
//
// The client makes full handshakes (no session resumption) at a steady
// rate, and keeps bulk connections busy: half TLS 1.3 (AES-GCM, Go's choice
// on AES-NI hardware), half TLS 1.2 forced to ChaCha20-Poly1305. So the
// server shows cipher, signature (RSA or ECDSA) and key exchange (X25519).
//
// Wire protocol inside TLS: the client sends an 8-byte big-endian length N,
// the server answers with N bytes.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const recordSize = 16 * 1024

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "server":
		err = runServer(os.Args[2:])
	case "client":
		err = runClient(os.Args[2:])
	case "handshakes":
		err = runHandshakes(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tlsprof-go-tls %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tlsprof-go-tls server|client|handshakes [flags]; -h after the mode lists the flags")
	os.Exit(2)
}

// stopContext returns a channel closed on SIGTERM/SIGINT or after d (d <= 0: signal only).
func stopChannel(d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		var timeout <-chan time.Time
		if d > 0 {
			timeout = time.After(d)
		}
		select {
		case <-sigs:
		case <-timeout:
		}
		close(done)
	}()
	return done
}

// writeFileAtomically writes via a temp file and rename so a poller never
// reads it half-written.
func writeFileAtomically(path, content string) error {
	// Only a regular file (or a new one) is replaced by rename: renaming over
	// /dev/null or a FIFO would replace the node itself.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return os.WriteFile(path, []byte(content), 0o644)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func makeCert(kind string) (tls.Certificate, error) {
	var priv interface{}
	var pub interface{}
	switch kind {
	case "rsa":
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return tls.Certificate{}, err
		}
		priv, pub = k, &k.PublicKey
	case "ecdsa":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		priv, pub = k, &k.PublicKey
	default:
		return tls.Certificate{}, fmt.Errorf("--cert must be rsa or ecdsa, not %q", kind)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "tlsprof-go-tls"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, nil
}

// ---- server -----------------------------------------------------------------

type serverStats struct {
	mu       sync.Mutex
	suites   map[string]int64
	hs       int64
	resumed  int64
	bytes    int64
	failures int64
	// The handshakes' own CPU (--stats-file), full and resumed.
	fullCPU, resumedCPU time.Duration
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the
// goroutine's only while it is locked to the thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// ioTimedConn counts the thread CPU spent in the connection's Read and
// Write, so that a handshake's own CPU can leave it out. Used by one
// goroutine, locked to its thread while it counts.
type ioTimedConn struct {
	net.Conn
	io time.Duration
}

func (c *ioTimedConn) Read(b []byte) (int, error) {
	t := threadCPU()
	n, err := c.Conn.Read(b)
	c.io += threadCPU() - t
	return n, err
}

func (c *ioTimedConn) Write(b []byte) (int, error) {
	t := threadCPU()
	n, err := c.Conn.Write(b)
	c.io += threadCPU() - t
	return n, err
}

// timedHandshake runs c's handshake on a thread of its own and returns
// crypto/tls's CPU for it (the thread's CPU less what the connection's I/O
// took).
func timedHandshake(c *tls.Conn, conn *ioTimedConn) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	io0, t0 := conn.io, threadCPU()
	err := c.Handshake()
	return threadCPU() - t0 - (conn.io - io0), err
}

func runServer(args []string) error {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0 = ephemeral)")
	certKind := fs.String("cert", "rsa", "certificate key: rsa (RSA-2048) or ecdsa (P-256)")
	ready := fs.String("ready-file", "", "written (content: host:port) once listening")
	duration := fs.Duration("duration", 0, "stop after this long (0 = until SIGTERM/SIGINT); e.g. 30s")
	handshakeOnly := fs.Bool("handshake-only", false, "after each handshake read one byte, then close")
	tickets := fs.Bool("tickets", true, "issue session tickets (resumption); false: every handshake is full")
	defaultCurves := fs.Bool("default-curves", false, "the toolchain's default key exchanges (Go 1.24: X25519MLKEM768 first; GODEBUG=tlsmlkem=0 drops it) instead of X25519 and P-256 only")
	statsFile := fs.String("stats-file", "", "time each handshake's CPU; write the counts and the handshakes' CPU (JSON) here at the stop")
	fs.Parse(args)

	cert, err := makeCert(*certKind)
	if err != nil {
		return fmt.Errorf("making %s certificate: %w", *certKind, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// X25519 first, as Go's default; listed so the key exchange is fixed.
		CurvePreferences:       []tls.CurveID{tls.X25519, tls.CurveP256},
		SessionTicketsDisabled: !*tickets,
	}
	if *defaultCurves {
		cfg.CurvePreferences = nil
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *addr, err)
	}
	stop := stopChannel(*duration)
	if *ready != "" {
		if err := writeFileAtomically(*ready, ln.Addr().String()+"\n"); err != nil {
			return fmt.Errorf("writing ready file: %w", err)
		}
	}
	st := &serverStats{suites: map[string]int64{}}
	var wg sync.WaitGroup
	var connsMu sync.Mutex
	conns := map[net.Conn]struct{}{}
	go func() {
		<-stop
		ln.Close()
	}()
	start := time.Now()
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-stop:
			default:
				fmt.Fprintf(os.Stderr, "tlsprof-go-tls server: accept: %v\n", err)
			}
			break
		}
		connsMu.Lock()
		conns[c] = struct{}{}
		connsMu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if *statsFile != "" {
				timed := &ioTimedConn{Conn: c}
				serveConn(tls.Server(timed, cfg), timed, st, *handshakeOnly)
			} else {
				serveConn(tls.Server(c, cfg), nil, st, *handshakeOnly)
			}
			connsMu.Lock()
			delete(conns, c)
			connsMu.Unlock()
		}()
	}
	// Close live connections so their goroutines end.
	connsMu.Lock()
	for c := range conns {
		c.Close()
	}
	connsMu.Unlock()
	wg.Wait()
	names := make([]string, 0, len(st.suites))
	for n, v := range st.suites {
		names = append(names, fmt.Sprintf("%s=%d", n, v))
	}
	sort.Strings(names)
	fmt.Printf("tlsprof-go-tls server: %.1fs handshakes=%d bytes=%d failed_conns=%d suites: %s\n",
		time.Since(start).Seconds(), st.hs, st.bytes, st.failures, strings.Join(names, " "))
	if *statsFile != "" {
		out, _ := json.Marshal(map[string]any{
			"handshakes": st.hs, "resumed": st.resumed, "failed_conns": st.failures,
			"handshake_cpu_seconds": map[string]float64{"full": st.fullCPU.Seconds(), "resumed": st.resumedCPU.Seconds()},
		})
		if err := writeFileAtomically(*statsFile, string(out)+"\n"); err != nil {
			return fmt.Errorf("writing stats file: %w", err)
		}
	}
	return nil
}

// serveConn serves one connection; `timed` (non-nil with --stats-file) is
// the connection under c, whose handshake is then timed.
func serveConn(c *tls.Conn, timed *ioTimedConn, st *serverStats, handshakeOnly bool) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var cpu time.Duration
	var err error
	if timed != nil {
		cpu, err = timedHandshake(c, timed)
	} else {
		err = c.Handshake()
	}
	if err != nil {
		// Clients that go away mid-handshake at shutdown end up here too.
		atomic.AddInt64(&st.failures, 1)
		return
	}
	cs := c.ConnectionState()
	name := versionName(cs.Version) + "/" + tls.CipherSuiteName(cs.CipherSuite)
	st.mu.Lock()
	st.hs++
	st.suites[name]++
	if cs.DidResume {
		st.resumed++
		st.resumedCPU += cpu
	} else {
		st.fullCPU += cpu
	}
	st.mu.Unlock()
	if handshakeOnly {
		var one [1]byte
		io.ReadFull(c, one[:])
		return // the deferred Close
	}
	buf := make([]byte, recordSize)
	var req [8]byte
	for {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return // EOF or close: the client is done
		}
		n := binary.BigEndian.Uint64(req[:])
		for n > 0 {
			chunk := uint64(len(buf))
			if n < chunk {
				chunk = n
			}
			w, err := c.Write(buf[:chunk])
			atomic.AddInt64(&st.bytes, int64(w))
			if err != nil {
				return
			}
			n -= chunk
		}
	}
}

// versionName is tls.VersionName, which Go 1.19 does not have yet (1.21).
func versionName(v uint16) string {
	switch v {
	case tls.VersionTLS12:
		return "TLS1.2"
	case tls.VersionTLS13:
		return "TLS1.3"
	}
	return fmt.Sprintf("0x%04x", v)
}

// ---- client -----------------------------------------------------------------

type clientStats struct {
	hs, bytes, errs int64
}

func runClient(args []string) error {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	addr := fs.String("addr", "", "server address host:port (required)")
	duration := fs.Duration("duration", 15*time.Second, "how long to run (0 = until SIGTERM/SIGINT)")
	rate := fs.Float64("handshake-rate", 100, "full handshakes per second (0 = none)")
	hsConc := fs.Int("handshake-concurrency", 4, "max handshakes in flight")
	bulkConns := fs.Int("bulk-conns", 2, "keep-alive bulk connections (even: TLS 1.3 AES-GCM, odd: TLS 1.2 ChaCha20-Poly1305)")
	bulkMiBps := fs.Float64("bulk-mibps", 200, "total bulk rate in MiB/s over all bulk connections (0 = unlimited)")
	fs.Parse(args)
	if *addr == "" {
		return errors.New("--addr is required")
	}
	stop := stopChannel(*duration)
	st := &clientStats{}
	var wg sync.WaitGroup
	start := time.Now()

	// Full handshakes: no ClientSessionCache, so never resumed.
	if *rate > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem := make(chan struct{}, *hsConc)
			tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
			defer tick.Stop()
			var inner sync.WaitGroup
			defer inner.Wait()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				select {
				case sem <- struct{}{}:
				default:
					continue // server is behind; skip rather than queue up
				}
				inner.Add(1)
				go func() {
					defer inner.Done()
					defer func() { <-sem }()
					if err := oneHandshake(*addr); err != nil {
						countErr(st, err)
						return
					}
					atomic.AddInt64(&st.hs, 1)
				}()
			}
		}()
	}
	for i := 0; i < *bulkConns; i++ {
		perConn := *bulkMiBps / float64(*bulkConns)
		chacha := i%2 == 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := bulk(*addr, chacha, perConn, stop, st); err != nil {
					countErr(st, err)
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	<-stop
	wg.Wait()
	fmt.Printf("tlsprof-go-tls client: %.1fs handshakes=%d bytes=%d errors=%d\n",
		time.Since(start).Seconds(), st.hs, st.bytes, st.errs)
	if st.hs == 0 && st.bytes == 0 {
		return errors.New("no handshake and no bytes completed; is the server at --addr up?")
	}
	return nil
}

func countErr(st *clientStats, err error) {
	if n := atomic.AddInt64(&st.errs, 1); n <= 10 {
		fmt.Fprintf(os.Stderr, "tlsprof-go-tls client: %v\n", err)
	}
}

func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("handshake with %s: %w", addr, err)
	}
	return c, nil
}

func request(c *tls.Conn, n uint64, buf []byte) (int64, error) {
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], n)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(req[:]); err != nil {
		return 0, err
	}
	got, err := io.ReadFull(c, buf[:n])
	return int64(got), err
}

func oneHandshake(addr string) error {
	// The server's certificate is self-signed and made at its start.
	c, err := dial(addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 1024)
	_, err = request(c, 1024, buf)
	return err
}

// bulk keeps one connection busy at mibps until stop.
func bulk(addr string, chacha bool, mibps float64, stop <-chan struct{}, st *clientStats) error {
	cfg := &tls.Config{InsecureSkipVerify: true}
	if chacha {
		// TLS 1.3 suites are not configurable in Go; TLS 1.2 lets us force ChaCha20.
		cfg.MaxVersion = tls.VersionTLS12
		cfg.CipherSuites = []uint16{
			tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		}
	}
	c, err := dial(addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	const chunk = 256 * 1024
	buf := make([]byte, chunk)
	var interval time.Duration
	if mibps > 0 {
		interval = time.Duration(float64(time.Second) * (float64(chunk) / (1 << 20)) / mibps)
	}
	next := time.Now()
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		n, err := request(c, chunk, buf)
		atomic.AddInt64(&st.bytes, n)
		if err != nil {
			return err
		}
		if interval > 0 {
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			} else if d < -time.Second {
				next = time.Now() // fell far behind; do not burst to catch up
			}
		}
	}
}

// ---- handshakes: the handshake-only client ------------------------------------

type handshakeCounts struct {
	Handshakes int64   `json:"handshakes"`
	Full       int64   `json:"full"`
	Resumed    int64   `json:"resumed"`
	Errors     int64   `json:"errors"`
	Seconds    float64 `json:"seconds"`
	// By negotiated version and suite, as the client saw them.
	Suites map[string]int64 `json:"suites"`
}

func runHandshakes(args []string) error {
	fs := flag.NewFlagSet("handshakes", flag.ExitOnError)
	addr := fs.String("addr", "", "server address host:port (required)")
	duration := fs.Duration("duration", 10*time.Second, "how long to run")
	rate := fs.Float64("rate", 0, "connections per second over all workers (0 = as fast as they go)")
	conc := fs.Int("concurrency", 4, "connections in flight")
	resume := fs.Bool("resume", false, "keep a session cache: resume with the server's tickets")
	tls12 := fs.Bool("tls12", false, "TLS 1.2 only (default: TLS 1.3)")
	output := fs.String("output", "", "write the counts as JSON here (default: stdout only)")
	fs.Parse(args)
	if *addr == "" {
		return errors.New("--addr is required")
	}
	if *conc < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	cfg := &tls.Config{InsecureSkipVerify: true}
	if *resume {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(64)
	}
	if *tls12 {
		cfg.MaxVersion = tls.VersionTLS12
	}
	// Paced by a schedule, not a ticker (which drops the ticks no worker
	// was free for, and fell 10% short at 3,000/s): connection n is due at
	// start + n / rate, and a worker late for its slot starts at once, so
	// the rate holds on average while the workers keep up.
	var issued atomic.Int64
	counts := handshakeCounts{Suites: map[string]int64{}}
	var mu sync.Mutex
	deadline := time.Now().Add(*duration)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < *conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if *rate > 0 {
					due := start.Add(time.Duration(float64(issued.Add(1)-1) / *rate * float64(time.Second)))
					if !due.Before(deadline) {
						return
					}
					time.Sleep(time.Until(due))
				}
				cs, err := handshakeOnce(*addr, cfg)
				mu.Lock()
				if err != nil {
					counts.Errors++
					if counts.Errors <= 10 {
						fmt.Fprintf(os.Stderr, "tlsprof-go-tls handshakes: %v\n", err)
					}
				} else {
					counts.Handshakes++
					if cs.DidResume {
						counts.Resumed++
					} else {
						counts.Full++
					}
					counts.Suites[versionName(cs.Version)+"/"+tls.CipherSuiteName(cs.CipherSuite)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	counts.Seconds = time.Since(start).Seconds()
	out, _ := json.Marshal(counts)
	fmt.Println(string(out))
	if *output != "" {
		if err := writeFileAtomically(*output, string(out)+"\n"); err != nil {
			return err
		}
	}
	if counts.Handshakes == 0 {
		return errors.New("no handshake completed; is the server at --addr up?")
	}
	return nil
}

// handshakeOnce connects, handshakes, sends one byte and reads until the
// server closes (taking in TLS 1.3 session tickets on the way).
func handshakeOnce(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	c, err := dial(addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte{1}); err != nil {
		return tls.ConnectionState{}, err
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		return tls.ConnectionState{}, err
	}
	return c.ConnectionState(), nil
}
