#!/usr/bin/env python3
"""hidden_servers.py: real TLS servers the project does not test, profiled
the way an SRE would (the whole host), against perf on the same run.

For each server (Apache 2.4 event MPM with mod_ssl, Redis 7.0 with TLS,
lighttpd 1.4 with mod_openssl, Caddy 2.6, Postgres 15 with ssl=on), each
certificate (ECDSA P-256, RSA-2048, made here with openssl) and each load
(handshake: a new TLS connection per request; bulk: keep-alive transfers) it
starts the server with that certificate and the load, and then, together:

  - `tlsprof-agent profile --duration D --frequency F --format json` on the
    whole host (no --pid), with `--usage --usage-budget 0` for the handshake
    loads (handshake counts);
  - `perf record -a -F F -k mono --call-graph dwarf` (fp for Caddy: Go keeps
    frame pointers and has no .eh_frame) over a longer span.

perf's samples are cut to the agent's own window (`window.start/end_monotonic_ns`
of the report; perf's clock is CLOCK_MONOTONIC with -k mono). A server is
every process whose name is the server's (postgres' backends are forked per
connection: they are all `postgres`). Printed per server x cert x load:

  - agent: the server's TLS CPU / its CPU (user + kernel), from the report's
    processes[] rows of that name;
  - perf: the server's user-mode samples with any frame in the TLS library
    (libssl/libcrypto; for Caddy, Go functions under crypto/ and
    golang.org/x/crypto/, named from the binary's pclntab since Debian
    strips its symbol table) / all its samples in the window;
  - their ratio, the agent's `unknown` share of TLS time (all buckets) and
    `other/unknown`;
  - handshakes the agent counted (--usage) against the load generator's
    count in the same window (s_time's '*' per connection, time-stamped as
    it is printed; redis' total_connections_received polled; pgbench -l's
    per-transaction log with -C).

Must run as root (BPF, perf -a). Hold `flock -x /tmp/tlsprof-measure.lock`
on shared machines. Servers: bench/install-hidden-servers.sh.

    sudo flock -x /tmp/tlsprof-measure.lock python3 bench/hidden_servers.py
        [--server apache,redis,lighttpd,caddy,postgres] [--cert ecdsa,rsa]
        [--load handshake,bulk] [--duration 10] [--frequency 999]
        [--bin DIR] [--json FILE] [--keep DIR]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_vs_perf import (REPO, PhaseError, Stopped, _on_signal, print_load_average, start, stop,  # noqa: E402
                              stop_all, table, tail)

import signal  # noqa: E402

LOAD_LEAD = 3.0      # seconds of load before the profilers start
PERF_MARGIN = 25.0   # perf records this much longer than the agent's window (agent set-up before it)
BULK_BYTES = 256 * 1024
SERVERS = ["apache", "redis", "lighttpd", "caddy", "postgres"]
COMM = {"apache": "apache2", "redis": "redis-server", "lighttpd": "lighttpd", "caddy": "caddy",
        "postgres": "postgres"}
TLS_DSO = re.compile(r"/lib(ssl|crypto)\.so[.0-9]*$")
GO_TLS_FUNC = re.compile(r"^(crypto/|vendor/golang\.org/x/crypto/|golang\.org/x/crypto/)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout, what, log):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PhaseError(f"{what} exited {proc.returncode} before listening\n{tail(log)}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise PhaseError(f"{what}: port {port} not open after {timeout} s\n{tail(log)}")


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise PhaseError(f"{shlex.join(argv)} exited {r.returncode}\n{r.stdout[-800:]}{r.stderr[-800:]}")
    return r.stdout


# --------------------------------------------------------------------------
# Certificates

def make_certs(tmp):
    out = {}
    for kind in ("ecdsa", "rsa"):
        d = os.path.join(tmp, f"cert-{kind}")
        os.makedirs(d, exist_ok=True)
        key, crt = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
        newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if kind == "ecdsa" else \
            ["-newkey", "rsa:2048"]
        run(["openssl", "req", "-x509", *newkey, "-nodes", "-keyout", key, "-out", crt, "-days", "30",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        os.chmod(d, 0o755)
        os.chmod(crt, 0o644)
        out[kind] = (crt, key)
    return out


# --------------------------------------------------------------------------
# Servers: start(cert) -> port; pids are found by name when measuring.

class Server:
    name = ""

    def __init__(self, tmp, cert):
        self.dir = tempfile.mkdtemp(prefix=f"{self.name}-", dir=tmp)
        os.chmod(self.dir, 0o755)
        self.crt, self.key = cert
        self.port = free_port()
        self.log = os.path.join(self.dir, "server.log")
        self.procs = []
        with open(os.path.join(self.dir, "small.html"), "w") as f:
            f.write("<html>hidden server</html>\n")
        with open(os.path.join(self.dir, "bulk.bin"), "wb") as f:
            f.write(os.urandom(BULK_BYTES))
        for n in ("small.html", "bulk.bin"):
            os.chmod(os.path.join(self.dir, n), 0o644)

    def spawn(self, argv, **kw):
        with open(self.log, "a") as lf:
            p = start(argv, own_group=True, stdout=lf, stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in reversed(self.procs):
            stop(p, timeout=20)

    def describe(self):
        return ""


class Apache(Server):
    name = "apache"

    def start(self):
        conf = os.path.join(self.dir, "httpd.conf")
        mods = "/usr/lib/apache2/modules"
        with open(conf, "w") as f:
            f.write(f"""ServerRoot {self.dir}
ServerName localhost
Listen 127.0.0.1:{self.port}
PidFile {self.dir}/httpd.pid
ErrorLog {self.dir}/error.log
LogLevel warn
User www-data
Group www-data
LoadModule mpm_event_module {mods}/mod_mpm_event.so
LoadModule authz_core_module {mods}/mod_authz_core.so
LoadModule socache_shmcb_module {mods}/mod_socache_shmcb.so
LoadModule ssl_module {mods}/mod_ssl.so
StartServers 3
ServerLimit 4
ThreadsPerChild 16
MaxRequestWorkers 64
MinSpareThreads 16
MaxSpareThreads 64
KeepAlive On
MaxKeepAliveRequests 0
Mutex file:{self.dir} default
SSLSessionCache shmcb:{self.dir}/ssl_scache(512000)
DocumentRoot {self.dir}
<Directory {self.dir}>
  Require all granted
</Directory>
SSLEngine on
SSLCertificateFile {self.crt}
SSLCertificateKeyFile {self.key}
""")
        p = self.spawn(["/usr/sbin/apache2", "-f", conf, "-DFOREGROUND"])
        wait_port(self.port, p, 30, "apache2", self.log)

    def describe(self):
        return "Apache 2.4 event MPM, 3 processes x 16 threads, mod_ssl"


class Lighttpd(Server):
    name = "lighttpd"

    def start(self):
        conf = os.path.join(self.dir, "lighttpd.conf")
        with open(conf, "w") as f:
            f.write(f"""server.document-root = "{self.dir}"
server.bind = "127.0.0.1"
server.port = {self.port}
server.errorlog = "{self.dir}/error.log"
server.modules = ("mod_openssl")
ssl.engine = "enable"
ssl.pemfile = "{self.crt}"
ssl.privkey = "{self.key}"
server.max-keep-alive-requests = 100000
""")
        p = self.spawn(["/usr/sbin/lighttpd", "-D", "-f", conf])
        wait_port(self.port, p, 30, "lighttpd", self.log)

    def describe(self):
        return "lighttpd 1.4 (one process), mod_openssl"


class Caddy(Server):
    name = "caddy"

    def start(self):
        conf = os.path.join(self.dir, "Caddyfile")
        with open(conf, "w") as f:
            f.write(f"""{{
  admin off
  auto_https off
  default_sni localhost
  storage file_system {self.dir}/storage
}}
https://localhost:{self.port}, https://127.0.0.1:{self.port} {{
  tls {self.crt} {self.key}
  root * {self.dir}
  file_server
}}
""")
        env = dict(os.environ, XDG_DATA_HOME=os.path.join(self.dir, "data"),
                   XDG_CONFIG_HOME=os.path.join(self.dir, "config"), HOME=self.dir)
        p = self.spawn(["/usr/bin/caddy", "run", "--config", conf, "--adapter", "caddyfile"], env=env)
        wait_port(self.port, p, 30, "caddy", self.log)

    def describe(self):
        return "Caddy 2.6 (Debian's, Go 1.19 crypto/tls, stripped), file_server"


class Redis(Server):
    name = "redis"

    def start(self):
        p = self.spawn(["/usr/bin/redis-server", "--port", "0", "--tls-port", str(self.port),
                        "--tls-cert-file", self.crt, "--tls-key-file", self.key, "--tls-ca-cert-file", self.crt,
                        "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
                        "--dir", self.dir, "--maxclients", "1000"])
        wait_port(self.port, p, 30, "redis-server", self.log)

    def cli(self, *cmd):
        return run(["redis-cli", "--tls", "--cacert", self.crt, "-h", "127.0.0.1", "-p", str(self.port), *cmd])

    def connections(self):
        m = re.search(r"total_connections_received:(\d+)", self.cli("INFO", "stats"))
        return int(m.group(1)) if m else None

    def describe(self):
        return "Redis 7.0 (io-threads 1), --tls-port, no persistence"


class Postgres(Server):
    name = "postgres"

    def start(self):
        data = os.path.join(self.dir, "data")
        shutil.chown(self.dir, "postgres", "postgres")
        key = os.path.join(self.dir, "server.key")
        crt = os.path.join(self.dir, "server.crt")
        shutil.copy(self.crt, crt)
        shutil.copy(self.key, key)
        for f in (key, crt):
            shutil.chown(f, "postgres", "postgres")
        os.chmod(key, 0o600)
        bindir = "/usr/lib/postgresql/15/bin"
        run(["runuser", "-u", "postgres", "--", f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"])
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"""
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = '{self.dir}'
ssl = on
ssl_cert_file = '{crt}'
ssl_key_file = '{key}'
max_connections = 100
fsync = off
synchronous_commit = off
""")
        open(self.log, "a").close()
        shutil.chown(self.log, "postgres", "postgres")
        p = self.spawn(["runuser", "-u", "postgres", "--", f"{bindir}/postgres", "-D", data])
        wait_port(self.port, p, 30, "postgres", self.log)
        self.conninfo = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres sslmode=require"
        run(["pgbench", "-i", "-s", "1", "-q", self.conninfo])

    def describe(self):
        return "Postgres 15, ssl=on, fsync off; pgbench select-only"


SERVER_CLASSES = {"apache": Apache, "redis": Redis, "lighttpd": Lighttpd, "caddy": Caddy, "postgres": Postgres}


# --------------------------------------------------------------------------
# Loads: each returns an object with stop() and count(t0_mono_ns, t1_mono_ns)
# (the generator's handshakes in that window, or None).

class STime:
    """openssl s_time -new: one full handshake (and a small GET) per
    connection; it prints a '*' per connection, time-stamped here."""

    def __init__(self, port, instances, tmp, tag):
        self.stamps = []
        self.lock = threading.Lock()
        self.procs = []
        for i in range(instances):
            err = os.path.join(tmp, f"{tag}.s_time{i}.err")
            with open(err, "w") as ef:
                p = start(["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-new", "-time", "100000",
                           "-www", "/small.html"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=ef,
                          bufsize=0)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p):
        while True:
            b = p.stdout.read(256)
            if not b:
                return
            now = time.monotonic_ns()
            n = b.count(b"*")
            if n:
                with self.lock:
                    self.stamps.append((now, n))

    def stop(self):
        for p in self.procs:
            stop(p)

    def count(self, t0, t1):
        with self.lock:
            return sum(n for t, n in self.stamps if t0 <= t <= t1)

    def alive(self):
        return all(p.poll() is None for p in self.procs)


class Wrk:
    def __init__(self, port, tmp, tag, path="/bulk.bin"):
        self.out = os.path.join(tmp, f"{tag}.wrk.out")
        with open(self.out, "w") as f:
            self.p = start(["wrk", "-t", "1", "-c", "4", "-d", "100000s", f"https://127.0.0.1:{port}{path}"],
                           stdout=f, stderr=subprocess.STDOUT)

    def stop(self):
        stop(self.p)

    def count(self, t0, t1):
        return None

    def alive(self):
        return self.p.poll() is None


class Poller:
    """Polls a counter (redis' total_connections_received) with monotonic
    time stamps and interpolates it at the window's ends."""

    def __init__(self, read, step=0.2):
        self.read, self.step, self.points, self.run = read, step, [], True
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        while self.run:
            t = time.monotonic_ns()
            try:
                v = self.read()
            except PhaseError:
                v = None
            if v is not None:
                self.points.append(((t + time.monotonic_ns()) // 2, v))
            time.sleep(self.step)

    def at(self, t):
        pts = self.points
        for (ta, va), (tb, vb) in zip(pts, pts[1:]):
            if ta <= t <= tb:
                return va + (vb - va) * (t - ta) / max(1, tb - ta)
        return None

    def count(self, t0, t1):
        a, b = self.at(t0), self.at(t1)
        return None if a is None or b is None else b - a

    def stop(self):
        self.run = False
        self.t.join()


class RedisBench:
    def __init__(self, srv, tmp, tag, keepalive):
        self.out = os.path.join(tmp, f"{tag}.redis-benchmark.out")
        argv = ["redis-benchmark", "--tls", "--cacert", srv.crt, "-h", "127.0.0.1", "-p", str(srv.port),
                "-c", "8", "-n", "100000000", "-k", "1" if keepalive else "0", "-q"]
        argv += ["-t", "get,set", "-d", "4096"] if keepalive else ["-t", "ping"]
        with open(self.out, "w") as f:
            self.p = start(argv, stdout=f, stderr=subprocess.STDOUT)
        self.poll = None if keepalive else Poller(srv.connections)

    def stop(self):
        stop(self.p)
        if self.poll:
            self.poll.stop()

    def count(self, t0, t1):
        return self.poll.count(t0, t1) if self.poll else None

    def alive(self):
        return self.p.poll() is None


class PgBench:
    """pgbench -S (select-only); -C: a new connection (TLS handshake) per
    transaction. -l logs each transaction with its epoch time."""

    def __init__(self, srv, tmp, tag, connect):
        self.dir = os.path.join(tmp, f"{tag}.pgbench")
        os.makedirs(self.dir, exist_ok=True)
        self.out = os.path.join(self.dir, "out")
        argv = ["pgbench", "-S", "-c", "4", "-j", "2", "-T", "100000", "-n", "-l", "--log-prefix",
                os.path.join(self.dir, "tx")] + (["-C"] if connect else []) + [srv.conninfo]
        with open(self.out, "w") as f:
            self.p = start(argv, stdout=f, stderr=subprocess.STDOUT, cwd=self.dir)
        self.connect = connect
        self.off = time.time_ns() - time.monotonic_ns()

    def stop(self):
        stop(self.p)

    def count(self, t0, t1):
        if not self.connect:
            return None
        r0, r1 = (t0 + self.off) / 1e9, (t1 + self.off) / 1e9
        n = 0
        for name in os.listdir(self.dir):
            if not name.startswith("tx"):
                continue
            with open(os.path.join(self.dir, name)) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6:
                        t = int(parts[4]) + int(parts[5]) / 1e6
                        if r0 <= t <= r1:
                            n += 1
        return n

    def alive(self):
        return self.p.poll() is None


def start_load(srv, load, tmp, tag, instances):
    if srv.name == "redis":
        return RedisBench(srv, tmp, tag, keepalive=(load == "bulk"))
    if srv.name == "postgres":
        return PgBench(srv, tmp, tag, connect=(load == "handshake"))
    if load == "handshake":
        return STime(srv.port, instances, tmp, tag)
    return Wrk(srv.port, tmp, tag)


# --------------------------------------------------------------------------
# perf: samples of the server's processes in the agent's window

def go_tls_ranges(binary, tmp):
    """[(lo, hi)] of the Go functions under crypto/ in a (stripped) Go
    binary, read from its pclntab by a small Go program (debug/gosym)."""
    src = os.path.join(tmp, "gofuncs")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "main.go"), "w") as f:
        f.write("""package main

import (
	"debug/elf"
	"debug/gosym"
	"fmt"
	"os"
)

func main() {
	f, err := elf.Open(os.Args[1])
	if err != nil {
		panic(err)
	}
	pcln, err := f.Section(".gopclntab").Data()
	if err != nil {
		panic(err)
	}
	text := f.Section(".text").Addr
	// perf prints an unnamed frame as an offset in the file: say how to
	// turn one into an address.
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			fmt.Printf("bias %x\\n", p.Vaddr-p.Off)
		}
	}
	t, err := gosym.NewTable(nil, gosym.NewLineTable(pcln, text))
	if err != nil {
		panic(err)
	}
	for _, fn := range t.Funcs {
		fmt.Printf("%x %x %s\\n", fn.Entry, fn.End, fn.Name)
	}
}
""")
    with open(os.path.join(src, "go.mod"), "w") as f:
        f.write("module gofuncs\n\ngo 1.19\n")
    exe = os.path.join(src, "gofuncs")
    run(["go", "build", "-o", exe, "."], cwd=src, env=dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=os.path.join(tmp, "gocache")))
    out = run([exe, binary])
    ranges, bias = [], None
    for line in out.splitlines():
        lo, hi, *name = line.split(" ", 2)
        if lo == "bias":
            bias = int(hi, 16)
        elif GO_TLS_FUNC.match(name[0]):
            ranges.append((int(lo, 16), int(hi, 16)))
    if bias is None:
        raise PhaseError(f"{binary}: no executable PT_LOAD segment")
    # perf script prints file offsets for frames it cannot name.
    ranges = sorted((lo - bias, hi - bias) for lo, hi in ranges)
    return ranges


def in_ranges(ranges, x):
    import bisect
    i = bisect.bisect_right(ranges, (x, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= x < ranges[i][1]


# Kernel frames that name why a kernel-mode sample ran. This kernel (6.18)
# dispatches system calls through a switch in do_syscall_64, so there is no
# __x64_sys_* frame: the syscall's own function below it names it.
KERNEL_NET = re.compile(r"^(do_writev|do_readv|ksys_(read|write)|vfs_(read|write|readv|writev)|"
                        r"__sys_(sendto|recvfrom|sendmsg|recvmsg|sendmmsg|recvmmsg|accept4?|shutdown)|"
                        r"do_epoll_wait|do_sys_poll|do_select|core_sys_select|__fput|__close_fd|file_close_fd|"
                        r"sock_|tcp_|inet_|__x64_sys_(read|write|readv|writev|send|recv|epoll|close|shutdown))")
KERNEL_ALLOC = re.compile(r"(getrandom|^ksys_mmap_pgoff|^vm_mmap_pgoff|^__vm_munmap|^do_vmi_munmap|^do_brk|"
                          r"^__do_sys_brk|^do_mprotect_pkey|^do_madvise|^__do_sys_(mremap|madvise|munmap|mmap))")
PAGE_FAULT = re.compile(r"^(asm_exc_page_fault|exc_page_fault)$")
UPROBE_TRAP = re.compile(r"^(asm_exc_int3|asm_exc_debug)$")  # a uprobe's breakpoint and single step


def is_kernel_frame(frame):
    ip, _, dso = frame
    return dso.startswith("[kernel") or dso.startswith("bpf_prog_") or int(ip, 16) >= 1 << 63


def kernel_cause(frames):
    """Why a kernel-mode sample under a TLS frame ran, from its kernel frames
    read outermost first: `net` (socket and file I/O, polling, close: the
    record layer's BIO or net.Conn), `alloc` (getrandom, mmap/munmap/brk,
    mprotect, madvise: kernel time an operation causes),
    `fault` (a user page fault), `uprobe` (a uprobe's trap: the agent's own
    --usage probes), `other_syscall`, `other` (interrupts, preemption,
    softirq on the way back)."""
    kernel = []
    for f in frames:
        if not is_kernel_frame(f):
            break
        kernel.append(f[1])
    syscall = False
    for sym in reversed(kernel):
        if sym == "do_syscall_64":
            syscall = True
            continue
        if PAGE_FAULT.match(sym):
            return "fault"
        if UPROBE_TRAP.match(sym):
            return "uprobe"
        if KERNEL_NET.match(sym):
            return "net"
        if KERNEL_ALLOC.search(sym):
            return "alloc"
    return "other_syscall" if syscall else "other"


def perf_counts(data, comm, t0, t1, go_ranges, go_binary):
    """{'samples', 'user', 'kernel', 'user_tls', 'kernel_tls'} of the processes
    named comm in [t0, t1] ns (CLOCK_MONOTONIC), from perf.data."""
    argv = ["perf", "script", "-i", data, "--no-inline", "-F", "comm,pid,tid,time,ip,sym,dso", "--ns",
            "--comms", comm]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
    c = {"samples": 0, "user": 0, "kernel": 0, "user_tls": 0, "kernel_tls": 0, "kernel_tls_by_cause": {},
         "pids": set()}
    hdr = re.compile(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+(\d+)\.(\d+):")
    frame = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
    cur = None

    def flush(s):
        if s is None or not s["frames"]:
            return
        if not (t0 <= s["t"] <= t1):
            return
        # Kernel mode: a kernel leaf, or a BPF program's (the agent's own
        # uprobe handlers run in the kernel; perf names their JIT image).
        kernel = is_kernel_frame(s["frames"][0])
        tls = False
        for ip, sym, dso in s["frames"]:
            if TLS_DSO.search(dso):
                tls = True
                break
            if go_ranges is not None and dso == go_binary and in_ranges(go_ranges, int(ip, 16)):
                tls = True
                break
        c["samples"] += 1
        c["pids"].add(s["pid"])
        if kernel:
            c["kernel"] += 1
            c["kernel_tls"] += tls
            if tls:
                k = kernel_cause(s["frames"])
                c["kernel_tls_by_cause"][k] = c["kernel_tls_by_cause"].get(k, 0) + 1
        else:
            c["user"] += 1
            c["user_tls"] += tls

    for line in p.stdout:
        if not line.strip():
            flush(cur)
            cur = None
            continue
        if line[0] not in " \t" or cur is None:
            m = hdr.match(line)
            if m:
                flush(cur)
                cur = {"pid": int(m.group(2)), "t": int(m.group(4)) * 10**9 + int(m.group(5).ljust(9, "0")[:9]),
                       "frames": []}
                continue
        m = frame.match(line)
        if m and cur is not None:
            cur["frames"].append((m.group(1), m.group(2), m.group(3)))
    flush(cur)
    p.wait()
    c["pids"] = len(c["pids"])
    return c


# --------------------------------------------------------------------------
# One case

def agent_figures(rep, comm):
    procs = [p for p in rep.get("processes", []) if p.get("comm") == comm]
    cpu = sum(p["cpu_seconds"] for p in procs)
    tls = sum(p["tls_cpu_seconds"] for p in procs)
    unknown = sum(a["cpu_seconds"] for p in procs for a in p["algorithms"] if a["algorithm"] == "unknown")
    other_unknown = sum(a["cpu_seconds"] for p in procs for a in p["algorithms"]
                        if a["algorithm"] == "unknown" and a["bucket"] == "other")
    buckets = {}
    for p in procs:
        for b in p["buckets"]:
            buckets[b["bucket"]] = buckets.get(b["bucket"], 0) + b["cpu_seconds"]
    unk_rows = {}
    for p in procs:
        for a in p["algorithms"]:
            if a["algorithm"] == "unknown":
                k = f"{a['bucket']}/{a['phase']}"
                unk_rows[k] = unk_rows.get(k, 0) + a["cpu_seconds"]
    hs = [h for h in rep.get("handshakes", []) if h.get("comm") == comm and h.get("side") == "server"]
    kinds = {}
    for h in hs:
        k = f"{h['version']} {h['cert_key_type']} {h['group']} {h['kind']}"
        kinds[k] = kinds.get(k, 0) + h["count"]
    return {"processes": len(procs), "cpu_seconds": cpu, "tls_cpu_seconds": tls,
            "tls_share": tls / cpu if cpu else None,
            "unknown_share": unknown / tls if tls else None,
            "other_unknown_share": other_unknown / tls if tls else None,
            "bucket_share": {k: v / tls for k, v in buckets.items()} if tls else {},
            "unknown_rows": {k: v / tls for k, v in sorted(unk_rows.items(), key=lambda x: -x[1])} if tls else {},
            "handshakes": sum(h["count"] for h in hs) if rep.get("handshakes") is not None else None,
            "handshake_kinds": kinds,
            "samples": rep.get("samples"), "agent_share_of_core": rep.get("agent", {}).get("cpu_share_of_core")}


def run_case(args, tmp, srv_name, cert_kind, cert, load):
    tag = f"{srv_name}-{cert_kind}-{load}"
    srv = SERVER_CLASSES[srv_name](tmp, cert)
    res = {"server": srv_name, "cert": cert_kind, "load": load, "frequency_hz": args.frequency}
    ld = None
    try:
        srv.start()
        res["server_describe"] = srv.describe()
        ld = start_load(srv, load, tmp, tag, args.s_time_instances)
        time.sleep(LOAD_LEAD)
        if not ld.alive():
            raise PhaseError(f"{tag}: the load generator exited at once\n" +
                             tail(getattr(ld, "out", "") or os.devnull))
        data = os.path.join(tmp, f"{tag}.perf.data")
        cg = ["--call-graph", "fp"] if srv_name == "caddy" else ["--call-graph", f"dwarf,{args.dwarf_size}"]
        perf_argv = ["perf", "record", "-a", "-F", str(args.frequency), "-k", "mono", *cg, "-o", data, "--",
                     "sleep", str(args.duration + PERF_MARGIN)]
        perf_err = os.path.join(tmp, f"{tag}.perf.err")
        with open(perf_err, "w") as ef:
            pp = start(perf_argv, stdout=ef, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        out = os.path.join(tmp, f"{tag}.agent.json")
        aerr = os.path.join(tmp, f"{tag}.agent.err")
        agent_argv = [os.path.join(args.bin, "tlsprof-agent"), "profile", "--duration", str(args.duration),
                      "--frequency", str(args.frequency), "--format", "json", "-o", out]
        if load == "handshake":
            agent_argv += ["--usage", "--usage-budget", "0"]
        with open(aerr, "w") as ef:
            ap = start(agent_argv, stdout=subprocess.DEVNULL, stderr=ef)
            rc = ap.wait()
        alive = ld.alive()
        # perf must outlive the window: end it now (SIGINT writes its data).
        if pp.poll() is None:
            pp.send_signal(signal.SIGINT)
        pp.wait(timeout=120)
        if rc != 0:
            raise PhaseError(f"{tag}: tlsprof-agent exited {rc}\n{tail(aerr)}")
        with open(out) as f:
            rep = json.load(f)
        w0, w1 = rep["window"]["start_monotonic_ns"], rep["window"]["end_monotonic_ns"]
        gen = ld.count(w0, w1)
        ld.stop()
        ld = None
        srv.close()
        if not alive:
            raise PhaseError(f"{tag}: the load generator died during the window")
        comm = COMM[srv_name]
        a = agent_figures(rep, comm)
        go_ranges = args.go_ranges if srv_name == "caddy" else None
        t_an = time.monotonic()
        pc = perf_counts(data, comm, w0, w1, go_ranges, "/usr/bin/caddy")
        # perf -a with dwarf stacks can fall behind: "Processed N samples and lost X%!"
        lost = re.findall(r"lost ([0-9.]+)%", open(perf_err).read())
        res.update({"agent": a, "perf": pc, "perf_argv": perf_argv, "agent_argv": agent_argv,
                    "window_seconds": (w1 - w0) / 1e9, "generator_handshakes": gen,
                    "perf_analysis_seconds": time.monotonic() - t_an, "perf_stderr": tail(perf_err, 3),
                    "perf_lost_percent": float(lost[-1]) if lost else 0.0})
        res["perf_tls_share"] = pc["user_tls"] / pc["samples"] if pc["samples"] else None
        res["perf_user_share"] = pc["user"] / pc["samples"] if pc["samples"] else None
        if not args.keep:
            os.unlink(data)
        return res
    finally:
        if ld is not None:
            ld.stop()
        srv.close()


def pct(x, nd=1):
    return "-" if x is None else f"{100 * x:.{nd}f}%"


def render(rows):
    header = ["agent TLS", "perf TLS", "agent/perf", "unknown", "other/unk", "HS agent", "HS gen",
              "CPU agent", "samples perf", "CPU seen", "perf user", "perf lost"]
    body = []
    for r in rows:
        label = f"{r['server']} {r['cert']} {r['load']}"
        if "error" in r:
            body.append((label, "failed: " + r["error"].splitlines()[0][:60], *[""] * (len(header) - 1)))
            continue
        a, p = r["agent"], r["perf"]
        ratio = (f"{a['tls_share'] / r['perf_tls_share']:.3f}" if a["tls_share"] is not None and r["perf_tls_share"]
                 else "-")
        gen = r["generator_handshakes"]
        body.append((label, pct(a["tls_share"]), pct(r["perf_tls_share"]), ratio, pct(a["unknown_share"]),
                     pct(a["other_unknown_share"], 2), "-" if a["handshakes"] is None else str(a["handshakes"]),
                     "-" if gen is None else f"{gen:.0f}", f"{a['cpu_seconds']:.2f} s", str(p["samples"]),
                     pct(a["cpu_seconds"] * r["frequency_hz"] / p["samples"] if p["samples"] else None, 0),
                     pct(r["perf_user_share"], 0), f"{r['perf_lost_percent']:.1f}%"))
    lines = [table("server cert load", header, body)]
    lines.append("  agent TLS: the server's TLS CPU / its CPU (report processes[] of that name); perf TLS: its "
                 "user-mode samples\n  with a frame in libssl/libcrypto (Caddy: Go crypto/ functions) / all its "
                 "samples, same window;\n  unknown: all buckets' `unknown` / TLS time; HS: server handshakes the "
                 "agent counted (--usage) vs the load generator's;\n  CPU seen: the server CPU the agent's process rows hold / perf's samples of the server (x 1/F)")
    for r in rows:
        if "error" in r:
            continue
        a = r["agent"]
        top = ", ".join(f"{k} {pct(v, 2)}" for k, v in list(a["unknown_rows"].items())[:4])
        bk = ", ".join(f"{k} {pct(v)}" for k, v in a["bucket_share"].items())
        lines.append(f"  {r['server']} {r['cert']} {r['load']}: buckets {bk}; unknown rows {top or '-'}; "
                     f"handshakes {a['handshake_kinds'] or '-'}; processes agent {a['processes']} perf "
                     f"{r['perf']['pids']}; host samples unresolved by the agent "
                     f"{(a['samples'] or {}).get('unresolved')}; perf kernel samples under a TLS frame "
                     f"{pct(r['perf']['kernel_tls'] / r['perf']['samples'] if r['perf']['samples'] else None)} "
                     f"of the server's, by cause {r['perf'].get('kernel_tls_by_cause')}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=",".join(SERVERS))
    ap.add_argument("--cert", default="ecdsa,rsa")
    ap.add_argument("--load", default="handshake,bulk")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of the agent's window (default 10)")
    ap.add_argument("--frequency", type=int, default=999)
    ap.add_argument("--dwarf-size", type=int, default=8192, help="perf's user stack dump per sample (bytes)")
    ap.add_argument("--s-time-instances", type=int, default=2)
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(REPO, "build", "bin")))
    ap.add_argument("--json")
    ap.add_argument("--keep")
    args = ap.parse_args()
    servers = [s for s in args.server.split(",") if s]
    for s in servers:
        if s not in SERVER_CLASSES:
            ap.error(f"--server {s}: one of {', '.join(SERVERS)}")
    certs = [c for c in args.cert.split(",") if c]
    loads = [x for x in args.load.split(",") if x]
    cmd = "sudo flock -x /tmp/tlsprof-measure.lock python3 " + shlex.join(
        [os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())] + sys.argv[1:])
    print(f"# reproduce: {cmd}")
    perf_version = subprocess.run(["perf", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {socket.gethostname()}  nproc {os.cpu_count()}  "
          f"kernel {os.uname().release}  {perf_version}  agent {args.bin}/tlsprof-agent")
    print(f"# agent: profile (whole host) {args.duration:g} s @ {args.frequency} Hz; perf record -a -F "
          f"{args.frequency} -k mono --call-graph dwarf,{args.dwarf_size} (Caddy: fp), cut to the agent's window")
    print_load_average()
    sys.stdout.flush()
    if os.geteuid() != 0:
        sys.exit("hidden_servers.py: must run as root")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    tmp = args.keep or tempfile.mkdtemp(prefix="tlsprof-hidden-")
    os.makedirs(tmp, exist_ok=True)
    os.chmod(tmp, 0o755)
    rows = []
    try:
        certs_made = make_certs(tmp)
        args.go_ranges = go_tls_ranges("/usr/bin/caddy", tmp) if "caddy" in servers else None
        for s in servers:
            for c in certs:
                for load in loads:
                    t0 = time.monotonic()
                    try:
                        r = run_case(args, tmp, s, c, certs_made[c], load)
                    except PhaseError as e:
                        r = {"server": s, "cert": c, "load": load, "error": str(e)}
                    r["case_seconds"] = time.monotonic() - t0
                    rows.append(r)
                    print(render([r]).splitlines()[1] if "error" not in r else
                          f"# {s} {c} {load}: failed: {r['error']}", flush=True)
    except Stopped as e:
        print(f"hidden_servers.py: {e}; cleaning up", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_all()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(render(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": cmd, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}, f, indent=1,
                      default=str)
        print(f"# numbers written to {args.json}")
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
