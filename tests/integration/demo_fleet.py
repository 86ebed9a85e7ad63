"""A live pipeline fed by the demo workload, for tests that look at what the
fleet exposes (dashboards' panel queries, the collector's status page).

    fleet = DemoFleet(procs).start()   # collector + agent daemon + tlsprof-demo
    fleet.wait_reports(3)              # the collector accepted 3 windows
    fleet.collector_http               # "127.0.0.1:PORT": /metrics, /api/v1/*, the status page
    fleet.agent_http                   # the agent's own /metrics

Everything is real: `tlsprof-demo` does RSA and ECDSA handshakes (full and
resumed) and AES-GCM, ChaCha20-Poly1305 and AES-CBC bulk over loopback;
`tlsprof-agent run` profiles the host and ships plaintext gRPC to
`tlsprof-collector --host-labels`. The processes are owned by `procs`
(tlsprof_testlib.Processes), which stops them.
"""
import os
import re
import time

import prometheus_harness
from tlsprof_testlib import AGENT, BIN, free_port

COLLECTOR = os.path.join(BIN, "tlsprof-collector")
DEMO = os.path.join(BIN, "tlsprof-demo")


class DemoFleet:
    def __init__(self, procs, interval=2, frequency=99, demo_threads=1):
        self.procs = procs
        self.interval = interval
        self.frequency = frequency
        self.demo_threads = demo_threads
        self.grpc_port, self.collector_port, self.agent_port = free_port(), free_port(), free_port()
        self.collector_http = f"127.0.0.1:{self.collector_port}"
        self.agent_http = f"127.0.0.1:{self.agent_port}"

    def start(self):
        for binary in (AGENT, COLLECTOR, DEMO):
            if not os.path.exists(binary):
                raise AssertionError(f"{binary} is not built")
        self.collector = self.procs.start(
            [COLLECTOR, "--insecure", "--host-labels", "--listen", f"127.0.0.1:{self.grpc_port}", "--metrics-listen",
             self.collector_http, "--state-dir", self.procs.path("collector-state")], port=self.collector_port)
        ready = self.procs.path("demo.ready")
        self.demo = self.procs.start([DEMO, "--duration", "0", "--threads", str(self.demo_threads), "--ready-file",
                                      ready], ready_file=ready)
        self.agent = self.procs.start(
            [AGENT, "--log-level", "info", "run", "--insecure", "--collector", f"127.0.0.1:{self.grpc_port}",
             "--interval", str(self.interval), "--frequency", str(self.frequency), "--metrics-listen",
             self.agent_http, "--state-dir", self.procs.path("agent-state")], port=self.agent_port)
        return self

    def accepted_reports(self):
        """Reports the collector accepted so far (0 while /metrics is not up)."""
        try:
            text = prometheus_harness.scrape(self.collector_http)
        except Exception:  # noqa: BLE001 - not serving yet
            return 0
        m = re.search(r'^tlsprof_collector_reports_total\{result="accepted"\} (\S+)$', text, re.M)
        return int(float(m.group(1))) if m else 0

    def wait_reports(self, n, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in (self.collector, self.agent, self.demo):
                if proc.poll() is not None:
                    raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{self.procs.log(proc)}")
            if self.accepted_reports() >= n:
                return
            time.sleep(0.5)
        raise AssertionError(f"the collector accepted fewer than {n} reports in {timeout} s; agent log:\n"
                             f"{self.procs.log(self.agent)}")
