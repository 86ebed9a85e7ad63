"""Discovery faults (issue 7): what a fleet does to the agent's view of its
processes and files, each checked on the attribution itself.

- A TLS library replaced on disk while mapped (an upgrade): by rename (the
  old file shows as "(deleted)": read through /proc/PID/map_files) and in
  place (cp over the same inode; the process that mapped it would die of
  SIGBUS, so a new process maps the new content). Each process is named with
  its own file's symbols; the image cache is not fooled by the kept inode.
- A reused pid: a static-OpenSSL process exits and a BoringSSL process gets
  its pid (the host's ns_last_pid), inside one window of the daemon. The new
  process is attributed with its own binary and library, not the old
  snapshot.
- A process in its own mount namespace whose libcrypto.so.3 is a bind mount
  only it sees: the agent reads the mapped file, not the host's path.

The libraries told apart are Debian's stripped libcrypto.so.3 and a
libcrypto.so.3 built here from libcrypto.a (full symbol table, another
build-id), so "the right file" shows in the report's build_id and symbols.

Exec/exit churn is test_faults_churn.py: it saturates the CPUs, so it runs
alone; these run beside tests that do not measure CPU.
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

from test_daemon import WINDOW_LINE, LogFollower, metric_sum, scrape
from tlsprof_testlib import (AGENT, BIN, Processes, free_port, process_row, profile_json, require_root,
                             summarize)

GT_SHARED = os.path.join(BIN, "tlsprof-groundtruth-shared")
GT_STATIC = os.path.join(BIN, "tlsprof-groundtruth")
GT_BORINGSSL = os.path.join(BIN, "tlsprof-groundtruth-boringssl")
SYSTEM_LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
STATIC_LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.a"
REGISTRY_LINE = re.compile(r"registry: processes=(\d+) images=(\d+) cached_images=(\d+) images_changed=(\d+) "
                           r"processes_replaced=(\d+)")

INTERVAL = 2
FREQUENCY = 999


def build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    assert m, f"{path} has no build-id"
    return m.group(1)


def build_symbolized_libcrypto(path):
    """A libcrypto.so.3 with a full symbol table, from libcrypto.a: the same
    OpenSSL as Debian's .so (so the ground truth runs on it), another file."""
    with tempfile.NamedTemporaryFile("w", suffix=".map", delete=False) as vs:
        vs.write("OPENSSL_3.0.0 { global: *; };\n")
    try:
        subprocess.run(["cc", "-shared", "-o", path, "-Wl,-soname,libcrypto.so.3", f"-Wl,--version-script={vs.name}",
                        "-Wl,--whole-archive", STATIC_LIBCRYPTO, "-Wl,--no-whole-archive", "-lpthread", "-ldl"],
                       check=True, capture_output=True)
    finally:
        os.unlink(vs.name)


def algorithm_share(rows, pred):
    """Share of a process's TLS CPU in the algorithms `pred` accepts."""
    tls = sum(r["cpu_seconds"] for r in rows)
    return sum(r["cpu_seconds"] for r in rows if pred(r["algorithm"])) / tls if tls else 0.0


def is_sha256(name):
    return name.upper().replace("-", "") == "SHA256"


def is_aes_gcm(name):
    return name.upper().startswith("AES") and name.upper().endswith("GCM")


class Daemon:
    """`tlsprof-agent run` without a collector: window lines and registry
    lines on stderr, /metrics on a free port."""

    def __init__(self, test, procs, on_window=None):
        self.port = free_port()
        state = procs.path("agent-state")
        os.makedirs(state, exist_ok=True)
        self.proc = subprocess.Popen([AGENT, "run", "--interval", str(INTERVAL), "--frequency", str(FREQUENCY),
                                      "--metrics-listen", f"127.0.0.1:{self.port}", "--state-dir", state],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        procs.procs.append(self.proc)
        self.proc.log_path = os.devnull
        self.log = LogFollower(self.proc.stderr, on_window)
        self.test = test
        test.addCleanup(self.close)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.thread.join(5)
        self.proc.stderr.close()

    def windows(self):
        with self.log.cond:
            return [m for m in (WINDOW_LINE.search(l) for l in self.log.lines) if m]

    def wait_windows(self, n, timeout=None):
        """Waits until n more windows closed; returns the registry line of the last."""
        have = len(self.windows())
        self.log.wait_for(WINDOW_LINE, have + n, timeout or INTERVAL * n + 30)
        self.test.assertIsNone(self.proc.poll(), "the agent died:\n" + self.log.text()[-3000:])
        return self.log.wait_for(REGISTRY_LINE, have + n, 5)[-1]

    def scrape(self):
        return scrape(self.port)


def delta(after, before, name, **labels):
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def label_split(after, before, name, label, **labels):
    """{label value: delta} of the series of `name` matching `labels`."""
    values = set(re.findall(rf'^{name}\{{[^}}]*{label}="([^"]*)"', after, re.M))
    return {v: delta(after, before, name, **labels, **{label: v}) for v in values}


class FaultsCase(unittest.TestCase):
    """Processes started by a test and stopped at its end, and ground-truth workloads under names of their own.
    No tests of its own (test_faults_churn.py shares it)."""

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def named_copy(self, binary, name):
        """A copy of `binary` called `name`: its comm (the daemon's service label)."""
        path = self.procs.path(name)
        shutil.copy(binary, path)
        return path

    def start_gt(self, binary, mix, env=None, name="gt"):
        ready = self.procs.path(f"{name}.ready")
        return self.procs.start([binary, "--warmup", "0.2", "--duration", "0", "--mix", mix, "--ready-file", ready],
                                ready_file=ready, env=env)


class FaultsDiscoveryTest(FaultsCase):
    @classmethod
    def setUpClass(cls):
        cls.libdir = tempfile.TemporaryDirectory(prefix="tlsprof-fdisc-")
        cls.symbolized = os.path.join(cls.libdir.name, "libcrypto.so.3")
        build_symbolized_libcrypto(cls.symbolized)
        cls.symbolized_id = build_id(cls.symbolized)
        cls.system_id = build_id(SYSTEM_LIBCRYPTO)
        assert cls.symbolized_id != cls.system_id

    @classmethod
    def tearDownClass(cls):
        cls.libdir.cleanup()

    def assert_library(self, proc, want_id, want_symbols=None, path=None):
        libs = [lib for lib in proc["libraries"] if lib["kind"] == "openssl-3"]
        self.assertEqual(len(libs), 1, proc["libraries"])
        self.assertEqual(libs[0]["build_id"], want_id, proc["libraries"])
        if want_symbols:
            self.assertEqual(libs[0]["symbols"], want_symbols, proc["libraries"])
        if path:
            self.assertEqual(libs[0]["path"], path, proc["libraries"])

    # 1. A TLS library replaced on disk.
    def test_library_replaced_by_rename(self):
        d = self.procs.path("upgrade")
        os.makedirs(d)
        lib = os.path.join(d, "libcrypto.so.3")
        shutil.copy(SYSTEM_LIBCRYPTO, lib)
        env = dict(os.environ, LD_LIBRARY_PATH=d)
        old = self.start_gt(GT_SHARED, "sha256=1", env=env, name="old")
        # The upgrade: a new file renamed over the old one.
        shutil.copy(self.symbolized, lib + ".new")
        os.rename(lib + ".new", lib)
        with open(f"/proc/{old.pid}/maps") as f:
            self.assertIn(f"{lib} (deleted)", f.read())
        new = self.start_gt(GT_SHARED, "aes_gcm=1", env=env, name="new")
        report = profile_json(self, ["--pid", str(old.pid), "--pid", str(new.pid), "--duration", "3"])
        p_old, p_new = process_row(report, old.pid), process_row(report, new.pid)
        self.assertIsNotNone(p_old, [p["pid"] for p in report["processes"]])
        self.assertIsNotNone(p_new, [p["pid"] for p in report["processes"]])
        # The old process: the old (deleted) file, Debian's build, named.
        self.assert_library(p_old, self.system_id, path=lib)
        self.assert_library(p_new, self.symbolized_id, "symtab", path=lib)
        old_sha = algorithm_share(p_old["algorithms"], is_sha256)
        new_gcm = algorithm_share(p_new["algorithms"], is_aes_gcm)
        msg = (f"old: tls {p_old['tls_share']:.3f} SHA-256 {old_sha:.3f} ({summarize(report, old.pid)}); "
               f"new: tls {p_new['tls_share']:.3f} AES-GCM {new_gcm:.3f} ({summarize(report, new.pid)})")
        print(msg)
        for p in (p_old, p_new):
            self.assertGreater(p["tls_share"], 0.8, msg)
        self.assertGreater(old_sha, 0.8, msg)
        self.assertGreater(new_gcm, 0.8, msg)

    def test_library_rewritten_in_place(self):
        # cp over a mapped library kills the process that maps it (SIGBUS on
        # the truncated pages): an upgrade in place means the old process
        # stops, and a new one maps the same inode with new content. The
        # daemon, which knew the inode, must load it again.
        d = self.procs.path("inplace")
        os.makedirs(d)
        lib = os.path.join(d, "libcrypto.so.3")
        shutil.copy(SYSTEM_LIBCRYPTO, lib)
        env = dict(os.environ, LD_LIBRARY_PATH=d)
        daemon = Daemon(self, self.procs)
        daemon.wait_windows(1, 60)
        old = self.start_gt(self.named_copy(GT_SHARED, "fdisc-inpl-old"), "sha256=1", env=env, name="old")
        daemon.wait_windows(2)
        self.procs.stop(old, signal.SIGKILL)
        inode = os.stat(lib).st_ino
        shutil.copyfile(self.symbolized, lib)  # truncate and write: the same inode
        self.assertEqual(os.stat(lib).st_ino, inode)
        new = self.start_gt(self.named_copy(GT_SHARED, "fdisc-inpl-new"), "aes_gcm=1", env=env, name="new")
        daemon.wait_windows(1)
        before = daemon.scrape()
        reg = daemon.wait_windows(2)
        after = daemon.scrape()
        tls = delta(after, before, "tlsprof_cpu_seconds_total", service="fdisc-inpl-new")
        busy = delta(after, before, "tlsprof_busy_cpu_seconds_total", service="fdisc-inpl-new")
        algos = label_split(after, before, "tlsprof_cpu_seconds_total", "algorithm", service="fdisc-inpl-new")
        gcm = sum(v for k, v in algos.items() if is_aes_gcm(k))
        msg = (f"new process on the rewritten inode: TLS {tls:.2f} of busy {busy:.2f} CPU-s, AES-GCM {gcm:.2f}; "
               f"algorithms {({k: round(v, 2) for k, v in algos.items() if v})}; {reg.group(0)}")
        print(msg)
        self.assertIsNone(new.poll())
        self.assertGreater(tls / busy, 0.8, msg)
        self.assertGreater(gcm / tls, 0.8, msg)
        self.assertGreaterEqual(int(reg.group(4)), 1, msg)

    # 2. A reused pid.
    def spawn_at_pid(self, argv, pid, attempts=500):
        """Starts argv as process `pid` (the host's ns_last_pid; another
        process forking in between takes the pid: retried)."""
        for _ in range(attempts):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            proc = self.procs.start(argv)
            if proc.pid == pid:
                return proc
            self.procs.stop(proc, signal.SIGKILL)
        self.fail(f"could not start a process as pid {pid} in {attempts} attempts")

    def test_reused_pid(self):
        daemon = Daemon(self, self.procs)
        daemon.wait_windows(1, 60)
        # The same program under another name: the new process's mappings
        # look like the old one's (same files' sizes, same count) at other
        # addresses (ASLR).
        old = self.start_gt(self.named_copy(GT_BORINGSSL, "fdisc-pid-old"), "sha256=1", name="old")
        daemon.wait_windows(2)
        pid = old.pid
        self.procs.stop(old, signal.SIGKILL)
        ready = self.procs.path("new.ready")
        new = self.spawn_at_pid([self.named_copy(GT_BORINGSSL, "fdisc-pid-new"), "--warmup", "0.2", "--duration", "0",
                                 "--mix", "aes_gcm=1", "--ready-file", ready], pid)
        daemon.wait_windows(1)  # the window of the reuse
        self.assertTrue(os.path.exists(ready), self.procs.log(new))
        before = daemon.scrape()
        reg = daemon.wait_windows(2)
        after = daemon.scrape()
        tls = delta(after, before, "tlsprof_cpu_seconds_total", service="fdisc-pid-new")
        busy = delta(after, before, "tlsprof_busy_cpu_seconds_total", service="fdisc-pid-new")
        stale = delta(after, before, "tlsprof_busy_cpu_seconds_total", service="fdisc-pid-old")
        libs = label_split(after, before, "tlsprof_cpu_seconds_total", "library", service="fdisc-pid-new")
        algos = label_split(after, before, "tlsprof_cpu_seconds_total", "algorithm", service="fdisc-pid-new")
        gcm = sum(v for k, v in algos.items() if is_aes_gcm(k))
        msg = (f"pid {pid} reused: new process TLS {tls:.2f} of busy {busy:.2f} CPU-s, libraries "
               f"{({k: round(v, 2) for k, v in libs.items() if v})}, AES-GCM {gcm:.2f}; still counted to the old "
               f"process: {stale:.2f} CPU-s; {reg.group(0)}")
        print(msg)
        self.assertGreater(busy, 0.5 * INTERVAL, msg)
        self.assertEqual(stale, 0, msg)
        self.assertGreater(tls / busy, 0.8, msg)
        self.assertGreater(libs.get("boringssl", 0), 0.95 * tls, msg)
        self.assertGreater(gcm / tls, 0.8, msg)

    # 3. A library from the process's own mount namespace.
    def test_library_from_own_mount_namespace(self):
        ready = self.procs.path("ns.ready")
        # Only this namespace sees the symbolized build at the system path.
        script = (f"mount --bind {self.symbolized} {SYSTEM_LIBCRYPTO} && exec {GT_SHARED} --warmup 0.2 "
                  f"--duration 0 --mix sha256=1 --ready-file {ready}")
        gt = self.procs.start(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                              ready_file=ready)
        self.assertEqual(build_id(SYSTEM_LIBCRYPTO), self.system_id, "the namespace leaked its mount")
        report = profile_json(self, ["--pid", str(gt.pid), "--duration", "3"])
        proc = process_row(report, gt.pid)
        self.assertIsNotNone(proc, [p["pid"] for p in report["processes"]])
        self.assert_library(proc, self.symbolized_id, "symtab", path=SYSTEM_LIBCRYPTO)
        sha = algorithm_share(proc["algorithms"], is_sha256)
        msg = f"tls {proc['tls_share']:.3f} SHA-256 {sha:.3f} ({summarize(report, gt.pid)})"
        print(msg)
        self.assertGreater(proc["tls_share"], 0.8, msg)
        self.assertGreater(sha, 0.8, msg)


if __name__ == "__main__":
    unittest.main()
