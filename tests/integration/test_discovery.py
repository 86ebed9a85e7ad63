"""Discovery in the situations an SRE's fleet produces: a process in its own
mount namespace (a container) whose binary the host cannot see at that path,
a process that starts while the profile runs, and a binary deleted after it
was started (an upgrade in place)."""
import os
import shutil
import subprocess
import threading
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
        started = {}

        def start_late():
            time.sleep(1.5)
            started["proc"] = self.procs.start([GT, "--warmup", "0.2", "--duration", "30", "--ready-file", ready],
                                               ready_file=ready)

        t = threading.Thread(target=start_late)
        t.start()
        report = profile_json(self, ["--duration", "6"])
        t.join()
        self.assertIn("proc", started)
        proc = self.assert_static_openssl(report, started["proc"].pid)
        self.assertGreater(report["tls_cpu_seconds"], 0)
        self.assertGreaterEqual(report["tls_cpu_seconds"], proc["tls_cpu_seconds"])


if __name__ == "__main__":
    unittest.main()
