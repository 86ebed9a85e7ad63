"""Remote write: a collector pushes its series to a real VictoriaMetrics and a
real Prometheus (--web.enable-remote-write-receiver) at once.

tlsprof-loadgen sends 50 agents' windows (--total-windows: exact totals) to a
tlsprof-collector run with two --remote-write URLs. Once the pushes caught up,
each receiver's sums by bucket and by algorithm of tlsprof_cpu_seconds_total,
and its TLS share of busy CPU in PromQL, equal the collector's own /metrics
to 1e-9 relative: nothing lost, nothing doubled, the same answer from either
engine. Every series carries the collector's external label.
"""
import json
import os
import re
import time
import unittest
import urllib.parse
import urllib.request

from prometheus_harness import Prometheus, scrape
from test_two_collectors import Collector, _wait_port, close, make_pki, run_loadgen
from tlsprof_testlib import Processes, free_port

VICTORIA = os.environ.get("TLSPROF_VICTORIA_METRICS", "/usr/bin/victoria-metrics")
FLEET = {"seed": 7, "agents": 50, "series": 40, "prefix": "rw-"}
LABEL = "collector=rw-1"


class VictoriaMetrics:
    """Debian's victoria-metrics on a free port, its data in the test's dir;
    queries see samples at once (-search.latencyOffset=0s)."""

    def __init__(self, procs):
        if not os.access(VICTORIA, os.X_OK):
            raise AssertionError(f"{VICTORIA} not found: install Debian's victoria-metrics (scripts/install-deps.sh)")
        self.port = free_port()
        argv = [VICTORIA, f"-storageDataPath={procs.path('victoria-data')}",
                f"-httpListenAddr=127.0.0.1:{self.port}", "-search.latencyOffset=0s",
                "-search.disableCache", "-loggerLevel=WARN"]
        self.proc = procs.start(argv, port=self.port, timeout=60)
        _wait_port(self.proc, procs, self.port)

    @property
    def write_url(self):
        return f"http://127.0.0.1:{self.port}/api/v1/write"

    def query(self, promql):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError(f"VictoriaMetrics: {body}")
        return {json.dumps(x["metric"], sort_keys=True): float(x["value"][1]) for x in body["data"]["result"]}


def prom_query(prom, promql):
    data = prom.api("/api/v1/query", {"query": promql})
    return {json.dumps(x["metric"], sort_keys=True): float(x["value"][1]) for x in data["result"]}


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def series(text, name):
    """(labels, value) of each sample of `name` in an exposition."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            labels = dict(_LABEL.findall(head[len(name):]))
            out.append((labels, float(value)))
    return out


def metric_sum(text, name, **labels):
    return sum(v for ls, v in series(text, name) if all(ls.get(k) == w for k, w in labels.items()))


def collector_sums(text, by):
    """sum by (`by`) of tlsprof_cpu_seconds_total in an exposition."""
    out = {}
    for labels, value in series(text, "tlsprof_cpu_seconds_total"):
        out[labels[by]] = out.get(labels[by], 0.0) + value
    return out


class RemoteWriteTest(unittest.TestCase):
    def setUp(self):
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_victoria_metrics_and_prometheus_receive_exactly_what_the_collector_counts(self):
        pki = make_pki(self.procs)
        vm = VictoriaMetrics(self.procs)
        prom = Prometheus(self.procs, [], extra_args=["--web.enable-remote-write-receiver"]).start()
        collector = Collector(self.procs, "rw", pki, extra=[
            "--remote-write", vm.write_url, "--remote-write", f"{prom.url}/api/v1/write",
            "--remote-write-label", LABEL, "--remote-write-interval", "1"])
        run_loadgen(self, collector, FLEET, pki)
        text = scrape(collector.metrics)
        want_bucket, want_algorithm = collector_sums(text, "bucket"), collector_sums(text, "algorithm")
        busy = metric_sum(text, "tlsprof_busy_cpu_seconds_total")
        self.assertGreater(sum(want_bucket.values()), 0)
        want_share = sum(want_bucket.values()) / busy

        engines = {"victoria-metrics": vm.query, "prometheus": lambda q: prom_query(prom, q)}
        deadline = time.monotonic() + 60
        for name, query in engines.items():
            while True:
                got = {json.loads(k).get("bucket"): v
                       for k, v in query(f'sum by (bucket) (tlsprof_cpu_seconds_total{{{LABEL.split("=")[0]}='
                                         f'"{LABEL.split("=")[1]}"}})').items()}
                if set(got) == set(want_bucket) and all(close(got[b], want_bucket[b]) for b in want_bucket):
                    break
                if time.monotonic() > deadline:
                    self.fail(f"{name}: sum by bucket {got} never reached the collector's {want_bucket}")
                time.sleep(0.5)
            algorithms = {json.loads(k).get("algorithm"): v
                          for k, v in query("sum by (algorithm) (tlsprof_cpu_seconds_total)").items()}
            self.assertEqual(set(algorithms), set(want_algorithm), name)
            for a, v in want_algorithm.items():
                self.assertTrue(close(algorithms[a], v), f"{name}: {a} {algorithms[a]} != {v}")
            share = query("sum(tlsprof_cpu_seconds_total) / sum(tlsprof_busy_cpu_seconds_total)")
            self.assertEqual(len(share), 1, f"{name}: {share}")
            self.assertTrue(close(next(iter(share.values())), want_share), f"{name}: share {share} != {want_share}")

        # The pushes are counted per receiver, and nothing was dropped or rejected.
        text = scrape(collector.metrics)
        for url in (vm.write_url, f"{prom.url}/api/v1/write"):
            self.assertGreater(metric_sum(text, "tlsprof_collector_remote_write_requests_total", receiver=url,
                                          result="sent"), 0)
            for result in ("rejected", "dropped"):
                self.assertEqual(metric_sum(text, "tlsprof_collector_remote_write_requests_total", receiver=url,
                                            result=result), 0)


if __name__ == "__main__":
    unittest.main()
