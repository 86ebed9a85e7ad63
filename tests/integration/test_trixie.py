"""The Debian 13 root (scripts/make-trixie-root.sh) and its two containers
(trixie.py): the root holds OpenSSL 3.5, and the agent finds
and names OpenSSL 3.5 in a process in a plain chroot (whose maps show host
paths) and after pivot_root (whose maps show paths inside), and attaches its
usage probes to the process's own libssl in both."""
import os
import time
import unittest

import trixie
from tlsprof_testlib import Processes, process_row, profile_json, require_root

PROFILE_SECONDS = 3


class TrixieTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        trixie.require_trixie(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_root_holds_todays_stacks(self):
        v = "\n".join(trixie.versions())
        for want in ("OpenSSL 3.5.", "go1.24", "nginx/1.26", "HAProxy version 3.0", "android-libboringssl 14"):
            self.assertIn(want, v)
        for path in ("/usr/lib/x86_64-linux-gnu/libcrypto.a", "/usr/lib/go-1.24/bin/go", "/usr/sbin/nginx",
                     "/usr/sbin/haproxy", "/usr/bin/g++"):
            self.assertTrue(os.path.exists(trixie.host_path(path)), path)

    def test_agent_names_openssl_35_in_both_containers(self):
        for name, container in trixie.CONTAINERS.items():
            with self.subTest(container=name):
                proc = self.procs.start(container(["openssl", "speed", "-seconds", str(PROFILE_SECONDS + 20),
                                                   "-evp", "aes-128-gcm"]))
                pid = self.wait_mapped(proc, "libcrypto.so.3")
                report = profile_json(self, ["--duration", str(PROFILE_SECONDS), "--pid", str(pid), "--usage"])
                row = process_row(report, pid)
                self.assertIsNotNone(row, f"{name}: pid {pid} missing from the report")
                libs = {l["path"]: l for l in row["libraries"] if l["kind"] != "libc"}
                inside = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
                # The path as the host's /proc/PID/maps shows it.
                want = trixie.host_path(inside) if name == "chroot" else inside
                self.assertIn(want, libs, f"{name}: libraries {sorted(libs)}")
                lib = libs[want]
                self.assertEqual(lib["kind"], "openssl-3")
                # Named from the root's own libcrypto.a, found beside the library
                # where the process sees it.
                self.assertEqual(lib["symbols"], "static-archive", f"{name}: {lib}")
                self.assertGreater(row["tls_share"], 0.5, f"{name}: {row['buckets']}")
                # The usage probes attach to the process's own libssl: the
                # agent hands the kernel a path that names it (for a chroot, the
                # host path its maps show, not that path under /proc/PID/root).
                files = {os.path.basename(f["path"]): f for f in report["agent"]["usage"]["files"]}
                self.assertIn("libssl.so.3", files, f"{name}: probed files {sorted(files)}")
                self.assertEqual(files["libssl.so.3"]["functions"], ["state_machine", "SSL_free"])
                self.assertEqual(os.path.dirname(files["libssl.so.3"]["path"]), os.path.dirname(want))
                print(f"\n{name}: {want} named by {lib['symbols']}, TLS share {row['tls_share']:.2f}")
                self.procs.stop(proc)

    def wait_mapped(self, proc, library, timeout=30):
        """The pid of the container's process (the wrapper execs it) once it maps `library`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{self.procs.log(proc)}")
            try:
                with open(f"/proc/{proc.pid}/maps") as f:
                    if library in f.read():
                        return proc.pid
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{proc.args}: {library} not mapped after {timeout} s")


if __name__ == "__main__":
    unittest.main()
