"""Every Grafana panel's query against a real Prometheus (issue 6).

A live pipeline (demo_fleet.DemoFleet: tlsprof-demo's real TLS, the agent
daemon, the collector with --host-labels) is scraped by Debian's Prometheus
under the job names the rules and dashboards assume (`tlsprof-collector`,
`tlsprof-agent`), with dashboards/prometheus/tlsprof-rules.yml loaded.

- Every panel target of every dashboard in dashboards/, with the template
  variables substituted as Grafana would (multi-value "All" = `.*`, the job
  variables at their defaults, `$__rate_interval` = RATE_INTERVAL), returns
  data: a finite sample in an instant query at now, and a series in a range
  query over the last RATE_INTERVAL. Panels in USAGE_PANELS read only the
  usage telemetry (`run --usage`, issue 4), which this pipeline runs without
  (tlsprof-demo links OpenSSL statically; test_usage_fleet.py checks those
  panels with data against nginx): for them the test asserts NO data, so a
  panel that reads other metrics too cannot hide there.
- Every template variable's label_values() query has values, including the
  defaults the dashboards select, the demo's service and this host.
- The rules loaded and evaluate without error (/api/v1/rules health "ok"),
  recording rules equal their raw expressions (1e-9, relative), and no alert
  fires or is pending on this healthy pipeline.
"""
import math
import os
import socket
import sys
import time
import unittest

from demo_fleet import DemoFleet
from prometheus_harness import Prometheus, _parse_time
from tlsprof_testlib import SRC, Processes

sys.path.insert(0, os.path.join(SRC, "tests", "dashboards"))
import test_dashboard_json as dashboards  # noqa: E402  (helpers shared with the static test)

RULES = os.path.join(SRC, "dashboards", "prometheus", "tlsprof-rules.yml")
RATE_INTERVAL = "15s"
RATE_SECONDS = 15
COLLECTOR_JOB = "tlsprof-collector"
AGENT_JOB = "tlsprof-agent"
# (dashboard file, panel title): panels that read only the usage telemetry
# (tlsprof_handshakes_total, tlsprof_handshake_cpu_seconds_total,
# tlsprof_crypto_operation*, tlsprof_tls_connections,
# tlsprof_tls_resident_memory_bytes, tlsprof_agent_usage_probe_*).
USAGE_PANELS = {
    ("tlsprof-fleet.json", "Handshakes by certificate key type (share of handshakes)"),
    ("tlsprof-fleet.json", "Handshakes by cipher construction (share of handshakes)"),
    ("tlsprof-fleet.json", "CPU per handshake by certificate key type"),
    ("tlsprof-fleet.json", "CPU per handshake: full vs resumed"),
    ("tlsprof-fleet.json", "Handshakes per second: full vs resumed"),
    ("tlsprof-fleet.json", "Handshakes per second by TLS version"),
    ("tlsprof-fleet.json", "Handshakes per second by cipher suite"),
    ("tlsprof-fleet.json", "CPU per handshake (handshake-phase TLS CPU / handshakes)"),
    ("tlsprof-fleet.json", "Sign latency p50 / p99 by algorithm (on-CPU)"),
    ("tlsprof-fleet.json", "Public-key operations per second"),
    ("tlsprof-fleet.json", "Live TLS connections"),
    ("tlsprof-fleet.json", "Memory per TLS connection"),
    ("tlsprof-fleet.json", "Handshakes on a post-quantum hybrid group (share of handshakes)"),
    ("tlsprof-agents.json", "Probe duty cycle"),
    ("tlsprof-agents.json", "Probe CPU vs budget (cores)"),
}
# Recording rules checked against their raw expressions (collector job),
# written in the rules' own shape: a share is 0, not absent, until its
# algorithm's first sample.
RECORDS = {
    "job:tlsprof_tls_share:ratio_rate5m":
        'sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector"}[5m])) / '
        'sum(rate(tlsprof_busy_cpu_seconds_total{job="tlsprof-collector"}[5m]))',
    "job:tlsprof_signature_rsa_share:ratio_rate5m":
        '(sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="signature",algorithm="RSA"}[5m]))'
        ' or 0 * sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="signature"}[5m]))) / '
        'sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="signature"}[5m]))',
    "job:tlsprof_cipher_cbc_share:ratio_rate5m":
        '(sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="cipher",algorithm=~".*CBC.*"}[5m]))'
        ' or 0 * sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="cipher"}[5m]))) / '
        'sum(rate(tlsprof_cpu_seconds_total{job="tlsprof-collector",bucket="cipher"}[5m]))',
}
DATA_TIMEOUT = 60  # seconds for every panel to have data once Prometheus scrapes


def finite(result):
    """Finite sample values of an instant query's vector (or scalar)."""
    if result and not isinstance(result[0], dict):
        values = [result[1]]
    else:
        values = [s["value"][1] for s in result]
    return [float(v) for v in values if math.isfinite(float(v))]


class DashboardsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One pipeline for the three tests (each reads it, none changes it).
        if os.geteuid() != 0:
            raise AssertionError("integration tests need root (CAP_BPF, CAP_PERFMON): run ctest -L integration as root")
        cls.t0 = time.monotonic()
        cls.procs = Processes()
        cls.addClassCleanup(cls.procs.close)
        cls.fleet = DemoFleet(cls.procs).start()
        cls.prom = Prometheus(cls.procs, jobs={COLLECTOR_JOB: [cls.fleet.collector_http],
                                               AGENT_JOB: [cls.fleet.agent_http]},
                              rule_files=[RULES]).start()
        cls.prom.wait_targets_up()
        cls.targets_up = time.time()
        cls.fleet.wait_reports(2)

    def panel_queries(self):
        """[(dashboard, panel title, refId, expr)] with the variables substituted."""
        out = []
        for name, d in dashboards.load_dashboards().items():
            values = dashboards.variable_values(d)
            values.update({"__rate_interval": RATE_INTERVAL, "__interval": "5s", "__range": "1m"})
            for panel, target in dashboards.targets(d):
                out.append((name, panel["title"], target["refId"], dashboards.substitute(target["expr"], values)))
        return out

    def test_every_panel_query(self):
        queries = self.panel_queries()
        panels = {(name, title) for name, title, _, _ in queries}
        self.assertFalse(USAGE_PANELS - panels, "USAGE_PANELS names panels that no longer exist")
        # Wait (bounded) until every panel that should have data has it: rate()
        # over RATE_INTERVAL needs a few scrapes of a few windows.
        deadline = time.monotonic() + DATA_TIMEOUT
        while True:
            missing = [(n, t, r) for n, t, r, e in queries
                       if (n, t) not in USAGE_PANELS and not finite(self.prom.query(e))]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(1)
        waited = time.monotonic() - self.t0
        self.assertFalse(missing, f"panels without data after {waited:.0f} s: {missing}")

        now = time.time()
        with_data = without_data = 0
        for name, title, ref, expr in queries:
            with self.subTest(dashboard=name, panel=title, ref=ref, expr=expr):
                instant = self.prom.query(expr, at=now)
                matrix = self.prom.query_range(expr, now - RATE_SECONDS, now, 1)
                if (name, title) in USAGE_PANELS:
                    # This pipeline runs without --usage: a usage panel with data reads something else.
                    self.assertEqual(instant, [], "a USAGE_PANELS panel has data without --usage")
                    self.assertEqual(matrix, [], "a USAGE_PANELS panel has data without --usage")
                    without_data += 1
                else:
                    self.assertTrue(finite(instant), f"no finite sample at now: {instant[:3]}")
                    self.assertTrue(any(s["values"] for s in matrix), "no series over the last interval")
                    with_data += 1
        print(f"\n{len(panels)} panels, {len(queries)} targets: {with_data} with data, {without_data} "
              f"of usage panels (no data without --usage, as expected); data after {waited:.1f} s")

    def test_template_variables(self):
        hostname = socket.gethostname()
        expect = {"job": COLLECTOR_JOB, "agent_job": AGENT_JOB, "collector_job": COLLECTOR_JOB,
                  "service": "tlsprof-demo", "host": hostname, "instance": self.fleet.agent_http}
        deadline = time.monotonic() + DATA_TIMEOUT
        for name, d in dashboards.load_dashboards().items():
            values = dashboards.variable_values(d)
            for var in d["templating"]["list"]:
                if var["type"] != "query":
                    continue
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                selector, label = dashboards.re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query).groups()
                selector = dashboards.substitute(selector, values)
                with self.subTest(dashboard=name, variable=var["name"]):
                    while True:
                        got = self.prom.api(f"/api/v1/label/{label}/values", {"match[]": selector})
                        if expect[var["name"]] in got or time.monotonic() > deadline:
                            break
                        time.sleep(1)
                    self.assertIn(expect[var["name"]], got, f"{query} -> {got}")

    def test_rules_load_and_evaluate(self):
        with open(RULES) as f:
            declared = sum(1 for line in f if line.lstrip().startswith(("- record:", "- alert:")))
        # Wait until every rule was evaluated after both targets had been
        # scraped (before that, TlsprofAgentsAbsent is rightly pending).
        deadline = time.monotonic() + DATA_TIMEOUT
        while True:
            rules = [r for g in self.prom.rule_groups() for r in g["rules"]]
            if (rules and all(_parse_time(r["lastEvaluation"]) > self.targets_up + 1 for r in rules)
                    or time.monotonic() > deadline):
                break
            time.sleep(0.5)
        self.assertEqual(len(rules), declared, "Prometheus did not load every rule of the file")
        bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        self.assertFalse(bad, "rules that do not evaluate")
        firing = [(r["name"], r["state"]) for r in rules if r["type"] == "alerting" and r["state"] != "inactive"]
        self.assertFalse(firing, "alerts on a healthy pipeline")

        # Recorded value at an evaluation timestamp == the raw expression there.
        # A scrape that started just before an evaluation may be appended just
        # after it (Prometheus stamps samples with the scrape's start): allow
        # one of the five timestamps to differ, within 1%.
        for record, raw in RECORDS.items():
            with self.subTest(record=record):
                deadline = time.monotonic() + DATA_TIMEOUT
                while True:
                    samples = self.prom.query(f'{record}{{job="{COLLECTOR_JOB}"}}[30s]')
                    # Before two windows are counted the ratio is 0/0 (NaN): compare the later ones.
                    points = [(t, float(v)) for s in samples for t, v in s["values"]
                              if t < time.time() - 3 and math.isfinite(float(v))]
                    # The demo's rarer algorithms (CBC) reach the collector some
                    # windows after the first: wait for five evaluations that saw them.
                    if (len(points) >= 5 and all(v > 0 for _, v in points[-5:])) or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                self.assertEqual(len(samples), 1, samples)
                self.assertGreaterEqual(len(points), 5, f"{record} has too few finite evaluations: {samples}")
                exact = 0
                for t, recorded in points[-5:]:
                    direct = self.prom.value(raw, at=t)
                    self.assertGreater(recorded, 0, t)
                    self.assertTrue(math.isclose(recorded, direct, rel_tol=1e-2), (t, recorded, direct))
                    exact += math.isclose(recorded, direct, rel_tol=1e-9, abs_tol=1e-12)
                self.assertGreaterEqual(exact, 4, f"{record}: recorded != raw at {5 - exact} of 5 evaluations")
                print(f"\n{record}: {points[-1][1]:.6f}, equal to the raw expression at {exact} of 5 evaluations")


if __name__ == "__main__":
    unittest.main()
