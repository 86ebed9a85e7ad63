"""Shared helpers for tlsprof's integration tests.

The tests start real processes (workloads, TLS servers, the agent), wait on
readiness files or ports rather than sleeps, and clean up what they started by
PID. They need root and a real kernel: they are registered with CTest under the
"bpf" label, and they fail (never skip) when they cannot run.
"""
import collections
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest
import urllib.request

BIN = os.environ.get("TLSPROF_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
SRC = os.environ.get("TLSPROF_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
AGENT = os.path.join(BIN, "tlsprof-agent")
# The ASan + UBSan pass (scripts/test-sanitizers.sh): CTest sets this in build-asan.
SANITIZED = os.environ.get("TLSPROF_SANITIZED") == "1"


def require_root(test: unittest.TestCase):
    if os.geteuid() != 0:
        test.fail("integration tests need root (CAP_BPF, CAP_PERFMON): run ctest -L integration as root")


def assert_resource_budget(test: unittest.TestCase, name, value, limit, msg=None):
    """Asserts one of the agent's own resource budgets (CPU share of a core, peak RSS, report latency):
    value <= limit. They are the release build's contract. In the sanitizer pass ASan's shadow memory and
    allocator quarantine, and the instrumentation of every load and store, raise all three by design, so
    there the value is printed with the reason and not asserted; every attribution and accuracy check
    still is."""
    if SANITIZED:
        print(f"sanitizer pass: {name} = {value:g} is not asserted against the release budget {limit:g} "
              "(ASan's shadow memory, quarantine and instrumentation raise CPU, RSS and latency by design)")
        return
    test.assertLessEqual(value, limit, msg if msg is not None else name)


class Processes:
    """Starts processes and kills exactly those, by PID, at the end."""

    def __init__(self):
        self.procs = []
        self.tmp = tempfile.TemporaryDirectory(prefix="tlsprof-it-")

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def start(self, argv, ready_file=None, port=None, timeout=60, http_path=None, **kw):
        """Starts argv; waits for `ready_file` to exist or `port` to accept. With
        `http_path`, the port is ready when that path answers 200: prometheus-cpp
        listens before its /metrics handler is registered, and a scrape in
        between gets a 404."""
        log = open(self.path(f"{os.path.basename(argv[0])}-{len(self.procs)}.log"), "wb")
        with log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        proc.log_path = log.name
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while ready_file or port:
            if proc.poll() is not None:
                raise AssertionError(f"{argv} exited with {proc.returncode} before it was ready:\n{self.log(proc)}")
            if ready_file and os.path.exists(ready_file):
                break
            if port and _port_open(port) and (http_path is None or _http_ok(port, http_path)):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{argv} not ready after {timeout} s:\n{self.log(proc)}")
            time.sleep(0.05)
        return proc

    @staticmethod
    def log(proc):
        try:
            with open(proc.log_path, "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, proc, sig=signal.SIGTERM, timeout=20):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def close(self):
        for proc in reversed(self.procs):
            self.stop(proc)
        self.tmp.cleanup()


def _port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status == 200
    except OSError:  # URLError, HTTPError (a 404 too) and timeouts
        return False


def wait_for(test, what, predicate, timeout, context=lambda: "", interval=0.2):
    """The first truthy value of predicate() within `timeout` seconds; otherwise the test fails, naming `what`
    and giving context() (a log's tail, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    test.fail(f"{what}: not after {timeout} s\n{context()}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(procs, kind="dual", tickets=True):
    """Debian's nginx (workloads/nginx/run-nginx.sh) on a free port, with an
    RSA and an ECDSA certificate (`dual`) and session tickets: (port, worker
    pids as strings). `procs` stops it."""
    port = free_port()
    root = procs.path(f"nginx-{port}")
    os.makedirs(root)
    procs.start(["bash", os.path.join(SRC, "workloads/nginx/run-nginx.sh"), root, str(port), kind],
                ready_file=os.path.join(root, "ready"),
                env={**os.environ, "NGINX_SESSION_TICKETS": "on" if tickets else "off"})
    with open(os.path.join(root, "nginx.pid")) as f:
        master = f.read().strip()
    workers = subprocess.run(["pgrep", "-P", master], capture_output=True, text=True).stdout.split()
    if not workers:
        raise AssertionError(f"nginx {master} has no workers")
    return port, workers


def scrape(port, timeout=10):
    """The text of http://127.0.0.1:PORT/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_sum(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def run_agent(args, timeout=120, wrap=None):
    """Runs tlsprof-agent; returns (returncode, stdout, stderr). `wrap` maps
    the command line to the one run (e.g. into a private mount namespace)."""
    argv = [AGENT, *args]
    proc = subprocess.run(wrap(argv) if wrap else argv, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# A ground truth runs until its test ends it, after the profile returned
# (end_ground_truth): its measured window then covers the profile's however
# long the agent's set-up took on a loaded machine. Its --duration is only
# a bound, for a test that dies before it ends the workload.
GROUND_TRUTH_BOUND_SECONDS = 300


def end_ground_truth(test, procs, proc, pid):
    """Ends a ground truth: SIGTERM to `pid`, the workload itself (`proc` may
    be a wrapper around it: chroot, unshare), then waits until it wrote its
    truth and exited 0."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    proc.wait(60)
    test.assertEqual(proc.returncode, 0, procs.log(proc))


def profile_json(test, args, timeout=120, wrap=None):
    code, out, err = run_agent(["profile", "--format", "json", *args], timeout, wrap)
    test.assertEqual(code, 0, f"tlsprof-agent failed: {err}")
    report = json.loads(out)
    test.assertEqual(report["schema"], "tlsprof.report.v1")
    return report


def process_row(report, pid):
    for p in report["processes"]:
        if p["pid"] == pid:
            return p
    return None


def truth_rate_in_window(truth, report):
    """The ground truth's measured CPU rate (CPU-seconds per second) over the
    profile's own window: the workload's `timeline` (CLOCK_MONOTONIC ns,
    cumulative measured CPU ns) interpolated at the report's `window`. The
    profile covers only part of the truth's window, and on a busy machine the
    workload's share of a CPU changes between the two; comparing the same
    seconds keeps that out of the accuracy figure."""
    timeline = truth["timeline"]
    start, end = report["window"]["start_monotonic_ns"], report["window"]["end_monotonic_ns"]
    if len(timeline) < 2 or not timeline[0][0] <= start < end <= timeline[-1][0] + 200_000_000:
        raise AssertionError(f"the profile window [{start}, {end}] is not inside the ground truth's timeline "
                             f"[{timeline[0][0]}, {timeline[-1][0]}]")

    def cpu_at(t):
        for (t0, c0), (t1, c1) in zip(timeline, timeline[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return timeline[-1][1]  # the last point is at most one step before the end

    return (cpu_at(end) - cpu_at(start)) / (end - start)


def by_name(rows, key):
    return {r[key]: r for r in rows}


def sources_under(directory, suffixes):
    """The files of SRC/directory ending in one of `suffixes`, as paths relative to SRC, sorted."""
    return [os.path.join(directory, n) for n in sorted(os.listdir(os.path.join(SRC, directory)))
            if n.endswith(suffixes)]


def build_once(out_dir, sources, outputs, build, salt=""):
    """Builds a workload the test suite builds itself (in the trixie root, or
    with another toolchain): copies `sources` (paths relative to SRC) to
    out_dir/src and calls build(), unless out_dir's stamp (a hash of the
    sources and `salt`: flags, toolchain) says these were built and every
    path of `outputs` exists. out_dir and outputs are host paths."""
    digest = hashlib.sha256(salt.encode())
    for rel in sources:
        with open(os.path.join(SRC, rel), "rb") as f:
            digest.update(rel.encode() + f.read())
    stamp = os.path.join(out_dir, "sources.sha256")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and all(map(os.path.exists, outputs)):
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    for rel in sources:
        os.makedirs(os.path.join(out_dir, "src", os.path.dirname(rel)), exist_ok=True)
        shutil.copy(os.path.join(SRC, rel), os.path.join(out_dir, "src", rel))
    build()
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())


def raise_go_line(go_mod, version):
    """A copied go.mod's `go 1.19` raised to the toolchain's release: a main
    module's go line sets the GODEBUG defaults, and 1.19's would turn the
    post-quantum groups off (tlskyber=0 in 1.23, tlsmlkem=0 in 1.24)."""
    with open(go_mod) as f:
        text = f.read()
    with open(go_mod, "w") as f:
        f.write(text.replace("\ngo 1.19\n", f"\ngo {version}\n"))


def summarize(report, pid=None):
    """A compact text view of a report, for assertion messages."""
    rows = process_row(report, pid)["algorithms"] if pid else report["algorithms"]
    return ", ".join(f'{r["algorithm"]}/{r["bucket"]}={r["share_of_tls"]*100:.1f}%' for r in rows)


# The scripted `openssl s_client` mix the usage tests share (test_usage.py's
# Go servers, test_usage_boringssl.py): (server's certificate, count,
# s_client arguments, the server row it must give: (kind, version,
# cipher_suite, group, cert_key_type)).
USAGE_MIX = [
    ("ecdsa", 5, ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-groups", "X25519"],
     ("full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "ECDSA")),
    ("ecdsa", 3, ["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256", "-groups", "P-256"],
     ("full", "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", "P-256", "ECDSA")),
    ("rsa", 4, ["-tls1_2", "-cipher", "ECDHE-RSA-AES128-SHA", "-groups", "X25519"],
     ("full", "TLSv1.2", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "X25519", "RSA")),
]

# Sessions resumed after their full handshake (test_usage_boringssl.py,
# test_usage_openssl11.py): (server's certificate, s_client arguments, the
# full row, the resumed row). A TLS 1.3 resumption (psk_dhe_ke) exchanges a
# key of its own and signs nothing; a TLS 1.2 one does neither. The server's
# key type is its own (one) key's.
USAGE_SESSIONS = [
    ("rsa", ["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384", "-groups", "X25519"],
     ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA"),
     ("resumed", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA")),
    # TLS 1.2 needs the ECDSA key's curve among the client's groups.
    ("ecdsa", ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256", "-groups", "X25519:P-256"],
     ("full", "TLSv1.2", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "X25519", "ECDSA"),
     ("resumed", "TLSv1.2", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "none", "ECDSA")),
]


class UsageAgentTestCase(unittest.TestCase):
    """The usage tests' base (test_usage.py, test_usage_boringssl.py): the
    processes they start, `profile --usage` run around a client mix, and
    `openssl s_client`."""

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def start_agent(self, name, pids, seconds, probed="libssl.so.3", budget="0", extra=()):
        """Starts `profile --usage --pid ...` for `seconds` and returns once its
        probes are on the file named `probed` (or on each of the files a tuple
        names; the window starts after set-up,
        where the processes present are read and their libraries probed):
        (process, report path, log path). `budget` is --usage-budget: 0
        (always attached) for the tests of exact counts, since the probes
        are on the library files for every process, and whatever else the
        host runs meanwhile (a build, other tests' TLS) costs from the same
        budget; test_usage_budget.py tests the budget itself. `extra`: more
        flags for `profile`."""
        report_path = self.procs.path(f"report-{name}.json")
        log_path = self.procs.path(f"agent-{name}.log")
        args = [AGENT, "--log-level", "info", "profile", "--usage", "--usage-budget", budget, "--format", "json",
                "-o", report_path, "--duration", str(seconds), *extra]
        for pid in pids:
            args += ["--pid", pid]
        with open(log_path, "wb") as log:
            agent = subprocess.Popen(args, stderr=log)
        self.addCleanup(lambda: agent.poll() is None and agent.kill())
        names = (probed,) if isinstance(probed, str) else probed
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as f:
                log = f.read()
            lines = [line for line in log.splitlines() if "usage probes: " in line]
            # The probes are on, and the window has begun (the agent logs when it opens).
            if all(any(name in line for line in lines) for name in names) and "profile: window open" in log:
                break
            self.assertIsNone(agent.poll(), "the agent exited during set-up")
            time.sleep(0.1)
        else:
            self.fail(f"the agent attached no usage probe to {probed}, or opened no window, in 30 s")
        return agent, report_path, log_path

    def agent_report(self, agent, report_path, log_path, timeout):
        """Waits for start_agent()'s agent to end its window; its report."""
        code = agent.wait(timeout=timeout)
        with open(log_path, errors="replace") as f:
            self.assertEqual(code, 0, f.read()[-2000:])
        with open(report_path) as f:
            return json.load(f)

    def hold_open(self, port, count):
        """`count` TLS connections to `port` (Python's ssl module: TLS 1.3),
        handshaken and left open until the test ends: live connections."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        for _ in range(count):
            sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port)))
            self.addCleanup(sock.close)

    def run_usage_mix(self, ports, mix, sessions, resumptions, session_path=None, **client):
        """Runs `mix` (USAGE_MIX's form) and `sessions` (USAGE_SESSIONS's, each
        full handshake then `resumptions` resumptions) with s_client against
        the servers `ports` (certificate -> port), `client` passed on to
        s_client(): the server rows they must give, keyed (certificate,) + row.
        `session_path(i)`: where the client keeps session i (default: a file
        of the test's)."""
        want = collections.Counter()
        for cert, count, args, row in mix:
            for _ in range(count):
                self.s_client(ports[cert], args, **client)
            want[(cert,) + row] += count
        for i, (cert, args, full, resumed) in enumerate(sessions):
            session = session_path(i) if session_path else self.procs.path(f"session-{i}.pem")
            self.s_client(ports[cert], args + ["-sess_out", session], **client)
            for _ in range(resumptions):
                self.s_client(ports[cert], args + ["-sess_in", session], **client)
            want[(cert,) + full] += 1
            want[(cert,) + resumed] += resumptions
        return want

    def check_mix_report(self, agent, report_path, log_path, servers, want, started, seconds, library, held,
                         held_row):
        """After run_usage_mix(): holds `held` connections to the "rsa" server
        open through the report (live; each gives `held_row`), waits for the
        agent's report and checks it: the server rows (`library`'s) equal
        `want`, the RSA server alone has live connections, no key dropped, no
        read error, the probes always attached, no field unknown. `servers`:
        certificate -> (process, port); `started`: the mix's start
        (monotonic), `seconds` the profile window. Returns the operations
        (handshake_operations()) and the probed files by base name."""
        self.hold_open(servers["rsa"][1], held)
        want[("rsa",) + held_row] += held
        self.assertLess(time.monotonic() - started, seconds - 3, "the client mix outran the profile window")
        report = self.agent_report(agent, report_path, log_path, seconds + 60)

        pid_cert = {p.pid: cert for cert, (p, _) in servers.items()}
        rows = self.server_rows(report, pid_cert, library)
        print(f"{library} handshakes:", dict(rows))
        self.assertEqual(rows, want)
        live = {c["pid"]: c["live_connections"] for c in report["connections"]}
        print(f"{library} live connections:", report["connections"])
        self.assertEqual(live, {servers["rsa"][0].pid: held})

        usage = report["agent"]["usage"]
        self.assertEqual(usage["dropped_keys"], 0)
        self.assertEqual(usage["read_errors"], 0)
        self.assertEqual(usage["budget"]["duty_cycle"], 1.0)
        files = {os.path.basename(f["path"]): f for f in usage["files"]}
        for f in files.values():
            self.assertNotIn("unknown", f["fields"].values(), f)
        ops = self.handshake_operations(report, pid_cert)
        print(f"{library} operations:", dict(ops))
        return ops, files

    @staticmethod
    def _key(pid_cert, pid):
        key = pid_cert[pid]
        return key if isinstance(key, tuple) else (key,)

    def server_rows(self, report, pid_cert, library=None):
        """The report's handshakes by (certificate, kind, version, cipher
        suite, group, certificate key type); each must be a server's of
        `pid_cert` (pid -> certificate, or a tuple that leads the row instead),
        probed in a file whose name ends in `library` (a str or a tuple; None:
        any)."""
        rows = collections.Counter()
        for h in report["handshakes"]:
            self.assertIn(h["pid"], pid_cert, h)
            self.assertEqual(h["side"], "server", h)
            if library is not None:
                self.assertTrue(h["library"].endswith(library), h)
            rows[(*self._key(pid_cert, h["pid"]), h["kind"], h["version"], h["cipher_suite"], h["group"],
                  h["cert_key_type"])] += h["count"]
        return rows

    def handshake_operations(self, report, pid_cert):
        """The report's operations by (certificate, operation, algorithm)
        (`pid_cert` as server_rows's); each must have run inside a handshake
        and been timed."""
        ops = collections.Counter()
        for o in report["operations"]:
            self.assertTrue(o["in_handshake"], o)
            self.assertGreater(o["latency_p50_us"], 1, o)
            self.assertGreaterEqual(o["latency_p99_us"], o["latency_p50_us"], o)
            ops[(*self._key(pid_cert, o["pid"]), o["operation"], o["algorithm"])] += o["count"]
        return ops

    def make_cert(self, name, cert):
        """A self-signed certificate (workloads/node/make-cert.sh, `cert` rsa
        or ecdsa) in a directory of the test's: (cert.pem, key.pem)."""
        certs = self.procs.path(name)
        subprocess.run(["sh", os.path.join(SRC, "workloads/node/make-cert.sh"), certs, cert], check=True,
                       capture_output=True)
        return os.path.join(certs, "cert.pem"), os.path.join(certs, "key.pem")

    def s_client(self, port, args, request=b"GET / HTTP/1.0\r\n\r\n", answer=b"HTTP/1.1 200", openssl=("openssl",)):
        # -quiet implies -ign_eof: the client reads until the server closes
        # (nginx after its HTTP/1.0 answer), so it also takes in TLS 1.3
        # session tickets. `openssl`: the command (another root's, through chroot).
        out = subprocess.run([*openssl, "s_client", "-connect", f"127.0.0.1:{port}", "-quiet", *args],
                             input=request, capture_output=True, timeout=30)
        err = out.stderr.decode(errors="replace")[-500:]
        if answer:
            self.assertIn(answer, out.stdout, err)
        else:
            self.assertEqual(out.returncode, 0, err)
