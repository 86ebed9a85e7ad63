"""Container and pod identity from cgroup paths, end to end (issue 6, item 4).

Real workloads (tlsprof-demo) run in cgroups whose paths look like a
container runtime's, made on this machine's own cgroup hierarchies:

- "pod": the cgroup2 mount, /kubepods/besteffort/pod<uid>/<64 hex>
  (the kubelet's cgroupfs driver; a "0::" line in /proc/PID/cgroup);
- "docker": the v1 name=systemd hierarchy, /system.slice/docker-<64 hex>.scope
  (docker's systemd driver; a v1 line, the v2 line stays "/");
- "host": a third demo left where it was.

`tlsprof-agent run --insecure` profiles the host and ships to a real
`tlsprof-collector`; the collector's /metrics (and the agent's own) must carry
each containerised workload's TLS CPU under its container_id (docker's short
id) and pod_uid, and the host's demo without those labels. Then
`--no-container-labels` must fold them back into one service, and the
one-shot JSON report must name the container of each process.

The cgroups are created by the test and removed at the end, failure or not
(processes moved back, directories removed deepest first). The test fails,
never skips, when the hierarchies are missing or read-only.
"""
import json
import os
import re
import secrets
import time
import unittest
import urllib.error
import uuid

import prometheus_harness
from demo_fleet import COLLECTOR, DEMO
from prometheus_harness import Prometheus
from tlsprof_testlib import AGENT, Processes, free_port, require_root, run_agent

SERIES = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cgroup_mounts():
    """{'cgroup2': path, 'name=systemd': path, ...} from /proc/self/mounts."""
    mounts = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, path, fstype, options = line.split()[:4]
            if fstype == "cgroup2":
                mounts.setdefault("cgroup2", path)
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt.startswith("name="):
                        mounts.setdefault(opt, path)
    return mounts


def own_cgroup(hierarchy):
    """This process's path in a hierarchy: '0::' for cgroup2, or a v1 line's
    controller list ('name=systemd')."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if (hierarchy == "cgroup2" and hid == "0" and controllers == "") or controllers == hierarchy:
                return path
    raise AssertionError(f"/proc/self/cgroup has no {hierarchy} line")


class Cgroups:
    """Creates cgroup directories and removes them (processes moved back to
    where this test runs, deepest first) on close."""

    def __init__(self):
        self.created = []  # (mount, relative path, the test's own cgroup there)

    def make(self, mount, hierarchy, relative):
        home = own_cgroup(hierarchy)
        parts = relative.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            path = os.path.join(mount, *parts[:i])
            if not os.path.isdir(path):
                os.mkdir(path)  # fails loudly (read-only mount, no privilege)
                self.created.append((mount, path, home))
        return os.path.join(mount, *parts)

    def close(self):
        errors = []
        for mount, path, home in reversed(self.created):
            home_procs = os.path.join(mount, home.lstrip("/"), "cgroup.procs")
            deadline = time.monotonic() + 10
            while True:
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        pids = [p for p in f.read().split() if p]
                    for pid in pids:
                        try:
                            with open(home_procs, "w") as f:
                                f.write(pid)
                        except ProcessLookupError:
                            pass  # exited meanwhile
                    os.rmdir(path)
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        errors.append(f"{path}: {e}")
                        break
                    time.sleep(0.1)  # a killed process still leaving
        self.created = []
        if errors:
            raise AssertionError("cannot remove the test's cgroups: " + "; ".join(errors))


def series(text, name):
    """[(labels dict, value)] of one metric in a text exposition."""
    out = []
    for line in text.splitlines():
        m = SERIES.match(line)
        if m and m.group(1) == name:
            out.append((dict(LABEL.findall(m.group(2))), float(m.group(3))))
    return out


def total(text, name, **want):
    """Sum of a metric's series whose label set is exactly `want` plus any of
    bucket/algorithm/phase/library (so that a container label, present or
    absent, must match)."""
    free = {"bucket", "algorithm", "phase", "library"}
    s = 0.0
    for labels, value in series(text, name):
        if {k: v for k, v in labels.items() if k not in free} == want:
            s += value
    return s


class ContainerLabelsTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        for binary in (AGENT, COLLECTOR, DEMO):
            self.assertTrue(os.path.exists(binary), f"{binary} is not built")
        mounts = cgroup_mounts()
        # This machine: cgroup v1 controllers plus a cgroup2 mount (hybrid).
        self.assertIn("cgroup2", mounts, "no cgroup2 mount: cannot make a kubepods-style cgroup")
        self.assertIn("name=systemd", mounts, "no v1 name=systemd hierarchy: cannot make a docker-style scope")
        self.procs = Processes()
        self.cgroups = Cgroups()
        # Registered first, so it runs last: after the processes are stopped.
        self.addCleanup(self.cgroups.close)
        self.addCleanup(self.procs.close)

        self.pod_uid = str(uuid.uuid4())
        self.pod_cid = secrets.token_hex(32)
        self.docker_cid = secrets.token_hex(32)
        self.pod_dir = self.cgroups.make(mounts["cgroup2"], "cgroup2",
                                         f"kubepods/besteffort/pod{self.pod_uid}/{self.pod_cid}")
        self.docker_dir = self.cgroups.make(mounts["name=systemd"], "name=systemd",
                                            f"system.slice/docker-{self.docker_cid}.scope")

    def start_demo(self, name, cgroup_dir=None):
        ready = self.procs.path(f"{name}.ready")

        def enter():  # in the child, before exec: every thread starts inside
            with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        proc = self.procs.start([DEMO, "--duration", "0", "--threads", "1", "--ready-file", ready], ready_file=ready,
                                preexec_fn=enter if cgroup_dir else None)
        with open(f"/proc/{proc.pid}/cgroup") as f:
            proc.cgroup_file = f.read()
        return proc

    def wait_metrics(self, proc, port, timeout, done, why):
        """Scrapes 127.0.0.1:port/metrics each second until done(text); fails with why(text) after timeout
        seconds, or when proc exits. Returns the last text."""
        deadline = time.monotonic() + timeout
        while True:
            self.assertIsNone(proc.poll(), f"{proc.args[0]} exited:\n{self.procs.log(proc)}")
            try:
                text = prometheus_harness.scrape(f"127.0.0.1:{port}")
            except urllib.error.HTTPError:  # the port is open a moment before /metrics is registered
                text = ""
            if done(text):
                return text
            self.assertLess(time.monotonic(), deadline, why(text))
            time.sleep(1)

    def test_containers_get_their_labels_and_the_host_none(self):
        pod = self.start_demo("pod", self.pod_dir)
        docker = self.start_demo("docker", self.docker_dir)
        host = self.start_demo("host")
        pod_path = f"/kubepods/besteffort/pod{self.pod_uid}/{self.pod_cid}"
        self.assertIn(f"0::{pod_path}\n", pod.cgroup_file)
        self.assertIn(f":name=systemd:/system.slice/docker-{self.docker_cid}.scope\n", docker.cgroup_file)
        self.assertNotIn("kubepods", host.cgroup_file + docker.cgroup_file)

        grpc_port, collector_port, agent_port = free_port(), free_port(), free_port()
        self.procs.start([COLLECTOR, "--insecure", "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen",
                          f"127.0.0.1:{collector_port}", "--state-dir", self.procs.path("collector-state")],
                         port=collector_port)
        agent = self.procs.start([AGENT, "run", "--insecure", "--collector", f"127.0.0.1:{grpc_port}", "--interval",
                                  "2", "--metrics-listen", f"127.0.0.1:{agent_port}", "--state-dir",
                                  self.procs.path("agent-state")], port=agent_port)

        pod_labels = {"service": "tlsprof-demo", "container_id": self.pod_cid[:12], "pod_uid": self.pod_uid}
        docker_labels = {"service": "tlsprof-demo", "container_id": self.docker_cid[:12]}
        host_labels = {"service": "tlsprof-demo"}
        wanted = (pod_labels, docker_labels, host_labels)
        # Until every workload has TLS CPU at the collector (a few 2 s windows).
        text = self.wait_metrics(
            agent, collector_port, 90,
            lambda text: all(total(text, "tlsprof_cpu_seconds_total", **w) > 0.05 for w in wanted),
            lambda text: "the collector never showed TLS CPU for all three workloads:\n"
            + "\n".join(l for l in text.splitlines() if l.startswith("tlsprof_cpu_seconds_total"))
            + f"\nagent log:\n{self.procs.log(agent)}")

        agent_text = prometheus_harness.scrape(f"127.0.0.1:{agent_port}")
        for where, exposition in (("collector", text), ("agent", agent_text)):
            ok, lint = prometheus_harness.check_metrics(exposition)
            self.assertTrue(ok, f"promtool check metrics on the {where}: {lint}")
        for where, exposition in (("collector", text), ("agent", agent_text)):
            for w in wanted:
                self.assertGreater(total(exposition, "tlsprof_busy_cpu_seconds_total", **w), 0, f"{where}: {w}")
                # Every TLS series of a workload: no empty container label, no other label set.
                self.assertGreater(total(exposition, "tlsprof_cpu_seconds_total", **w), 0, f"{where}: {w}")
            # Only the two containerised workloads carry container labels.
            for name in ("tlsprof_cpu_seconds_total", "tlsprof_busy_cpu_seconds_total"):
                for labels, _ in series(exposition, name):
                    if "container_id" in labels or "pod_uid" in labels:
                        keyed = {k: labels.get(k) for k in ("service", "container_id", "pod_uid") if k in labels}
                        self.assertIn(keyed, (pod_labels, docker_labels), f"{where} {name}: {labels}")
                    self.assertNotIn("", labels.values(), f"{where}: an empty label value in {labels}")
            # The pod's workload did its handshakes and bulk in its container.
            pod_algorithms = {l["algorithm"] for l, v in series(exposition, "tlsprof_cpu_seconds_total")
                              if l.get("pod_uid") == self.pod_uid and v > 0}
            self.assertTrue(pod_algorithms & {"AES-GCM", "ChaCha20-Poly1305", "RSA", "X25519"},
                            f"{where}: {pod_algorithms}")

        # A real Prometheus: the host's series (no container labels) select
        # as container_id="", and by-container sums split the three workloads.
        prom = Prometheus(self.procs, [f"127.0.0.1:{collector_port}"])
        prom.start()
        prom.wait_scraped_after(time.time())
        at = time.time()  # both queries see the same scrape
        by_container = prom.vector('sum by (container_id, pod_uid) (tlsprof_cpu_seconds_total{service="tlsprof-demo"})',
                                   ["container_id", "pod_uid"], at)
        self.assertEqual(set(by_container), {(self.pod_cid[:12], self.pod_uid), (self.docker_cid[:12], ""), ("", "")})
        self.assertTrue(all(v > 0 for v in by_container.values()), by_container)
        host_only = prom.value('sum(tlsprof_cpu_seconds_total{service="tlsprof-demo",container_id=""})', at)
        self.assertAlmostEqual(host_only, by_container[("", "")], delta=1e-9)

        # The one-shot JSON report names each process's container.
        code, out, err = run_agent(["profile", "--duration", "2", "--format", "json", "--pid", str(pod.pid), "--pid",
                                    str(docker.pid), "--pid", str(host.pid)])
        self.assertEqual(code, 0, err)
        rows = {p["pid"]: p for p in json.loads(out)["processes"]}
        self.assertEqual({k: rows[pod.pid][k] for k in ("container_id", "pod_uid", "container_runtime")},
                         {"container_id": self.pod_cid[:12], "pod_uid": self.pod_uid, "container_runtime": "cri"})
        self.assertEqual({k: rows[docker.pid][k] for k in ("container_id", "pod_uid", "container_runtime")},
                         {"container_id": self.docker_cid[:12], "pod_uid": "", "container_runtime": "docker"})
        self.assertEqual({k: rows[host.pid][k] for k in ("container_id", "pod_uid", "container_runtime")},
                         {"container_id": "", "pod_uid": "", "container_runtime": ""})

        # --no-container-labels: the three demos are one service again.
        self.procs.stop(agent)
        plain_port = free_port()
        plain = self.procs.start([AGENT, "run", "--no-container-labels", "--interval", "2", "--metrics-listen",
                                  f"127.0.0.1:{plain_port}"], port=plain_port)
        plain_text = self.wait_metrics(
            plain, plain_port, 60, lambda text: total(text, "tlsprof_cpu_seconds_total", **host_labels) > 0.05,
            lambda text: f"no TLS CPU with --no-container-labels:\n{text}")
        self.assertNotIn("container_id=", plain_text)
        self.assertNotIn("pod_uid=", plain_text)
        self.assertEqual([l for l, _ in series(plain_text, "tlsprof_busy_cpu_seconds_total")
                          if l["service"] == "tlsprof-demo"], [host_labels])


if __name__ == "__main__":
    unittest.main()
