"""Accuracy against ground truth: a statically linked OpenSSL workload that
measures its own thread CPU per crypto category (workloads/groundtruth).

Acceptance (issue 2, leaf-only attribution): the TLS CPU rate within ±25% of
ground truth, and AES-GCM, ChaCha20-Poly1305, AES-CBC, SHA-256, SHA-1, RSA and
X25519 each within ±4 percentage points of the process's TLS time.
"""
import json
import os
import unittest

from tlsprof_testlib import (BIN, GROUND_TRUTH_BOUND_SECONDS, Processes, assert_resource_budget, by_name,
                             end_ground_truth, process_row, profile_json, require_root, truth_rate_in_window)

ALGORITHMS = ["AES-GCM", "ChaCha20-Poly1305", "AES-CBC", "SHA-256", "SHA-1", "RSA", "X25519"]
RATE_TOLERANCE = 0.25
SHARE_TOLERANCE_PP = 4.0
PROFILE_SECONDS = 10


class AccuracyTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_static_openssl_mix_without_p256(self):
        ready = self.procs.path("gt.ready")
        truth_file = self.procs.path("gt.json")
        gt = self.procs.start([os.path.join(BIN, "tlsprof-groundtruth"), "--warmup", "2",
                               "--duration", str(GROUND_TRUTH_BOUND_SECONDS), "--output", truth_file,
                               "--ready-file", ready], ready_file=ready)
        # Leaf-only, as the foundation specifies; the stack-aware accuracy
        # is test_stack_accuracy.py's.
        report = profile_json(self, ["--pid", str(gt.pid), "--duration", str(PROFILE_SECONDS),
                                     "--frequency", "999", "--no-stacks"])
        end_ground_truth(self, self.procs, gt, gt.pid)
        with open(truth_file) as f:
            truth = json.load(f)

        proc = process_row(report, gt.pid)
        self.assertIsNotNone(proc, "the ground-truth process is missing from the report")
        kinds = {(lib["kind"], lib["linkage"], lib["symbols"]) for lib in proc["libraries"]}
        self.assertIn(("openssl-3", "static", "symtab"), kinds)

        truth_total = sum(c["cpu_seconds"] for c in truth["categories"])
        truth_rate = truth_rate_in_window(truth, report)
        measured_rate = proc["tls_cpu_seconds"] / report["duration_seconds"]
        lines = [f"TLS CPU rate: truth {truth_rate:.3f} CPU, tlsprof {measured_rate:.3f} CPU "
                 f"({(measured_rate / truth_rate - 1) * 100:+.1f}%)"]

        truth_share = {}
        for c in truth["categories"]:
            truth_share[c["algorithm"]] = truth_share.get(c["algorithm"], 0) + c["cpu_seconds"] / truth_total
        measured = {}
        for row in proc["algorithms"]:
            measured[row["algorithm"]] = measured.get(row["algorithm"], 0) + row["share_of_tls"]
        errors = []
        for alg in ALGORITHMS:
            t = truth_share.get(alg, 0) * 100
            m = measured.get(alg, 0) * 100
            lines.append(f"  {alg:<20} truth {t:5.1f}%  tlsprof {m:5.1f}%  diff {m - t:+5.1f} pp")
            if abs(m - t) > SHARE_TOLERANCE_PP:
                errors.append(alg)
        other = by_name(proc["buckets"], "bucket")["other"]["share_of_tls"] * 100
        lines.append(f"  (other bucket: {other:.1f}% of TLS time)")
        lines.append(f"  agent: {report['agent']['cpu_share_of_core'] * 100:.2f}% of a core")
        print("\n".join(lines))
        self.assertLessEqual(abs(measured_rate / truth_rate - 1), RATE_TOLERANCE, "\n".join(lines))
        self.assertEqual(errors, [], "\n".join(lines))
        # The agent's own cost is part of the contract.
        assert_resource_budget(self, "agent cpu_share_of_core", report["agent"]["cpu_share_of_core"], 0.01,
                               report["agent"])


if __name__ == "__main__":
    unittest.main()
