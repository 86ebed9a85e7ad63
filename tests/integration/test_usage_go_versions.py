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
import hashlib
import json
import os
import shutil
import subprocess
import time
import unittest

from tlsprof_testlib import SRC, USAGE_MIX, UsageAgentTestCase

GOBP = os.environ.get("TLSPROF_GO_BACKPORTS", "/opt/tlsprof-go-backports")
VERSIONS = ("1.21", "1.22", "1.23")
BUILD_DIR = "/var/tmp/tlsprof-go-versions"  # built binaries, kept across runs (a stamp of the sources)
PROFILE_SECONDS = 20
SIGN_ALGORITHM = {"rsa": "RSA-2048", "ecdsa": "ECDSA-P256"}
KX_ALGORITHM = {"X25519": "X25519", "P-256": "ECDHE-P256", "X25519Kyber768Draft00": "X25519"}


def goroot(version):
    return os.path.join(GOBP, f"usr/lib/go-{version}")


def build(version):
    """tlsprof-go-tls built by Go `version`: {"symbols": path, "stripped": path}."""
    src_dir = os.path.join(SRC, "workloads/go-tls")
    names = sorted(n for n in os.listdir(src_dir) if n.endswith(".go") or n == "go.mod")
    digest = hashlib.sha256(version.encode())
    for name in names:
        with open(os.path.join(src_dir, name), "rb") as f:
            digest.update(name.encode() + f.read())
    out_dir = os.path.join(BUILD_DIR, version)
    out = {"symbols": os.path.join(out_dir, f"tlsprof-go-tls-{version}"),
           "stripped": os.path.join(out_dir, f"tlsprof-go-tls-{version}-stripped")}
    stamp = os.path.join(out_dir, "sources.sha256")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and all(map(os.path.exists, out.values())):
        return out
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(os.path.join(out_dir, "src"))
    for name in names:
        with open(os.path.join(src_dir, name)) as f:
            text = f.read()
        if name == "go.mod":
            text = text.replace("\ngo 1.19\n", f"\ngo {version}\n")
        with open(os.path.join(out_dir, "src", name), "w") as f:
            f.write(text)
    env = {**os.environ, "GOROOT": goroot(version), "GOCACHE": os.path.join(out_dir, "cache"),
           "GOPATH": os.path.join(out_dir, "gopath"), "GOFLAGS": "-mod=mod", "GOPROXY": "off",
           "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOTELEMETRY": "off"}
    for kind, ldflags in (("symbols", ""), ("stripped", "-s -w")):
        r = subprocess.run([os.path.join(goroot(version), "bin/go"), "build", f"-ldflags={ldflags}", "-o", out[kind],
                            "."], cwd=os.path.join(out_dir, "src"), env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"go {version} build failed:\n{r.stdout}\n{r.stderr}")
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
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
        want_ops = collections.Counter()
        for (v, cert, _, _, _, group, _), n in want.items():
            want_ops[(v, cert, "sign", SIGN_ALGORITHM[cert])] += n
            want_ops[(v, cert, "key_exchange", KX_ALGORITHM[group])] += n
            if group == "X25519Kyber768Draft00":
                want_ops[(v, cert, "key_exchange", "Kyber768")] += n
        ops = self.handshake_operations(report, pid_server)
        print("operations:", "\n  ".join(f"{k}: {n}" for k, n in sorted(ops.items())))
        self.assertEqual(ops, want_ops)

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
