"""Privacy check (issue 7, item 4; docs/attribution.md, "Privacy").

A TLS workload (privacy_workload.py: Python's ssl on Debian's OpenSSL) sends a
random canary plaintext under a freshly generated canary RSA key while
`tlsprof-agent run` (stacks on, --log-level debug) profiles it and ships to a
real `tlsprof-collector` (--log-level debug) through a TCP relay that records
every byte both ways. Midway the collector is stopped until batches wait in
the agent's spool (copied then, before they are sent), then restarted. A
one-shot `tlsprof-agent profile` with JSON, folded and pprof outputs runs
meanwhile. Then neither canary may appear anywhere the project writes:

  - reports: the one-shot's JSON, folded and pprof files; the collector's
    state directory (journal and snapshot: the raw Submit requests);
  - metrics: /metrics of the agent and the collector, /api/v1/{summary,trend,
    agents}, the status page;
  - logs: both daemons' and the one-shot's stdout/stderr, at debug level;
  - spool files: the agent's --state-dir, before and after sending;
  - gRPC messages: the relay's recording of agent -> collector traffic.

The needles: the canary string; the private key's DER, its PEM body lines,
and the big-endian bytes of its private exponent and primes. A positive
control shows the search finds each needle where it is (the key files, the
client's own log), so the check cannot pass vacuously.
"""
import gzip
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import prometheus_harness
from demo_fleet import COLLECTOR
from tlsprof_testlib import AGENT, Processes, free_port, require_root

HERE = os.path.dirname(os.path.abspath(__file__))


class Relay:
    """A TCP relay listen_port -> target_port that appends every byte, both ways, to `record`."""

    def __init__(self, target_port, record):
        self.target_port = target_port
        self.record = open(record, "ab")
        self.lock = threading.Lock()
        self.bytes = 0
        self.sockets = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
                upstream.settimeout(None)
            except OSError:  # the collector is down: the agent keeps its batches
                client.close()
                continue
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, src, dst):
        try:
            while data := src.recv(65536):
                with self.lock:
                    self.record.write(data)
                    self.record.flush()
                    self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()
        for s in self.sockets:
            s.close()
        self.record.close()


def key_needles(key_pem, tmp):
    """{name: bytes} that only the canary key holds: DER, PEM body lines, d, p, q."""
    der = subprocess.run(["openssl", "pkey", "-in", key_pem, "-outform", "DER"], check=True,
                         capture_output=True).stdout
    text = subprocess.run(["openssl", "pkey", "-in", key_pem, "-text", "-noout"], check=True, capture_output=True,
                          text=True).stdout
    needles = {"key DER": der}
    for field in ("privateExponent", "prime1", "prime2"):
        m = re.search(rf"^{field}:\n((?:\s+[0-9a-f:]+\n)+)", text, re.M)
        value = bytes.fromhex(re.sub(r"[\s:]", "", m.group(1))).lstrip(b"\0")
        needles[f"key {field}"] = value
        # A part of it is a leak too: its first and last 16 bytes on their own.
        needles[f"key {field} head"] = value[:16]
        needles[f"key {field} tail"] = value[-16:]
    with open(key_pem) as f:
        body = [line.strip() for line in f if line.strip() and not line.startswith("-----")]
    for i, line in enumerate(body[:-1]):  # full 64-character lines (the last one may be short and common)
        needles[f"key PEM line {i}"] = line.encode()
    return needles


def find_needles(haystack, needles):
    return [name for name, needle in needles.items() if needle in haystack]


class PrivacyTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def scrape_all(self, collector_http, agent_http):
        out = {}
        for name, url in (("agent /metrics", f"http://{agent_http}/metrics"),
                          ("collector /metrics", f"http://{collector_http}/metrics"),
                          ("collector /api/v1/summary", f"http://{collector_http}/api/v1/summary?minutes=60"),
                          ("collector /api/v1/trend", f"http://{collector_http}/api/v1/trend?minutes=60"),
                          ("collector /api/v1/agents", f"http://{collector_http}/api/v1/agents"),
                          ("collector status page", f"http://{collector_http}/")):
            with urllib.request.urlopen(url, timeout=10) as r:
                out[name] = r.read()
        return out

    def start_collector(self, grpc_port, http, state):
        return self.procs.start([COLLECTOR, "--insecure", "--log-level", "debug", "--listen", f"127.0.0.1:{grpc_port}",
                                 "--metrics-listen", http, "--state-dir", state], port=int(http.split(":")[1]))

    def metric(self, http, name):
        m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", prometheus_harness.scrape(http), re.M)
        return float(m.group(1)) if m else 0.0

    def wait_for(self, what, predicate, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.25)
        self.fail(f"timed out waiting for {what}")

    def test_canaries_never_leave_the_workload(self):
        tmp = self.procs.path("")
        canary = "tlsprof-canary-" + secrets.token_hex(16)
        key, cert = self.procs.path("canary.key"), self.procs.path("canary.crt")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=canary"], check=True, capture_output=True)
        needles = {"canary plaintext": canary.encode(), **key_needles(key, tmp)}

        # Positive controls: the search finds each needle where it is.
        with open(key, "rb") as f:
            pem = f.read()
        der = subprocess.run(["openssl", "pkey", "-in", key, "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.assertEqual(sorted(find_needles(pem, needles)),
                         sorted(n for n in needles if n.startswith("key PEM")))
        self.assertEqual(sorted(find_needles(der, needles)), sorted(n for n in needles if n.startswith("key ")
                                                                     and "PEM" not in n))

        # The pipeline: collector <- relay <- agent (debug logs, stacks on), and the workload.
        grpc_port, collector_http, agent_http = free_port(), f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        collector_state, agent_state = self.procs.path("collector-state"), self.procs.path("agent-state")
        collector = self.start_collector(grpc_port, collector_http, collector_state)
        relay = Relay(grpc_port, self.procs.path("grpc-capture.bin"))
        self.addCleanup(relay.close)
        ready = self.procs.path("server.ready")
        server = self.procs.start([sys.executable, os.path.join(HERE, "privacy_workload.py"), "server", key, cert,
                                   ready], ready_file=ready)
        with open(ready) as f:
            port = f.read().strip()
        client_log = self.procs.path("client.log")
        self.procs.start([sys.executable, os.path.join(HERE, "privacy_workload.py"), "client", port, canary,
                          client_log])
        agent = self.procs.start([AGENT, "--log-level", "debug", "run", "--insecure", "--collector",
                                  f"127.0.0.1:{relay.port}", "--interval", "1", "--frequency", "499",
                                  "--metrics-listen", agent_http, "--state-dir", agent_state],
                                 port=int(agent_http.split(":")[1]))
        self.wait_for("2 accepted reports", lambda: self.metric(
            collector_http, r'tlsprof_collector_reports_total\{result="accepted"\}') >= 2)
        self.wait_for("TLS CPU of the canary workload", lambda: re.search(
            r'^tlsprof_cpu_seconds_total\{[^}]*service="python3"[^}]*\} [1-9e.]',
            prometheus_harness.scrape(collector_http), re.M) is not None)

        # The collector goes away: batches stay in the spool; copy them before they are sent.
        self.procs.stop(collector)
        first_collector = collector
        self.wait_for("batches in the spool", lambda: self.metric(agent_http, "tlsprof_agent_spool_batches") >= 2)
        spool_copy = self.procs.path("spool-copy")
        shutil.copytree(agent_state, spool_copy)
        collector = self.start_collector(grpc_port, collector_http, collector_state)
        self.wait_for("the spool to empty", lambda: self.metric(agent_http, "tlsprof_agent_spool_batches") == 0)

        # A one-shot report with every output, meanwhile.
        outs = {f: self.procs.path(f"oneshot.{f}") for f in ("json", "folded", "pprof")}
        oneshot = subprocess.run([AGENT, "--log-level", "debug", "profile", "--duration", "3", "--format", "json",
                                  "-o", outs["json"], "--folded", outs["folded"], "--pprof", outs["pprof"]],
                                 capture_output=True, timeout=120)
        self.assertEqual(oneshot.returncode, 0, oneshot.stderr.decode(errors="replace"))
        with open(outs["folded"]) as f:
            self.assertIn("python3", f.read(), "the one-shot saw the workload's TLS stacks")

        scraped = self.scrape_all(collector_http, agent_http)
        self.procs.stop(agent)
        self.procs.stop(collector)
        self.procs.stop(server)

        haystacks = {}
        for f, p in outs.items():
            with open(p, "rb") as fh:
                haystacks[f"one-shot {f}"] = fh.read()
        haystacks["one-shot stdout+stderr"] = oneshot.stdout + oneshot.stderr
        haystacks.update(scraped)
        for proc in (agent, first_collector, collector):
            with open(proc.log_path, "rb") as f:
                haystacks[f"log {os.path.basename(proc.log_path)}"] = f.read()
        for label, root in (("collector state", collector_state), ("agent state", agent_state),
                            ("agent spool before sending", spool_copy)):
            files = 0
            for dirpath, _, names in os.walk(root):
                for name in names:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        data = f.read()
                    if data[:2] == b"\x1f\x8b":
                        data += gzip.decompress(data)
                    haystacks[f"{label}: {os.path.relpath(os.path.join(dirpath, name), root)}"] = data
                    files += 1
            self.assertGreater(files, 0, f"{label} is empty: nothing to check")
        with open(relay.record.name, "rb") as f:
            haystacks["gRPC capture"] = f.read()

        # The haystacks are real: the capture holds Submit calls, the spool copy batches, the reports TLS rows.
        self.assertIn(b"PRI * HTTP/2.0", haystacks["gRPC capture"])
        self.assertIn(b"python3", haystacks["gRPC capture"])
        self.assertIn(socket.gethostname().encode(), haystacks["gRPC capture"])
        # Every report the collector accepted crossed the relay: each Submit carries the agent's instance id
        # (agent/ship/spool.cc), so the capture holds it at least once per accepted report.
        with open(os.path.join(agent_state, "instance")) as f:
            instance = bytes.fromhex(f.read().strip())
        accepted = re.search(rb'^tlsprof_collector_reports_total\{result="accepted"\} (\S+)$',
                             haystacks["collector /metrics"], re.M)
        self.assertIsNotNone(accepted, "the collector's /metrics has no accepted reports")
        self.assertGreaterEqual(float(accepted.group(1)), 2)
        self.assertGreaterEqual(haystacks["gRPC capture"].count(instance), float(accepted.group(1)))
        self.assertIn(b"python3", haystacks["agent /metrics"])
        # And the client's own log (the positive control) has the canary, where the search finds it.
        with open(client_log, "rb") as f:
            self.assertEqual(find_needles(f.read(), needles), ["canary plaintext"])

        leaks = {name: found for name, data in haystacks.items() if (found := find_needles(data, needles))}
        self.assertEqual(leaks, {})
        total = sum(len(d) for d in haystacks.values())
        print(f"\n{len(needles)} needles, {len(haystacks)} haystacks, {total} bytes: no canary. "
              f"Haystacks: {', '.join(sorted(haystacks))}")


if __name__ == "__main__":
    unittest.main()
