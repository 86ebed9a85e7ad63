"""tlsprof-collector end to end: the real binary, a throw-away PKI
(scripts/make-test-pki.sh), python grpcio clients and the generated python
protobuf code of proto/tlsprof/v1/report.proto.

Checks docs/fleet.md's ingest rules from the outside: exact counter values in
base units, malformed/oversized/injected/cardinality-bomb reports, replays,
handshake failures (expired, wrong CA, no certificate), the allow list, the
rate limit, `promtool check metrics`, /api/v1/summary, and kill -9 + restart
with --state-dir; and the journal's promises on a disk that stalls (fsfreeze
of a loop-mounted ext4), fills up (a small tmpfs) or is damaged in place
(CollectorJournalFaultsTest, which needs root for the mounts). Submit latency is printed for information
only; bench/ measures performance.
"""
import glob
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

from tlsprof_testlib import BIN, SRC, Processes, free_port, require_root

try:
    import grpc
except ImportError:  # a pyenv python without grpcio: use Debian's python3-grpcio (same CPython ABI)
    sys.path.append("/usr/lib/python3/dist-packages")
    import grpc

COLLECTOR = os.path.join(BIN, "tlsprof-collector")
PERIOD_NS = 10**9 // 99
SUBMIT = "/tlsprof.v1.Collector/Submit"
MAX_MESSAGE_BYTES = 262144
MAX_SERIES = 50


def load_proto(tmp):
    """Generates report_pb2 with protoc into `tmp` and imports it."""
    out = os.path.join(tmp, "py")
    os.makedirs(out, exist_ok=True)
    subprocess.run(["protoc", f"--python_out={out}", "-I", os.path.join(SRC, "proto"),
                    os.path.join(SRC, "proto", "tlsprof", "v1", "report.proto")], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("tlsprof.v1.report_pb2")


def parse_metrics(text):
    """{(name, ((label, value), ...)): value} from the Prometheus text format."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, labels = series, ()
        if "{" in series:
            name, rest = series.split("{", 1)
            pairs = []
            for part in rest.rstrip("}").split('",'):
                if part:
                    k, v = part.split('="', 1)
                    pairs.append((k, v.rstrip('"')))
            labels = tuple(sorted(pairs))
        out[(name, labels)] = float(value)
    return out


def key(name, **labels):
    return (name, tuple(sorted(labels.items())))


class Collector:
    """One collector process on free ports."""

    def __init__(self, procs, args, state_dir=None):
        self.procs, self.args, self.state_dir = procs, args, state_dir
        self.grpc_port, self.http_port = free_port(), free_port()
        self.proc = None

    def argv(self):
        argv = [COLLECTOR, "--listen", f"127.0.0.1:{self.grpc_port}", "--metrics-listen",
                f"127.0.0.1:{self.http_port}", *self.args]
        if self.state_dir:
            argv += ["--state-dir", self.state_dir]
        return argv

    def start(self):
        self.proc = self.procs.start(self.argv(), port=self.http_port, timeout=30)
        # civetweb listens before the collector has added its handlers: until
        # then a request gets 404 (a scraper just tries again). Ready means
        # /metrics answers.
        deadline = time.monotonic() + 10
        while True:
            try:
                self.http("/metrics")
                return self
            except urllib.error.HTTPError as e:
                if e.code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    def http(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as r:
            return r.status, r.read().decode()

    def metrics_text(self):
        return self.http("/metrics")[1]

    def metrics(self):
        return parse_metrics(self.metrics_text())

    def log(self):
        return Processes.log(self.proc)


class Client:
    def __init__(self, pb, port, pki=None, name=None, insecure=False):
        self.pb = pb
        if insecure:
            self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        else:
            def read(f):
                with open(os.path.join(pki, f), "rb") as fh:
                    return fh.read()
            creds = (grpc.ssl_channel_credentials(read("ca.crt"), read(f"{name}.key"), read(f"{name}.crt"))
                     if name else grpc.ssl_channel_credentials(read("ca.crt")))
            self.channel = grpc.secure_channel(f"127.0.0.1:{port}", creds,
                                               options=[("grpc.ssl_target_name_override", "localhost")])
        self.submit = self.channel.unary_unary(SUBMIT, request_serializer=pb.SubmitRequest.SerializeToString,
                                               response_deserializer=pb.SubmitResponse.FromString)
        # Raw bytes in, raw bytes out: for what the generated code cannot produce.
        self.raw = self.channel.unary_unary(SUBMIT, request_serializer=lambda b: b,
                                            response_deserializer=lambda b: b)

    def send(self, report, timeout=10):
        """(result name or status code name, details, response or None)."""
        try:
            resp = self.submit(self.pb.SubmitRequest(report=report), timeout=timeout)
            return self.pb.SubmitResponse.Result.Name(resp.result), "", resp
        except grpc.RpcError as e:
            return e.code().name, e.details(), None

    def send_raw(self, data):
        try:
            self.raw(data, timeout=10)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details()

    def close(self):
        self.channel.close()


def make_report(pb, seq, instance, service="svc", hostname="host-1", rows=None, busy=800, non_tls=200):
    """A 10 s window ending now on 2 CPUs at 99 Hz. `rows`: [(bucket, algorithm, phase, library, samples)]."""
    rows = rows if rows is not None else [(pb.BUCKET_CIPHER, "AES-GCM", pb.PHASE_RECORD, "openssl-3", 300),
                                          (pb.BUCKET_SIGNATURE, "ECDSA-P256", pb.PHASE_HANDSHAKE, "openssl-3", 50)]
    r = pb.AgentReport(agent_instance=instance, sequence=seq, busy_samples=busy + non_tls)
    r.host.hostname, r.host.cpus = hostname, 2
    now = time.time_ns()
    r.window.start_unix_ns, r.window.end_unix_ns = now - 10 * 10**9, now
    r.window.frequency_hz, r.window.period_ns = 99, PERIOD_NS
    s = r.services.add(name=service, busy_samples=busy, tls_samples=sum(x[4] for x in rows))
    for bucket, alg, phase, lib, n in rows:
        s.tls.add(bucket=bucket, algorithm=alg, phase=phase, library=lib, samples=n)
    if non_tls:
        r.services.add(name="(non-tls)", busy_samples=non_tls)
    return r


def seconds(samples):
    return samples * PERIOD_NS / 1e9


class CollectorTlsTest(unittest.TestCase):
    """One mTLS collector for the whole class; each test uses its own service
    names or instances, and compares counters before and after."""

    @classmethod
    def setUpClass(cls):
        cls.procs = Processes()
        cls.tmp = cls.procs.tmp.name
        cls.pki = os.path.join(cls.tmp, "pki")
        # The collector takes a report only for a host its certificate names: agent-1, agent-2 and bomber all
        # report as host-1 (make_report's default), agent-2 also as host-2.
        subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), cls.pki, "agent-1=host-1",
                        "agent-2=host-1,host-2", "bomber=host-1", "tlsprof-loadgen", "stranger"], check=True,
                       capture_output=True)
        cls.pb = load_proto(cls.tmp)
        allowed = os.path.join(cls.tmp, "allowed-agents")
        with open(allowed, "w") as f:
            f.write("# test fleet\nagent-*\nbomber\ntlsprof-loadgen\n")
        cls.collector = Collector(cls.procs, [
            "--tls-ca", f"{cls.pki}/ca.crt", "--tls-cert", f"{cls.pki}/collector.crt", "--tls-key",
            f"{cls.pki}/collector.key", "--allowed-agents", allowed, "--relay-identity", "tlsprof-loadgen",
            "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--max-series-per-agent", str(MAX_SERIES),
            "--host-labels", "--max-hosts", "3"]).start()
        cls.clients = {}

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients.values():
            c.close()
        cls.procs.close()

    def client(self, name):
        if name not in self.clients:
            self.clients[name] = Client(self.pb, self.collector.grpc_port, self.pki, name)
        return self.clients[name]

    def result_count(self, metrics, result):
        return metrics.get(key("tlsprof_collector_reports_total", result=result), 0)

    def test_a_valid_reports_are_counted_exactly(self):
        pb, c = self.pb, self.client("agent-1")
        instance = os.urandom(16)
        before = self.collector.metrics()
        latencies = []
        for seq in range(1, 4):
            t = time.perf_counter()
            result, details, resp = c.send(make_report(pb, seq, instance, service="svc-a"))
            latencies.append(time.perf_counter() - t)
            self.assertEqual(result, "ACCEPTED", details)
            self.assertEqual(resp.dropped_series, 0)
        m = self.collector.metrics()
        cpu = dict(bucket="cipher", algorithm="AES-GCM", phase="record", library="openssl-3", service="svc-a")
        self.assertAlmostEqual(m[key("tlsprof_cpu_seconds_total", **cpu)], 3 * seconds(300), places=9)
        sig = dict(bucket="signature", algorithm="ECDSA-P256", phase="handshake", library="openssl-3",
                   service="svc-a")
        self.assertAlmostEqual(m[key("tlsprof_cpu_seconds_total", **sig)], 3 * seconds(50), places=9)
        self.assertAlmostEqual(m[key("tlsprof_busy_cpu_seconds_total", service="svc-a")], 3 * seconds(800), places=9)
        self.assertAlmostEqual(m[key("tlsprof_host_busy_cpu_seconds_total", host="host-1")]
                               - before.get(key("tlsprof_host_busy_cpu_seconds_total", host="host-1"), 0),
                               3 * seconds(1000), places=9)
        self.assertEqual(m[key("tlsprof_reports_total")] - before[key("tlsprof_reports_total")], 3)
        self.assertEqual(self.result_count(m, "accepted") - self.result_count(before, "accepted"), 3)
        self.assertGreaterEqual(m[key("tlsprof_collector_agents")], 1)
        # Warm channel: the first call paid for the handshake.
        warm = []
        for seq in range(4, 24):
            t = time.perf_counter()
            self.assertEqual(c.send(make_report(pb, seq, instance, service="svc-a-warm"))[0], "ACCEPTED")
            warm.append(time.perf_counter() - t)
        print(f"\nSubmit latency (information only; bench/ measures): first {latencies[0]*1e3:.1f} ms, "
              f"warm p50 {statistics.median(warm)*1e3:.2f} ms, max {max(warm)*1e3:.2f} ms over {len(warm)} calls",
              file=sys.stderr)

    def test_a2_an_agent_cannot_add_to_another_hosts_series(self):
        pb = self.pb
        result, details, _ = self.client("agent-2").send(make_report(pb, 1, os.urandom(16), "svc-a2", "host-2"))
        self.assertEqual(result, "ACCEPTED", details)
        before = self.collector.metrics()
        victim = key("tlsprof_host_busy_cpu_seconds_total", host="host-2")
        self.assertIn(victim, before)
        # agent-1's certificate names host-1 only: its report for host-2 is refused, counted, and adds nothing.
        code, details, _ = self.client("agent-1").send(make_report(pb, 1, os.urandom(16), "svc-a2", "host-2"))
        self.assertEqual(code, "PERMISSION_DENIED")
        self.assertIn("host.hostname 'host-2' is not this certificate's", details)
        m = self.collector.metrics()
        self.assertEqual(self.result_count(m, "denied") - self.result_count(before, "denied"), 1)
        self.assertEqual(m[victim], before[victim])
        self.assertEqual(m[key("tlsprof_busy_cpu_seconds_total", service="svc-a2")],
                         before[key("tlsprof_busy_cpu_seconds_total", service="svc-a2")])
        self.assertEqual(m[key("tlsprof_reports_total")], before[key("tlsprof_reports_total")])

    def test_b_malformed_bytes_are_invalid(self):
        before = self.collector.metrics()
        code, details = self.client("agent-1").send_raw(b"\xff\xff\xff\xff garbage")
        self.assertEqual(code, "INVALID_ARGUMENT")
        self.assertIn("not a valid tlsprof.v1.SubmitRequest", details)
        # A well-formed report that breaks a rule names the field.
        bad = make_report(self.pb, 0, os.urandom(16), service="svc-b")
        code, details, _ = self.client("agent-1").send(bad)
        self.assertEqual(code, "INVALID_ARGUMENT")
        self.assertEqual(details, "sequence: must be >= 1")
        m = self.collector.metrics()
        self.assertEqual(self.result_count(m, "invalid") - self.result_count(before, "invalid"), 2)
        self.assertNotIn(key("tlsprof_busy_cpu_seconds_total", service="svc-b"), m)

    def test_c_oversized_message(self):
        before = self.collector.metrics()
        big = make_report(self.pb, 1, os.urandom(16), service="svc-c")
        big.host.machine_id = "x" * (MAX_MESSAGE_BYTES + 1000)
        code, details, _ = self.client("agent-1").send(big)
        self.assertEqual(code, "RESOURCE_EXHAUSTED")
        self.assertIn("--max-message-bytes", details)
        # Far beyond the limit gRPC itself refuses it, with the same code.
        big.host.machine_id = "x" * (3 * MAX_MESSAGE_BYTES)
        self.assertEqual(self.client("agent-1").send(big)[0], "RESOURCE_EXHAUSTED")
        m = self.collector.metrics()
        self.assertEqual(self.result_count(m, "too_large") - self.result_count(before, "too_large"), 1)
        self.assertNotIn(key("tlsprof_busy_cpu_seconds_total", service="svc-c"), m)

    def test_d_injected_labels_are_rejected(self):
        pb = self.pb
        for service, rows in [('a"} evil{', None),
                              ("svc-d", [(pb.BUCKET_HASH, 'SHA-256"} tlsprof_evil{x="', pb.PHASE_OTHER, "go", 5)]),
                              ("svc-d", [(pb.BUCKET_HASH, "SHA-256", pb.PHASE_OTHER, "go\nevil 1", 5)])]:
            code, details, _ = self.client("agent-1").send(make_report(pb, 1, os.urandom(16), service, rows=rows))
            self.assertEqual(code, "INVALID_ARGUMENT")
            self.assertIn("must be 1-64 characters", details)
        hostile = make_report(pb, 1, os.urandom(16), "svc-d", hostname='h"}{evil')
        self.assertEqual(self.client("agent-1").send(hostile)[0], "INVALID_ARGUMENT")
        text = self.collector.metrics_text()
        self.assertNotIn("evil", text)
        self.assertNotIn("svc-d", text)

    def test_d_usage_telemetry_is_validated_and_counted(self):
        """run --usage's rows: a valid report is counted; each kind of bad
        field is INVALID_ARGUMENT with its field and rule, and counts nothing."""
        pb = self.pb

        def usage_report(mutate=None):
            r = make_report(pb, 1, os.urandom(16), "svc-usage")
            s = r.services[0]
            s.handshakes.add(side=pb.SIDE_SERVER, kind=pb.HANDSHAKE_KIND_FULL, version="TLSv1.3",
                             cipher_suite="TLS_AES_128_GCM_SHA256", group="X25519", cert_key_type="ECDSA",
                             library="openssl-3", observed=10, estimated=10)
            s.operations.add(operation=pb.OPERATION_SIGN, algorithm="ECDSA-P256", library="openssl-3",
                             in_handshake=True, observed=10, estimated=10, cpu_seconds=0.0002,
                             latency_buckets=[10 if i == 10 else 0 for i in range(50)])
            s.connections.add(library="openssl-3", estimated=3)
            r.usage.duty_cycle, r.usage.probe_hits = 1, 60
            if mutate:
                mutate(r)
            return r

        def field(name, value):
            return lambda r: setattr(r.services[0].handshakes[0], name, value)

        bad = [
            (field("cipher_suite", 'x"} tlsprof_evil{x="'),
             "services[0].handshakes[0].cipher_suite: must be 1-64 characters"),
            (field("estimated", float("nan")), "services[0].handshakes[0].estimated: must be a finite number >= 0"),
            (field("side", pb.SIDE_UNSPECIFIED), "services[0].handshakes[0].side: must be a specified"),
            (lambda r: r.services[0].operations[0].latency_buckets.append(1),
             "services[0].operations[0].latency_buckets: must be empty or hold exactly 50 buckets"),
            (lambda r: r.services[0].operations[0].latency_buckets.__setitem__(6, 1),
             "services[0].operations[0].latency_buckets: must add up to observed 10"),
            (lambda r: setattr(r.services[0].connections[0], "estimated", -1),
             "services[0].connections[0].estimated: must be a finite number >= 0"),
            (lambda r: r.ClearField("usage"), "services[0]: usage rows (handshakes, operations, connections) need"),
            (lambda r: setattr(r.usage, "duty_cycle", 2), "usage.duty_cycle: must be in [0, 1]"),
        ]
        before = self.collector.metrics()
        for mutate, message in bad:
            code, details, _ = self.client("agent-2").send(usage_report(mutate))
            self.assertEqual(code, "INVALID_ARGUMENT", message)
            self.assertIn(message, details)
        text = self.collector.metrics_text()
        self.assertNotIn("evil", text)
        self.assertNotIn("svc-usage", text)
        self.assertEqual(self.result_count(self.collector.metrics(), "invalid") - self.result_count(before, "invalid"),
                         len(bad))
        result, details, _ = self.client("agent-2").send(usage_report())
        self.assertEqual(result, "ACCEPTED", details)
        m = self.collector.metrics()
        self.assertEqual(m[key("tlsprof_handshakes_total", service="svc-usage", library="openssl-3", side="server",
                               kind="full", version="TLSv1.3", cipher_suite="TLS_AES_128_GCM_SHA256", group="X25519",
                               cert_key_type="ECDSA")], 10)
        self.assertEqual(m[key("tlsprof_crypto_operation_latency_seconds_count", service="svc-usage",
                               library="openssl-3", operation="sign", algorithm="ECDSA-P256", in_handshake="true")], 10)
        self.assertEqual(m[key("tlsprof_tls_connections", service="svc-usage", library="openssl-3")], 3)

    def test_e_cardinality_bomb_is_capped(self):
        pb = self.pb
        before = self.collector.metrics()
        n = 2500  # one sample each: 2500 samples fit 2 CPUs x 10 s x 99 Hz x 1.5
        rows = [(pb.BUCKET_OTHER, f"alg-{i}", pb.PHASE_OTHER, "openssl-3", 1) for i in range(n)]
        result, details, resp = self.client("bomber").send(
            make_report(pb, 1, os.urandom(16), "svc-bomb", rows=rows, busy=n, non_tls=0))
        self.assertEqual(result, "ACCEPTED", details)
        self.assertEqual(resp.dropped_series, n - MAX_SERIES)
        m = self.collector.metrics()
        bomb = [k for k in m if k[0] == "tlsprof_cpu_seconds_total" and ("service", "svc-bomb") in k[1]]
        self.assertEqual(len(bomb), MAX_SERIES)
        self.assertEqual(m[key("tlsprof_collector_dropped_series_total")]
                         - before[key("tlsprof_collector_dropped_series_total")], n - MAX_SERIES)

    def test_f_replayed_batch_is_duplicate_and_counted_once(self):
        pb, c = self.pb, self.client("agent-2")
        report = make_report(pb, 7, os.urandom(16), "svc-f")
        self.assertEqual(c.send(report)[0], "ACCEPTED")
        before = self.collector.metrics()
        self.assertEqual(c.send(report)[0], "DUPLICATE")
        m = self.collector.metrics()
        self.assertAlmostEqual(m[key("tlsprof_busy_cpu_seconds_total", service="svc-f")], seconds(800), places=9)
        self.assertEqual(self.result_count(m, "duplicate") - self.result_count(before, "duplicate"), 1)
        self.assertEqual(m[key("tlsprof_reports_total")], before[key("tlsprof_reports_total")])
        # The same (instance, sequence) from another agent is its own batch.
        self.assertEqual(self.client("agent-1").send(report)[0], "ACCEPTED")

    def test_g_bad_certificates_never_reach_the_service(self):
        before = self.collector.metrics()
        report = make_report(self.pb, 1, os.urandom(16), "svc-g")
        for name in ["expired", "wrong-ca", None]:
            c = Client(self.pb, self.collector.grpc_port, self.pki, name)
            code, details, _ = c.send(report)
            c.close()
            self.assertEqual(code, "UNAVAILABLE", f"{name}: {details}")
        # A good certificate whose CN is not in --allowed-agents.
        code, details, _ = self.client("stranger").send(report)
        self.assertEqual(code, "PERMISSION_DENIED")
        self.assertIn("stranger", details)
        m = self.collector.metrics()
        self.assertEqual(self.result_count(m, "denied") - self.result_count(before, "denied"), 1)
        self.assertEqual(self.result_count(m, "accepted"), self.result_count(before, "accepted"))
        self.assertNotIn(key("tlsprof_busy_cpu_seconds_total", service="svc-g"), m)

    def test_h_rate_limit_per_relayed_host(self):
        pb, c = self.pb, self.client("tlsprof-loadgen")
        instance = os.urandom(16)
        before = self.collector.metrics()
        results = [c.send(make_report(pb, seq, instance, "svc-h", hostname="rl-host"))[:2] for seq in range(1, 131)]
        limited = [d for code, d in results if code == "RESOURCE_EXHAUSTED"]
        accepted = sum(1 for code, _ in results if code == "ACCEPTED")
        # Burst 120 at 1/s: about 120 pass in the first seconds, the rest is limited.
        self.assertGreaterEqual(len(limited), 5)
        self.assertGreaterEqual(accepted, 120)
        self.assertEqual(len(limited) + accepted, 130)
        self.assertIn("rate limit", limited[0])
        # Another host behind the same relay has its own bucket.
        self.assertEqual(c.send(make_report(pb, 1, instance, "svc-h", hostname="other-host"))[0], "ACCEPTED")
        m = self.collector.metrics()
        self.assertEqual(self.result_count(m, "rate_limited") - self.result_count(before, "rate_limited"),
                         len(limited))

    def test_y_summary(self):
        status, body = self.collector.http("/api/v1/summary?minutes=5")
        self.assertEqual(status, 200)
        s = json.loads(body)
        m = self.collector.metrics()
        tls = sum(v for k, v in m.items() if k[0] == "tlsprof_cpu_seconds_total")
        busy = sum(v for k, v in m.items() if k[0] == "tlsprof_busy_cpu_seconds_total")
        self.assertEqual(s["minutes"], 5)
        self.assertEqual(s["reports"], m[key("tlsprof_reports_total")])
        self.assertAlmostEqual(s["tls_cpu_seconds"], tls, places=6)
        self.assertAlmostEqual(s["busy_cpu_seconds"], busy, places=6)
        self.assertAlmostEqual(s["tls_share"], tls / busy, places=9)
        self.assertEqual([b["bucket"] for b in s["buckets"]], ["cipher", "signature", "key_exchange", "hash", "other"])
        cipher = sum(v for k, v in m.items() if k[0] == "tlsprof_cpu_seconds_total" and ("bucket", "cipher") in k[1])
        self.assertAlmostEqual(s["buckets"][0]["cpu_seconds"], cipher, places=6)
        self.assertAlmostEqual(sum(b["share_of_tls"] for b in s["buckets"]), 1.0, places=9)
        self.assertGreaterEqual(s["agents"], 4)
        shares = [a["cpu_seconds"] for a in s["algorithms"]]
        self.assertEqual(shares, sorted(shares, reverse=True))
        with self.assertRaises(urllib.error.HTTPError) as bad:
            self.collector.http("/api/v1/summary?minutes=61")
        self.assertEqual(bad.exception.code, 400)

    def test_z_still_up_and_promtool_clean(self):
        self.assertIsNone(self.collector.proc.poll(), "the collector died")
        pb = self.pb
        before = self.collector.metrics()
        self.assertEqual(self.client("agent-1").send(make_report(pb, 1, os.urandom(16), "svc-z"))[0], "ACCEPTED")
        m = self.collector.metrics()
        self.assertAlmostEqual(m[key("tlsprof_busy_cpu_seconds_total", service="svc-z")], seconds(800), places=9)
        self.assertEqual(m[key("tlsprof_reports_total")] - before[key("tlsprof_reports_total")], 1)
        text = self.collector.metrics_text()
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(lint.returncode, 0, lint.stdout + lint.stderr)
        self.assertEqual(lint.stdout.strip() + lint.stderr.strip(), "")


class CollectorRestartTest(unittest.TestCase):
    """--state-dir: counters and duplicates survive kill -9; SIGTERM is clean;
    bad flags exit 2."""

    def setUp(self):
        self.procs = Processes()
        self.pb = load_proto(self.procs.tmp.name)

    def tearDown(self):
        self.procs.close()

    def data(self, collector):
        return {k: v for k, v in collector.metrics().items()
                if k[0] in ("tlsprof_cpu_seconds_total", "tlsprof_busy_cpu_seconds_total", "tlsprof_reports_total")}

    def test_kill_9_and_restart(self):
        state = self.procs.path("state")
        collector = Collector(self.procs, ["--insecure", "--journal-compact-bytes", "4096"], state).start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        instance = os.urandom(16)
        reports = [make_report(self.pb, seq, instance, "svc-r") for seq in range(1, 41)]
        for r in reports[:30]:
            self.assertEqual(c.send(r)[0], "ACCEPTED")
        before = self.data(collector)
        self.assertEqual(before[key("tlsprof_reports_total")], 30)
        self.assertAlmostEqual(before[key("tlsprof_busy_cpu_seconds_total", service="svc-r")], 30 * seconds(800),
                               places=9)
        # Compaction runs beside ingest, on a thread of its own (lower
        # priority): give it its time before the kill, bounded.
        snapshot = os.path.join(state, "snapshot")
        deadline = time.monotonic() + 20
        while not os.path.exists(snapshot) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.procs.stop(collector.proc, signal.SIGKILL)
        c.close()
        self.assertTrue(os.path.exists(snapshot), "4 KiB journals should have compacted within 20 s")

        collector.start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        self.assertEqual(self.data(collector), before)
        self.assertEqual(c.send(reports[29])[0], "DUPLICATE")
        self.assertEqual(c.send(reports[0])[0], "DUPLICATE")
        self.assertEqual(c.send(reports[30])[0], "ACCEPTED")

        # A torn record at the journal's end (a crash mid-write) is ignored.
        after = self.data(collector)
        self.procs.stop(collector.proc, signal.SIGKILL)
        c.close()
        (journal,) = glob.glob(os.path.join(state, "journal-*"))
        with open(journal, "ab") as f:
            f.write(b"\x40\x00\x00\x00\x12\x34")
        collector.start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        self.assertEqual(self.data(collector), after)
        self.assertIn("torn or corrupt", collector.log())
        self.assertEqual(c.send(reports[30])[0], "DUPLICATE")
        self.assertEqual(c.send(reports[31])[0], "ACCEPTED")

        # SIGTERM: clean exit, nothing lost.
        after = self.data(collector)
        self.procs.stop(collector.proc, signal.SIGTERM)
        self.assertEqual(collector.proc.returncode, 0, collector.log())
        collector.start()
        self.assertEqual(self.data(collector), after)
        c.close()

    def test_insecure_identity_is_per_hostname(self):
        collector = Collector(self.procs, ["--insecure"]).start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        instance = os.urandom(16)
        self.assertEqual(c.send(make_report(self.pb, 1, instance, "s", hostname="a"))[0], "ACCEPTED")
        self.assertEqual(c.send(make_report(self.pb, 1, instance, "s", hostname="b"))[0], "ACCEPTED")
        self.assertEqual(c.send(make_report(self.pb, 1, instance, "s", hostname="a"))[0], "DUPLICATE")
        c.close()

    def test_bad_flags_exit_2(self):
        missing = self.procs.path("missing.pem")
        pki = self.procs.path("pki")
        subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki], check=True, capture_output=True)
        cases = [
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--insecure", "--bogus"], "--bogus"),
            (["--listen", "127.0.0.1:1"], "metrics-listen"),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2"], "--insecure"),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--tls-ca", missing, "--tls-cert",
              missing, "--tls-key", missing], missing),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--tls-ca", f"{pki}/ca.crt", "--tls-cert",
              f"{pki}/collector.crt", "--tls-key", f"{pki}/agent-1.key"], "is not the key of"),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--tls-ca", f"{pki}/ca.key", "--tls-cert",
              f"{pki}/collector.crt", "--tls-key", f"{pki}/collector.key"], "not a PEM certificate"),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--insecure", "--tls-ca", missing],
             "excludes"),
            (["--listen", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:2", "--insecure", "--allowed-agents",
              missing], missing),
        ]
        for args, needle in cases:
            p = subprocess.run([COLLECTOR, *args], capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stderr}")
            self.assertIn(needle, p.stderr, args)


class CollectorJournalFaultsTest(unittest.TestCase):
    """--state-dir on disks that misbehave: an answer that lets the agent
    delete its batch (ACCEPTED, DUPLICATE) is sent only once the batch is
    durable; a full disk refuses until space is back, then accepts with no
    restart; a record damaged in place costs that record only."""

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)
        self.pb = load_proto(self.procs.tmp.name)

    def mount(self, *args):
        mnt = self.procs.path(f"mnt-{len(os.listdir(self.procs.tmp.name))}")
        os.makedirs(mnt)
        subprocess.run(["mount", *args, mnt], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mnt], check=False)
        return mnt

    def restarted_reports(self, collector):
        """kill -9, start again on the same directory: the reports it counts."""
        self.procs.stop(collector.proc, signal.SIGKILL)
        collector.start()
        return collector.metrics()[key("tlsprof_reports_total")]

    def test_duplicate_only_once_the_original_is_durable(self):
        image = self.procs.path("ext4.img")
        with open(image, "wb") as f:
            f.truncate(64 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
        mnt = self.mount("-o", "loop", image)
        collector = Collector(self.procs, ["--insecure"], os.path.join(mnt, "state")).start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        self.addCleanup(c.close)
        instance = os.urandom(16)
        self.assertEqual(c.send(make_report(self.pb, 1, instance, "svc-d"))[0], "ACCEPTED")
        batch = make_report(self.pb, 2, instance, "svc-d")
        subprocess.run(["fsfreeze", "--freeze", mnt], check=True)
        thawed = []

        def thaw():
            if not thawed:
                subprocess.run(["fsfreeze", "--unfreeze", mnt], check=True)
                thawed.append(True)
        self.addCleanup(thaw)  # before the umount (cleanups run last first)
        # The flush stalls: the agent's attempt times out, and so must its
        # retry. A DUPLICATE now would let it delete a batch that is only in
        # the collector's memory.
        answers = [c.send(batch, timeout=2)[0] for _ in range(2)]
        self.assertEqual(answers, ["DEADLINE_EXCEEDED"] * 2, "answered while the journal could not be written")
        thaw()
        deadline = time.monotonic() + 20
        while (answer := c.send(batch, timeout=5)[0]) not in ("ACCEPTED", "DUPLICATE"):
            self.assertLess(time.monotonic(), deadline, answer)
            time.sleep(0.2)
        self.assertEqual(answer, "DUPLICATE")
        self.assertEqual(self.restarted_reports(collector), 2, collector.log())

    def test_full_disk_refuses_then_accepts_without_a_restart(self):
        mnt = self.mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tlsprof-journal-test")
        collector = Collector(self.procs, ["--insecure"], os.path.join(mnt, "state")).start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        self.addCleanup(c.close)
        instance = os.urandom(16)
        self.assertEqual(c.send(make_report(self.pb, 1, instance, "svc-f"))[0], "ACCEPTED")
        ballast = os.path.join(mnt, "ballast")
        with open(ballast, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass  # full
        # The journal's last page takes a few more reports; then a write fails.
        seq, answer = 1, "ACCEPTED"
        while answer == "ACCEPTED" and seq < 200:
            seq += 1
            answer = c.send(make_report(self.pb, seq, instance, "svc-f"))[0]
        self.assertEqual(answer, "UNAVAILABLE", f"report {seq}")
        refused = seq
        # Refused at once while the disk is full; then space comes back.
        self.assertEqual(c.send(make_report(self.pb, refused, instance, "svc-f"))[0], "UNAVAILABLE")
        os.remove(ballast)
        deadline = time.monotonic() + 10
        while (answer := c.send(make_report(self.pb, refused, instance, "svc-f"))[0]) == "UNAVAILABLE":
            self.assertLess(time.monotonic(), deadline, "still refused 10 s after space came back")
            time.sleep(0.2)
        # Counted in memory at its first attempt, written now: DUPLICATE.
        self.assertIn(answer, ("ACCEPTED", "DUPLICATE"))
        self.assertEqual(c.send(make_report(self.pb, refused + 1, instance, "svc-f"))[0], "ACCEPTED")
        self.assertIn("writing again after", collector.log())
        self.assertEqual(self.restarted_reports(collector), refused + 1, collector.log())

    def test_a_damaged_record_costs_only_itself(self):
        state = self.procs.path("state")
        collector = Collector(self.procs, ["--insecure"], state).start()
        c = Client(self.pb, collector.grpc_port, insecure=True)
        instance = os.urandom(16)
        for seq in range(1, 11):
            self.assertEqual(c.send(make_report(self.pb, seq, instance, "svc-c"))[0], "ACCEPTED")
        self.procs.stop(collector.proc, signal.SIGKILL)
        c.close()
        (journal,) = glob.glob(os.path.join(state, "journal-*"))
        with open(journal, "r+b") as f:
            data = bytearray(f.read())
            second = 8 + int.from_bytes(data[0:4], "little")  # record 2's frame
            data[second + 8 + 20] ^= 0x01
            f.seek(0)
            f.write(data)
        collector.start()
        self.assertEqual(collector.metrics()[key("tlsprof_reports_total")], 9, collector.log())
        self.assertIn(f"at byte {second} are corrupt", collector.log())
        c = Client(self.pb, collector.grpc_port, insecure=True)
        self.addCleanup(c.close)
        self.assertEqual(c.send(make_report(self.pb, 10, instance, "svc-c"))[:2], ("DUPLICATE", ""), collector.log())
        self.assertEqual(c.send(make_report(self.pb, 11, instance, "svc-c"))[:2], ("ACCEPTED", ""), collector.log())


if __name__ == "__main__":
    unittest.main()
