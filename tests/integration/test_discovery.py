"""Discovery in the situations an SRE's fleet produces: a process in its own
mount namespace (a container) whose binary the host cannot see at that path,
a process that starts while the profile runs, and a binary deleted after it
was started (an upgrade in place)."""
import json
import os
import shutil
import subprocess
import time
import unittest

from tlsprof_testlib import AGENT, BIN, Processes, process_row, profile_json, require_root, summarize

GT = os.path.join(BIN, "tlsprof-groundtruth")


class DiscoveryTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def assert_static_openssl(self, report, pid, path=None):
        proc = process_row(report, pid)
        self.assertIsNotNone(proc, f"pid {pid} missing: {[p['pid'] for p in report['processes']]}")
        libs = [lib for lib in proc["libraries"] if lib["kind"] == "openssl-3"]
        self.assertTrue(libs, proc["libraries"])
        self.assertEqual(libs[0]["symbols"], "symtab")
        if path:
            self.assertEqual(libs[0]["path"], path)
        self.assertGreater(proc["tls_share"], 0.5, summarize(report, pid))
        return proc

    def test_process_in_its_own_mount_namespace(self):
        # The binary lives on a tmpfs mounted only inside the new namespace:
        # the host cannot open it by path, only through /proc/PID/map_files
        # or /proc/PID/root.
        inner = "/mnt/tlsprof-container-bin"
        ready = self.procs.path("ns.ready")
        script = (f"mkdir -p {inner} && mount -t tmpfs tlsprof {inner} && cp {GT} {inner}/gt && "
                  f"exec {inner}/gt --warmup 1 --duration 30 --ready-file {ready}")
        gt = self.procs.start(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                              ready_file=ready)
        self.assertFalse(os.path.exists(f"{inner}/gt"), "the namespace leaked its mount")
        report = profile_json(self, ["--pid", str(gt.pid), "--duration", "3"])
        self.assert_static_openssl(report, gt.pid, path=f"{inner}/gt")

    def test_binary_deleted_after_start(self):
        copy = self.procs.path("gt-deleted")
        shutil.copy(GT, copy)
        ready = self.procs.path("del.ready")
        gt = self.procs.start([copy, "--warmup", "1", "--duration", "30", "--ready-file", ready], ready_file=ready)
        os.unlink(copy)
        report = profile_json(self, ["--pid", str(gt.pid), "--duration", "3"])
        self.assert_static_openssl(report, gt.pid, path=copy)

    def test_process_started_during_a_host_profile(self):
        ready = self.procs.path("late.ready")
        report_path, log_path = self.procs.path("late-report.json"), self.procs.path("late-agent.log")
        with open(log_path, "wb") as log:
            agent = subprocess.Popen([AGENT, "--log-level", "info", "profile", "--format", "json", "-o", report_path,
                                      "--duration", "6"], stderr=log)
        self.addCleanup(lambda: agent.poll() is None and agent.kill())
        # The process starts once the window is open (the agent logs it), so it is discovered during the window.
        deadline = time.monotonic() + 30
        while "profile: window open" not in open(log_path, errors="replace").read():
            self.assertIsNone(agent.poll(), "the agent exited during set-up")
            self.assertLess(time.monotonic(), deadline, "the agent opened no window in 30 s")
            time.sleep(0.05)
        late = self.procs.start([GT, "--warmup", "0.2", "--duration", "30", "--ready-file", ready], ready_file=ready)
        self.assertEqual(agent.wait(timeout=120), 0, open(log_path, errors="replace").read()[-2000:])
        with open(report_path) as f:
            report = json.load(f)
        proc = self.assert_static_openssl(report, late.pid)
        self.assertGreater(report["tls_cpu_seconds"], 0)
        self.assertGreaterEqual(report["tls_cpu_seconds"], proc["tls_cpu_seconds"])


if __name__ == "__main__":
    unittest.main()
