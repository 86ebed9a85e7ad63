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
        self.assertIn(("openssl-3", "shared"), kinds)
        self.assertGreater(demo["tls_cpu_seconds"], 0.2)
        buckets = by_name(demo["buckets"], "bucket")
        # Debian's libcrypto is stripped: leaf attribution names only exported
        # functions, so only the buckets are checked for presence here.
        self.assertGreater(buckets["other"]["cpu_seconds"], 0)
        self.assertGreater(report["tls_share"], 0)


if __name__ == "__main__":
    unittest.main()
