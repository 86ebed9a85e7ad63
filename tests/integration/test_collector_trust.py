"""The collector's trust boundary under attack, over real mTLS (docs/fleet.md, "Identity" and "Bounds"): 10,000
forged host names from one relay identity give their --max-hosts slots and agent keys up after
--idle-expiry-seconds; 2,000 concurrent 4 MiB Submits (tlsprof-flood, collector/loadgen/flood.cc) leave the collector inside a cgroup
memory limit, never OOM-killed, while an honest agent keeps being counted.
"""
import json
import os
import subprocess
import sys
import threading
import time
import unittest

from tlsprof_testlib import BIN, SRC, Processes, require_root
from test_collector import Client, Collector, key, load_proto, make_report

RELAY = "tlsprof-loadgen"
HONEST = "honest-host"
FORGED_HOSTS = 10000
MAX_HOSTS = 100
IDLE_EXPIRY_SECONDS = 15
# The flood: 2,000 Submits of 4 MiB in flight for FLOOD_SECONDS (each answered call is sent again), half from the
# relay identity (its rate limit waits for the decoded hostname) and half from a plain agent identity (rate-limited
# before a byte is read).
FLOOD_CALLS = 2000
FLOOD_BYTES = 4 << 20
FLOOD_SECONDS = 15
# The collector's memory limit in the test (a cgroup v1 memory controller): half the packaged 2 GiB, with
# --max-request-memory at 192 MiB: requests hold at most twice that (its reservations, and gRPC's quota of the same
# size), beside the threads and the rest of the collector.
MEMORY_LIMIT = 1 << 30
MAX_REQUEST_MEMORY = 192 << 20
CGROUP_ROOT = "/sys/fs/cgroup/memory"


def make_pki(procs, *agents):
    pki = procs.path("pki")
    subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki, *agents], check=True,
                   capture_output=True)
    return pki


def tls_flags(pki):
    return ["--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/collector.crt", "--tls-key", f"{pki}/collector.key"]


class MemoryCgroup:
    """A cgroup v1 memory controller with a hard limit; removed (empty) at close."""

    def __init__(self, limit):
        self.path = os.path.join(CGROUP_ROOT, f"tlsprof-trust-{os.getpid()}")
        os.makedirs(self.path, exist_ok=True)
        self.write("memory.limit_in_bytes", str(limit))

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def oom_kills(self):
        fields = dict(line.split() for line in self.read("memory.oom_control").splitlines())
        return int(fields.get("oom_kill", 0))

    def close(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def vm_hwm_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class HostSlotExpiryTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)
        self.pb = load_proto(self.procs.tmp.name)
        self.pki = make_pki(self.procs, RELAY, f"agent-1={HONEST}")

    def test_forged_hosts_do_not_hold_slots_past_their_expiry(self):
        collector = Collector(self.procs, [*tls_flags(self.pki), "--relay-identity", RELAY, "--host-labels",
                                           "--max-hosts", str(MAX_HOSTS), "--idle-expiry-seconds",
                                           str(IDLE_EXPIRY_SECONDS)]).start()
        relay = Client(self.pb, collector.grpc_port, self.pki, RELAY)
        honest = Client(self.pb, collector.grpc_port, self.pki, "agent-1")
        self.addCleanup(relay.close)
        self.addCleanup(honest.close)
        start = time.monotonic()
        results = {}
        futures = []
        for i in range(FORGED_HOSTS):
            request = self.pb.SubmitRequest(report=make_report(self.pb, 1, os.urandom(16), "svc", f"forged-{i}"))
            futures.append(relay.submit.future(request, timeout=60))
            if len(futures) == 500:
                for f in futures:
                    name = self.pb.SubmitResponse.Result.Name(f.result().result)
                    results[name] = results.get(name, 0) + 1
                futures = []
        flood_seconds = time.monotonic() - start
        self.assertEqual(results, {"ACCEPTED": FORGED_HOSTS})
        m = collector.metrics()
        hosts = {dict(k[1])["host"] for k in m if k[0] == "tlsprof_host_busy_cpu_seconds_total"}
        self.assertEqual(len(hosts - {"(overflow)"}), MAX_HOSTS)
        # Within the expiry every slot and agent key is held: the honest host is refused or counted as overflow.
        early = honest.send(make_report(self.pb, 1, os.urandom(16), "svc", HONEST))
        print(f"\n{FORGED_HOSTS} forged hosts sent in {flood_seconds:.1f} s; the honest host then: {early[0]} "
              f"({early[1]})", file=sys.stderr)
        if time.monotonic() - start < IDLE_EXPIRY_SECONDS - 2:
            self.assertNotIn(key("tlsprof_host_busy_cpu_seconds_total", host=HONEST), collector.metrics())
        # Past the expiry of the last forged host, the honest host gets its own slot (and agent key).
        time.sleep(max(0.0, start + flood_seconds + IDLE_EXPIRY_SECONDS + 1 - time.monotonic()))
        result, details, _ = honest.send(make_report(self.pb, 2, os.urandom(16), "svc", HONEST))
        self.assertEqual(result, "ACCEPTED", details)
        m = collector.metrics()
        hosts = {dict(k[1])["host"] for k in m if k[0] == "tlsprof_host_busy_cpu_seconds_total"}
        self.assertIn(HONEST, hosts)
        self.assertFalse([h for h in hosts if h.startswith("forged-")], "expired hosts keep their series")
        print(f"after {IDLE_EXPIRY_SECONDS} s idle: host series {sorted(hosts)}", file=sys.stderr)


class MemoryFloodTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        # Removed after the processes in it are stopped (cleanups run last first).
        self.cgroup = MemoryCgroup(MEMORY_LIMIT)
        self.addCleanup(self.cgroup.close)
        self.procs = Processes()
        self.addCleanup(self.procs.close)
        self.pb = load_proto(self.procs.tmp.name)
        self.pki = make_pki(self.procs, RELAY, "flooder", f"agent-1={HONEST}")

    def flood(self, name, calls, out):
        argv = [os.path.join(BIN, "tlsprof-flood"), "--collector", f"127.0.0.1:{self.collector.grpc_port}",
                "--tls-ca", f"{self.pki}/ca.crt", "--tls-cert", f"{self.pki}/{name}.crt", "--tls-key",
                f"{self.pki}/{name}.key", "--calls", str(calls), "--bytes", str(FLOOD_BYTES), "--channels", "8",
                "--seconds", str(FLOOD_SECONDS), "--deadline-seconds", "60"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=FLOOD_SECONDS + 120)
        out[name] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr}

    def test_concurrent_4mib_messages_stay_under_the_memory_limit(self):
        self.collector = Collector(self.procs, [*tls_flags(self.pki), "--relay-identity", RELAY,
                                                "--max-request-memory", str(MAX_REQUEST_MEMORY)])
        # The collector runs in the cgroup from its first instruction: the shell moves itself there, then execs.
        argv = self.collector.argv
        self.collector.argv = lambda: ["sh", "-c", f'echo $$ > {self.cgroup.path}/cgroup.procs && exec "$@"', "sh",
                                       *argv()]
        self.collector.start()
        honest = Client(self.pb, self.collector.grpc_port, self.pki, "agent-1")
        self.addCleanup(honest.close)
        instance = os.urandom(16)
        self.assertEqual(honest.send(make_report(self.pb, 1, instance, "svc", HONEST))[0], "ACCEPTED")
        before = self.collector.metrics()[key("tlsprof_collector_reports_total", result="accepted")]

        out = {}
        floods = [threading.Thread(target=self.flood, args=(name, FLOOD_CALLS // 2, out))
                  for name in (RELAY, "flooder")]
        start = time.monotonic()
        for t in floods:
            t.start()
        # The honest agent sends every 0.25 s while the flood lasts, retrying as a real agent does.
        honest_results = {}
        seq = 2
        while any(t.is_alive() for t in floods):
            result = honest.send(make_report(self.pb, seq, instance, "svc", HONEST), timeout=10)[0]
            honest_results[result] = honest_results.get(result, 0) + 1
            if result == "ACCEPTED":
                seq += 1
            time.sleep(0.25)
        for t in floods:
            t.join()
        seconds = time.monotonic() - start
        alive = self.collector.proc.poll() is None
        hwm = vm_hwm_bytes(self.collector.proc.pid) if alive else 0
        peak = int(self.cgroup.read("memory.max_usage_in_bytes"))
        oom = self.cgroup.oom_kills()
        print(f"\nflood: {json.dumps(out)}\n{seconds:.1f} s; collector alive {alive}, VmHWM {hwm >> 20} MiB, "
              f"cgroup peak {peak >> 20} MiB of {MEMORY_LIMIT >> 20} MiB, OOM kills {oom}; honest agent during "
              f"the flood: {honest_results}", file=sys.stderr)
        self.assertTrue(alive, f"the collector died: {Processes.log(self.collector.proc)}")
        self.assertEqual(oom, 0)
        self.assertLess(hwm, MEMORY_LIMIT)
        for name in (RELAY, "flooder"):
            self.assertNotIn("error", out[name], out[name])
            self.assertGreaterEqual(out[name]["answered"], FLOOD_CALLS // 2)
            self.assertNotIn("OK", out[name]["codes"])
        m = self.collector.metrics()
        self.assertGreater(honest_results.get("ACCEPTED", 0), 0, honest_results)
        self.assertGreaterEqual(m[key("tlsprof_collector_reports_total", result="accepted")] - before,
                                honest_results.get("ACCEPTED", 0))
        # And after it, the honest agent is counted at once.
        self.assertEqual(honest.send(make_report(self.pb, seq, instance, "svc", HONEST))[0], "ACCEPTED")


if __name__ == "__main__":
    unittest.main()
