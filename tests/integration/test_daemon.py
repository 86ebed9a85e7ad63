"""`tlsprof-agent run`: continuous windows, the agent's /metrics and a clean
stop (docs/fleet.md, "Agent daemon"). Bad flags, the config file and sealing
windows into the spool when the collector is down are
test_daemon_lifecycle.py, which runs beside other tests; this one reads the
host's totals, so it runs alone.

The TLS share the daemon's /metrics shows over three windows must agree with
a one-shot `tlsprof-agent profile` over the same seconds (both sample the same
ground-truth workload at the same frequency), within 5% of the one-shot's
share: a window that lost or double-counted samples would show here.
"""
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import unittest

from tlsprof_testlib import (AGENT, BIN, Processes, free_port, metric_sum, process_row, profile_json, require_root,
                             scrape)

INTERVAL = 3
WINDOWS = 3
FREQUENCY = 999  # many samples per window: the comparison is about windows, not sampling noise
SHARE_TOLERANCE = 0.05
WINDOW_LINE = re.compile(r"window=\[(\d+),(\d+)\) busy_samples=(\d+) tls_samples=(\d+)")
SEALED_LINE = re.compile(r"sealed batch sequence=(\d+) window=\[(\d+),(\d+)\) busy_samples=(\d+) tls_samples=(\d+)")


def label_values(text, name, label):
    return set(re.findall(rf'^{name}\{{[^}}]*{label}="([^"]*)"', text, re.M))


def process_cpu_seconds(pid):
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LogFollower:
    """Collects the agent's stderr lines from a thread, so the test can wait on
    them. `on_window(line)` runs as each window line arrives; its results are
    kept in `marks`, one per window line."""

    def __init__(self, stream, on_window=None):
        self.lines = []
        self.marks = []
        self.on_window = on_window
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            mark = self.on_window(line) if self.on_window and WINDOW_LINE.search(line) else None
            with self.cond:
                if mark is not None:
                    self.marks.append(mark)
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, pattern, count, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [m for m in (pattern.search(l) for l in self.lines) if m]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{count} lines matching {pattern.pattern} not seen in {timeout} s:\n"
                                         + "".join(self.lines[-30:]))
                self.cond.wait(left)

    def text(self):
        with self.cond:
            return "".join(self.lines)


class DaemonCase(unittest.TestCase):
    """Agent daemons started by a test, their stderr followed. No tests of its own (test_daemon_lifecycle.py
    shares it)."""

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def start_agent(self, args, on_window=None):
        proc = subprocess.Popen([AGENT, "run", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.procs.append(proc)
        proc.log_path = os.devnull
        self.addCleanup(proc.stderr.close)
        return proc, LogFollower(proc.stderr, on_window)


class DaemonTest(DaemonCase):
    def test_metrics_match_a_one_shot_profile(self):
        ready = self.procs.path("gt.ready")
        gt = self.procs.start([os.path.join(BIN, "tlsprof-groundtruth-shared"), "--duration", "0",
                               "--ready-file", ready], ready_file=ready)
        port = free_port()
        # The workload's own CPU clock, read as each window closes.
        agent, log = self.start_agent(["--interval", str(INTERVAL), "--frequency", str(FREQUENCY),
                                       "--metrics-listen", f"127.0.0.1:{port}"],
                                      on_window=lambda line: process_cpu_seconds(gt.pid))
        log.wait_for(WINDOW_LINE, 1, 60)
        # Right after a window closed: the next WINDOWS windows and the one-shot
        # cover (nearly) the same seconds.
        before = scrape(port)
        closed = len(log.wait_for(WINDOW_LINE, 1, 1))
        oneshot = {}

        def run_oneshot():
            oneshot["report"] = profile_json(self, ["--duration", str(INTERVAL * WINDOWS - 0.5),
                                                    "--frequency", str(FREQUENCY)])

        t = threading.Thread(target=run_oneshot)
        t.start()
        log.wait_for(WINDOW_LINE, closed + WINDOWS, INTERVAL * WINDOWS + 30)
        after = scrape(port)
        t.join(60)
        self.assertIn("report", oneshot, "the one-shot profile failed")

        def delta(name, **labels):
            return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

        windows = delta("tlsprof_agent_windows_total")
        self.assertGreaterEqual(windows, WINDOWS)
        self.assertEqual(windows, delta("tlsprof_reports_total"))
        # The workload's service (its comm, or its unit): the one with the most TLS time.
        services = label_values(after, "tlsprof_cpu_seconds_total", "service")
        service = max(services, key=lambda s: delta("tlsprof_cpu_seconds_total", service=s))
        tls = delta("tlsprof_cpu_seconds_total", service=service)
        busy = delta("tlsprof_busy_cpu_seconds_total", service=service)
        self.assertGreater(busy, 0)
        report = oneshot["report"]
        proc = process_row(report, gt.pid)
        self.assertIsNotNone(proc, "the workload is missing from the one-shot report")
        # The workload's own TLS share: other helpers' load on the machine
        # changes the host's busy CPU between two spans, not this.
        daemon_share, oneshot_share = tls / busy, proc["tls_share"]
        host_tls, host_busy = delta("tlsprof_cpu_seconds_total"), delta("tlsprof_busy_cpu_seconds_total")
        msg = (f"{service}: TLS share daemon /metrics {daemon_share * 100:.2f}% ({tls:.2f} of {busy:.2f} CPU-s over "
               f"{windows:.0f} windows), one-shot {oneshot_share * 100:.2f}% ({proc['tls_cpu_seconds']:.2f} of "
               f"{proc['cpu_seconds']:.2f} CPU-s over {report['duration_seconds']:.1f} s); host: daemon "
               f"{host_tls / host_busy * 100:.2f}%, one-shot {report['tls_share'] * 100:.2f}%")
        print(msg)
        self.assertGreater(oneshot_share, 0.1, msg)
        self.assertLessEqual(abs(daemon_share / oneshot_share - 1), SHARE_TOLERANCE, msg)
        # And its busy CPU over those windows against its own CPU clock over
        # the same seconds: a window lost or counted twice would be a third
        # off or more. (Busy vCPUs here get 97-99% of the nominal samples.)
        with log.cond:
            clock = log.marks[closed + WINDOWS - 1] - log.marks[closed - 1]
        self.assertLessEqual(abs(busy / clock - 1), 0.10,
                             f"{service}: busy {busy:.2f} CPU-s in /metrics, its CPU clock {clock:.2f} s; {msg}")
        # Every busy CPU-second is some service's: the host's busy CPU is
        # about the window's length times the CPUs at most.
        self.assertLessEqual(host_busy, windows * INTERVAL * os.cpu_count() * 1.05, msg)
        self.assertGreater(host_tls, 0)

        # The windows are contiguous and their busy samples add up to the metric.
        lines = log.wait_for(WINDOW_LINE, 1, 1)
        for a, b in zip(lines, lines[1:]):
            self.assertEqual(a.group(2), b.group(1), "windows must be contiguous")
        # Health metrics are there and sane.
        self.assertGreater(metric_sum(after, "tlsprof_agent_resident_memory_bytes"), 1e6)
        self.assertGreater(metric_sum(after, "tlsprof_agent_cpu_seconds_total"), 0)
        self.assertAlmostEqual(metric_sum(after, "tlsprof_agent_window_duration_seconds"), INTERVAL, delta=0.5)

        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool is needed (install-deps installs prometheus)")
        check = subprocess.run([promtool, "check", "metrics"], input=after, capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout.strip() + check.stderr.strip(), "", "promtool has remarks")

        # SIGTERM: the partial window is closed and the agent exits 0 promptly.
        started = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(15)
        self.assertEqual(code, 0, log.text()[-3000:])
        self.assertLess(time.monotonic() - started, 5)


if __name__ == "__main__":
    unittest.main()
