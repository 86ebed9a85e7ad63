"""Three collectors as a tier: failover, return, and exact sums
through remote write.

Three tlsprof-collector processes (mTLS, each its own --state-dir) remote-write
to one real VictoriaMetrics and one real Prometheus receiver
(--web.enable-remote-write-receiver). The load: tlsprof-loadgen's 50 agents
(paced, 1 s windows) and one real agent daemon profiling the ground-truth TLS
workload (--pid), each given all three collectors. Each agent places itself by
rendezvous hashing of its identity; the test computes the real agent's choice
with its own implementation of the hash, and kill -9s that collector mid-run.
The agent fails over (tlsprof_agent_collector_failovers_total), the collector
restarts from its state dir, and the agent returns to it.

Afterwards VictoriaMetrics' sums by bucket and by bucket and algorithm equal
exactly (1e-9 relative: float sums) what the loadgen got counted plus what the
real agent sealed: nothing lost, nothing counted by two collectors. PromQL's TLS
share is the same on both engines. The real agent's part is its own /metrics
once the workload has exited (its windows add nothing more), cross-checked
against its `sealed batch` log lines.
"""
import json
import os
import signal
import socket
import subprocess
import time
import unittest

from prometheus_harness import Prometheus, VictoriaMetrics, metric_sum, prom_query, scrape, series
from test_fleet import PERIOD_S, FleetCase, sealed_batches
from test_two_collectors import COLLECTOR, LOADGEN, RELAY, _wait_port, close
from tlsprof_testlib import AGENT, BIN, SRC, Processes, free_port, require_root

AGENT_IDENTITY = "agent-1"
FLEET = {"seed": 21, "agents": 50, "series": 30, "prefix": "fo-"}
WINDOWS = 18  # per loadgen agent, one a second
WORKLOAD_SECONDS = 14
FREQUENCY = 99

M64 = (1 << 64) - 1


def rendezvous_score(key, target):
    """common/placement/rendezvous.h, written again: FNV-1a 64 of key NUL
    target, then SplitMix64's finalizer."""
    h = 0xcbf29ce484222325
    for byte in key.encode() + b"\0" + target.encode():
        h = ((h ^ byte) * 0x100000001b3) & M64
    h ^= h >> 30
    h = (h * 0xbf58476d1ce4e5b9) & M64
    h ^= h >> 27
    h = (h * 0x94d049bb133111eb) & M64
    return h ^ (h >> 31)


def rendezvous_order(key, targets):
    return sorted(targets, key=lambda t: (-rendezvous_score(key, t), targets.index(t)))


class TierCollector:
    """A collector whose ports and state dir survive a restart."""

    def __init__(self, procs, name, pki, write_urls):
        self.procs, self.name = procs, name
        self.grpc_port, self.metrics_port = free_port(), free_port()
        self.argv = [COLLECTOR, "--listen", f"127.0.0.1:{self.grpc_port}", "--metrics-listen",
                     f"127.0.0.1:{self.metrics_port}", "--state-dir", procs.path(f"{name}-state"),
                     "--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/collector.crt", "--tls-key",
                     f"{pki}/collector.key", "--relay-identity", RELAY, "--remote-write-interval", "1",
                     "--remote-write-label", f"collector={name}"]
        for url in write_urls:
            self.argv += ["--remote-write", url]
        self.start()

    def start(self):
        self.proc = self.procs.start(self.argv, port=self.metrics_port, timeout=30, http_path="/metrics")
        _wait_port(self.proc, self.procs, self.grpc_port)

    @property
    def address(self):  # the name in the collector's certificate
        return f"localhost:{self.grpc_port}"

    @property
    def metrics(self):
        return f"127.0.0.1:{self.metrics_port}"


class FailoverTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        for path in (AGENT, COLLECTOR, LOADGEN):
            self.assertTrue(os.access(path, os.X_OK), f"{path} is not built")
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    wait_for = FleetCase.wait_for

    def agent_metric(self, name):
        return metric_sum(scrape(self.agent_metrics), name)

    def test_failover_kill_9_and_return_count_each_window_once(self):
        pki = self.procs.path("pki")
        # The real agent reports this machine's hostname: its certificate names it (docs/fleet.md, "Identity").
        subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki, RELAY,
                        f"{AGENT_IDENTITY}={socket.gethostname()}"], check=True,
                       capture_output=True)
        vm = VictoriaMetrics(self.procs)
        prom = Prometheus(self.procs, [], extra_args=["--web.enable-remote-write-receiver"]).start()
        urls = [vm.write_url, f"{prom.url}/api/v1/write"]
        collectors = [TierCollector(self.procs, f"c{i}", pki, urls) for i in range(3)]
        addresses = [c.address for c in collectors]
        first = {c.address: c for c in collectors}[rendezvous_order(AGENT_IDENTITY, addresses)[0]]

        workload = self.procs.start([os.path.join(BIN, "tlsprof-groundtruth-shared"), "--duration",
                                     str(WORKLOAD_SECONDS), "--output", self.procs.path("truth.json"),
                                     "--ready-file", self.procs.path("truth.ready")],
                                    ready_file=self.procs.path("truth.ready"))
        self.agent_metrics = f"127.0.0.1:{free_port()}"
        agent_argv = [AGENT, "--log-level", "info", "run", "--pid", str(workload.pid), "--interval", "1",
                      "--frequency", str(FREQUENCY), "--metrics-listen", self.agent_metrics, "--state-dir",
                      self.procs.path("agent-state"), "--tls-ca", f"{pki}/ca.crt", "--tls-cert",
                      f"{pki}/{AGENT_IDENTITY}.crt", "--tls-key", f"{pki}/{AGENT_IDENTITY}.key"]
        for a in addresses:
            agent_argv += ["--collector", a]
        agent = self.procs.start(agent_argv, port=int(self.agent_metrics.rsplit(":", 1)[1]),
                                 http_path="/metrics")
        loadgen_argv = [LOADGEN, "--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/{RELAY}.crt", "--tls-key",
                        f"{pki}/{RELAY}.key", "--agents", str(FLEET["agents"]), "--series", str(FLEET["series"]),
                        "--seed", str(FLEET["seed"]), "--hostname-prefix", FLEET["prefix"], "--interval", "1",
                        "--frequency", str(FREQUENCY), "--total-windows", str(WINDOWS), "--paced",
                        "--connections", "2", "--retries", "60", "--timeout-ms", "3000", "--breakdown", "--json"]
        for a in addresses:
            loadgen_argv += ["--collector", a]
        loadgen = subprocess.Popen(loadgen_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: loadgen.poll() is None and loadgen.kill())

        # The agent ships to its first choice; then that collector dies.
        self.wait_for("the agent's first batches at its own collector",
                      lambda: metric_sum(scrape(first.metrics), "tlsprof_collector_reports_total",
                                         result="accepted") > FLEET["agents"])
        self.wait_for("2 batches accepted from the agent",
                      lambda: metric_sum(scrape(self.agent_metrics), "tlsprof_agent_batches_total",
                                         result="accepted") >= 2)
        self.assertEqual(self.agent_metric("tlsprof_agent_collector_failovers_total"), 0)
        # It hangs first (SIGSTOP: calls to it stay in flight, their outcome
        # unknown), then dies: those reports may only be retried there.
        first.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        self.procs.stop(first.proc, signal.SIGKILL)
        self.wait_for("the agent's batch in flight to stay pinned to its dead collector",
                      lambda: self.agent_metric("tlsprof_agent_spool_pinned_batches") >= 1, timeout=20)
        self.wait_for("the agent to fail over", lambda: self.agent_metric("tlsprof_agent_collector_failovers_total") >= 1,
                      timeout=20)
        time.sleep(2)
        self.assertGreaterEqual(self.agent_metric("tlsprof_agent_spool_pinned_batches"), 1,
                                "the pinned batch went elsewhere while its collector was down")
        first.start()
        self.wait_for("the agent to return to its own collector",
                      lambda: self.agent_metric("tlsprof_agent_collector_failovers_total") >= 2, timeout=45)

        out, err = loadgen.communicate(timeout=120)
        self.assertEqual(loadgen.returncode, 0, f"{' '.join(loadgen_argv)}\n{out}\n{err}")
        run = json.loads(out)
        self.assertEqual(run["failed"], 0, run)
        self.assertEqual(run["accepted"] + run["duplicate_after_retry"], FLEET["agents"] * WINDOWS, run)
        self.assertTrue(all(n > 0 for n in run["accepted_by_collector"]), run["accepted_by_collector"])
        self.assertGreater(run["retried"], 0, "no loadgen report was in flight at the kill: the test proves less")

        # The workload exits: the agent's windows add nothing more; its spool drains.
        self.wait_for("the workload to exit", lambda: workload.poll() is not None, timeout=60)
        windows = self.agent_metric("tlsprof_agent_windows_total")
        self.wait_for("two more agent windows", lambda: self.agent_metric("tlsprof_agent_windows_total") >= windows + 2)
        self.wait_for("the agent's spool to drain", lambda: self.agent_metric("tlsprof_agent_spool_batches") == 0)
        agent_text = scrape(self.agent_metrics)
        self.assertEqual(metric_sum(agent_text, "tlsprof_agent_spool_pinned_batches"), 0)
        agent_sums = {}
        for labels, value in series(agent_text, "tlsprof_cpu_seconds_total"):
            for key in (labels["bucket"], f'{labels["bucket"]}/{labels["algorithm"]}'):
                agent_sums[key] = agent_sums.get(key, 0.0) + value
        agent_busy = metric_sum(agent_text, "tlsprof_busy_cpu_seconds_total")
        sealed = sealed_batches([agent.log_path])
        self.assertTrue(close(sum(b["tls"] for b in sealed) * PERIOD_S, sum(v for k, v in agent_sums.items()
                                                                          if "/" not in k)),
                        "the agent's /metrics differ from the windows it sealed")
        self.assertGreater(sum(b["tls"] for b in sealed), 0, "the agent saw no TLS CPU")

        want = {}
        for key, samples in list(run["accepted_tls_samples_by_bucket"].items()) + list(
                run["accepted_tls_samples_by_algorithm"].items()):
            want[key] = samples * PERIOD_S
        for key, value in agent_sums.items():
            want[key] = want.get(key, 0.0) + value
        want_tls = sum(v for k, v in want.items() if "/" not in k)
        want_busy = run["accepted_busy_samples"] * PERIOD_S + agent_busy

        def vm_sums():
            got = {}
            for labels, value in vm.query("sum by (bucket) (tlsprof_cpu_seconds_total)").items():
                got[json.loads(labels)["bucket"]] = value
            for labels, value in vm.query("sum by (bucket, algorithm) (tlsprof_cpu_seconds_total)").items():
                ls = json.loads(labels)
                got[f'{ls["bucket"]}/{ls["algorithm"]}'] = value
            return got

        def matches():
            got = vm_sums()
            return set(got) == set(want) and all(close(got[k], want[k]) for k in want)

        deadline = time.monotonic() + 60
        while not matches():
            if time.monotonic() > deadline:
                got = vm_sums()
                diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want)
                        if got.get(k) is None or want.get(k) is None or not close(got[k], want[k])}
                self.fail(f"VictoriaMetrics' sums never reached loadgen + agent; differing (got, want): {diff}")
            time.sleep(0.5)

        print(f"\nfailover: killed {first.name}; loadgen counted {run['accepted']} + {run['duplicate_after_retry']} "
              f"(DUPLICATE after a lost answer) reports, per collector {run['accepted_by_collector']}, "
              f"{run['retried']} retries; agent sealed {len(sealed)} windows, "
              f"{self.agent_metric('tlsprof_agent_collector_failovers_total'):.0f} collector changes, "
              f"{self.agent_metric('tlsprof_agent_send_errors_total'):.0f} failed attempts", flush=True)
        share = want_tls / want_busy
        query = "sum(tlsprof_cpu_seconds_total) / sum(tlsprof_busy_cpu_seconds_total)"
        self.wait_for("Prometheus' receiver to hold the same TLS share",
                      lambda: close(next(iter(prom_query(prom, query).values()), 0), share), timeout=30)
        vm_share = next(iter(vm.query(query).values()))
        prom_share = next(iter(prom_query(prom, query).values()))
        self.assertTrue(close(vm_share, share), f"VictoriaMetrics' TLS share {vm_share} != {share}")
        self.assertTrue(close(prom_share, vm_share), f"Prometheus {prom_share} != VictoriaMetrics {vm_share}")
        # Every collector pushed to both receivers, and none was rejected.
        for c in collectors:
            text = scrape(c.metrics)
            for url in urls:
                self.assertGreater(metric_sum(text, "tlsprof_collector_remote_write_requests_total", receiver=url,
                                              result="sent"), 0, f"{c.name} → {url}")
                self.assertEqual(metric_sum(text, "tlsprof_collector_remote_write_requests_total", receiver=url,
                                            result="rejected"), 0, f"{c.name} → {url}")


if __name__ == "__main__":
    unittest.main()
