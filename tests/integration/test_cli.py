"""CLI behaviour: bad input gives a clear message and a non-zero exit."""
import os
import subprocess
import unittest

import stat
import tempfile
import threading

from tlsprof_testlib import AGENT, BIN, require_root, run_agent


class CliTest(unittest.TestCase):
    def setUp(self):
        require_root(self)

    def assert_fails(self, args, *needles):
        code, out, err = run_agent(args, timeout=60)
        self.assertNotEqual(code, 0, f"{args} succeeded:\n{out}")
        text = (out + err).lower()
        for needle in needles:
            self.assertIn(needle.lower(), text, f"{args}: message lacks '{needle}':\n{err}")

    def test_workload_output_to_a_fifo_keeps_the_node(self):
        # `--output /dev/null` once replaced the device with a regular file
        # (write to a temp file, rename over it). A FIFO stands in for it:
        # the JSON must go through it and the node must stay a FIFO.
        for binary in ("tlsprof-groundtruth", "tlsprof-go-groundtruth"):
            with tempfile.TemporaryDirectory(prefix="tlsprof-fifo-") as tmp:
                fifo = os.path.join(tmp, "out")
                os.mkfifo(fifo)
                received = []
                reader = threading.Thread(target=lambda: received.append(open(fifo).read()))
                reader.start()
                proc = subprocess.run([os.path.join(BIN, binary), "--warmup", "0", "--duration", "0.3", "--mix",
                                       "sha256=1", "--output", fifo], capture_output=True, text=True, timeout=120)
                reader.join(30)
                self.assertEqual(proc.returncode, 0, f"{binary}: {proc.stderr}")
                self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode), f"{binary} replaced the FIFO")
                self.assertIn('"categories"', received[0] if received else "", f"{binary}: no JSON came through")
                self.assertFalse(os.path.exists(fifo + ".tmp"), f"{binary} left {fifo}.tmp")

    def test_no_subcommand(self):
        self.assert_fails([], "subcommand")

    def test_unknown_flag(self):
        self.assert_fails(["profile", "--bogus"], "--bogus")

    def test_bad_values(self):
        self.assert_fails(["profile", "--duration", "-3"], "--duration")
        self.assert_fails(["profile", "--duration", "soon"], "--duration")
        self.assert_fails(["profile", "--frequency", "0"], "--frequency")
        self.assert_fails(["profile", "--frequency", "20000"], "--frequency")
        self.assert_fails(["profile", "--format", "xml"], "--format")
        self.assert_fails(["profile", "--pid", "-1"], "--pid")

    def test_pid_that_does_not_exist(self):
        # The highest possible pid is never in use on a test machine.
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
        self.assert_fails(["profile", "--duration", "1", "--pid", str(pid_max)], "no such process", str(pid_max))

    def test_unwritable_output(self):
        self.assert_fails(["profile", "--duration", "0.2", "--output", "/nonexistent-dir/report.json"],
                          "cannot write")

    def test_without_privileges(self):
        # Drop to nobody with no capabilities at all.
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "--inh-caps=-all", "--bounding-set=-all", AGENT, "profile", "--duration", "1"],
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("root", proc.stderr)
        self.assertIn("CAP_BPF", proc.stderr)

    def test_help(self):
        code, out, _ = run_agent(["profile", "--help"])
        self.assertEqual(code, 0)
        self.assertIn("--frequency", out)


if __name__ == "__main__":
    unittest.main()
