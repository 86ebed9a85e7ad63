"""Hostile tenants (issue 32): nine attacks, each from uid 65534 in its own container (overlayfs over the trixie root,
pivot_root), beside a ground truth on the host, under one `tlsprof-agent run --usage` with a memory cap. Each must
leave windows on time, /healthz and /metrics answering within 1 s, RSS under the cap, the host canaries unopened,
the ground truth's buckets within 3 pp, and its refusals counted by reason. What the agent before issue 32 did to
each: bench/README.md, "Hostile tenants"."""
import ctypes
import dataclasses
import json
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import threading
import time
import unittest
import urllib.error
import urllib.request

import trixie
from test_daemon import WINDOW_LINE
from test_faults_discovery import build_id, label_split
from test_stack_accuracy import BUCKETS, SHARE_TOLERANCE_PP, draw_seeds
from tlsprof_testlib import AGENT, BIN, Processes, assert_resource_budget, free_port, metric_sum, require_root

HOSTILE = os.path.join(BIN, "tlsprof-hostile")
GT_SHARED = os.path.join(BIN, "tlsprof-groundtruth-shared")
HOST_LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
HOST_LIBCRYPTO_A = "/usr/lib/x86_64-linux-gnu/libcrypto.a"
# Inside the containers (the trixie root's OpenSSL 3.5, and a small library to copy).
LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
LIBSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
NOBODY = 65534

INTERVAL = 2
FREQUENCY = 999  # many samples per window: the bucket check is about attribution, not sampling noise
MEMORY_LIMIT_MIB = 256
# Past this the test kills the agent itself, so that a runaway agent cannot take the shared machine down; the RSS
# check has failed long before.
RSS_KILL_MIB = 3 * MEMORY_LIMIT_MIB
LATENCY_LIMIT_S = 1.0
POLL_S = 0.5
ATTACK_SECONDS = 12
REASONS = ["not_regular", "replaced", "file_size", "elf_headers", "section_size", "symbols", "cfi_rows",
           "pclntab_rows", "maps", "memory", "deadline", "short_read"]  # agent/guard/limits.h ReasonName
REFUSED = "tlsprof_agent_images_refused_total"
POISON_PREFIX = "ossl_ml_kem_poison_"  # the rules table reads ossl_ml_kem_* as ML-KEM, which OpenSSL 3.0 has none of


def http_get(port, path):
    """(status or None, seconds, error text) of one GET with LATENCY_LIMIT_S to answer."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=LATENCY_LIMIT_S) as r:
            r.read()
            return r.status, time.monotonic() - started, ""
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - started, str(e)
    except OSError as e:  # refused, timed out
        return None, time.monotonic() - started, str(e)


def proc_status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cpu_seconds(pid):
    """utime + stime of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def main_thread_state(pid):
    """'<state> in <wchan>' of a process's main thread (the agent's window loop), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{pid}/wchan") as f:
            wchan = f.read().strip() or "-"
        return f"{state} in {wchan}"
    except (OSError, IndexError):
        return None


def elf_section(path, name):
    """The bytes of section `name` of an ELF64 little-endian file."""
    with open(path, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3c)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    names = headers[shstrndx][4]
    for h in headers:
        if data[names + h[0]:data.index(b"\0", names + h[0])].decode() == name:
            return data[h[4]:h[4] + h[5]]
    raise AssertionError(f"{path} has no {name}")


class Fanotify:
    """Every open of the marked files (fanotify FAN_OPEN | FAN_ACCESS on their inodes, whatever path reached them),
    with the opener's pid, read by a thread."""
    FAN_CLOEXEC, FAN_NONBLOCK = 0x1, 0x2
    FAN_ACCESS, FAN_OPEN, FAN_OPEN_EXEC = 0x1, 0x20, 0x1000
    FAN_MARK_ADD = 0x1
    AT_FDCWD = -100
    EVENT = struct.Struct("<IBBHQii")  # struct fanotify_event_metadata

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int,
                                            ctypes.c_char_p]
        self.fd = self.libc.fanotify_init(self.FAN_CLOEXEC | self.FAN_NONBLOCK, os.O_RDONLY | os.O_LARGEFILE)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        self.events = []  # (unix time, pid, comm, path)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def mark(self, path):
        mask = self.FAN_OPEN | self.FAN_ACCESS | self.FAN_OPEN_EXEC
        if self.libc.fanotify_mark(self.fd, self.FAN_MARK_ADD, mask, self.AT_FDCWD, path.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"fanotify_mark {path}")

    def _read(self):
        while not self.done.is_set():
            if not select.select([self.fd], [], [], 0.2)[0]:
                continue
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            off = 0
            while off + self.EVENT.size <= len(buf):
                length, _, _, _, _, fd, pid = self.EVENT.unpack_from(buf, off)
                path = ""
                if fd >= 0:
                    try:
                        path = os.readlink(f"/proc/self/fd/{fd}")
                    finally:
                        os.close(fd)
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    comm = "?"
                with self.lock:
                    self.events.append((time.time(), pid, comm, path))
                off += max(length, self.EVENT.size)

    def by(self, pids):
        with self.lock:
            return [e for e in self.events if e[1] in pids]

    def close(self):
        self.done.set()
        self.thread.join(2)
        os.close(self.fd)


class Agent:
    """`tlsprof-agent run --usage` over the whole host with the memory cap; its log holds the window lines."""

    def __init__(self, procs, index):
        self.port = free_port()
        state = procs.path(f"agent-state-{index}")
        os.makedirs(state)
        self.proc = procs.start([AGENT, "run", "--usage", "--memory-limit", f"{MEMORY_LIMIT_MIB}MiB", "--interval",
                                 str(INTERVAL), "--frequency", str(FREQUENCY), "--metrics-listen",
                                 f"127.0.0.1:{self.port}", "--state-dir", state],
                                port=self.port, http_path="/metrics", timeout=180)
        self.pid = self.proc.pid
        self.killed_for_rss = False

    def log(self):
        with open(self.proc.log_path, errors="replace") as f:
            return f.read()

    def windows(self):
        """[(start, end)] of every closed window, unix seconds."""
        return [(int(m.group(1)) / 1e9, int(m.group(2)) / 1e9) for m in WINDOW_LINE.finditer(self.log())]

    def wait_windows(self, n, timeout):
        """True once n more windows closed, False if they did not within `timeout`."""
        have = len(self.windows())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.windows()) >= have + n:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def scrape(self, timeout=5):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout) as r:
                return r.read().decode()
        except OSError:
            return None

    def exit_text(self):
        code = self.proc.poll()
        if code is None:
            return "running"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"


class Monitor(threading.Thread):
    """Every POLL_S: /healthz and /metrics (status, latency) and the agent's VmRSS; an agent past RSS_KILL_MIB is
    killed."""

    def __init__(self):
        super().__init__(daemon=True)
        self.agent = None
        self.samples = []  # dicts: t (unix), agent pid, healthz/metrics (status, seconds, error), rss_kib
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            started = time.monotonic()
            agent = self.agent
            if agent is not None and agent.proc.poll() is None:
                rss = proc_status_kib(agent.pid, "VmRSS")
                if rss is not None and rss > RSS_KILL_MIB * 1024:
                    agent.killed_for_rss = True
                    agent.proc.kill()
                sample = {"t": time.time(), "pid": agent.pid, "rss_kib": rss,
                          "healthz": http_get(agent.port, "/healthz"), "metrics": http_get(agent.port, "/metrics")}
                with self.lock:
                    self.samples.append(sample)
            self.done.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def between(self, start, end, pid):
        with self.lock:
            return [s for s in self.samples if start <= s["t"] <= end and s["pid"] == pid]


class Container:
    """An unprivileged tenant's container: an overlayfs whose lower layer is the trixie root and whose upper layer is
    a directory of the test's (what the tenant writes lands there; the shared root is never written), entered in its
    own mount and pid namespaces through pivot_root, as uid/gid 65534. Its files are under /hostile; `host(path)` is
    where the test prepares them before it starts."""
    # The overlay is mounted inside the new namespace, so the host never sees it; the rest is runc's sequence
    # (trixie.py), then the drop to nobody.
    _ENTER = (
        'set -e; lower="$1"; upper="$2"; work="$3"; root="$4"; shift 4; '
        'mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"; '
        'mount -t proc proc "$root/proc"; '
        'mount --rbind /dev "$root/dev"; '
        'cd "$root"; pivot_root . .oldroot; cd /; umount -l /.oldroot; '
        f'exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --no-new-privs "$@"'
    )

    def __init__(self, procs, name):
        self.procs = procs
        self.name = name
        self.dir = procs.path(f"container-{name}")
        self.upper, self.work, self.root = (os.path.join(self.dir, d) for d in ("upper", "work", "root"))
        for d in (self.upper, self.work, self.root, os.path.join(self.upper, ".oldroot")):
            os.makedirs(d)
        self.mkdir("/hostile/bin")
        # Its own name (comm, so its own service in /metrics): hostile-<name>.
        self.binary = f"/hostile/bin/hostile-{name}"[:len("/hostile/bin/") + 15]
        shutil.copy(HOSTILE, self.host(self.binary))
        self.comm = os.path.basename(self.binary)

    def host(self, path):
        return os.path.join(self.upper, path.lstrip("/"))

    def mkdir(self, path):
        """A directory of the tenant's own, under /hostile."""
        os.makedirs(self.host(path), exist_ok=True)
        for d in (self.host("/hostile"), self.host(path)):
            os.chown(d, NOBODY, NOBODY)

    def start(self, *argv, ready=True):
        args = [self.binary, *argv]
        ready_file = None
        if ready:
            args += ["--ready-file", "/hostile/ready"]
            ready_file = self.host("/hostile/ready")
        proc = self.procs.start(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
                                 "sh", "-c", self._ENTER, "sh", trixie.ROOT, self.upper, self.work, self.root, *args],
                                ready_file=ready_file, timeout=120)
        return proc

    def status(self, name="/hostile/status.json"):
        try:
            with open(self.host(name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


@dataclasses.dataclass
class Phase:
    """What one attack's seconds showed."""
    name: str
    agent: Agent
    start: float = 0.0  # unix seconds
    end: float = 0.0
    before: str = ""
    after: str = ""
    hwm_kib: int = 0
    cpu_start: float = 0.0
    restarted: str = ""  # why the agent was restarted before this attack, if it was
    notes: list = dataclasses.field(default_factory=list)
    figures: dict = dataclasses.field(default_factory=dict)


class HostileTest(unittest.TestCase):
    results = []

    @classmethod
    def setUpClass(cls):
        cls.procs = Processes()
        cls.fan = None
        cls.monitor = None
        cls.canaries = {}
        if os.geteuid() != 0 or not os.path.exists(trixie.STAMP):
            return  # each test fails on it (require_root, require_trixie)
        try:
            cls._set_up()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _set_up(cls):
        for binary in (AGENT, HOSTILE, GT_SHARED):
            if not os.path.exists(binary):
                raise AssertionError(f"{binary} is not built")
        cls.seed = draw_seeds(1)[0]
        print(f"ground truth seed {cls.seed} (replay: TLSPROF_SEEDS={cls.seed})")
        cls.gt = os.path.join(cls.procs.path("gt"), "hostile-gt")
        os.makedirs(os.path.dirname(cls.gt))
        shutil.copy(GT_SHARED, cls.gt)
        # The canaries: files on the host only, at paths a tenant names with absolute symlinks.
        token = secrets.token_hex(4)
        cls.fan = Fanotify()
        for kind in ("debuglink", "archive"):
            path = f"/var/tmp/tlsprof-canary-{token}-{kind}"
            with open(path, "w") as f:
                f.write("tlsprof hostile-tenant canary: the agent must never open this file\n")
            cls.canaries[kind] = path
            cls.fan.mark(path)
        cls.agent_pids = set()
        # A benign tenant maps the root's libssl and libcrypto before the agent starts: their images (and the
        # archive match against the root's libcrypto.a) are loaded at set-up, not in an attack's windows.
        benign = Container(cls.procs, "benign")
        benign.start("tenant", "--map", LIBSSL, "--map", LIBCRYPTO, "--duty", "0.05")
        cls.monitor = Monitor()
        cls.monitor.start()
        cls.agent = cls._start_agent()

    @classmethod
    def _start_agent(cls):
        agent = Agent(cls.procs, len(cls.agent_pids))
        cls.agent_pids.add(agent.pid)
        cls.monitor.agent = agent
        if not agent.wait_windows(2, 60):
            raise AssertionError(f"the agent closed no windows:\n{agent.log()[-3000:]}")
        return agent

    @classmethod
    def tearDownClass(cls):
        if cls.monitor is not None:
            cls.monitor.done.set()
            cls.monitor.join(5)
        cls.procs.close()
        if cls.fan is not None:
            cls.fan.close()
        for path in cls.canaries.values():
            os.unlink(path)
        if cls.results:
            print("\nhostile tenants, per attack:")
            for p in cls.results:
                print(f"  {p.name}: " + ", ".join(f"{k} {v}" for k, v in p.figures.items()))
                for note in p.notes:
                    print(f"      {note}")

    def setUp(self):
        require_root(self)
        trixie.require_trixie(self)

    # -- one attack ------------------------------------------------------------------------------------------------

    def ensure_agent(self):
        """The agent, restarted if the attack before left it dead or stalled (so each attack is judged alone)."""
        agent = self.agent
        why = ""
        if agent.proc.poll() is not None:
            why = agent.exit_text()
            if agent.killed_for_rss:
                why += f" (by the test: RSS over {RSS_KILL_MIB} MiB)"
        elif not agent.wait_windows(1, 3 * INTERVAL):
            why = f"stalled (no window in {3 * INTERVAL} s)"
        if not why:
            return ""
        self.procs.stop(agent.proc, signal.SIGKILL)
        type(self).agent = self._start_agent()
        return why

    def start_gt(self, path, name, env=None):
        ready = self.procs.path(f"{name}.ready")
        out = self.procs.path(f"{name}-{time.monotonic_ns()}.json")
        proc = self.procs.start([path, "--warmup", "0.2", "--duration", "0", "--seed", str(self.seed), "--output", out,
                                 "--ready-file", ready], ready_file=ready, env=env)
        os.unlink(ready)
        return proc, out

    def stop_gt(self, gt):
        proc, out = gt
        self.procs.stop(proc)
        self.assertEqual(proc.returncode, 0, self.procs.log(proc))
        with open(out) as f:
            return json.load(f)

    def run_attack(self, name, start, seconds=ATTACK_SECONDS, during=None):
        """Runs one attack beside the ground truth: `start(phase)` starts its container(s) (and returns what to stop),
        `during(phase)` runs next, then the attack goes on until `seconds` have passed. Returns the Phase and the
        ground truth's truth."""
        restarted = self.ensure_agent()
        agent = self.agent
        phase = Phase(name, agent, restarted=restarted)
        if restarted:
            phase.notes.append(f"agent restarted before this attack: the previous one left it {restarted}")
        gt = self.start_gt(self.gt, "gt")
        agent.wait_windows(1, 3 * INTERVAL)  # the ground truth is in a whole window
        phase.before = agent.scrape() or ""
        with open(f"/proc/{agent.pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here
        phase.start = time.time()
        phase.cpu_start = cpu_seconds(agent.pid) or 0.0
        started = time.monotonic()
        tenants = start(phase)
        if during:
            during(phase)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        phase.end = time.time()
        phase.hwm_kib = proc_status_kib(agent.pid, "VmHWM") or 0
        phase.after = agent.scrape() or ""
        cpu = cpu_seconds(agent.pid)
        if cpu is not None:
            phase.figures["agent_cpu_s"] = round(cpu - phase.cpu_start, 2)
        if agent.proc.poll() is None and not [w for w in agent.windows() if w[1] > phase.start]:
            # Stalled: where its window loop is (a FIFO's open waits in wait_for_partner; R is busy).
            phase.notes.append(f"no window closed: the agent's main thread is {main_thread_state(agent.pid)}")
        for t in tenants:
            self.procs.stop(t)
        truth = self.stop_gt(gt)
        self.results.append(phase)
        return phase, truth

    # -- the checks, each a subtest ------------------------------------------------------------------------------------

    def check_invariants(self, phase, truth, refusals=(), gt_service="hostile-gt"):
        agent = phase.agent
        f = phase.figures
        with self.subTest(check="agent alive"):
            f["agent"] = agent.exit_text() + (" (by the test: RSS)" if agent.killed_for_rss else "")
            self.assertIsNone(agent.proc.poll(), f"{phase.name}: the agent {f['agent']}\n{agent.log()[-3000:]}")
        with self.subTest(check="windows on time"):
            windows = [w for w in agent.windows() if phase.start < w[1] <= phase.end + 0.5]
            gaps = [end - start for start, end in windows]
            last = windows[-1][1] if windows else phase.start - INTERVAL
            gaps.append(phase.end - last)  # a window still open at the end (a stalled agent)
            late = max(gaps) - INTERVAL
            f["windows"] = len(windows)
            f["late_max_s"] = round(late, 2)
            self.assertLessEqual(late, INTERVAL, f"{phase.name}: windows {[round(g, 2) for g in gaps]} s")
        samples = self.monitor.between(phase.start, phase.end, agent.pid)
        for endpoint in ("healthz", "metrics"):
            with self.subTest(check=f"/{endpoint} within {LATENCY_LIMIT_S} s"):
                answers = [s[endpoint] for s in samples]
                bad = [a for a in answers if a[0] != 200 or a[1] > LATENCY_LIMIT_S]
                f[f"{endpoint}_max_s"] = round(max((a[1] for a in answers), default=0), 3)
                f[f"{endpoint}_bad"] = f"{len(bad)}/{len(answers)}"
                self.assertGreater(len(answers), 0, "no sample of the agent during the attack")
                self.assertEqual(bad, [], f"{phase.name}: /{endpoint} answers not 200 within {LATENCY_LIMIT_S} s "
                                          f"(status, seconds, error)")
        with self.subTest(check="RSS under the cap"):
            rss = max((s["rss_kib"] or 0 for s in samples), default=0)
            f["rss_max_mib"] = round(rss / 1024, 1)
            f["hwm_mib"] = round(phase.hwm_kib / 1024, 1)
            self.assertFalse(agent.killed_for_rss, f"{phase.name}: RSS over {RSS_KILL_MIB} MiB, killed by the test")
            assert_resource_budget(self, f"{phase.name}: agent peak RSS (VmHWM, MiB)", max(rss, phase.hwm_kib) / 1024,
                                   MEMORY_LIMIT_MIB)
        with self.subTest(check="no host canary opened by the agent"):
            opened = [e for e in self.fan.by(self.agent_pids) if phase.start - 1 <= e[0] <= phase.end + 1]
            f["canary_opens_by_agent"] = len(opened)
            self.assertEqual(opened, [], f"{phase.name}: the agent opened a host canary (time, pid, comm, path)")
        with self.subTest(check=f"ground truth buckets within {SHARE_TOLERANCE_PP} pp"):
            self.check_buckets(phase, truth, gt_service)
        f["refused"] = {r: int(v) for r in REASONS if (v := self.refused(phase, r))}
        for want in refusals:
            with self.subTest(check=f"refusal counted: {' or '.join(want)}"):
                self.assertGreater(sum(self.refused(phase, r) for r in want), 0,
                                   f"{phase.name}: no refusal under {want} in {REFUSED}; counted: {f['refused']}")
        print(f"\n{phase.name}: " + "; ".join(f"{k} {v}" for k, v in f.items()))
        for note in phase.notes:
            print(f"  {note}")

    def refused(self, phase, reason):
        return metric_sum(phase.after, REFUSED, reason=reason) - metric_sum(phase.before, REFUSED, reason=reason)

    def check_buckets(self, phase, truth, service):
        if not phase.after:
            self.fail(f"{phase.name}: /metrics did not answer at the end")
        tls = {b: metric_sum(phase.after, "tlsprof_cpu_seconds_total", service=service, bucket=b)
               - metric_sum(phase.before, "tlsprof_cpu_seconds_total", service=service, bucket=b) for b in BUCKETS}
        total = sum(tls.values())
        truth_total = sum(c["cpu_seconds"] for c in truth["categories"])
        truth_bucket = {b: sum(c["cpu_seconds"] for c in truth["categories"] if c["bucket"] == b) / truth_total
                        for b in BUCKETS}
        rows = []
        worst = 0.0
        for b in BUCKETS:
            t, m = truth_bucket[b] * 100, (tls[b] / total * 100 if total else 0)
            worst = max(worst, abs(m - t))
            rows.append(f"{b} {t:.1f}/{m:.1f}")
        label = "gt" if service == "hostile-gt" else service
        phase.figures[f"{label}_tls_cpu_s"] = round(total, 2)
        phase.figures[f"{label}_buckets_truth/agent_%"] = ", ".join(rows)
        phase.figures[f"{label}_worst_pp"] = round(worst, 1)
        self.assertGreater(total, 0, f"{phase.name}: no TLS CPU of {service} in /metrics during the attack")
        self.assertLessEqual(worst, SHARE_TOLERANCE_PP, f"{phase.name}: {service} buckets (truth/agent %): {rows}")

    def saw_tenant(self, phase, container):
        """The agent found the tenant's process and its TLS library (its own service in /metrics)."""
        busy = metric_sum(phase.after, "tlsprof_busy_cpu_seconds_total", service=container.comm) - \
            metric_sum(phase.before, "tlsprof_busy_cpu_seconds_total", service=container.comm)
        phase.figures["tenant_busy_cpu_s"] = round(busy, 2)
        return busy

    # -- the attacks -----------------------------------------------------------------------------------------------

    def test_a1_fifo_swapped_for_a_mapped_library(self):
        c = Container(self.procs, "a1")
        c.mkdir("/hostile/a1")
        phase, truth = self.run_attack("1 fifo", lambda p: [c.start(
            "fifo-swap", "--library", LIBZ, "--dir", "/hostile/a1", "--map", LIBCRYPTO, "--fillers", "3000",
            "--status", "/hostile/status.json")])
        status = c.status()
        phase.figures["rounds/swapped"] = f"{status.get('rounds', 0)}/{status.get('swapped', 0)}"
        with self.subTest(check="the agent opened a copy and the tenant swapped it"):
            self.assertGreater(status.get("swapped", 0), 0, f"tenant status {status}")
        # Nothing to refuse is expected: the agent reads the mapping itself (map_files) and keeps that fd for every
        # later read, so the FIFO the tenant puts at the path once it sees that open is never opened. Were it opened
        # (the fallback when map_files fails), it is refused as not_regular without waiting for a writer
        # (guard_test: GuardedOpen.AFifoIsRefusedWithoutWaitingForAWriter), which the windows on time show here.
        self.check_invariants(phase, truth)

    def test_a2_library_truncated_and_restored_while_read(self):
        c = Container(self.procs, "a2")
        c.mkdir("/hostile/a2")
        phase, truth = self.run_attack("2 truncate", lambda p: [c.start(
            "truncate-loop", "--library", LIBCRYPTO, "--path", "/hostile/a2/libcrypto.so.3", "--spawn-ms", "1000",
            "--status", "/hostile/status.json")])
        phase.figures["mappers"] = c.status().get("mappers", 0)
        phase.figures["rewrites"] = c.status("/hostile/status.json.rewriter").get("rewrites", 0)
        self.saw_tenant(phase, c)
        self.check_invariants(phase, truth)

    def test_a3_symlinks_to_a_host_canary(self):
        c = Container(self.procs, "a3")
        c.mkdir("/hostile/a3/.debug")
        lib = "/hostile/a3/libcrypto.so.3"
        # A copy of the root's stripped libcrypto under a build-id of its own: no image of the agent's is shared
        # with it, so it is looked up for itself. Its .gnu_debuglink names a file beside it, and a libcrypto.a
        # beside it is where the agent looks for an archive of the same build: all absolute symlinks to paths
        # that exist on the host only.
        subprocess.run([HOSTILE, "copy-build-id", trixie.host_path(LIBCRYPTO), c.host(lib), "--build-id",
                        secrets.token_hex(20)], check=True, capture_output=True)
        link = elf_section(c.host(lib), ".gnu_debuglink").split(b"\0")[0].decode()
        os.symlink(self.canaries["debuglink"], c.host(f"/hostile/a3/{link}"))
        os.symlink(self.canaries["debuglink"], c.host(f"/hostile/a3/.debug/{link}"))
        os.symlink(self.canaries["archive"], c.host("/hostile/a3/libcrypto.a"))
        phase, truth = self.run_attack("3 symlinks", lambda p: [c.start("tenant", "--map", lib)])
        opened = self.fan.by(self.agent_pids)
        phase.figures["canary_opens"] = [f"{os.path.basename(e[3])} by {e[2]}" for e in opened]
        with self.subTest(check="the agent saw the tenant's library"):
            self.assertGreater(self.saw_tenant(phase, c), 0, "the tenant's process never showed in /metrics")
        self.check_invariants(phase, truth)

    def test_a4_sixty_thousand_mappings(self):
        c = Container(self.procs, "a4")
        phase, truth = self.run_attack("4 maps", lambda p: [c.start(
            "many-maps", "--file", LIBZ, "--count", "60000", "--map", LIBCRYPTO, "--status", "/hostile/status.json")])
        phase.figures["mappings"] = c.status().get("mappings", 0)
        self.check_invariants(phase, truth, refusals=[("maps",)])

    def test_a5_sparse_64_gib_library(self):
        c = Container(self.procs, "a5")
        c.mkdir("/hostile/a5")
        lib = "/hostile/a5/libcrypto.so.3"
        subprocess.run([HOSTILE, "gen-sparse", c.host(lib), "--size-gib", "64"], check=True, capture_output=True)
        phase, truth = self.run_attack("5 sparse", lambda p: [c.start("tenant", "--map", lib)])
        self.check_invariants(phase, truth, refusals=[("file_size", "section_size")])

    def test_a6_ten_million_symbols(self):
        c = Container(self.procs, "a6")
        c.mkdir("/hostile/a6")
        lib = "/hostile/a6/libssl.so.3"
        started = time.monotonic()
        subprocess.run([HOSTILE, "gen-symbols", c.host(lib), "--count", "10000000"], check=True, capture_output=True)
        generated = time.monotonic() - started
        phase, truth = self.run_attack("6 symbols", lambda p: [c.start("tenant", "--map", lib)])
        phase.figures["generated_s"] = round(generated, 1)
        # Refused by whichever bound comes first: the symbol cap, or the memory budget, which charges the table
        # from the section headers before it is read (which one depends on --memory-limit).
        self.check_invariants(phase, truth, refusals=[("symbols", "memory")])

    def test_a7_one_fde_of_200k_rows(self):
        c = Container(self.procs, "a7")
        c.mkdir("/hostile/a7")
        lib = "/hostile/a7/libhostile-fde.so"
        subprocess.run([HOSTILE, "gen-fde", c.host(lib), "--rows", "200000"], check=True, capture_output=True)
        phase, truth = self.run_attack("7 fde", lambda p: [c.start(
            "tenant", "--map", lib, "--map", LIBSSL, "--map", LIBCRYPTO)])
        self.check_invariants(phase, truth, refusals=[("cfi_rows",)])

    def test_a8_pclntab_with_one_shared_pcsp_table(self):
        c = Container(self.procs, "a8")
        c.mkdir("/hostile/a8")
        binary = "/hostile/a8/hostile-go"
        subprocess.run([HOSTILE, "gen-pclntab", c.host(binary), "--text-mib", "16", "--functions", "8192"], check=True,
                       capture_output=True)
        phase, truth = self.run_attack("8 pclntab", lambda p: [c.start("tenant", "--map", binary, "--map", LIBSSL)])
        self.check_invariants(phase, truth, refusals=[("pclntab_rows",)])

    def test_a9_copied_build_id_with_a_crafted_symtab(self):
        # Two copies of the HOST's libcrypto.so.3 whose added .symtab names all their code ossl_ml_kem_poison_N:
        # one with Debian's own build-id (which every host process mapping libcrypto shares, the test's own
        # Python among them), one with a build-id that only a second ground truth's copy of the same library has.
        # Both are mapped in the container before that ground truth starts; neither ground truth may be named by
        # them.
        c = Container(self.procs, "a9")
        unique = secrets.token_hex(20)
        for name, bid in (("debian", ""), ("unique", unique)):
            c.mkdir(f"/hostile/a9/{name}")
            subprocess.run([HOSTILE, "crafted-symtab", HOST_LIBCRYPTO, c.host(f"/hostile/a9/{name}/libcrypto.so.3"),
                            "--prefix", POISON_PREFIX] + (["--build-id", bid] if bid else []),
                           check=True, capture_output=True)
        self.assertEqual(build_id(c.host("/hostile/a9/debian/libcrypto.so.3")), build_id(HOST_LIBCRYPTO))
        gt9_dir = self.procs.path("gt9lib")
        os.makedirs(gt9_dir)
        subprocess.run([HOSTILE, "copy-build-id", HOST_LIBCRYPTO, os.path.join(gt9_dir, "libcrypto.so.3"),
                        "--build-id", unique], check=True, capture_output=True)
        os.symlink(HOST_LIBCRYPTO_A, os.path.join(gt9_dir, "libcrypto.a"))  # the same build's archive, on the host
        gt9_bin = os.path.join(self.procs.path("gt"), "hostile-gt9")
        shutil.copy(GT_SHARED, gt9_bin)
        gt9 = {}

        def during(phase):
            phase.agent.wait_windows(2, 4 * INTERVAL)  # the tenant's copies are loaded first
            gt9["gt"] = self.start_gt(gt9_bin, "gt9", env={**os.environ, "LD_LIBRARY_PATH": gt9_dir})
            with open(f"/proc/{gt9['gt'][0].pid}/maps") as f:
                self.assertIn(os.path.join(gt9_dir, "libcrypto.so.3"), f.read())
            phase.agent.wait_windows(1, 3 * INTERVAL)
            gt9["before"] = phase.agent.scrape() or ""

        phase, truth = self.run_attack("9 build-id", lambda p: [c.start(
            "tenant", "--map", "/hostile/a9/debian/libcrypto.so.3", "--map", "/hostile/a9/unique/libcrypto.so.3")],
            seconds=ATTACK_SECONDS + 10, during=during)
        truth9 = self.stop_gt(gt9["gt"])
        with self.subTest(check="the agent saw the tenant's copies"):
            self.assertGreater(self.saw_tenant(phase, c), 0, "the tenant's process never showed in /metrics")
        for service in ("hostile-gt", "hostile-gt9"):
            with self.subTest(check=f"{service} not named by the crafted .symtab"):
                before = gt9["before"] if service == "hostile-gt9" else phase.before
                algos = label_split(phase.after, before, "tlsprof_cpu_seconds_total", "algorithm", service=service)
                poisoned = algos.get("ML-KEM", 0)
                total = sum(algos.values())
                phase.figures[f"{service}_ml_kem_share"] = round(poisoned / total, 3) if total else None
                self.assertGreater(total, 0, f"no TLS CPU of {service} during the attack")
                self.assertEqual(poisoned, 0, f"{service}: {poisoned:.2f} of {total:.2f} TLS CPU-s named ML-KEM "
                                              f"(the crafted .symtab's names)")
        with self.subTest(check=f"hostile-gt9 buckets within {SHARE_TOLERANCE_PP} pp"):
            self.check_buckets(dataclasses.replace(phase, before=gt9["before"]), truth9, "hostile-gt9")
        self.check_invariants(phase, truth)


if __name__ == "__main__":
    unittest.main()
