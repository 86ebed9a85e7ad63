"""Exec/exit churn (issue 7): 200 short-lived TLS processes a second for 20 s
beside a steady TLS workload, under `tlsprof-agent run`. The daemon keeps
closing its windows on time, still attributes the steady workload's TLS CPU,
sees the churners' own TLS CPU (part of it: a churner that exits before the
agent reads its maps cannot be symbolized), and its process and image counts
come back to the baseline once the churn stops.

The churn saturates the CPUs, so this test runs alone; the other discovery
faults are test_faults_discovery.py.
"""
import json
import os
import time
import unittest

from test_daemon import metric_sum, process_cpu_seconds
from test_faults_discovery import INTERVAL, GT_SHARED, Daemon, FaultsCase, delta, is_sha256, label_split
from tlsprof_testlib import BIN, SANITIZED, assert_resource_budget

CHURN = os.path.join(BIN, "tlsprof-churn")

# Churn. Measured on the 2-vCPU VM beside other helpers' builds (load 12-25),
# 7 runs: 190-200/s achieved (169-181/s at load 17-25 with the driver only
# reniced, which the test does; 200/s with --driver-fifo, which starved the
# agent). Each
# churner costs 5-9 ms of CPU, most of it the exec, 1 ms of it SHA-256. The
# daemon saw 32-41% of the churners' crypto (the half that lingers 0.7 s;
# the others exit before the agent can read their maps), 14-20% at load
# 17-25 (the agent, starved of CPU, reads them late), 85-90%
# of it as SHA-256. The steady workload: TLS share 96-97%, busy CPU within
# 1-2% of its CPU clock. Windows at most 2.19 s for 2 s (5.1-6.8 s at load
# 17-25, the agent using 0.5-0.6 CPU-s over the churn: starved, not busy).
# Tracked processes 115-142 before, ~400 at the peak, back within +10 after;
# images +0..+10 (compilers beside); agent RSS +1..+4.2 MiB.
# What 200/s costs depends on the host under the VM: the same churn measured
# 3.7-8.6 ms of CPU per churner standalone within minutes (nested paging makes
# exec's page faults dear, and host contention shows as guest CPU time), 9.7
# ms in a clean-clone CI run, where 200/s then needs 1.94 of the 2 CPUs and
# the driver (nice -10) reached 172.5/s; a nice of -20 kept it at 188-200/s
# but starved the agent instead (windows 12-15 s late). At 11 ms per churner
# (a trivial static binary measured 8.5 ms per fork+exec+wait at that time) the
# driver reached 143/s. A clean-clone CI run later measured 8.1 ms per
# churner beside the steady workload, which takes one of the 2 CPUs: that
# leaves ~1 CPU for ~123 churners/s, and the driver reached 119.0/s. So the
# driver is held to 40% of the rate (still 1,600+ processes through exec,
# snapshot and forgetting), and the rate reached is printed; the agent's
# own bounds (windows, tracking, forgetting) are asserted separately below.
CHURN_RATE = 200
CHURN_SECONDS = 20
CHURN_MIN_RATE = 80
CHURN_PEAK_ABOVE_BASELINE = 50
# The sanitizer pass churns at a quarter of the rate. The ASan agent needs
# several times the release agent's CPU per new process, and at 200/s the
# churners leave it ~1 CPU-s over the churn: measured there, 3 windows in
# 20 s (17 s late) and no churner ever read, which tests nothing but ASan's
# cost. At 50/s the sanitized agent still takes 1,000 processes through
# every path (exec events, snapshots, forgetting) in 20 s.
if SANITIZED:
    CHURN_RATE, CHURN_MIN_RATE, CHURN_PEAK_ABOVE_BASELINE = CHURN_RATE // 4, CHURN_MIN_RATE // 4, 12
RSS_SLACK_MIB = 32


class FaultsChurnTest(FaultsCase):
    def test_exec_exit_churn(self):
        steady_bin = self.named_copy(GT_SHARED, "fdisc-steady")
        steady = self.start_gt(steady_bin, "aes_gcm=1,sha256=1", name="steady")
        marks = []
        daemon = Daemon(self, self.procs,
                        on_window=lambda line: (time.monotonic(), process_cpu_seconds(steady.pid)))
        daemon.wait_windows(1, 60)
        base_reg = daemon.wait_windows(2)
        baseline_processes, baseline_images = int(base_reg.group(1)), int(base_reg.group(2))
        before = daemon.scrape()
        with daemon.log.cond:
            first_mark = len(daemon.log.marks) - 1

        out = self.procs.path("churn.json")
        churn = self.procs.start([CHURN, "--rate", str(CHURN_RATE), "--duration", str(CHURN_SECONDS), "--work-ms", "1",
                                  "--linger-ms", "700", "--linger-percent", "50", "--output", out,
                                  # Only the driver is reniced: it keeps the schedule beside
                                  # other load, the churners compete like any process.
                                  # (--driver-fifo holds 200/s at any load but starves the
                                  # agent: a 16 s window at load 20.)
                                  "--driver-nice", "-10"])
        peak = 0
        while churn.poll() is None:
            reg = daemon.wait_windows(1)
            peak = max(peak, int(reg.group(1)))
        self.assertEqual(churn.returncode, 0, self.procs.log(churn))
        with open(out) as f:
            result = json.load(f)
        daemon.wait_windows(1)  # the last churners' window
        during = daemon.scrape()
        with daemon.log.cond:
            last_mark = len(daemon.log.marks) - 1
            marks = daemon.log.marks[first_mark:last_mark + 1]
        # The churn's windows closed on time.
        windows = daemon.windows()
        durations = [(int(w.group(2)) - int(w.group(1))) / 1e9 for w in windows[-len(marks) + 1:]]
        # Then the churners are forgotten: a window without their samples.
        settle = [daemon.wait_windows(1) for _ in range(3)]
        after_processes = min(int(r.group(1)) for r in settle)
        after_images = min(int(r.group(2)) for r in settle)
        rss = {k: metric_sum(t, "tlsprof_agent_resident_memory_bytes") / 2**20
               for k, t in (("baseline", before), ("churn", during), ("after", daemon.scrape()))}

        agent_cpu = delta(during, before, "tlsprof_agent_cpu_seconds_total")
        steady_tls = delta(during, before, "tlsprof_cpu_seconds_total", service="fdisc-steady")
        steady_busy = delta(during, before, "tlsprof_busy_cpu_seconds_total", service="fdisc-steady")
        steady_clock = marks[-1][1] - marks[0][1]
        churn_tls = delta(during, before, "tlsprof_cpu_seconds_total", service="tlsprof-churn-c")
        churn_algos = label_split(during, before, "tlsprof_cpu_seconds_total", "algorithm", service="tlsprof-churn-c")
        churn_sha = sum(v for k, v in churn_algos.items() if is_sha256(k))
        msg = (f"churn: {result['started']} processes at {result['rate_per_second']:.1f}/s, crypto "
               f"{result['child_crypto_cpu_seconds']:.2f} CPU-s, churners' CPU {result['child_cpu_seconds']:.2f} s; "
               f"daemon churner TLS {churn_tls:.2f} CPU-s (SHA-256 {churn_sha:.2f}); steady TLS {steady_tls:.2f} of "
               f"busy {steady_busy:.2f} CPU-s, its CPU clock {steady_clock:.2f} s; windows {len(durations)} "
               f"max {max(durations):.2f} s; tracked processes baseline {baseline_processes} peak {peak} after "
               f"{after_processes}; images baseline {baseline_images} after {after_images}; agent RSS MiB "
               f"{', '.join(f'{k} {v:.1f}' for k, v in rss.items())}; agent CPU {agent_cpu:.2f} s")
        print(msg)
        self.assertGreaterEqual(result["rate_per_second"], CHURN_MIN_RATE, msg)
        self.assertEqual(result["failed"], 0, msg)
        # On time: a window is late only when the agent gets no CPU. The agent
        # runs at nice 0 beside ~30 runnable churners, so when they saturate
        # the VM it gets 0.5-0.8 CPU-s over the churn. A median of 2.19 s at
        # load <= 14, 2.80 s with a sanitizer build beside it; 5.0-5.7 s (max
        # 5.5-7.6 s) when the host made each churner cost 9-11 ms, so the
        # churners took the whole VM. The bounds catch a stalled agent, not a
        # starved one; data is not lost either way (the steady workload's
        # busy CPU still matches its clock, below).
        self.assertLessEqual(sorted(durations)[len(durations) // 2], INTERVAL * 4, msg)
        self.assertLessEqual(max(durations), INTERVAL * 10, msg)
        self.assertGreater(peak, baseline_processes + CHURN_PEAK_ABOVE_BASELINE,
                           "the churners were never tracked: " + msg)
        # The steady workload: its busy CPU is its CPU clock's, and nearly all
        # of it TLS (it does nothing else), through the churn.
        self.assertLessEqual(abs(steady_busy / steady_clock - 1), 0.10, msg)
        self.assertGreater(steady_tls / steady_busy, 0.90, msg)
        # The churners' own TLS CPU: the lingering half can be read in time,
        # when the agent gets CPU: 32-41% of it seen on a quiet VM, 14-20% at
        # load 17-25, 3-9% when the churners took the whole VM.
        self.assertGreater(churn_tls, 0.01 * result["child_crypto_cpu_seconds"], msg)
        self.assertGreater(churn_sha, 0.8 * churn_tls, msg)
        # Back to the baseline (other processes on the host come and go, with
        # their files: +10 images once with compilers running beside; a leak
        # would be per churner, thousands).
        self.assertLessEqual(after_processes, baseline_processes + 40, msg)
        self.assertLessEqual(after_images, baseline_images + 30, msg)
        # 4000 processes seen must not cost memory for good (snapshots are
        # ~1 KiB each, images are shared: growth here is allocator slack).
        # A resource budget: under ASan the quarantine fills with what the
        # churn freed, so there it is printed, not asserted.
        assert_resource_budget(self, "agent RSS growth over the churn (MiB)", rss["after"] - rss["baseline"],
                               RSS_SLACK_MIB, msg)


if __name__ == "__main__":
    unittest.main()
