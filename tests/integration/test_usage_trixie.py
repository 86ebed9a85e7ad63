"""Usage telemetry on today's stacks. The tests below: nginx and HAProxy (this
docstring), node (OpenSSL linked into the executable), Go 1.24 and Android's
BoringSSL 14 (Kyber), each under the same kind of scripted mix.

`tlsprof-agent profile --usage` on nginx
1.26 and HAProxy 3.0 of the Debian 13 root (OpenSSL 3.5's stripped libssl.so.3
and libcrypto.so.3), run as containers both ways (trixie.py): each server
software with an RSA-2048 and an ECDSA P-256 certificate, one of the two in a
plain chroot and the other after pivot_root. The client is the root's own
`openssl s_client` (3.5, through chroot), in a scripted mix whose every
handshake is known: the hybrid post-quantum X25519MLKEM768 (OpenSSL 3.5's
default), X25519 only and P-256, TLS 1.3 and 1.2, and sessions resumed (TLS
1.3 with X25519 and with X25519MLKEM768, TLS 1.2). The counts by side, kind,
version, cipher suite, group and certificate key type must be exact; each full
handshake signs once with the server's key; each one on a hybrid group (full
or a TLS 1.3 resumption) counts one KEM operation, X25519MLKEM768, timed
on-CPU; and no field of 3.5's layout may be unknown (its accessors dispatch on
the object's type first, QUIC's or a TLS connection's)."""
import collections
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import trixie
from tlsprof_testlib import SRC, USAGE_MIX, USAGE_SESSIONS, UsageAgentTestCase, free_port

PROFILE_SECONDS = 20
RESUMED = 3  # resumptions of each session after its full handshake
HELD = 2  # connections held open through the report (host Python's ssl, TLS 1.3 with X25519)
HELD_ROW = ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA")
OPENSSL = trixie.chroot(["openssl"])

# The hybrid group, on top of USAGE_MIX (X25519 and P-256, TLS 1.3 and 1.2).
PQ_MIX = [
    ("ecdsa", 4, ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-groups", "X25519MLKEM768"],
     ("full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519MLKEM768", "ECDSA")),
    ("rsa", 3, ["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256", "-groups", "X25519MLKEM768"],
     ("full", "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", "X25519MLKEM768", "RSA")),
]
# A TLS 1.3 resumption (psk_dhe_ke) exchanges a key on the client's group: a
# hybrid one encapsulates again.
PQ_SESSIONS = [
    ("ecdsa", ["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384", "-groups", "X25519MLKEM768"],
     ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519MLKEM768", "ECDSA"),
     ("resumed", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519MLKEM768", "ECDSA")),
]
# The key exchange each group's handshakes time.
KX_ALGORITHM = {"X25519": "X25519", "P-256": "ECDHE-P256", "X25519MLKEM768": "X25519MLKEM768"}
SIGN_ALGORITHM = {"RSA": "RSA-2048", "ECDSA": "ECDSA-P256"}

def expected_operations(want, key_exchanges=lambda group: [KX_ALGORITHM[group]]):
    """The operations `want`'s server rows ((lead..., kind, version, suite,
    group, cert key type) -> count) run: one signature per full handshake, the
    group's key exchanges (`key_exchanges(group)`) per full handshake and TLS
    1.3 resumption; keyed (lead..., operation, algorithm)."""
    ops = collections.Counter()
    for (*lead, kind, version, _, group, key_type), n in want.items():
        if kind == "full":
            ops[(*lead, "sign", SIGN_ALGORITHM[key_type])] += n
        if kind == "full" or version == "TLSv1.3":
            for algorithm in key_exchanges(group):
                ops[(*lead, "key_exchange", algorithm)] += n
    return ops


# Which container runs which server: each software both ways.
PLACEMENT = {("nginx", "rsa"): "chroot", ("nginx", "ecdsa"): "pivot_root",
             ("haproxy", "rsa"): "pivot_root", ("haproxy", "ecdsa"): "chroot"}


def nginx_conf(inside, port):
    """One worker, TLS 1.2 and 1.3 with the library's default groups (3.5:
    X25519MLKEM768 first), session tickets; `inside` is the directory as the
    container sees it."""
    temp = "\n".join(f"  {d}_temp_path {inside}/tmp/{d};" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""worker_processes 1;
user root root;
daemon off;
pid {inside}/nginx.pid;
error_log {inside}/error.log info;
events {{ worker_connections 256; }}
http {{
  access_log off;
{temp}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {inside}/cert.pem;
    ssl_certificate_key {inside}/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    location / {{ return 200 "ok\\n"; }}
  }}
}}
"""


def haproxy_conf(inside, port):
    """One thread, TLS 1.2 and 1.3, an HTTP answer of its own."""
    return f"""global
  nbthread 1
  ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
  mode http
  timeout client 10s
  timeout connect 5s
  timeout server 10s
frontend tls
  bind 127.0.0.1:{port} ssl crt {inside}/server.pem
  http-request return status 200 content-type text/plain string ok
"""


class TrixieUsageTest(UsageAgentTestCase):
    def setUp(self):
        super().setUp()
        trixie.require_trixie(self)
        # Shared with the containers: under the root's /tmp.
        self.shared = tempfile.mkdtemp(prefix="tlsprof-usage-", dir=trixie.host_path("/tmp"))
        self.addCleanup(shutil.rmtree, self.shared, True)

    def inside(self, host):
        return "/" + os.path.relpath(host, trixie.ROOT)

    def start_server(self, software, cert):
        """The server in its container: (pids the agent profiles, port)."""
        container = trixie.CONTAINERS[PLACEMENT[(software, cert)]]
        d = os.path.join(self.shared, f"{software}-{cert}")
        os.makedirs(os.path.join(d, "tmp"))
        subprocess.run(["sh", os.path.join(SRC, "workloads/node/make-cert.sh"), d, cert], check=True,
                       capture_output=True)
        port, inside = free_port(), self.inside(d)
        if software == "nginx":
            with open(os.path.join(d, "nginx.conf"), "w") as f:
                f.write(nginx_conf(inside, port))
            proc = self.procs.start(container(["/usr/sbin/nginx", "-p", inside, "-c", f"{inside}/nginx.conf",
                                               "-e", f"{inside}/error.log"]), port=port)
            deadline = time.monotonic() + 10  # the master listens before it forks its worker
            while True:
                workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
                if workers or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(len(workers), 1, f"nginx {cert}: workers {workers}")
            return [int(w) for w in workers], port
        with open(os.path.join(d, "server.pem"), "w") as out:
            for name in ("cert.pem", "key.pem"):
                with open(os.path.join(d, name)) as f:
                    out.write(f.read())
        with open(os.path.join(d, "haproxy.cfg"), "w") as f:
            f.write(haproxy_conf(inside, port))
        proc = self.procs.start(container(["/usr/sbin/haproxy", "-db", "-f", f"{inside}/haproxy.cfg"]), port=port)
        return [proc.pid], port

    def test_nginx_and_haproxy_mix_is_counted_exactly(self):
        servers = {}  # (software, cert) -> (pids, port)
        for key in PLACEMENT:
            servers[key] = self.start_server(*key)
        pid_server = {pid: key for key, (pids, _) in servers.items() for pid in pids}
        agent, report_path, log_path = self.start_agent("trixie", [str(p) for p in pid_server], PROFILE_SECONDS)
        started = time.monotonic()
        want = collections.Counter()
        for software in ("nginx", "haproxy"):
            ports = {cert: port for (s, cert), (_, port) in servers.items() if s == software}
            rows = self.run_usage_mix(
                ports, USAGE_MIX + PQ_MIX, USAGE_SESSIONS + PQ_SESSIONS, RESUMED, openssl=OPENSSL, answer=b" 200 ",
                session_path=lambda i, s=software: self.inside(os.path.join(self.shared, f"session-{s}-{i}.pem")))
            for (cert, *row), n in rows.items():
                want[(software, cert, *row)] += n
        self.hold_open(servers[("nginx", "rsa")][1], HELD)
        want[("nginx", "rsa") + HELD_ROW] += HELD
        self.assertLess(time.monotonic() - started, PROFILE_SECONDS - 3, "the client mix outran the profile window")
        report = self.agent_report(agent, report_path, log_path, PROFILE_SECONDS + 60)

        rows = self.server_rows(report, pid_server, "libssl.so.3")
        print("handshakes:", "\n  ".join(f"{k}: {v}" for k, v in sorted(rows.items())))
        self.assertEqual(rows, want)

        # Operations: one signature per full handshake, one key exchange per
        # full handshake and TLS 1.3 resumption, a hybrid's one KEM operation.
        want_ops = expected_operations(want)
        ops = self.handshake_operations(report, pid_server)
        print("operations:", "\n  ".join(f"{k}: {v}" for k, v in sorted(ops.items())))
        self.assertEqual(ops, want_ops)

        live = {c["pid"]: c["live_connections"] for c in report["connections"]}
        self.assertEqual(live, {servers[("nginx", "rsa")][0][0]: HELD})
        usage = report["agent"]["usage"]
        self.assertEqual(usage["dropped_keys"], 0)
        self.assertEqual(usage["read_errors"], 0)
        files = {os.path.basename(f["path"]): f for f in usage["files"]}
        print("probed:", {name: f["functions"] for name, f in files.items()})
        self.assertEqual(files["libssl.so.3"]["functions"], ["state_machine", "SSL_free"])
        self.assertIn("EVP_PKEY_encapsulate", files["libcrypto.so.3"]["functions"])
        for f in files.values():
            self.assertNotIn("unknown", f["fields"].values(), f)
            self.assertTrue(f["fields"]["ssl.version"].startswith("[+0x0 == 0] "), f)

    def test_node_static_openssl_mix_is_counted_exactly(self):
        """node's https server (this machine's node 20, OpenSSL 3.0 linked into
        the fixed-address executable): the plan finds the state machine
        through the method tables the executable holds as absolute addresses
        (node drives its handshakes through SSL_read, never SSL_do_handshake).
        The same mix from the root's client, as far as 3.0 negotiates: the
        hybrid offered first falls back to X25519."""
        servers = {}
        for cert in ("rsa", "ecdsa"):
            cert_pem, key_pem = self.make_cert(f"node-{cert}", cert)
            port = free_port()
            proc = self.procs.start(["node", os.path.join(SRC, "workloads/node/https-server.js"), "--cert",
                                     cert_pem, "--key", key_pem,
                                     "--port", str(port), "--size", "16"], port=port)
            servers[cert] = (proc, port)
        agent, report_path, log_path = self.start_agent("node", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="node")
        fallback = [(cert, count, [a if a != "X25519MLKEM768" else "X25519MLKEM768:X25519" for a in args],
                     row[:3] + ("X25519",) + row[4:]) for cert, count, args, row in PQ_MIX]
        started = time.monotonic()
        want = self.run_usage_mix(
            {cert: port for cert, (_, port) in servers.items()}, USAGE_MIX + fallback, USAGE_SESSIONS, RESUMED,
            openssl=OPENSSL, session_path=lambda i: self.inside(os.path.join(self.shared, f"session-node-{i}.pem")))
        ops, files = self.check_mix_report(agent, report_path, log_path, servers, want, started, PROFILE_SECONDS,
                                           "node", HELD, HELD_ROW)
        self.assertEqual(ops, expected_operations(want))
        self.assertEqual(files["node"]["functions"][0], "state_machine")

    def test_go_124_mix_is_counted_exactly(self):
        """The workloads' Go TLS server built in the root with Go 1.24 (crypto
        under crypto/internal/fips140, ECDHE through crypto/ecdh, ML-KEM-768
        for X25519MLKEM768 by default): ECDSA with symbols and DWARF, RSA
        linked with -s -w (tls.Conn's layout from the table's go1.24 row, which
        must equal the other binary's DWARF). Go runs a hybrid's halves as two
        calls: one ML-KEM-768 and one X25519 operation per hybrid handshake,
        and the handshake's group is their hybrid."""
        binaries = trixie.build_go_tls()
        servers = {}
        for cert, name in (("ecdsa", "tlsprof-go-tls"), ("rsa", "tlsprof-go-tls-stripped")):
            ready = os.path.join(self.shared, f"go-{cert}.ready")
            proc = self.procs.start(trixie.chroot([binaries[name], "server", "--cert", cert, "--handshake-only",
                                                   "--default-curves", "--ready-file", self.inside(ready)]),
                                    ready_file=ready, env={**os.environ, "GOMAXPROCS": "1"})
            with open(ready) as f:
                servers[cert] = (proc, int(f.read().strip().rsplit(":", 1)[1]))
        agent, report_path, log_path = self.start_agent("go", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="tlsprof-go-tls-stripped")
        # Go's server signs nothing when it resumes: no certificate key then.
        sessions = [(cert, args, full, resumed[:4] + ("none",))
                    for cert, args, full, resumed in USAGE_SESSIONS + PQ_SESSIONS]
        started = time.monotonic()
        want = self.run_usage_mix(
            {cert: port for cert, (_, port) in servers.items()}, USAGE_MIX + PQ_MIX, sessions, RESUMED,
            openssl=OPENSSL, request=b"x", answer=None,
            session_path=lambda i: self.inside(os.path.join(self.shared, f"session-go-{i}.pem")))
        # Python's ssl module (OpenSSL 3.0: X25519 first), Go's suite choice.
        held_row = ("full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "RSA")
        ops, files = self.check_mix_report(agent, report_path, log_path, servers, want, started, PROFILE_SECONDS,
                                           ("tlsprof-go-tls", "tlsprof-go-tls-stripped"), HELD, held_row)
        # Go runs the hybrid's halves as two operations.
        self.assertEqual(ops, expected_operations(
            want, lambda group: ["ML-KEM-768", "X25519"] if group == "X25519MLKEM768" else [KX_ALGORITHM[group]]))
        dwarf = files["tlsprof-go-tls"]["fields"]
        table = files["tlsprof-go-tls-stripped"]["fields"]
        print("go 1.24 fields:", dwarf, table)
        self.assertTrue(dwarf["go.version"].startswith("go1.24"), dwarf)
        for field in ("ssl.version", "ssl.cipher", "ssl.resumed"):
            self.assertTrue(dwarf[field].endswith("[dwarf]"), dwarf)
            self.assertEqual(table[field], dwarf[field].replace("[dwarf]", "[table go1.24]"))
        for name in ("crypto/internal/fips140/mlkem.(*EncapsulationKey768).encapsulate",
                     "crypto/ecdh.(*x25519Curve).ecdh", "crypto/ecdh.(*nistCurve).ecdh"):
            self.assertIn(name, files["tlsprof-go-tls-stripped"]["functions"])

    def test_boringssl_14_kyber_is_counted_exactly(self):
        """Android's BoringSSL 14 of the root (stripped libssl.so.0 and
        libcrypto.so.0): the workloads' handshake server on it, RSA in a plain
        chroot and ECDSA after pivot_root, and its client mode on the same
        library, which alone offers BoringSSL's X25519Kyber (0x6399,
        X25519Kyber768Draft00: X25519 and the draft Kyber768). Each hybrid
        handshake runs one X25519 and one Kyber768 (KYBER_encap, void: every
        call counts), and is on their hybrid group; P-256's exchange has no
        probed call, its group is the library's own answer."""
        binary = trixie.build_boringssl_server()
        groups = "X25519Kyber:X25519:P-256"
        placement = {"rsa": "chroot", "ecdsa": "pivot_root"}
        servers = {}
        for cert, way in placement.items():
            ready = os.path.join(self.shared, f"boringssl-{cert}.ready")
            proc = self.procs.start(trixie.CONTAINERS[way]([binary, "--cert", cert, "--groups", groups,
                                                            "--tickets", "off", "--ready-file", self.inside(ready)]),
                                    ready_file=ready)
            with open(ready) as f:
                servers[cert] = (proc, f.read().strip())
        agent, report_path, log_path = self.start_agent("boringssl", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="libssl.so.0")
        mix = {"X25519Kyber": ("X25519Kyber768Draft00", 4), "X25519": ("X25519", 3), "P-256": ("P-256", 2)}
        want, want_ops = collections.Counter(), collections.Counter()
        for cert, (_, addr) in servers.items():
            for client_group, (group, n) in mix.items():
                out = subprocess.run(trixie.chroot([binary, "--connect", addr, "--count", str(n), "--groups",
                                                    client_group]), capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
                key_type = "RSA" if cert == "rsa" else "ECDSA"
                want[(cert, "full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", group, key_type)] += n
                want_ops[(cert, "sign", SIGN_ALGORITHM[key_type])] += n
                if group != "P-256":
                    want_ops[(cert, "key_exchange", "X25519")] += n
                if group == "X25519Kyber768Draft00":
                    want_ops[(cert, "key_exchange", "Kyber768")] += n
        report = self.agent_report(agent, report_path, log_path, PROFILE_SECONDS + 60)
        pid_cert = {p.pid: cert for cert, (p, _) in servers.items()}
        rows = self.server_rows(report, pid_cert, "libssl.so.0")
        print("boringssl 14 handshakes:", dict(rows))
        self.assertEqual(rows, want)
        ops = self.handshake_operations(report, pid_cert)
        print("boringssl 14 operations:", dict(ops))
        self.assertEqual(ops, want_ops)
        files = {os.path.basename(f["path"]): f for f in report["agent"]["usage"]["files"]}
        self.assertIn("KYBER_encap", files["libcrypto.so.0"]["functions"])
        for f in files.values():
            self.assertNotIn("unknown", f["fields"].values(), f)


if __name__ == "__main__":
    unittest.main()
