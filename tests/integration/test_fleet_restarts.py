"""The fleet pipeline through restarts (issue 5): the agent daemon profiles a
real TLS workload and ships over mTLS to the collector. kill -9 of the
collector, and separately of the agent, in the middle of a run: afterwards
the collector's totals equal the truth exactly. The truth is what the agent
sealed: every window it closed is logged once, with its sample counts
(`sealed batch sequence=...`), before it touches the network.

Exact counts, so it runs beside other tests (test_fleet.py compares CPU
figures and holds the CPU lock); in the sanitizer pass as the daemon's path
through a collector restart.
"""
import os
import signal
import time
import unittest

from test_fleet import PERIOD_S, FleetCase, metric_sum, scrape, sealed_batches
from tlsprof_testlib import free_port


class FleetRestartsTest(FleetCase):
    def test_kill_9_collector_then_agent_loses_and_doubles_nothing(self):
        cport, cmetrics, ametrics = free_port(), free_port(), free_port()
        cstate, astate = self.procs.path("collector-state"), self.procs.path("agent-state")
        self.start_workload(90)
        collector = self.start_collector(cport, cmetrics, cstate)
        agent = self.start_agent(cport, ametrics, astate, interval=2)
        logs = [agent.log_path]
        self.wait_for("3 sealed windows", lambda: self.sealed_count(logs) >= 3)

        # The collector dies mid-run: the agent keeps sealing into its spool.
        time.sleep(0.7)
        self.procs.stop(collector, signal.SIGKILL)
        sealed_at_kill = self.sealed_count(logs)
        self.wait_for("2 more windows while the collector is down", lambda: self.sealed_count(logs) >= sealed_at_kill + 2)
        spooled = os.listdir(os.path.join(astate, "spool"))
        self.assertTrue(any(not n.startswith(".") and n != "corrupt" for n in spooled),
                        f"no batch waits in the spool while the collector is down: {spooled}")
        collector = self.start_collector(cport, cmetrics, cstate)
        self.wait_for("the spool to drain", lambda: metric_sum(scrape(ametrics), "tlsprof_agent_spool_batches") == 0,
                      timeout=90)

        # The agent dies mid-window; its successor continues the sequence.
        self.wait_for("a window after the restart", lambda: self.sealed_count(logs) >= sealed_at_kill + 4)
        time.sleep(1.0)
        self.procs.stop(agent, signal.SIGKILL)
        agent = self.start_agent(cport, ametrics, astate, interval=2)
        logs.append(agent.log_path)
        before = self.sealed_count(logs)
        self.wait_for("2 windows of the second agent", lambda: self.sealed_count(logs) >= before + 2)
        self.procs.stop(agent, signal.SIGTERM)  # seals the partial window and flushes it
        self.assertEqual(agent.returncode, 0, self.procs.log(agent))

        batches = sealed_batches(logs)
        sequences = [b["sequence"] for b in batches]
        self.assertEqual(sequences, sorted(set(sequences)), "sequences repeat or go back across the restart")
        self.assertEqual(sequences, list(range(sequences[0], sequences[0] + len(sequences))),
                         "a sequence was skipped")
        for log in logs:
            run = [b for b in batches if b["log"] == log]
            for a, b in zip(run, run[1:]):
                self.assertEqual(a["end"], b["start"], f"windows {a['sequence']} and {b['sequence']} are not contiguous")
        truth_busy = sum(b["busy"] for b in batches) * PERIOD_S
        truth_tls = sum(b["tls"] for b in batches) * PERIOD_S
        self.assertGreater(truth_tls, 0)

        text = scrape(cmetrics)
        self.assertEqual(metric_sum(text, "tlsprof_reports_total"), len(batches))
        got_busy = metric_sum(text, "tlsprof_busy_cpu_seconds_total")
        got_tls = metric_sum(text, "tlsprof_cpu_seconds_total")
        print(f"{len(batches)} windows sealed over two agent runs and a collector restart: "
              f"busy {got_busy:.4f} vs truth {truth_busy:.4f}, TLS {got_tls:.4f} vs truth {truth_tls:.4f} CPU-s")
        self.assertAlmostEqual(got_busy, truth_busy, delta=1e-6 * truth_busy)
        self.assertAlmostEqual(got_tls, truth_tls, delta=1e-6 * truth_tls)
        duplicates = metric_sum(text, "tlsprof_collector_reports_total", result="duplicate")
        print(f"collector answered DUPLICATE {duplicates:.0f} times (replays after a lost reply)")


if __name__ == "__main__":
    unittest.main()
