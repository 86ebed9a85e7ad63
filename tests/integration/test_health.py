"""GET /healthz of `tlsprof-agent run` (docs/fleet.md, "Health"): 200 while
windows close. The window loop's thread (the main thread) stopped with
ptrace, the HTTP threads serving on: 503 within STALL_INTERVALS + 1
intervals, naming the last close and the interval, while /metrics answers
and counts no window. Let go: 200 again at the next window.

Slow clients cannot fake it: 50 connections that send nothing, to the
agent's and to the collector's HTTP server, and GET /healthz of each still
answers within 1 s (common/http's workers and request timeout). The
collector's /healthz says "ingesting".
"""
import os
import re
import signal
import socket
import time
import unittest
import urllib.error
import urllib.request

from thread_stop import StoppedThread
from tlsprof_testlib import AGENT, BIN, Processes, free_port, metric_sum, require_root, scrape

STALL_INTERVALS = 3  # agent/expose/health.h, kStallIntervals
INTERVAL = 1.0
# How often the test asks; the stall is timed to within this.
POLL = 0.1
IDLE_CONNECTIONS = 50


def healthz(port):
    """(status, body) of GET /healthz."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class HealthTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def wait_healthz(self, port, status, pattern, timeout):
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = healthz(port)
            if seen[0] == status and re.search(pattern, seen[1]):
                return seen
            time.sleep(POLL)
        self.fail(f"/healthz not {status} /{pattern}/ after {timeout} s; last answer {seen}")

    def test_a_stopped_window_loop_turns_healthz_503_and_back(self):
        port = free_port()
        agent = self.procs.start([AGENT, "run", "--interval", str(INTERVAL), "--metrics-listen", f"127.0.0.1:{port}"],
                                 port=port, http_path="/healthz", timeout=120)
        # The first snapshot of the host's processes, then windows every second.
        self.wait_healthz(port, 200, r"^ok: window (?:[2-9]|\d{2,}) closed", 180)

        with StoppedThread(agent.pid) as stopped:
            status, body = healthz(port)
            self.assertEqual(status, 200, body)
            ago = float(re.search(r"closed (\d+\.\d) s ago", body).group(1))
            windows = metric_sum(scrape(port), "tlsprof_agent_windows_total")
            _, body = self.wait_healthz(port, 503, "^stalled", (STALL_INTERVALS + 2) * INTERVAL)
            elapsed = time.monotonic() - stopped.stopped_at
            self.assertEqual(stopped.state(), "t", "the window loop's thread is not stopped")
            # Not before the rule says (the last close was `ago` s before the stop), and within the brief's bound.
            self.assertGreaterEqual(elapsed, STALL_INTERVALS * INTERVAL - ago - 0.3, body)
            self.assertLessEqual(elapsed, (STALL_INTERVALS + 1) * INTERVAL, body)
            self.assertRegex(body, r"^stalled: the last window closed \d+\.\d s ago \(interval 1 s; stalled after "
                             rf"{STALL_INTERVALS} intervals\)\n$")
            # /metrics is served all along, by the threads the stop left running, and counts no new window.
            time.sleep(2 * INTERVAL)
            self.assertEqual(metric_sum(scrape(port), "tlsprof_agent_windows_total"), windows)
            status, later = healthz(port)
            self.assertEqual(status, 503, later)
            self.assertGreater(float(re.search(r"closed (\d+\.\d) s ago", later).group(1)),
                               float(re.search(r"closed (\d+\.\d) s ago", body).group(1)))
            self.assertEqual(stopped.resume(), "resumed")
            print(f"\n/healthz 503 {elapsed:.2f} s after the stop (the last window closed {ago:.1f} s before it): "
                  f"{body.strip()}")

        resumed = time.monotonic()
        _, body = self.wait_healthz(port, 200, "^ok: window", 2 * INTERVAL + 2)
        print(f"/healthz 200 {time.monotonic() - resumed:.2f} s after the resume: {body.strip()}")
        self.assertGreater(metric_sum(scrape(port), "tlsprof_agent_windows_total"), windows)
        agent.send_signal(signal.SIGTERM)
        self.assertEqual(agent.wait(20), 0, self.procs.log(agent))

    def test_b_idle_connections_do_not_hold_up_healthz(self):
        agent_port, collector_port = free_port(), free_port()
        self.procs.start([AGENT, "run", "--interval", str(INTERVAL), "--metrics-listen", f"127.0.0.1:{agent_port}"],
                         port=agent_port, http_path="/healthz", timeout=120)
        self.wait_healthz(agent_port, 200, r"^ok: window", 180)
        self.procs.start([os.path.join(BIN, "tlsprof-collector"), "--insecure", "--listen", f"127.0.0.1:{free_port()}",
                          "--metrics-listen", f"127.0.0.1:{collector_port}"], port=collector_port,
                         http_path="/healthz", timeout=30)
        for name, port, pattern in (("agent", agent_port, r"^ok: window"), ("collector", collector_port,
                                                                             r"^ingesting\n$")):
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE_CONNECTIONS)]
            self.addCleanup(lambda socks=idle: [s.close() for s in socks])
            time.sleep(0.2)  # all accepted and held by workers before the probe
            start = time.monotonic()
            status, body = healthz(port)
            took = time.monotonic() - start
            print(f"\n{name}: /healthz behind {IDLE_CONNECTIONS} idle connections: {status} in {took * 1000:.0f} ms")
            self.assertEqual(status, 200, body)
            self.assertRegex(body, pattern)
            self.assertLess(took, 1.0)


if __name__ == "__main__":
    unittest.main()
