"""Least privilege (issue 7, item 3; docs/fleet.md, "Capabilities").

The agent, started as root with every capability, keeps only what steady
state needs once its BPF sampler is loaded and attached; the collector keeps
none. Both set no_new_privs. The sets are read from /proc/PID/task/*/status,
every thread (capabilities are per thread), while the processes run, and the
agent must still profile afterwards: TLS CPU keeps reaching the collector, also
from a process started after the drop by another user from a directory only
that user can enter (discovery with the reduced set).
"""
import json
import os
import re
import shutil
import subprocess
import time
import unittest

import prometheus_harness
from demo_fleet import DEMO, DemoFleet
from tlsprof_testlib import AGENT, Processes, require_root

CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE = 2, 19, 38, 39, 40
WINDOW_LOG = re.compile(r"capabilities after set-up: (.*)")


def steady_state_mask():
    """The documented steady-state set, of what the agent had: CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH +
    CAP_CHECKPOINT_RESTORE (/proc/PID/map_files: binaries deleted after start), and CAP_BPF
    on kernels before 6.5 that restrict unprivileged bpf() (map access through fds needs it there)."""
    mask = (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH) | (1 << CAP_CHECKPOINT_RESTORE)
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
    with open("/proc/sys/kernel/unprivileged_bpf_disabled") as f:
        restricted = int(f.read()) != 0
    if (major, minor) < (6, 5) and restricted:
        mask |= 1 << CAP_BPF
    return mask


def thread_caps(pid):
    """{tid: {CapInh, CapPrm, CapEff, CapBnd, CapAmb, NoNewPrivs}} for every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = {}
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.startswith("Cap"):
                        fields[key] = int(value.strip(), 16)
                    elif key == "NoNewPrivs":
                        fields[key] = int(value.strip())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(tid)] = fields
    return out


def cpu_by_service(http):
    """{service: TLS CPU-seconds} from tlsprof_cpu_seconds_total on http's /metrics."""
    totals = {}
    for m in re.finditer(r'^tlsprof_cpu_seconds_total\{([^}]*)\} (\S+)$', prometheus_harness.scrape(http), re.M):
        service = re.search(r'service="([^"]*)"', m.group(1)).group(1)
        totals[service] = totals.get(service, 0.0) + float(m.group(2))
    return totals


class PrivilegeTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def assert_caps(self, pid, effective, bounding, what):
        threads = thread_caps(pid)
        self.assertTrue(threads, f"{what}: no threads")
        for tid, caps in threads.items():
            where = f"{what} thread {tid}: {caps}"
            self.assertEqual(caps["CapEff"], effective, where)
            self.assertEqual(caps["CapPrm"], effective, where)
            self.assertEqual(caps["CapInh"], 0, where)
            self.assertEqual(caps["CapAmb"], 0, where)
            self.assertEqual(caps["CapBnd"], bounding, where)
            self.assertEqual(caps["NoNewPrivs"], 1, where)
        return len(threads)

    def start_late_demo(self):
        """tlsprof-demo as `nobody`, copied into a 0700 directory of nobody's: its comm (latedemo) names its own
        service, and root without CAP_DAC_READ_SEARCH / CAP_SYS_PTRACE could neither open its binary nor read its
        maps."""
        home = self.procs.path("nobody-home")
        os.mkdir(home, 0o700)
        binary = os.path.join(home, "latedemo")
        shutil.copy2(DEMO, binary)
        os.chown(home, 65534, 65534)
        os.chown(binary, 65534, 65534)
        os.chmod(os.path.dirname(home), 0o755)  # the temporary directory: nobody must reach its own home
        ready = os.path.join(home, "ready")
        return self.procs.start(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                                 "--inh-caps=-all", binary, "--duration", "0", "--ready-file", ready],
                                ready_file=ready)

    def test_daemon_and_collector_drop_capabilities(self):
        fleet = DemoFleet(self.procs, interval=1).start()
        fleet.wait_reports(2)
        steady = steady_state_mask()
        agent_threads = self.assert_caps(fleet.agent.pid, steady, steady, "tlsprof-agent run")
        collector_threads = self.assert_caps(fleet.collector.pid, 0, 0, "tlsprof-collector")
        self.assertGreater(agent_threads, 1, "the daemon's metrics server and shipper threads are checked too")
        self.assertGreater(collector_threads, 1)
        log = self.procs.log(fleet.agent)
        self.assertEqual(len(WINDOW_LOG.findall(log)), 1, log)
        print(f"\nagent run: {WINDOW_LOG.search(log).group(1)} ({agent_threads} threads); "
              f"collector: CapEff=0 ({collector_threads} threads)")

        # Profiling goes on with the reduced set: the demo's TLS CPU keeps arriving, and a process started now, by
        # another user, from a directory root may not enter without CAP_DAC_READ_SEARCH, is found and attributed.
        before = cpu_by_service(fleet.collector_http)
        self.assertGreater(before.get("tlsprof-demo", 0), 0, before)
        self.start_late_demo()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = cpu_by_service(fleet.collector_http)
            if now.get("latedemo", 0) > 0.05 and now.get("tlsprof-demo", 0) > before["tlsprof-demo"]:
                break
            time.sleep(0.5)
        else:
            self.fail(f"no TLS CPU from latedemo after the drop: {now}\n{self.procs.log(fleet.agent)}")
        print(f"TLS CPU-seconds at the collector: {now}")
        self.assertIsNone(fleet.agent.poll())
        # Still exactly the steady state (nothing raised capabilities back).
        self.assert_caps(fleet.agent.pid, steady, steady, "tlsprof-agent run, later")

    def run_profile(self, argv, what):
        """Starts a one-shot profile (long --duration), checks its capabilities while it runs, then its report."""
        ready = self.procs.path("demo.ready")
        demo = self.procs.start([DEMO, "--duration", "0", "--ready-file", ready], ready_file=ready)
        outdir = self.procs.path(f"out-{what}")
        os.mkdir(outdir)
        os.chmod(outdir, 0o777)  # the agent may run as nobody
        os.chmod(os.path.dirname(outdir), 0o755)
        out = os.path.join(outdir, "report.json")
        err_path = self.procs.path(f"{what}.err")
        with open(err_path, "wb") as err:
            agent = subprocess.Popen([*argv, AGENT, "--log-level", "info", "profile", "--duration", "6", "--format",
                                      "json", "-o", out], stdout=subprocess.DEVNULL, stderr=err,
                                     start_new_session=True)
        self.procs.procs.append(agent)
        agent.log_path = err_path
        deadline = time.monotonic() + 30
        while not WINDOW_LOG.search(self.procs.log(agent)):
            self.assertIsNone(agent.poll(), self.procs.log(agent))
            self.assertLess(time.monotonic(), deadline, self.procs.log(agent))
            time.sleep(0.05)
        caps = thread_caps(agent.pid)
        self.assertEqual(agent.wait(60), 0, self.procs.log(agent))
        with open(out) as f:
            report = json.load(f)
        rows = [p for p in report["processes"] if p["pid"] == demo.pid]
        self.assertTrue(rows and rows[0]["tls_cpu_seconds"] > 0, f"no TLS CPU for the demo: {rows}")
        return caps, WINDOW_LOG.search(self.procs.log(agent)).group(1), rows[0]["tls_cpu_seconds"]

    def test_profile_drops_capabilities(self):
        steady = steady_state_mask()
        caps, logged, tls = self.run_profile([], "root")
        for tid, c in caps.items():
            self.assertEqual((c["CapEff"], c["CapPrm"], c["CapInh"], c["CapBnd"], c["CapAmb"], c["NoNewPrivs"]),
                             (steady, steady, 0, steady, 0, 1), f"thread {tid}: {c}")
        print(f"\nagent profile (root): {logged}; demo TLS CPU {tls:.2f} s")

    def test_profile_as_non_root_with_ambient_capabilities(self):
        # Not root: only the four capabilities, as ambient ones (what systemd's AmbientCapabilities= gives). No
        # CAP_SETPCAP, so the bounding set cannot shrink; no_new_privs stops exec from using it.
        caps_arg = "+bpf,+perfmon,+sys_ptrace,+dac_read_search"
        given = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH)
        steady = steady_state_mask() & given
        caps, logged, tls = self.run_profile(
            ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", f"--inh-caps={caps_arg}",
             f"--ambient-caps={caps_arg}"], "nobody")
        for tid, c in caps.items():
            self.assertEqual((c["CapEff"], c["CapPrm"], c["CapInh"], c["CapAmb"], c["NoNewPrivs"]),
                             (steady, steady, 0, 0, 1), f"thread {tid}: {c}")
        print(f"\nagent profile (nobody + ambient caps): {logged}; demo TLS CPU {tls:.2f} s")


if __name__ == "__main__":
    unittest.main()
