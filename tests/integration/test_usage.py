"""Usage telemetry (issue 4): `tlsprof-agent profile --usage` on Debian's
nginx (stripped shared OpenSSL 3) with an RSA and an ECDSA certificate and
session tickets, under a scripted `openssl s_client` mix whose every
handshake is known. The counts by side, kind, version, cipher suite, group
and certificate key type must be exact, and so must the signatures and key
exchanges, each timed on-CPU."""
import collections
import os
import subprocess
import time
import unittest

from tlsprof_testlib import BIN, SRC, USAGE_MIX, UsageAgentTestCase, free_port

GO_TLS = os.path.join(BIN, "tlsprof-go-tls")
GO_TLS_STRIPPED = os.path.join(BIN, "tlsprof-go-tls-stripped")

PROFILE_SECONDS = 20

# (count, s_client arguments, the server row it must give)
MIX = [
    (6, ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-groups", "X25519", "-sigalgs", "ECDSA+SHA256"],
     ("full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "ECDSA")),
    (5, ["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256", "-groups", "P-256",
         "-sigalgs", "rsa_pss_rsae_sha256"],
     ("full", "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", "P-256", "RSA")),
    (4, ["-tls1_2", "-cipher", "ECDHE-RSA-AES128-SHA", "-groups", "X25519"],
     ("full", "TLSv1.2", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "X25519", "RSA")),
]
RESUMED = 3  # resumptions of one TLS 1.3 AES-256-GCM session (plus its full handshake)
HELD_OPEN = 3  # connections still open when the Go test's report is written


class UsageTest(UsageAgentTestCase):
    def test_scripted_mix_is_counted_exactly(self):
        port = free_port()
        root = self.procs.path("nginx")
        os.makedirs(root)
        self.procs.start(["bash", os.path.join(SRC, "workloads/nginx/run-nginx.sh"), root, str(port), "dual"],
                         ready_file=os.path.join(root, "ready"), env={**os.environ, "NGINX_SESSION_TICKETS": "on"})
        with open(os.path.join(root, "nginx.pid")) as f:
            master = f.read().strip()
        workers = subprocess.run(["pgrep", "-P", master], capture_output=True, text=True).stdout.split()
        self.assertTrue(workers, "no nginx workers")

        agent, report_path, log_path = self.start_agent("mix", workers, PROFILE_SECONDS)

        started = time.monotonic()
        for count, client_args, _ in MIX:
            for _ in range(count):
                self.s_client(port, client_args)
        session = self.procs.path("session.pem")
        resume_args = ["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384", "-groups", "X25519",
                       "-sigalgs", "ECDSA+SHA256"]
        self.s_client(port, resume_args + ["-sess_out", session])
        for _ in range(RESUMED):
            self.s_client(port, resume_args + ["-sess_in", session])
        mix_seconds = time.monotonic() - started
        self.assertLess(mix_seconds, PROFILE_SECONDS - 3, "the client mix outran the profile window")

        report = self.agent_report(agent, report_path, log_path, PROFILE_SECONDS + 60)

        rows = collections.Counter()
        for h in report["handshakes"]:
            self.assertIn(str(h["pid"]), workers)
            self.assertEqual(h["side"], "server")
            rows[(h["kind"], h["version"], h["cipher_suite"], h["group"], h["cert_key_type"])] += h["count"]
        print("handshakes:", dict(rows))
        want = collections.Counter()
        for count, _, row in MIX:
            want[row] += count
        want[("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "ECDSA")] += 1
        # A resumed handshake presents no certificate; the key type is the
        # server's current key, which with two certificates is either.
        resumed = {k: v for k, v in rows.items() if k[0] == "resumed"}
        full = {k: v for k, v in rows.items() if k[0] != "resumed"}
        self.assertEqual(full, dict(want))
        self.assertEqual(sum(resumed.values()), RESUMED, resumed)
        for k in resumed:
            self.assertEqual(k[1:4], ("TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519"))

        ops = collections.Counter()
        for o in report["operations"]:
            self.assertTrue(o["in_handshake"], o)
            self.assertGreater(o["latency_p50_us"], 1, o)
            self.assertGreaterEqual(o["latency_p99_us"], o["latency_p50_us"], o)
            ops[(o["operation"], o["algorithm"])] += o["count"]
        print("operations:", dict(ops))
        self.assertEqual(ops, collections.Counter({
            ("sign", "ECDSA-P256"): 6 + 1,
            ("sign", "RSA-2048"): 5 + 4,
            ("key_exchange", "X25519"): 6 + 4 + 1 + RESUMED,
            ("key_exchange", "ECDHE-P256"): 5,
        }))

        per_process = {c["pid"]: c for c in report["handshake_cpu"]}
        self.assertEqual(sum(c["handshakes"] for c in per_process.values()), sum(want.values()) + RESUMED)
        self.assertEqual(sum(c["resumed"] for c in per_process.values()), RESUMED)
        usage = report["agent"]["usage"]
        self.assertEqual(usage["dropped_keys"], 0)
        self.assertEqual(usage["read_errors"], 0)
        for f in usage["files"]:
            self.assertNotIn("unknown", f["fields"].values(), f)

    def test_handshakes_driven_by_ssl_read_are_counted(self):
        """`openssl s_server -www` never calls SSL_do_handshake or SSL_accept:
        its SSL_read (through a BIO) drives the handshake. The probe on the
        state machine counts it all the same, once per connection."""
        port = free_port()
        certs = self.procs.path("certs")
        subprocess.run(["sh", os.path.join(SRC, "workloads/node/make-cert.sh"), certs, "ecdsa"], check=True,
                       capture_output=True)
        server = self.procs.start(["openssl", "s_server", "-accept", str(port), "-cert",
                                   os.path.join(certs, "cert.pem"), "-key", os.path.join(certs, "key.pem"),
                                   "-www", "-quiet"], port=port)
        agent, report_path, log_path = self.start_agent("s_server", [str(server.pid)], 10)
        connections = 5
        for _ in range(connections):
            out = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-quiet", "-tls1_3"],
                                 input=b"GET / HTTP/1.0\r\n\r\n", capture_output=True, timeout=30)
            self.assertIn(b"HTTP/1.0 200", out.stdout, out.stderr.decode(errors="replace")[-500:])
        report = self.agent_report(agent, report_path, log_path, 70)
        rows = collections.Counter()
        for h in report["handshakes"]:
            rows[(h["side"], h["kind"], h["version"], h["group"], h["cert_key_type"])] += h["count"]
        print("s_server handshakes:", dict(rows))
        self.assertEqual(rows, collections.Counter({("server", "full", "TLSv1.3", "X25519", "ECDSA"): connections}))
        probed = [f["functions"] for f in report["agent"]["usage"]["files"] if f["path"].endswith("libssl.so.3")]
        self.assertEqual(probed, [["state_machine", "SSL_free"]])

    def test_go_servers_mix_is_counted_exactly(self):
        """Go crypto/tls: probes at function entries and RET instructions
        (never uretprobes), matched by goroutine. An ECDSA server with
        symbols and DWARF, and an RSA server linked with -s -w (functions from
        .gopclntab, tls.Conn's layout from the table), each in the Go study's
        handshake-only mode, under a scripted `openssl s_client` mix."""
        servers = {}
        for cert, binary in (("ecdsa", GO_TLS), ("rsa", GO_TLS_STRIPPED)):
            ready = self.procs.path(f"go-{cert}.ready")
            proc = self.procs.start([binary, "server", "--cert", cert, "--handshake-only", "--ready-file", ready],
                                    ready_file=ready, env={**os.environ, "GOMAXPROCS": "1"})
            with open(ready) as f:
                servers[cert] = (proc, int(f.read().strip().rsplit(":", 1)[1]))
        agent, report_path, log_path = self.start_agent("go", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="tlsprof-go-tls-stripped")
        # (server, count, s_client arguments, the row it must give)
        mix = USAGE_MIX + [
            ("rsa", 2, ["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384", "-groups", "X25519"],
             ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA")),
        ]
        started = time.monotonic()
        for cert, count, args, _ in mix:
            for _ in range(count):
                self.s_client(servers[cert][1], args, request=b"x", answer=None)
        # Resumed with the session ticket of a TLS 1.2 handshake: no key
        # exchange, no signature (Go's server signs nothing when resuming).
        session = self.procs.path("go-session.pem")
        resume = ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]
        self.s_client(servers["ecdsa"][1], resume + ["-sess_out", session], request=b"x", answer=None)
        for _ in range(RESUMED):
            self.s_client(servers["ecdsa"][1], resume + ["-sess_in", session], request=b"x", answer=None)
        # Connections held open through the report: live. (The server
        # waits for their byte; everything above was closed.)
        self.hold_open(servers["rsa"][1], HELD_OPEN)
        self.assertLess(time.monotonic() - started, PROFILE_SECONDS - 3, "the client mix outran the profile window")
        report = self.agent_report(agent, report_path, log_path, PROFILE_SECONDS + 60)

        live = {c["pid"]: c for c in report["connections"]}
        print("go live connections:", report["connections"])
        self.assertEqual(set(live), {servers["rsa"][0].pid}, report["connections"])
        self.assertEqual(live[servers["rsa"][0].pid]["live_connections"], HELD_OPEN)
        self.assertGreater(live[servers["rsa"][0].pid]["rss_bytes"], 0)

        pid_cert = {p.pid: cert for cert, (p, _) in servers.items()}
        rows = collections.Counter()
        for h in report["handshakes"]:
            self.assertIn(h["pid"], pid_cert, h)
            self.assertEqual(h["side"], "server")
            rows[(pid_cert[h["pid"]],) + (h["kind"], h["version"], h["cipher_suite"], h["group"],
                                          h["cert_key_type"])] += h["count"]
        print("go handshakes:", dict(rows))
        want = collections.Counter()
        for cert, count, _, row in mix:
            want[(cert,) + row] += count
        suite = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
        want[("ecdsa", "full", "TLSv1.2", suite, "X25519", "ECDSA")] += 1
        want[("ecdsa", "resumed", "TLSv1.2", suite, "none", "none")] += RESUMED
        # Python's ssl module: TLS 1.3, Go's suite choice, X25519.
        held_row = ("rsa", "full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "RSA")
        want[held_row] += HELD_OPEN
        self.assertEqual(rows, want)

        ops = collections.Counter()
        for o in report["operations"]:
            self.assertTrue(o["in_handshake"], o)
            self.assertGreater(o["latency_p50_us"], 1, o)
            ops[(o["operation"], o["algorithm"])] += o["count"]
        print("go operations:", dict(ops))
        self.assertEqual(ops, collections.Counter({
            ("sign", "ECDSA-P256"): 5 + 3 + 1,
            ("sign", "RSA-2048"): 4 + 2 + HELD_OPEN,
            ("key_exchange", "X25519"): 5 + 4 + 2 + 1 + HELD_OPEN,
            ("key_exchange", "ECDHE-P256"): 3,
        }))
        usage = report["agent"]["usage"]
        files = {os.path.basename(f["path"]): f for f in usage["files"]}
        self.assertEqual(files["tlsprof-go-tls"]["fields"]["ssl.version"].split()[-1], "[dwarf]")
        self.assertTrue(files["tlsprof-go-tls-stripped"]["fields"]["ssl.version"].endswith("[table go1.19]"),
                        files["tlsprof-go-tls-stripped"]["fields"])
        self.assertEqual(usage["go_unmatched_returns"], 0)
        self.assertEqual(usage["budget"]["duty_cycle"], 1.0)


if __name__ == "__main__":
    unittest.main()
