"""Collectors add up: what two collectors count of two fleets equals what one
collector counts of both, as Prometheus sees it.

Three real tlsprof-collector processes (mTLS, the loadgen a relay identity,
certificates from scripts/make-test-pki.sh), tlsprof-loadgen with --total-windows
(exact, deterministic totals): set A (seed 1) → C1, set B (seed 2) → C2, both
sets → C3. One real Prometheus scrapes all three every second. The test asserts
with PromQL that sum over C1 and C2 of tlsprof_cpu_seconds_total (by bucket,
by bucket and algorithm) and of tlsprof_busy_cpu_seconds_total (by service)
equals C3's to 1e-9 relative, that the totals equal the samples the loadgen's
accepted reports carried, that a replay is all duplicates and changes nothing,
and that `promtool check metrics` accepts each collector's /metrics.

PrometheusHarnessTest checks the harness itself against a fixed exposition.
"""
import http.server
import json
import os
import subprocess
import threading
import time
import unittest

from prometheus_harness import Prometheus, check_metrics, scrape
from tlsprof_testlib import BIN, SRC, Processes, free_port

COLLECTOR = os.path.join(BIN, "tlsprof-collector")
LOADGEN = os.path.join(BIN, "tlsprof-loadgen")
RELAY = "tlsprof-loadgen"  # the loadgen's certificate CN, a relay identity for the collectors

# Set A and set B: different seeds, hosts, sizes and series counts.
SET_A = {"seed": 1, "agents": 30, "series": 40, "prefix": "a-"}
SET_B = {"seed": 2, "agents": 20, "series": 60, "prefix": "b-"}
WINDOWS = 5
FREQUENCY = 99
PERIOD_S = round(1e9 / FREQUENCY) / 1e9
REL = 1e-9


def close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def make_pki(procs):
    d = procs.path("pki")
    proc = subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), d, RELAY], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise AssertionError(f"make-test-pki.sh failed: {proc.stderr}")
    return d


class Collector:
    """A tlsprof-collector with mTLS that takes tlsprof-loadgen as a relay
    identity (its reports are keyed by (identity, hostname))."""

    def __init__(self, procs, name, pki, extra=()):
        self.name = name
        for attempt in range(3):
            self.grpc_port, self.metrics_port = free_port(), free_port()
            if self.grpc_port == self.metrics_port:
                continue
            argv = [COLLECTOR, "--listen", f"127.0.0.1:{self.grpc_port}", "--metrics-listen",
                    f"127.0.0.1:{self.metrics_port}", "--tls-ca", f"{pki}/ca.crt", "--tls-cert",
                    f"{pki}/collector.crt", "--tls-key", f"{pki}/collector.key", "--relay-identity", RELAY, *extra]
            try:
                self.proc = procs.start(argv, port=self.metrics_port, timeout=30, http_path="/metrics")
                _wait_port(self.proc, procs, self.grpc_port)
                return
            except AssertionError as e:
                if attempt == 2 or "in use" not in str(e):
                    raise

    @property
    def address(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics(self):
        return f"127.0.0.1:{self.metrics_port}"


def _wait_port(proc, procs, port, timeout=30):
    import socket
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"collector exited with {proc.returncode}:\n{procs.log(proc)}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"collector's gRPC port {port} not open after {timeout} s:\n{procs.log(proc)}")
        time.sleep(0.05)


def run_loadgen(test, collector, fleet, pki, extra=()):
    argv = [LOADGEN, "--collector", collector.address, "--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/{RELAY}.crt",
            "--tls-key", f"{pki}/{RELAY}.key", "--agents", str(fleet["agents"]),
            "--series", str(fleet["series"]), "--seed", str(fleet["seed"]), "--hostname-prefix", fleet["prefix"],
            "--interval", "10", "--frequency", str(FREQUENCY), "--total-windows", str(WINDOWS),
            "--connections", "4", "--json", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    test.assertEqual(proc.returncode, 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout)


class TwoCollectorsTest(unittest.TestCase):
    def setUp(self):
        for path in (COLLECTOR, LOADGEN):
            if not os.access(path, os.X_OK):
                self.fail(f"{path} is missing: build it (./scripts/build.sh)")
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_sum_of_two_collectors_equals_one_of_both(self):
        pki = make_pki(self.procs)
        c1, c2, c3 = (Collector(self.procs, n, pki) for n in ("c1", "c2", "c3"))
        prom = Prometheus(self.procs, [c.metrics for c in (c1, c2, c3)]).start()
        prom.wait_targets_up()

        a1 = run_loadgen(self, c1, SET_A, pki)
        b2 = run_loadgen(self, c2, SET_B, pki)
        a3 = run_loadgen(self, c3, SET_A, pki)
        b3 = run_loadgen(self, c3, SET_B, pki)
        for run, fleet in ((a1, SET_A), (b2, SET_B), (a3, SET_A), (b3, SET_B)):
            self.assertEqual(run["accepted"], fleet["agents"] * WINDOWS, run)
            self.assertEqual(run["failed"], 0, run)
            self.assertEqual(run["dropped_series"], 0, run)
        # The same seed carries the same samples, whichever collector took them.
        self.assertEqual(a1["accepted_tls_samples"], a3["accepted_tls_samples"])
        self.assertEqual(b2["accepted_busy_samples"], b3["accepted_busy_samples"])

        done = time.time()
        prom.wait_scraped_after(done)
        sel12 = f'instance=~"{c1.metrics}|{c2.metrics}"'
        sel3 = f'instance="{c3.metrics}"'

        def compare(metric, by):
            group = ", ".join(by)
            key = by[0] if len(by) == 1 else by
            left = prom.vector(f"sum by ({group}) ({metric}{{{sel12}}})", key)
            right = prom.vector(f"sum by ({group}) ({metric}{{{sel3}}})", key)
            self.assertTrue(left, f"no {metric} in Prometheus")
            self.assertEqual(set(left), set(right), f"{metric} by {group}: label sets differ")
            for key in left:
                self.assertTrue(close(left[key], right[key]),
                                f"{metric} by {group} {key}: C1+C2 {left[key]!r} != C3 {right[key]!r}")
            return left

        by_bucket = compare("tlsprof_cpu_seconds_total", ["bucket"])
        self.assertEqual(set(by_bucket), {"cipher", "signature", "key_exchange", "hash", "other"})
        by_algorithm = compare("tlsprof_cpu_seconds_total", ["bucket", "algorithm"])
        self.assertGreaterEqual(len(by_algorithm), 15)
        compare("tlsprof_cpu_seconds_total", ["bucket", "algorithm", "phase", "library", "service"])
        busy = compare("tlsprof_busy_cpu_seconds_total", ["service"])
        self.assertIn("(non-tls)", busy)

        # The totals are what the accepted reports carried.
        tls_c3 = prom.value(f"sum(tlsprof_cpu_seconds_total{{{sel3}}})")
        busy_c3 = prom.value(f"sum(tlsprof_busy_cpu_seconds_total{{{sel3}}})")
        sent_tls = (a3["accepted_tls_samples"] + b3["accepted_tls_samples"]) * PERIOD_S
        sent_busy = (a3["accepted_busy_samples"] + b3["accepted_busy_samples"]) * PERIOD_S
        self.assertTrue(close(tls_c3, sent_tls), f"C3 TLS {tls_c3} != loadgen's {sent_tls}")
        self.assertTrue(close(busy_c3, sent_busy), f"C3 busy {busy_c3} != loadgen's {sent_busy}")
        # Each collector alone: C1 holds exactly set A.
        tls_c1 = prom.value(f'sum(tlsprof_cpu_seconds_total{{instance="{c1.metrics}"}})')
        self.assertTrue(close(tls_c1, a1["accepted_tls_samples"] * PERIOD_S))
        reports = prom.vector("sum by (instance) (tlsprof_reports_total)", "instance")
        total = (SET_A["agents"] + SET_B["agents"]) * WINDOWS
        self.assertEqual(reports[c1.metrics], SET_A["agents"] * WINDOWS)
        self.assertEqual(reports[c2.metrics], SET_B["agents"] * WINDOWS)
        self.assertEqual(reports[c3.metrics], total)
        accepted = prom.vector('sum by (instance) (tlsprof_collector_reports_total{result="accepted"})', "instance")
        self.assertEqual(accepted[c3.metrics], total)
        # The relay's reports are keyed by hostname: one agent per simulated host.
        agents = prom.vector("tlsprof_collector_agents", "instance")
        self.assertEqual(agents, {c1.metrics: SET_A["agents"], c2.metrics: SET_B["agents"],
                                  c3.metrics: SET_A["agents"] + SET_B["agents"]})

        # A replay of set A to C1 is all duplicates and changes no counter.
        again = run_loadgen(self, c1, SET_A, pki)
        self.assertEqual(again["duplicate"], SET_A["agents"] * WINDOWS, again)
        self.assertEqual(again["accepted"], 0, again)
        prom.wait_scraped_after(time.time())
        self.assertEqual(prom.value(f'sum(tlsprof_cpu_seconds_total{{instance="{c1.metrics}"}})'), tls_c1)
        dup = prom.value(f'sum(tlsprof_collector_reports_total{{instance="{c1.metrics}",result="duplicate"}})')
        self.assertEqual(dup, SET_A["agents"] * WINDOWS)

        # Each collector's exposition passes promtool's lint.
        for c in (c1, c2, c3):
            ok, out = check_metrics(scrape(c.metrics))
            self.assertTrue(ok, f"promtool check metrics on {c.name} ({c.metrics}):\n{out}")


class _Exposition(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body if self.path == "/metrics" else b"")

    def log_message(self, *args):
        pass


class PrometheusHarnessTest(unittest.TestCase):
    """The harness against a fixed exposition: what Prometheus answers is what
    the target served."""

    def setUp(self):
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def serve(self, text):
        handler = type("Handler", (_Exposition,), {"body": text.encode()})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return f"127.0.0.1:{server.server_address[1]}"

    def test_queries_see_the_targets_values(self):
        text = ("# HELP demo_seconds_total Demo.\n# TYPE demo_seconds_total counter\n"
                'demo_seconds_total{bucket="cipher"} 1.25\ndemo_seconds_total{bucket="hash"} 0.5\n')
        one, two = self.serve(text), self.serve(text.replace("1.25", "2.5"))
        prom = Prometheus(self.procs, [one, two]).start()
        state = prom.wait_targets_up()
        self.assertEqual(sorted(t["scrapeUrl"] for t in state), sorted(f"http://{t}/metrics" for t in (one, two)))
        t = time.time()
        prom.wait_scraped_after(t)
        self.assertEqual(prom.vector("sum by (bucket) (demo_seconds_total)", "bucket"), {"cipher": 3.75, "hash": 1.0})
        self.assertEqual(prom.value(f'demo_seconds_total{{bucket="cipher",instance="{two}"}}'), 2.5)
        self.assertEqual(prom.value("scalar(sum(demo_seconds_total))"), 4.75)
        # At a time before the first scrape there is nothing.
        self.assertEqual(prom.query("demo_seconds_total", at=t - 3600), [])
        ok, out = check_metrics(text)
        self.assertTrue(ok, out)
        ok, out = check_metrics("demo_bad 1\n# TYPE demo_bad counter\n")
        self.assertFalse(ok)
        with self.assertRaises(AssertionError):
            prom.query("sum(")  # Prometheus's parse error surfaces
        prom.stop()
        self.assertIsNotNone(prom.proc.poll())


if __name__ == "__main__":
    unittest.main()
