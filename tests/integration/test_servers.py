"""Real TLS servers in other runtimes: node (OpenSSL 3 embedded in the node
binary) and a Go 1.19 crypto/tls server. Each must show up with the right
library kind and non-zero cipher, signature and key-exchange time, and the
agent must stay within its memory and latency budget while profiling node.
"""
import os
import subprocess
import unittest

from tlsprof_testlib import (BIN, SRC, Processes, assert_resource_budget, by_name, process_row, profile_json,
                             require_root, summarize)

PROFILE_SECONDS = 8


def samples_by_algorithm(proc):
    """Algorithm rows are per phase: add them up per algorithm."""
    out = {}
    for row in proc["algorithms"]:
        out[row["algorithm"]] = out.get(row["algorithm"], 0) + row["samples"]
    return out


class ServerTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def assert_crypto_buckets(self, report, pid):
        proc = process_row(report, pid)
        self.assertIsNotNone(proc, f"server {pid} missing from the report")
        buckets = by_name(proc["buckets"], "bucket")
        for bucket in ("cipher", "signature", "key_exchange"):
            self.assertGreater(buckets[bucket]["cpu_seconds"], 0,
                               f"{bucket} is zero for pid {pid}: {summarize(report, pid)}")
        return proc

    def test_node_https_server(self):
        certs = self.procs.path("certs")
        subprocess.run([os.path.join(SRC, "workloads/node/make-cert.sh"), certs, "rsa"], check=True,
                       capture_output=True)
        ready = self.procs.path("node.ready")
        server = self.procs.start(["node", os.path.join(SRC, "workloads/node/https-server.js"),
                                   "--cert", f"{certs}/cert.pem", "--key", f"{certs}/key.pem",
                                   "--ready-file", ready], ready_file=ready)
        with open(ready) as f:
            port = f.read().strip()
        self.procs.start([os.path.join(SRC, "workloads/node/run-load.sh"), port, str(2 * PROFILE_SECONDS + 8)])
        report = profile_json(self, ["--pid", str(server.pid), "--duration", str(PROFILE_SECONDS)])
        proc = self.assert_crypto_buckets(report, server.pid)
        libs = {(lib["kind"], lib["linkage"]) for lib in proc["libraries"]}
        self.assertIn(("openssl-3", "static"), libs)
        algorithms = samples_by_algorithm(proc)
        self.assertGreater(algorithms.get("RSA", 0), 0, summarize(report, server.pid))
        self.assertGreater(algorithms.get("AES-GCM", 0), 0, summarize(report, server.pid))
        stacks = report["agent"]
        # The foundation's budget (1% of a core at 999 Hz, 100 MB, report
        # within 1 s) is for the leaf-only agent: profile the same load again
        # with --no-stacks. The stack-aware cost is printed beside it.
        leaf = profile_json(self, ["--pid", str(server.pid), "--duration", str(PROFILE_SECONDS), "--no-stacks"])
        agent = leaf["agent"]
        print(f"node: TLS {proc['tls_cpu_seconds']:.3f} of {proc['cpu_seconds']:.3f} CPU-s; leaf-only agent "
              f"{agent['cpu_share_of_core'] * 100:.2f}% of a core, RSS {agent['max_rss_bytes'] / 1e6:.1f} MB, report "
              f"after {agent['report_latency_seconds'] * 1000:.0f} ms; with stacks {stacks['cpu_share_of_core'] * 100:.2f}%"
              f" (BPF {stacks['bpf_seconds']:.3f} s, {stacks['cpu_share_of_core'] / agent['cpu_share_of_core']:.2f}x the "
              f"leaf-only agent; bench/unwind_cost.py measures it), RSS {stacks['max_rss_bytes'] / 1e6:.1f} MB, report "
              f"after {stacks['report_latency_seconds'] * 1000:.0f} ms")
        assert_resource_budget(self, "leaf-only agent max_rss_bytes", agent["max_rss_bytes"], 100 * 1000 * 1000)
        assert_resource_budget(self, "agent max_rss_bytes", stacks["max_rss_bytes"], 100 * 1000 * 1000)
        assert_resource_budget(self, "leaf-only agent report_latency_seconds", agent["report_latency_seconds"], 1.0)
        assert_resource_budget(self, "agent report_latency_seconds", stacks["report_latency_seconds"], 1.0)
        assert_resource_budget(self, "leaf-only agent cpu_share_of_core", agent["cpu_share_of_core"], 0.01, agent)

    def test_go_tls_server(self):
        go_tls = os.path.join(BIN, "tlsprof-go-tls")
        ready = self.procs.path("go.ready")
        server = self.procs.start([go_tls, "server", "--cert", "rsa", "--ready-file", ready], ready_file=ready)
        with open(ready) as f:
            addr = f.read().strip()
        self.procs.start([go_tls, "client", "--addr", addr, "--duration", f"{PROFILE_SECONDS + 6}s",
                          "--handshake-rate", "100"])
        report = profile_json(self, ["--pid", str(server.pid), "--duration", str(PROFILE_SECONDS)])
        proc = self.assert_crypto_buckets(report, server.pid)
        libs = {lib["kind"] for lib in proc["libraries"]}
        self.assertEqual(libs, {"go"})
        algorithms = samples_by_algorithm(proc)
        for alg in ("RSA", "X25519", "AES-GCM", "ChaCha20-Poly1305"):
            self.assertGreater(algorithms.get(alg, 0), 0, f"{alg}: {summarize(report, server.pid)}")


if __name__ == "__main__":
    unittest.main()
