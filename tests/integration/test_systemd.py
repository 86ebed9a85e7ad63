"""The installed units under a real systemd (systemd-nspawn --boot; see
systemd_container.py), their whole sandbox applied (system call filter,
address families, namespaces), which test_packaging.py cannot do.

- Agent: the .deb's postinst starts the unit: Type=notify with WatchdogSec=60s,
  active (READY=1 crossed the sandbox). With WatchdogSec=5s from a drop-in
  (seconds, not minutes) it stays up for several of them (the pings cross
  too); its window loop's thread stopped with ptrace, /healthz turns 503,
  the pings stop, systemd aborts it and Restart= starts another.
- Collector: with a test PKI, its unit starts as shipped and serves /metrics.
"""
import glob
import os
import re
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from systemd_container import Container, depends_of, ensure_root
from thread_stop import StoppedThread
from tlsprof_testlib import BIN, SRC, Processes, free_port, require_root

BUILD = os.path.dirname(os.path.abspath(BIN))
AGENT_UNIT = "tlsprof-agent.service"
COLLECTOR_UNIT = "tlsprof-collector.service"
# The agent unit's bounding set: nspawn's default capability set lacks these.
CAPABILITIES = ("CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_CHECKPOINT_RESTORE")
TEST_WATCHDOG = 5  # seconds, the drop-in's WatchdogSec=
INTERVAL = 1
PROPERTIES = ("Type", "NotifyAccess", "WatchdogUSec", "ActiveState", "SubState", "NRestarts", "MainPID", "Result")


def get(port, path):
    """(status, body) of GET http://127.0.0.1:PORT/PATH; status None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # not listening (between two agents)
        return None, str(e)


class SystemdUnitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        p = subprocess.run([os.path.join(SRC, "scripts", "package.sh"), BUILD], capture_output=True, text=True,
                           timeout=900)
        if p.returncode != 0:
            raise AssertionError(f"scripts/package.sh failed:\n{p.stdout}\n{p.stderr}")
        cls.debs = {}
        for package in ("tlsprof-agent", "tlsprof-collector"):
            (cls.debs[package],) = glob.glob(os.path.join(BUILD, "packages", f"{package}_*.deb"))
        cls.root = ensure_root(sorted({d for deb in cls.debs.values() for d in depends_of(deb)}))

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def boot(self):
        return Container(self.procs, self.root, binds=[f"{os.path.dirname(self.debs['tlsprof-agent'])}:/debs"],
                         capabilities=CAPABILITIES, system_calls=("bpf", "perf_event_open"))

    def write(self, container, path, text, mode=None):
        p = container.run(["sh", "-c", 'mkdir -p "$(dirname "$0")" && cat > "$0"', path], input=text)
        self.assertEqual(p.returncode, 0, p.stderr)
        if mode is not None:
            container.run(["chmod", mode, path], check=True)

    def install(self, container, package):
        # The root's policy-rc.d keeps apt from starting services; here postinst starts what it starts on a host.
        container.run(["rm", "-f", "/usr/sbin/policy-rc.d"], check=True)
        p = container.run(["dpkg", "-i", f"/debs/{os.path.basename(self.debs[package])}"], timeout=420)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def wait_for(self, what, predicate, timeout, container, unit):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        self.fail(f"{what}: not after {timeout} s\n{container.journal(unit)[-4000:]}")

    def test_agent_watchdog_restarts_a_stalled_window_loop(self):
        started = time.monotonic()
        self.assertIn("libsystemd0", depends_of(self.debs["tlsprof-agent"]), "sd_notify's library is not in Depends")
        container = self.boot()
        port = free_port()
        # The shipped unit, with 1 s windows on a free port (the container shares this host's network).
        self.write(container, f"/etc/systemd/system/{AGENT_UNIT}.d/10-test.conf",
                   "[Service]\nExecStart=\nExecStart=/usr/bin/tlsprof-agent run --config /etc/tlsprof/agent.conf "
                   f"--interval {INTERVAL} --metrics-listen 127.0.0.1:{port}\n")
        self.install(container, "tlsprof-agent")

        # As installed: Type=notify with its watchdog, and active, which a notify unit is only after READY=1.
        shown = container.show(AGENT_UNIT, *PROPERTIES)
        self.assertEqual((shown["Type"], shown["NotifyAccess"], shown["WatchdogUSec"]), ("notify", "main", "1min"),
                         shown)
        self.assertEqual((shown["ActiveState"], shown["SubState"]), ("active", "running"),
                         f"{shown}\n{container.journal(AGENT_UNIT)[-4000:]}")
        self.wait_for("the agent's watchdog log line",
                      lambda: "systemd watchdog: WatchdogSec=60 s" in container.journal(AGENT_UNIT), 10, container,
                      AGENT_UNIT)
        self.wait_for("/healthz 200", lambda: get(port, "/healthz")[0] == 200, 30, container, AGENT_UNIT)

        # WatchdogSec=5s: the pings must keep it up for several of those.
        self.write(container, f"/etc/systemd/system/{AGENT_UNIT}.d/20-watchdog.conf",
                   f"[Service]\nWatchdogSec={TEST_WATCHDOG}s\n")
        container.run(["systemctl", "daemon-reload"], check=True)
        container.run(["systemctl", "restart", AGENT_UNIT], check=True, timeout=400)
        shown = container.show(AGENT_UNIT, *PROPERTIES)
        self.assertEqual((shown["WatchdogUSec"], shown["ActiveState"]), (f"{TEST_WATCHDOG}s", "active"), shown)
        first_pid, restarts = int(shown["MainPID"]), int(shown["NRestarts"])
        self.wait_for("a window closed", lambda: re.match(r"ok: window \d+", get(port, "/healthz")[1]), 60,
                      container, AGENT_UNIT)
        time.sleep(3 * TEST_WATCHDOG)
        shown = container.show(AGENT_UNIT, *PROPERTIES)
        self.assertEqual((shown["ActiveState"], int(shown["MainPID"]), int(shown["NRestarts"])),
                         ("active", first_pid, restarts),
                         f"the agent did not stay up across 3 x WatchdogSec={TEST_WATCHDOG}s: are its pings lost?\n"
                         f"{container.journal(AGENT_UNIT)[-4000:]}")

        # The window loop stopped: /healthz 503, no more pings, systemd's watchdog, a new agent.
        with StoppedThread(container.host_pid(first_pid)) as stopped:
            self.wait_for("/healthz 503", lambda: get(port, "/healthz")[0] == 503, 3 * INTERVAL + 3, container,
                          AGENT_UNIT)
            stalled = time.monotonic() - stopped.stopped_at

            def restarted():
                now = container.show(AGENT_UNIT, *PROPERTIES)
                return (now["ActiveState"] == "active" and int(now["MainPID"]) not in (0, first_pid)
                        and int(now["NRestarts"]) > restarts and now)
            after = self.wait_for("a restart by the watchdog", restarted, 120, container, AGENT_UNIT)
            seconds = time.monotonic() - stopped.stopped_at
            self.assertEqual(stopped.resume(), "exited", "the stopped agent was not the one systemd ended")
        self.wait_for("systemd's and the agent's log of the stall",
                      lambda: re.search(rf"Watchdog timeout \(limit {TEST_WATCHDOG}s\)", container.journal(AGENT_UNIT))
                      and "window loop stalled: the last window closed" in container.journal(AGENT_UNIT), 10,
                      container, AGENT_UNIT)
        self.wait_for("the new agent's /healthz 200", lambda: re.match(r"ok: window", get(port, "/healthz")[1]), 60,
                      container, AGENT_UNIT)
        print(f"\nagent: /healthz 503 {stalled:.1f} s after the stop, restarted by the watchdog {seconds:.1f} s after "
              f"it (NRestarts {restarts} -> {after['NRestarts']}, MainPID {first_pid} -> {after['MainPID']}); "
              f"test {time.monotonic() - started:.0f} s")
        container.stop()

    def test_collector_unit_starts_as_shipped(self):
        container = self.boot()
        grpc, http = free_port(), free_port()
        self.write(container, f"/etc/systemd/system/{COLLECTOR_UNIT}.d/10-test.conf",
                   "[Service]\nExecStart=\nExecStart=/usr/bin/tlsprof-collector --config /etc/tlsprof/collector.conf "
                   f"--listen 127.0.0.1:{grpc} --metrics-listen 127.0.0.1:{http}\n")
        self.install(container, "tlsprof-collector")
        # Its certificate where collector.conf looks, readable by its group (packaging/README.md).
        with tempfile.TemporaryDirectory() as pki:
            subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki], check=True, capture_output=True)
            for name in ("ca.crt", "collector.crt", "collector.key"):
                with open(os.path.join(pki, name)) as f:
                    self.write(container, f"/etc/tlsprof/tls/{name}", f.read(), mode="0640")
        container.run(["chgrp", "-R", "tlsprof", "/etc/tlsprof/tls"], check=True)
        container.run(["systemctl", "start", COLLECTOR_UNIT], check=True, timeout=120)
        self.wait_for("the collector's /metrics", lambda: "tlsprof_collector_reports_total" in get(http, "/metrics")[1],
                      30, container, COLLECTOR_UNIT)
        shown = container.show(COLLECTOR_UNIT, "ActiveState", "SubState", "NRestarts")
        self.assertEqual((shown["ActiveState"], shown["SubState"], shown["NRestarts"]), ("active", "running", "0"),
                         f"{shown}\n{container.journal(COLLECTOR_UNIT)[-4000:]}")
        container.stop()


if __name__ == "__main__":
    unittest.main()
