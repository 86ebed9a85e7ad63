"""`tlsprof-agent run` from start to stop (docs/fleet.md, "Agent daemon"):
bad flags and a port in use exit non-zero with a message, the config file's
[run] section is read, and with the collector down every window is sealed
into the spool, the partial one too at SIGTERM. Functional checks: they run
beside other tests (test_daemon.py compares figures, alone).
"""
import os
import signal
import socket
import unittest

from test_daemon import SEALED_LINE, WINDOW_LINE, DaemonCase
from tlsprof_testlib import AGENT, free_port, metric_sum, run_agent, scrape


class DaemonLifecycleTest(DaemonCase):
    def test_bad_flags(self):
        port = free_port()
        cases = [
            (["--interval", "0"], "--interval"),
            (["--interval=-1"], "--interval"),
            (["--metrics-listen", "nonsense"], "--metrics-listen"),
            (["--metrics-listen", "127.0.0.1:99999"], "--metrics-listen"),
            (["--collector", "127.0.0.1:1"], "--insecure"),
            (["--collector", "127.0.0.1:1", "--tls-ca", AGENT, "--tls-cert", AGENT], "--tls-key"),
            (["--frequency", "0"], "--frequency"),
        ]
        for args, expected in cases:
            code, out, err = run_agent(["run", "--metrics-listen", f"127.0.0.1:{port}", *args], timeout=30)
            self.assertNotEqual(code, 0, f"{args} accepted")
            self.assertIn(expected, err, f"{args}: {err}")
        # A port in use.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            busy_port = s.getsockname()[1]
            code, out, err = run_agent(["run", "--metrics-listen", f"127.0.0.1:{busy_port}"], timeout=30)
            self.assertNotEqual(code, 0)
            self.assertIn("in use", err)

    def test_config_file(self):
        port = free_port()
        config = self.procs.path("agent.conf")
        with open(config, "w") as f:
            # run's options go in its section (CLI11 2.1 reads --config at the top level).
            f.write(f'[run]\ninterval = 1\nmetrics-listen = "127.0.0.1:{port}"\nfrequency = 99\n')
        agent, log = self.start_agent(["--config", config])
        lines = log.wait_for(WINDOW_LINE, 2, 30)
        length = (int(lines[1].group(2)) - int(lines[1].group(1))) / 1e9
        self.assertAlmostEqual(length, 1, delta=0.3)
        self.assertIn("tlsprof_agent_windows_total", scrape(port))
        agent.send_signal(signal.SIGINT)
        self.assertEqual(agent.wait(15), 0)

    def test_collector_down_seals_into_the_spool(self):
        state = self.procs.path("state")
        port = free_port()
        dead = free_port()  # nothing listens there
        agent, log = self.start_agent(["--interval", "1", "--metrics-listen", f"127.0.0.1:{port}",
                                       "--collector", f"127.0.0.1:{dead}", "--insecure", "--state-dir", state])
        sealed = log.wait_for(SEALED_LINE, 3, 30)
        self.assertEqual([int(m.group(1)) for m in sealed[:3]], [1, 2, 3])
        spooled = [f for root, _, files in os.walk(state) for f in files]
        self.assertGreaterEqual(len(spooled), 3, spooled)
        text = scrape(port)
        self.assertGreaterEqual(metric_sum(text, "tlsprof_agent_spool_batches"), 2)
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(20)  # the flush budget is 10 s
        self.assertEqual(code, 0, log.text()[-3000:])
        # The partial window was sealed too, and everything stays in the spool.
        final = log.wait_for(SEALED_LINE, len(sealed), 1)
        self.assertGreaterEqual(len(final), 3)


if __name__ == "__main__":
    unittest.main()
