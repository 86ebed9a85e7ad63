"""TLS CPU per handshake (issue 4) against servers that time their own
handshakes: `tlsprof-openssl-server` (Debian's stripped OpenSSL 3, over
memory BIOs, so each SSL_do_handshake() call's thread CPU is the library's)
and `tlsprof-go-tls server --stats-file` (crypto/tls, each Handshake timed on
its locked thread less the connection's I/O), with ECDSA and RSA
certificates, each loaded with full handshakes by a client of its own (the Go
study's handshake-only load) under `profile --usage`.

The truth comes from a twin of each server that runs beside it, on copies of
its files (a copy of the Go binary; copies of libssl.so.3 and libcrypto.so.3
through LD_LIBRARY_PATH), which the agent neither probes nor is asked about:
the probed server's own figure includes its probes' traps (kernel time, which
TLS CPU rightly leaves out), and this VM's CPU cost of a handshake drifts by
10-20% from one minute to the next, so the truth must come from the same
seconds.

The agent's handshake counts must equal the probed servers' own; its TLS CPU
of the handshake phase per handshake must be near the twins', and so must the
RSA/ECDSA ratio. The bounds guard against a broken attribution (a lost phase,
uncounted handshakes, a stripped library's frames unnamed); the issue's 15%
on the ratio is measured by bench/usage_handshake_cost.py (bench/README.md)."""
import json
import os
import shutil
import subprocess
import unittest

from tlsprof_testlib import BIN, UsageAgentTestCase

GO_TLS = os.path.join(BIN, "tlsprof-go-tls")
OPENSSL_SERVER = os.path.join(BIN, "tlsprof-openssl-server")
LIBDIR = "/usr/lib/x86_64-linux-gnu"

LOAD_SECONDS = 15
RATE = 100  # full handshakes a second per server: ~1,500 each
# Three times the default 999 Hz: 1,500 handshakes of 0.4-2 ms are 1,800-9,000
# samples of TLS CPU per server.
FREQUENCY = 2999
# Guards against a broken attribution, not the 15% (that is
# bench/usage_handshake_cost.py's, one server and its twin at a time): with
# four servers, four twins' and eight clients' worth of load on 2 vCPUs a
# twin's cost drifts from its server's too. Seen in three runs: per handshake
# -16.2% to +10.7%, RSA/ECDSA -2.2% to +32.1% (OpenSSL). What each side
# counts that the other does not (Go's netFD code under crypto/tls frames,
# in the agent's only; kernel entries inside OpenSSL's calls, in the
# server's thread CPU only) adds a few percent.
ABSOLUTE_BOUND = 0.35
RATIO_BOUND = 0.40

class UsageCostTest(UsageAgentTestCase):
    def twin_files(self):
        """A copy of the Go binary and a directory with copies of Debian's
        libssl.so.3 and libcrypto.so.3: files the agent has not probed."""
        go = self.procs.path("tlsprof-go-tls-twin")
        shutil.copy(GO_TLS, go)
        libs = self.procs.path("twin-lib")
        os.makedirs(libs)
        for name in ("libssl.so.3", "libcrypto.so.3"):
            shutil.copy(os.path.join(LIBDIR, name), libs)
        return go, libs

    def start_server(self, library, cert, twin):
        name = f"{library}-{cert}-{'twin' if twin else 'probed'}"
        ready, stats = self.procs.path(f"{name}.ready"), self.procs.path(f"{name}.json")
        env = {**os.environ, "GOMAXPROCS": "1"}
        if library == "go":
            argv = [self.twin_go if twin else GO_TLS, "server", "--cert", cert, "--handshake-only", "--tickets=false",
                    "--ready-file", ready, "--stats-file", stats]
        else:
            argv = [OPENSSL_SERVER, "--cert", cert, "--tickets", "off", "--ready-file", ready, "--stats-file", stats]
            if twin:
                env["LD_LIBRARY_PATH"] = self.twin_libs
        proc = self.procs.start(argv, ready_file=ready, env=env)
        if twin and library == "openssl":
            with open(f"/proc/{proc.pid}/maps") as f:
                self.assertIn(os.path.join(self.twin_libs, "libssl.so.3"), f.read(), "the twin maps the copy")
        with open(ready) as f:
            return proc, f.read().strip(), stats

    def measure(self, library):
        """An ECDSA and an RSA server of `library` and their twins, each
        loaded by a client of its own, the two probed ones under the agent:
        {cert: (agent's count, agent's TLS us per handshake, probed server's
        own stats, twin's own stats)}."""
        servers = {(cert, twin): self.start_server(library, cert, twin)
                   for cert in ("ecdsa", "rsa") for twin in (False, True)}
        probed = {cert: servers[(cert, False)][0].pid for cert in ("ecdsa", "rsa")}
        agent, report_path, log_path = self.start_agent(
            library, [str(pid) for pid in probed.values()], LOAD_SECONDS + 8,
            probed="tlsprof-go-tls" if library == "go" else "libssl.so.3", extra=("--frequency", str(FREQUENCY)))
        loads = [subprocess.Popen([self.client, "handshakes", "--addr", addr, "--duration", f"{LOAD_SECONDS}s",
                                   "--rate", str(RATE), "--concurrency", "2"], stdout=subprocess.DEVNULL)
                 for _, addr, _ in servers.values()]
        for load in loads:
            self.assertEqual(load.wait(timeout=LOAD_SECONDS + 60), 0, "a handshake client failed")
        report = self.agent_report(agent, report_path, log_path, LOAD_SECONDS + 60)
        own = {}
        for key, (proc, _, stats_path) in servers.items():
            self.procs.stop(proc)
            self.assertEqual(proc.returncode, 0, self.procs.log(proc))
            with open(stats_path) as f:
                own[key] = json.load(f)
            self.assertGreater(own[key]["handshakes"], RATE * LOAD_SECONDS * 0.8, (key, own[key]))
            self.assertEqual(own[key]["resumed"], 0, (key, own[key]))
        result = {}
        for cert, pid in probed.items():
            count = sum(h["count"] for h in report["handshakes"] if h["pid"] == pid)
            tls = sum(c["handshake_tls_cpu_seconds"] for c in report["handshake_cpu"] if c["pid"] == pid)
            self.assertGreater(count, 0, f"{library} {cert}: no handshake counted")
            result[cert] = (count, tls / count * 1e6, own[(cert, False)], own[(cert, True)])
        return result

    def test_tls_cpu_per_handshake_matches_the_servers_own(self):
        self.twin_go, self.twin_libs = self.twin_files()
        # The clients: another copy of the Go binary (not probed either).
        self.client = self.procs.path("handshake-client")
        shutil.copy(GO_TLS, self.client)
        per_us = {}
        for library in ("go", "openssl"):
            for cert, (count, agent_us, probed, twin) in self.measure(library).items():
                self.assertEqual(count, probed["handshakes"], f"{library} {cert}: the agent's count, the server's")
                own_us = twin["handshake_cpu_seconds"]["full"] / twin["handshakes"] * 1e6
                probed_us = probed["handshake_cpu_seconds"]["full"] / probed["handshakes"] * 1e6
                per_us[(library, cert)] = (agent_us, own_us)
                print(f"{library:<7} {cert:<5} handshakes {count}: agent TLS {agent_us:7.1f} us, the twin's own "
                      f"{own_us:7.1f} us ({agent_us / own_us - 1:+.1%}); the probed server's own {probed_us:7.1f} us")
        # RSA/ECDSA: (agent's, twin's own).
        ratios = {library: tuple(per_us[(library, "rsa")][i] / per_us[(library, "ecdsa")][i] for i in (0, 1))
                  for library in ("go", "openssl")}
        for library, (agent_ratio, own_ratio) in ratios.items():
            print(f"{library:<7} RSA/ECDSA: agent {agent_ratio:.2f}, own {own_ratio:.2f} "
                  f"({agent_ratio / own_ratio - 1:+.1%})")
        for (library, cert), (agent_us, own_us) in per_us.items():
            self.assertLess(abs(agent_us / own_us - 1), ABSOLUTE_BOUND, f"{library} {cert}: TLS CPU per handshake")
        for library, (agent_ratio, own_ratio) in ratios.items():
            self.assertLess(abs(agent_ratio / own_ratio - 1), RATIO_BOUND, f"{library}: RSA/ECDSA per handshake")


if __name__ == "__main__":
    unittest.main()
