"""Faults and bounds of the fleet pipeline (issue 7), each against the real
agent daemon and the real collector:

- the spool's disk fills up (a tiny tmpfs) while the collector is down;
- the collector stalls (a TCP listener that accepts and never answers);
- the agent's clock is skewed (libfaketime: +1 h and -1 day).

The collector under a cardinality attack is test_faults_cardinality.py (it
saturates the CPUs, so it runs alone; these mostly wait on windows and
deadlines, so they run beside other tests). See docs/fleet.md ("Agent daemon", "Clock skew", "Bounds") for the behaviour
these tests pin down.
"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import unittest
import zlib

import prometheus_harness
from test_collector import Collector, parse_metrics
from tlsprof_testlib import AGENT, BIN, Processes, free_port, require_root

PERIOD_NS = 10**9 // 99
SEALED = re.compile(r"sealed batch sequence=(\d+) window=\[(-?\d+),(-?\d+)\) busy_samples=(\d+) tls_samples=(\d+)")
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def agent_metric(text, name, **labels):
    """The value of one series in the agent's exposition (0 when absent)."""
    want = tuple(sorted(labels.items()))
    return parse_metrics(text).get((name, want), 0.0)


def wait_for(what, predicate, timeout, procs=(), interval=0.2):
    """Polls `predicate` until true; fails naming `what` (with the logs of
    `procs`, or the one that died)."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited with {proc.returncode} while waiting for {what}:\n"
                                     f"{Processes.log(proc)}")
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.args[0]}:\n{Processes.log(p)}" for p in procs)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")
        time.sleep(interval)


def read_log(log_path):
    with open(log_path, errors="replace") as f:
        return f.read()


def sealed_lines(log_path):
    """[(sequence, start_ns, end_ns, busy, tls)] of an agent log's sealed lines."""
    return [tuple(int(x) for x in m.groups()) for m in SEALED.finditer(read_log(log_path))]


def check_batch_file(path):
    """Decodes a spool batch file's header (agent/ship/spool.cc): magic,
    payload length, CRC-32. Returns an error string, or None when intact."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 20 or data[:8] != b"TLSPSPL1":
        return f"{path}: bad header"
    length, crc = struct.unpack("<QI", data[8:20])
    payload = data[20:]
    if len(payload) != length:
        return f"{path}: payload {len(payload)} bytes, header says {length}"
    if zlib.crc32(payload) != crc:
        return f"{path}: checksum mismatch"
    return None


class StallListener:
    """A hung collector: accepts TCP connections, completes the HTTP/2
    connection preface (an empty SETTINGS frame and the ACK of the client's),
    so that gRPC sends its call, then reads and discards everything and never
    answers. The agent's call can only end by its deadline."""

    def __init__(self, port):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.accepted = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn):
        try:
            # Frame header: 24-bit length, type 4 (SETTINGS), flags (1 = ACK), stream 0.
            conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # a FIN now, as when a process dies; wakes _serve's recv
            except OSError:
                pass
            conn.close()
        self.thread.join(5)


class FaultsPipelineTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        for binary in (AGENT, os.path.join(BIN, "tlsprof-collector")):
            self.assertTrue(os.path.exists(binary), f"{binary} is not built")
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def start_agent(self, collector_port, state_dir, interval="1", env=None, prefix=()):
        metrics_port = free_port()
        proc = self.procs.start(
            [*prefix, AGENT, "--log-level", "info", "run", "--insecure", "--collector",
             f"127.0.0.1:{collector_port}", "--interval", interval, "--frequency", "99", "--metrics-listen",
             f"127.0.0.1:{metrics_port}", "--state-dir", state_dir], port=metrics_port, env=env,
            http_path="/metrics")
        proc.metrics = f"127.0.0.1:{metrics_port}"
        return proc

    def scrape_agent(self, agent):
        start = time.monotonic()
        text = prometheus_harness.scrape(agent.metrics, timeout=5)
        return text, time.monotonic() - start

    def stop_timed(self, proc, budget):
        """SIGTERM; asserts a clean exit within `budget` seconds; returns the time taken."""
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(budget)
        except subprocess.TimeoutExpired:
            self.fail(f"{proc.args} did not exit within {budget} s of SIGTERM:\n{Processes.log(proc)}")
        self.assertEqual(rc, 0, Processes.log(proc))
        return time.monotonic() - start

    # ------------------------------------------------------------------ disk

    def test_spool_disk_full(self):
        """The spool's filesystem fills up while the collector is down: the
        agent keeps sampling and serving /metrics, drops the oldest batches to
        make room (counted), leaves no torn file; with no batch left to drop a
        window is counted as unpersisted. Once the collector is up, the spool
        drains with no duplicate and nothing invalid at the collector."""
        mnt = self.procs.path("spoolfs")
        os.makedirs(mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tlsprof-spool-test", mnt], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mnt], check=False)
        state = os.path.join(mnt, "state")
        grpc_port = free_port()
        agent = self.start_agent(grpc_port, state, interval="0.5")

        def counters():
            text, took = self.scrape_agent(agent)
            self.assertLess(took, 3, "the agent's /metrics answered slowly")
            return {name: agent_metric(text, "tlsprof_agent_batches_total", result=name)
                    for name in ("sealed", "accepted", "dropped", "unpersisted")} | {
                "windows": agent_metric(text, "tlsprof_agent_windows_total")}

        # 1. The disk fills: the oldest batches make room for the newest.
        wait_for("batches dropped for room on the full spool disk",
                 lambda: counters()["dropped"] >= 3, 60, [agent])
        before = counters()
        wait_for("windows to go on while the disk is full",
                 lambda: counters()["windows"] >= before["windows"] + 3, 30, [agent])
        self.assertGreater(counters()["sealed"], before["sealed"], "no window sealed on the full disk")
        self.assertIn("the spool's disk is full", Processes.log(agent))
        spool = os.path.join(state, "spool")
        batches = [n for n in os.listdir(spool) if n.endswith(".batch")]
        self.assertTrue(batches, "the newest batches should be kept")
        for name in batches:
            try:
                self.assertIsNone(check_batch_file(os.path.join(spool, name)))
            except FileNotFoundError:
                pass  # dropped for room between listdir and open
        self.assertFalse(os.path.exists(os.path.join(spool, "corrupt")), "nothing should have been quarantined")

        # 2. The collector comes up: the spool drains.
        collector = Collector(self.procs, ["--insecure"])
        collector.grpc_port = grpc_port
        collector.start()
        wait_for("the spool to drain", lambda: counters()["accepted"] >= 3 and not any(
            n.endswith(".batch") for n in os.listdir(spool)), 60, [agent, collector.proc])

        # 3. Filled by something else, with nothing of ours left to drop: a
        # window cannot be written at all and is counted as unpersisted.
        filler_path = os.path.join(mnt, "filler")
        stop_filling = threading.Event()

        def fill():
            with open(filler_path, "ab", buffering=0) as f:
                while not stop_filling.is_set():
                    try:
                        f.write(b"\0" * 4096)
                    except OSError:
                        time.sleep(0.02)  # full; take whatever the agent frees

        filler = threading.Thread(target=fill, daemon=True)
        filler.start()
        try:
            wait_for("a window counted as unpersisted", lambda: counters()["unpersisted"] >= 1, 60, [agent])
            during = counters()
            wait_for("windows to go on with the disk full of someone else's data",
                     lambda: counters()["windows"] >= during["windows"] + 2, 30, [agent])
        finally:
            stop_filling.set()
            filler.join(5)
            os.unlink(filler_path)

        # 4. Space is back: windows are sealed and shipped again.
        after = counters()
        wait_for("shipping to resume after space frees",
                 lambda: counters()["accepted"] >= after["accepted"] + 2, 60, [agent, collector.proc])
        self.stop_timed(agent, 15)
        m = collector.metrics()

        def collected(result):
            return m.get(("tlsprof_collector_reports_total", (("result", result),)), 0)

        sealed = sealed_lines(agent.log_path)
        sequences = [s[0] for s in sealed]
        self.assertEqual(len(sequences), len(set(sequences)), "a sequence was sealed twice")
        log = Processes.log(agent)
        self.assertEqual(collected("duplicate"), 0, "the collector saw a batch twice")
        self.assertEqual(collected("invalid"), 0, "the collector got a corrupt batch")
        # Everything sealed was either accepted once or dropped for room.
        dropped = len(re.findall(r"the spool's disk is full: dropped", read_log(agent.log_path)))
        self.assertEqual(collected("accepted") + dropped, len(sealed), log)
        unpersisted = len(re.findall(r"cannot seal", read_log(agent.log_path)))
        self.assertGreaterEqual(unpersisted, 1)
        print(f"\nspool disk full: {len(sealed)} windows sealed, {dropped} dropped for room, {unpersisted} "
              f"unpersisted, {int(collected('accepted'))} accepted")

    # ----------------------------------------------------------------- stall

    def test_stalled_collector(self):
        """A collector that accepts and never answers: the agent's send times
        out (a deadline), windows spool, sampling and /metrics stay live, and
        SIGTERM exits within the flush budget. Then the stalled listener is
        replaced by a real collector on the same port while a second run of
        the agent is still retrying: every window sealed in both runs arrives
        exactly once."""
        grpc_port = free_port()
        stall = StallListener(grpc_port)
        self.addCleanup(stall.close)
        state = self.procs.path("agent-state")

        def counters(agent):
            text, took = self.scrape_agent(agent)
            self.assertLess(took, 3, "the agent's /metrics answered slowly")
            return {"sealed": agent_metric(text, "tlsprof_agent_batches_total", result="sealed"),
                    "accepted": agent_metric(text, "tlsprof_agent_batches_total", result="accepted"),
                    "errors": agent_metric(text, "tlsprof_agent_send_errors_total"),
                    "spooled": agent_metric(text, "tlsprof_agent_spool_batches"),
                    "windows": agent_metric(text, "tlsprof_agent_windows_total")}

        # Run 1: stalled throughout; the RPC deadline (10 s) fails the attempt.
        agent = self.start_agent(grpc_port, state)
        start = time.monotonic()
        wait_for("a send to time out", lambda: counters(agent)["errors"] >= 1, 40, [agent])
        timed_out_after = time.monotonic() - start
        self.assertTrue(stall.accepted, "the agent never connected to the stalled listener")
        c = counters(agent)
        self.assertGreaterEqual(c["windows"], 5, f"sampling stopped while the send hung: {c}\n{Processes.log(agent)}")
        self.assertGreaterEqual(c["spooled"], 5, "windows were not spooled")
        self.assertIn("DEADLINE_EXCEEDED", read_log(agent.log_path))
        took = self.stop_timed(agent, 18)  # the flush budget is 10 s, plus closing the last window
        run1 = sealed_lines(agent.log_path)

        # Run 2: starts against the stall, then the listener is replaced.
        agent = self.start_agent(grpc_port, state)
        wait_for("run 2 to fail a send", lambda: counters(agent)["errors"] >= 1, 40, [agent])
        stall.close()
        collector = Collector(self.procs, ["--insecure"])
        collector.grpc_port = grpc_port
        collector.start()
        replaced = time.monotonic()
        wait_for("the spool to drain into the real collector",
                 lambda: counters(agent)["accepted"] >= len(run1) + 2 and counters(agent)["spooled"] == 0, 90,
                 [agent, collector.proc])
        drained_after = time.monotonic() - replaced
        self.stop_timed(agent, 15)
        run2 = sealed_lines(agent.log_path)
        sequences = [s[0] for s in run1 + run2]
        self.assertEqual(len(sequences), len(set(sequences)), "a sequence was sealed twice")
        m = collector.metrics()
        accepted = m.get(("tlsprof_collector_reports_total", (("result", "accepted"),)), 0)
        duplicates = m.get(("tlsprof_collector_reports_total", (("result", "duplicate"),)), 0)
        self.assertEqual(accepted, len(sequences), "every sealed window arrives exactly once")
        self.assertEqual(duplicates, 0)
        busy = sum(v for (name, _), v in m.items() if name == "tlsprof_busy_cpu_seconds_total")
        self.assertAlmostEqual(busy, sum(s[3] for s in run1 + run2) * PERIOD_NS / 1e9, places=6)
        print(f"\nstalled collector: first send timed out after {timed_out_after:.1f} s, SIGTERM exit in "
              f"{took:.1f} s, spool drained {drained_after:.1f} s after the replacement; {len(sequences)} windows, "
              f"{int(accepted)} accepted once")

    # ------------------------------------------------------------------ skew

    def test_clock_skew(self):
        """Two agents under libfaketime, one an hour ahead and one a day
        behind, each in its own UTS namespace (its own hostname, so its own
        agent key): both have every window counted once, and the collector
        shows each skew (/api/v1/agents, tlsprof_collector_clock_skew_seconds,
        tlsprof_collector_skewed_reports_total)."""
        self.assertTrue(os.path.exists(FAKETIME_LIB), f"{FAKETIME_LIB} missing: apt-get install faketime")
        collector = Collector(self.procs, ["--insecure"]).start()
        agents = {}
        for host, offset, skew in (("skew-ahead", "+1h", 3600), ("skew-behind", "-1d", -86400)):
            env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME=offset, FAKETIME_DONT_FAKE_MONOTONIC="1",
                       FAKETIME_NO_CACHE="1")
            uts = ("unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"')
            agents[host] = (self.start_agent(collector.grpc_port, self.procs.path(f"state-{host}"), env=env,
                                             prefix=uts), skew)

        rows = {}

        def four_windows_each():
            # Each agent on its own: one slow to start (the sanitizer build
            # beside a CPU-heavy test) must not be hidden by the other's count.
            rows.update({r["hostname"]: r for r in json.loads(collector.http("/api/v1/agents")[1])["agents"]})
            return all(rows.get(host, {}).get("reports", 0) >= 4 for host in agents)

        wait_for("4 windows from each skewed agent", four_windows_each, 90,
                 [collector.proc] + [a for a, _ in agents.values()])
        for host, (agent, skew) in agents.items():
            self.stop_timed(agent, 15)
            sealed = sealed_lines(agent.log_path)
            # The windows carry the faked clock: the preload works on this binary.
            end_s = sealed[-1][2] / 1e9
            self.assertAlmostEqual(end_s - time.time(), skew, delta=120, msg=f"{host}: libfaketime had no effect")
            self.assertAlmostEqual(rows[host]["clock_skew_seconds"], skew, delta=60)
        m = collector.metrics()
        sealed_all = [s for agent, _ in agents.values() for s in sealed_lines(agent.log_path)]
        self.assertEqual(m[("tlsprof_collector_reports_total", (("result", "accepted"),))], len(sealed_all))
        self.assertEqual(m.get(("tlsprof_collector_reports_total", (("result", "invalid"),)), 0), 0)
        self.assertEqual(m[("tlsprof_collector_skewed_reports_total", ())], len(sealed_all))
        self.assertAlmostEqual(m[("tlsprof_collector_clock_skew_seconds", ())], 86400, delta=60)
        busy = sum(v for (name, _), v in m.items() if name == "tlsprof_busy_cpu_seconds_total")
        self.assertAlmostEqual(busy, sum(s[3] for s in sealed_all) * PERIOD_NS / 1e9, places=6)
        # The per-minute ring is keyed by the collector's receive time: the
        # skewed windows are in the last 5 minutes of the summary.
        summary = json.loads(collector.http("/api/v1/summary?minutes=5")[1])
        self.assertEqual(summary["reports"], len(sealed_all))
        print(f"\nclock skew: {len(sealed_all)} windows from agents at +1 h and -1 day, all counted once; "
              f"skews seen {rows['skew-ahead']['clock_skew_seconds']:.1f} s and "
              f"{rows['skew-behind']['clock_skew_seconds']:.1f} s")


if __name__ == "__main__":
    unittest.main()
