"""--folded and --pprof: the TLS stacks of a profile, with bucket, algorithm
and phase labels, readable by flame-graph tools and `go tool pprof`."""
import os
import re
import subprocess
import unittest

from tlsprof_testlib import BIN, Processes, process_row, profile_json, require_root


class ExportsTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_folded_and_pprof(self):
        ready = self.procs.path("gt.ready")
        gt = self.procs.start([os.path.join(BIN, "tlsprof-groundtruth"), "--warmup", "1", "--duration", "30",
                               "--ready-file", ready], ready_file=ready)
        folded, pprof = self.procs.path("tls.folded"), self.procs.path("tls.pb")
        report = profile_json(self, ["--pid", str(gt.pid), "--duration", "3", "--folded", folded, "--pprof", pprof])
        proc = process_row(report, gt.pid)
        self.assertGreater(report["samples"]["tls_with_stack"], 0)

        with open(folded) as f:
            lines = f.read().splitlines()
        self.assertTrue(lines)
        line_re = re.compile(r"^[^ ;]+;\[(handshake|record|other)\];\[(cipher|signature|key_exchange|hash|other) "
                             r"[^;]+\](;[^;]+)+ (\d+)$")
        total = 0
        for line in lines:
            m = line_re.match(line)
            self.assertIsNotNone(m, f"not a folded line: {line}")
            total += int(m.group(4))
        self.assertEqual(total, report["samples"]["tls_with_stack"])
        self.assertTrue(any(";aesni_gcm_encrypt;" in l or "_aesni_ctr32_ghash_6x" in l for l in lines))

        tags = subprocess.run(["go", "tool", "pprof", "-tags", pprof], capture_output=True, text=True, timeout=120)
        self.assertEqual(tags.returncode, 0, tags.stderr)
        for label in ("bucket:", "algorithm:", "phase:", "AES-GCM", "RSA", "X25519"):
            self.assertIn(label, tags.stdout)
        top = subprocess.run(["go", "tool", "pprof", "-top", pprof], capture_output=True, text=True, timeout=120)
        self.assertEqual(top.returncode, 0, top.stderr)
        self.assertIn(f"Total samples = {total}", top.stdout)
        self.assertGreater(proc["tls_cpu_seconds"], 0)


if __name__ == "__main__":
    unittest.main()
