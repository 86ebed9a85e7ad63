"""The installed units under a real systemd (systemd-nspawn --boot; see
systemd_container.py), their whole sandbox applied (system call filter,
address families, namespaces), which test_packaging.py cannot do.

- Agent: the .deb's postinst starts the unit: Type=notify with WatchdogSec=60s,
  active (READY=1 crossed the sandbox). With WatchdogSec=5s from a drop-in
  (seconds, not minutes) it stays up for several of them (the pings cross
  too); its window loop's thread stopped with ptrace, /healthz turns 503,
  the pings stop, systemd aborts it and Restart= starts another.
- Both, as a new user installs them: `apt install` of the two .debs, the
  shipped configs edited to ship over mTLS, `systemctl start`; after 60 s both
  are active, the agent counts windows and the collector counts the agent's
  reports. `systemd-analyze security` rates both units as they run, and the
  scores must not rise above packaging/README.md's.
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
from tlsprof_testlib import BIN, SRC, Processes, free_port, metric_sum, require_root, wait_for

BUILD = os.path.dirname(os.path.abspath(BIN))
AGENT_UNIT = "tlsprof-agent.service"
COLLECTOR_UNIT = "tlsprof-collector.service"
# The agent unit's bounding set: nspawn's default capability set lacks these.
CAPABILITIES = ("CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_CHECKPOINT_RESTORE")
TEST_WATCHDOG = 5  # seconds, the drop-in's WatchdogSec=
INTERVAL = 1
# systemd-analyze security's overall exposure (0 best, 10 worst), as packaging/README.md gives it: a change
# that raises a unit's score must lower these on purpose, and say why there.
EXPOSURE_AT_MOST = {AGENT_UNIT: 2.5, COLLECTOR_UNIT: 1.2}
UP_FOR = 60  # seconds both services must stay active
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
        return wait_for(self, what, predicate, timeout, lambda: container.journal(unit)[-4000:])

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

    def test_both_units_installed_by_apt_ship_over_mtls(self):
        started = time.monotonic()
        container = self.boot()
        # As a user installs them: apt resolves the Depends (installed in the root already: no download).
        # The root's policy-rc.d keeps the agent's postinst from starting it before its config is written.
        debs = [f"/debs/{os.path.basename(self.debs[p])}" for p in ("tlsprof-agent", "tlsprof-collector")]
        p = container.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", *debs], timeout=420)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        installed = container.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", "tlsprof-agent",
                                   "tlsprof-collector"]).stdout
        self.assertEqual(installed.count("install ok installed"), 2, installed)

        # The agent's certificate names the host its reports name: the container's hostname.
        hostname = container.run(["hostname"], check=True).stdout.strip()
        grpc, collector_http, agent_http = free_port(), free_port(), free_port()
        with tempfile.TemporaryDirectory() as pki:
            subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki, hostname], check=True,
                           capture_output=True)
            files = {"ca.crt": "ca.crt", "collector.crt": "collector.crt", "collector.key": "collector.key",
                     "agent.crt": f"{hostname}.crt", "agent.key": f"{hostname}.key"}
            for name, source in files.items():
                with open(os.path.join(pki, source)) as f:
                    self.write(container, f"/etc/tlsprof/tls/{name}", f.read(), mode="0640")
        container.run(["chgrp", "tlsprof", "/etc/tlsprof/tls/ca.crt", "/etc/tlsprof/tls/collector.crt",
                       "/etc/tlsprof/tls/collector.key"], check=True)
        container.run(["chmod", "0600", "/etc/tlsprof/tls/agent.crt", "/etc/tlsprof/tls/agent.key"], check=True)
        # The shipped configs, edited the way their comments say: ports free on this host (the container shares
        # its network), 1 s windows, and the agent shipping to the collector (by address: a minbase root has no
        # /etc/hosts; the test certificate's subjectAltName holds IP:127.0.0.1).
        self.edit_config(container, "/etc/tlsprof/collector.conf",
                         {"listen": f'"127.0.0.1:{grpc}"', "metrics-listen": f'"127.0.0.1:{collector_http}"'})
        self.edit_config(container, "/etc/tlsprof/agent.conf",
                         {"collector": f'"127.0.0.1:{grpc}"', "tls-ca": '"/etc/tlsprof/tls/ca.crt"',
                          "tls-cert": '"/etc/tlsprof/tls/agent.crt"', "tls-key": '"/etc/tlsprof/tls/agent.key"',
                          "interval": "1", "metrics-listen": f'"127.0.0.1:{agent_http}"'})

        container.run(["systemctl", "start", COLLECTOR_UNIT], check=True, timeout=120)
        container.run(["systemctl", "start", AGENT_UNIT], check=True, timeout=400)
        up = time.monotonic()
        time.sleep(UP_FOR)
        for unit in (AGENT_UNIT, COLLECTOR_UNIT):
            state = container.run(["systemctl", "is-active", unit]).stdout.strip()
            restarts = container.show(unit, "NRestarts")["NRestarts"]
            self.assertEqual((state, restarts), ("active", "0"),
                             f"{unit} after {time.monotonic() - up:.0f} s\n{container.journal(unit)[-4000:]}")
        windows = metric_sum(get(agent_http, "/metrics")[1], "tlsprof_agent_windows_total")
        collected = get(collector_http, "/metrics")[1]
        accepted = metric_sum(collected, "tlsprof_collector_reports_total", result="accepted")
        refused = {result: metric_sum(collected, "tlsprof_collector_reports_total", result=result)
                   for result in ("invalid", "unauthenticated", "denied", "rate_limited", "too_large")}
        # 1 s windows for 60 s, the first after the agent's set-up: most of them shipped and counted.
        self.assertGreaterEqual(windows, UP_FOR / 2, container.journal(AGENT_UNIT)[-4000:])
        self.assertGreaterEqual(accepted, UP_FOR / 2,
                                f"{container.journal(AGENT_UNIT)[-3000:]}\n{container.journal(COLLECTOR_UNIT)[-3000:]}")
        self.assertEqual(sum(refused.values()), 0, refused)
        # Nothing in the shipped collector unit should make its own log complain at start.
        complaints = [line for line in container.journal(COLLECTOR_UNIT).splitlines()
                      if "[warning]" in line or "[error]" in line]
        self.assertEqual(complaints, [], "the collector warns under its own unit")

        scores = {}
        for unit in (AGENT_UNIT, COLLECTOR_UNIT):
            p = container.run(["systemd-analyze", "security", "--no-pager", unit], timeout=60)
            # The exposed lines (✗) and the verdict: what the unit leaves open, and what it costs.
            print(f"\n{unit}:\n" + "\n".join(line.rstrip() for line in p.stdout.splitlines()
                                              if line.startswith("✗") or "Overall exposure" in line))
            m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\S+)", p.stdout)
            self.assertIsNotNone(m, p.stdout + p.stderr)
            scores[unit] = float(m.group(1))
        for unit, score in scores.items():
            self.assertLessEqual(score, EXPOSURE_AT_MOST[unit],
                                 f"{unit}: systemd-analyze security exposure rose from {EXPOSURE_AT_MOST[unit]}")
        print(f"agent: {windows:.0f} windows in {UP_FOR} s; collector: {accepted:.0f} reports accepted over mTLS "
              f"from '{hostname}'; exposure: agent {scores[AGENT_UNIT]}, collector {scores[COLLECTOR_UNIT]}; "
              f"test {time.monotonic() - started:.0f} s")
        container.stop()

    def edit_config(self, container, path, values):
        """Sets `key = value` in a shipped config: the commented-out example line of each key is replaced,
        or the line is added to the [run] table's end when it has none."""
        text = container.run(["cat", path], check=True).stdout
        for key, value in values.items():
            line = f"{key} = {value}"
            text, n = re.subn(rf"^#? ?{re.escape(key)} = .*$", line, text, count=1, flags=re.M)
            if n == 0:
                text = text.rstrip("\n") + f"\n{line}\n"
        self.write(container, path, text)


if __name__ == "__main__":
    unittest.main()
