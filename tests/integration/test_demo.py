"""The README's main command: the demo workload profiled by the agent."""
import json
import unittest

from tlsprof_testlib import require_root, run_agent, by_name


class DemoTest(unittest.TestCase):
    def setUp(self):
        require_root(self)

    def test_demo_report_shows_every_bucket(self):
        code, out, err = run_agent(["demo", "--duration", "6", "--format", "json"], timeout=120)
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        demo = [p for p in report["processes"] if p["comm"].startswith("tlsprof-demo")]
        self.assertEqual(len(demo), 1, [p["comm"] for p in report["processes"]])
        demo = demo[0]
        kinds = {(lib["kind"], lib["linkage"]) for lib in demo["libraries"]}
        self.assertIn(("openssl-3", "static"), kinds)
        self.assertGreater(demo["tls_cpu_seconds"], 0.2)
        buckets = by_name(demo["buckets"], "bucket")
        for bucket in ("cipher", "signature", "key_exchange", "hash"):
            self.assertGreater(buckets[bucket]["cpu_seconds"], 0, bucket)
        algorithms = {r["algorithm"] for r in demo["algorithms"] if r["samples"] > 0}
        for alg in ("AES-GCM", "ChaCha20-Poly1305", "AES-CBC", "RSA", "X25519", "SHA-1"):
            self.assertIn(alg, algorithms)
        self.assertGreater(report["tls_share"], 0)
        # The report names where the time went.
        self.assertTrue(demo["top_symbols"])


if __name__ == "__main__":
    unittest.main()
