"""Usage telemetry on the Go releases between Debian 12's 1.19 and Debian 13's
1.24: Go 1.21, 1.22 and 1.23 from bookworm-backports (scripts/install-deps.sh
unpacks them into /opt/tlsprof-go-backports). The workloads' Go TLS server is
built by each (its go.mod's go line raised to the toolchain's, so GODEBUG
defaults are that release's: 1.23 offers X25519Kyber768Draft00), ECDSA with
symbols and DWARF, RSA linked with -s -w, and all six run at once under one
`profile --usage`. The mix: `openssl s_client` (X25519 and P-256 over TLS 1.3,
ECDHE-RSA over TLS 1.2) and, against 1.23, its own client, which negotiates
X25519Kyber768Draft00 (crypto/internal/mlkem768 and X25519). Every row exact;
one Kyber768 and one X25519 operation per hybrid handshake; each release's
stripped binary reads tls.Conn from the table's row, which must equal the
DWARF of the binary beside it."""
import collections
import json
import os
import subprocess
import time
import unittest

from test_usage_trixie import KX_ALGORITHM, expected_operations
from tlsprof_testlib import USAGE_MIX, UsageAgentTestCase, build_once, raise_go_line, sources_under

GOBP = os.environ.get("TLSPROF_GO_BACKPORTS", "/opt/tlsprof-go-backports")
VERSIONS = ("1.21", "1.22", "1.23")
BUILD_DIR = "/var/tmp/tlsprof-go-versions"  # built binaries, kept across runs (a stamp of the sources)
PROFILE_SECONDS = 20


def goroot(version):
    return os.path.join(GOBP, f"usr/lib/go-{version}")


def build(version):
    """tlsprof-go-tls built by Go `version`: {"symbols": path, "stripped": path}."""
    out_dir = os.path.join(BUILD_DIR, version)
    src = os.path.join(out_dir, "src/workloads/go-tls")
    out = {"symbols": os.path.join(out_dir, f"tlsprof-go-tls-{version}"),
           "stripped": os.path.join(out_dir, f"tlsprof-go-tls-{version}-stripped")}
    env = {**os.environ, "GOROOT": goroot(version), "GOCACHE": os.path.join(out_dir, "cache"),
           "GOPATH": os.path.join(out_dir, "gopath"), "GOFLAGS": "-mod=mod", "GOPROXY": "off",
           "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOTELEMETRY": "off"}

    def build_both():
        raise_go_line(os.path.join(src, "go.mod"), version)
        for kind, ldflags in (("symbols", ""), ("stripped", "-s -w")):
            r = subprocess.run([os.path.join(goroot(version), "bin/go"), "build", f"-ldflags={ldflags}", "-o",
                                out[kind], "."], cwd=src, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise AssertionError(f"go {version} build failed:\n{r.stdout}\n{r.stderr}")
    build_once(out_dir, sources_under("workloads/go-tls", (".go", "go.mod")), list(out.values()), build_both,
               salt=version)
    return out


class GoVersionsUsageTest(UsageAgentTestCase):
    def test_go_121_to_123_mix_is_counted_exactly(self):
        for v in VERSIONS:
            self.assertTrue(os.path.exists(os.path.join(goroot(v), "bin/go")),
                            f"no Go {v} in {GOBP}: scripts/install-deps.sh unpacks bookworm-backports' golang-{v}")
        binaries = {v: build(v) for v in VERSIONS}
        servers = {}  # (version, cert) -> (process, port)
        for v in VERSIONS:
            for cert, kind in (("ecdsa", "symbols"), ("rsa", "stripped")):
                ready = self.procs.path(f"go-{v}-{cert}.ready")
                proc = self.procs.start([binaries[v][kind], "server", "--cert", cert, "--handshake-only",
                                         "--default-curves", "--ready-file", ready], ready_file=ready,
                                        env={**os.environ, "GOMAXPROCS": "1"})
                with open(ready) as f:
                    servers[(v, cert)] = (proc, int(f.read().strip().rsplit(":", 1)[1]))
        pid_server = {p.pid: key for key, (p, _) in servers.items()}
        probed = tuple(os.path.basename(b) for v in VERSIONS for b in binaries[v].values())
        agent, report_path, log_path = self.start_agent("go-versions", [str(p) for p in pid_server], PROFILE_SECONDS,
                                                        probed=probed)
        started = time.monotonic()
        want = collections.Counter()
        for v in VERSIONS:
            for cert, count, args, row in USAGE_MIX:
                for _ in range(count):
                    self.s_client(servers[(v, cert)][1], args, request=b"x", answer=None)
                want[(v, cert) + row] += count
        # Go 1.23's own client against its servers: X25519Kyber768Draft00.
        for cert in ("ecdsa", "rsa"):
            out = self.procs.path(f"kyber-{cert}.json")
            subprocess.run([binaries["1.23"]["symbols"], "handshakes", "--addr",
                            f"127.0.0.1:{servers[('1.23', cert)][1]}", "--duration", "1s", "--rate", "4",
                            "--concurrency", "1", "--output", out], check=True, capture_output=True, timeout=60)
            with open(out) as f:
                n = json.load(f)["handshakes"]
            self.assertGreater(n, 0)
            key_type = "RSA" if cert == "rsa" else "ECDSA"
            want[("1.23", cert, "full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519Kyber768Draft00", key_type)] += n
        self.assertLess(time.monotonic() - started, PROFILE_SECONDS - 3, "the client mix outran the profile window")
        report = self.agent_report(agent, report_path, log_path, PROFILE_SECONDS + 60)

        rows = self.server_rows(report, pid_server)
        print("handshakes:", "\n  ".join(f"{k}: {n}" for k, n in sorted(rows.items())))
        self.assertEqual(rows, want)
        ops = self.handshake_operations(report, pid_server)
        print("operations:", "\n  ".join(f"{k}: {n}" for k, n in sorted(ops.items())))
        # Every handshake is full; a hybrid runs its Kyber768 and X25519 halves.
        self.assertEqual(ops, expected_operations(
            want, lambda group: ["X25519", "Kyber768"] if group == "X25519Kyber768Draft00" else [KX_ALGORITHM[group]]))

        files = {os.path.basename(f["path"]): f for f in report["agent"]["usage"]["files"]}
        for v in VERSIONS:
            dwarf = files[os.path.basename(binaries[v]["symbols"])]["fields"]
            table = files[os.path.basename(binaries[v]["stripped"])]["fields"]
            print(f"go {v}:", dwarf, table)
            self.assertTrue(dwarf["go.version"].startswith(f"go{v}."), dwarf)
            for field in ("ssl.version", "ssl.cipher", "ssl.resumed"):
                self.assertTrue(dwarf[field].endswith("[dwarf]"), dwarf)
                self.assertEqual(table[field], dwarf[field].replace("[dwarf]", f"[table go{v}]"))
        self.assertEqual(report["agent"]["usage"]["go_unmatched_returns"], 0)


if __name__ == "__main__":
    unittest.main()
