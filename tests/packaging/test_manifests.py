"""packaging/: the Kubernetes manifests, the default configs and the Prometheus
scrape jobs, checked against each other and against the real binaries.

- Every YAML document parses and has the fields Kubernetes requires; the
  kustomization lists every manifest.
- The agent DaemonSet: hostPID, not privileged, capabilities = drop ALL + the
  systemd unit's bounding set, the BTF/tracefs/debugfs mounts read-only, the
  state and TLS mounts where its config points, a port named metrics where
  its config listens, resources, tolerations for every taint; its liveness
  probe is GET /healthz on that port, and restarts no sooner than an interval.
- The agent's systemd unit: Type=notify with a watchdog (NotifyAccess=main,
  WatchdogSec= longer than an interval, TimeoutStartSec= the agent's set-up
  limit), and a sandbox that lets the notify datagram through (AF_UNIX, and
  the system calls sd_notify makes allowed by the filter). Both units' filters
  allow what their binaries call beyond @system-service (capset for the
  capability drop; bpf and perf_event_open for the agent).
- The collector StatefulSet: at least 2 replicas, non-root, no capabilities,
  read-only root, state on a volume per replica (volumeClaimTemplates), ports
  grpc/metrics where its config listens; its serviceName is a headless Service
  that selects its pods, and the agents' config lists one name per replica
  (tlsprof-collector-N.<service>.<namespace>.svc), as many as replicas.
- Every container's flags are flags of the real binary (its --help), and
  every config (the ConfigMaps, and packaging/config/*.conf with every
  commented example switched on) is accepted by the real binary: the agent
  parses it and stops at an --interval 0 given on the command line (no
  privileges needed); the collector is started with it and serves /metrics.
  A misspelled key must be rejected by both (so the checks above can fail).
- The commented defaults in packaging/config/*.conf are the binaries' own.
- The scrape jobs are named tlsprof-agent and tlsprof-collector;
  promtool checks the static file.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

import yaml

SRC = os.environ.get("TLSPROF_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TLSPROF_BIN", os.path.join(SRC, "build", "bin"))
# The ASan build (scripts/test-sanitizers.sh) defaults --memory-limit to this many times the release's
# (common/sanitizer.h, kSanitizerMemoryFactor); the shipped config documents the release's.
SANITIZER_MEMORY_FACTOR = 8 if os.environ.get("TLSPROF_SANITIZED") == "1" else 1
PKG = os.path.join(SRC, "packaging")
AGENT = os.path.join(BIN, "tlsprof-agent")
COLLECTOR = os.path.join(BIN, "tlsprof-collector")
NAMESPACED = {"ConfigMap", "DaemonSet", "Deployment", "StatefulSet", "Service", "PersistentVolumeClaim", "Secret",
              "PodDisruptionBudget"}
WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")


def help_options(argv):
    """{--flag: default or None} from a CLI11 --help."""
    out = subprocess.run(argv + ["--help"], capture_output=True, text=True, check=True).stdout
    options = {}
    for line in out.splitlines():
        m = re.match(r"^  (?:-\w,)?(--[\w-]+)(.*)$", line)
        if not m:
            continue
        spec = re.split(r"\s{2,}", m.group(2).strip())[0] if m.group(2).strip() else ""
        default = re.search(r"=(\S+)$", spec)
        options[m.group(1)] = default.group(1) if default else None
    return options


def parse_config(text):
    """CLI11 config: [(section, key, value)] of the active lines."""
    entries, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def commented_examples(text):
    """`# key = value` lines of a shipped config: (line, key, value)."""
    return [(m.group(0), m.group(1), m.group(2))
            for m in re.finditer(r"^# ([a-z][\w-]*) = (.+)$", text, re.M)]


def unit_settings(path):
    settings = {}
    with open(path) as f:
        for line in f:
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.strip().split("=", 1)
                settings.setdefault(key, []).append(value)
    return settings


def seconds(value):
    """A systemd time span in seconds ("60s", "5min", "300")."""
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?", value):
        total += float(number) * {"ms": 0.001, "min": 60, "m": 60, "h": 3600}.get(unit, 1)
    return total


def syscall_group(name):
    """The system calls of a SystemCallFilter= group, as this machine's systemd-analyze expands it."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True,
                         check=True).stdout
    calls = {line.strip() for line in out.splitlines()[1:] if line.startswith("    ") and not line.strip().startswith("#")}
    nested = {c for c in calls if c.startswith("@")}
    for group in nested:
        calls |= syscall_group(group)
    return calls - nested


def allowed_system_calls(unit):
    """What a unit's SystemCallFilter= lines allow, in systemd's order: the first (an allow list) sets it, a `~`
    line removes, a later plain line adds back."""
    allowed = set()
    for line in unit["SystemCallFilter"]:
        calls = set()
        for item in line.lstrip("~").split():
            calls |= syscall_group(item) if item.startswith("@") else {item}
        allowed = allowed - calls if line.startswith("~") else allowed | calls
    return allowed


def port_of(address):
    return int(address.strip('"').rsplit(":", 1)[1])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for binary in (AGENT, COLLECTOR):
            if not os.path.exists(binary):
                raise AssertionError(f"{binary} is not built")
        cls.docs = {}
        kube = os.path.join(PKG, "kubernetes")
        cls.files = sorted(f for f in os.listdir(kube) if f.endswith(".yaml") and f != "kustomization.yaml")
        for name in cls.files:
            with open(os.path.join(kube, name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is not None:
                        cls.docs[(doc["kind"], doc["metadata"]["name"])] = doc
        with open(os.path.join(kube, "kustomization.yaml")) as f:
            cls.kustomization = yaml.safe_load(f)
        cls.agent_top = help_options([AGENT])
        cls.agent_run = help_options([AGENT, "run"])
        cls.collector_flags = help_options([COLLECTOR])
        cls.agent_conf = cls.config_map("tlsprof-agent-config")["agent.conf"]
        cls.collector_conf = cls.config_map("tlsprof-collector-config")["collector.conf"]
        cls.tmp = tempfile.mkdtemp(prefix="tlsprof-manifests-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def config_map(cls, name):
        return cls.docs[("ConfigMap", name)]["data"]

    def doc(self, kind, name):
        if (kind, name) not in self.docs:
            self.fail(f"no {kind} {name} in packaging/kubernetes")
        return self.docs[(kind, name)]

    def config_value(self, text, key, section=None):
        for s, k, v in parse_config(text):
            if k == key and (section is None or s == section):
                return v.strip('"')
        self.fail(f"{key} not set in\n{text}")

    def config_list(self, text, key, section=None):
        """A key's value as a list: a CLI11 array `["a", "b"]` (JSON's syntax for strings), or one value."""
        value = self.config_value(text, key, section)
        return json.loads(value) if value.startswith("[") else [value]

    # --- structure -----------------------------------------------------------------------------------------

    def test_documents_have_required_fields(self):
        self.assertGreaterEqual(len(self.docs), 7)
        for (kind, name), doc in self.docs.items():
            self.assertIn("apiVersion", doc, name)
            self.assertRegex(name, r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
            if kind in NAMESPACED:
                self.assertEqual(doc["metadata"].get("namespace"), "tlsprof", f"{kind} {name}")
            if kind in WORKLOADS:
                spec = doc["spec"]
                selector = spec["selector"]["matchLabels"]
                labels = spec["template"]["metadata"]["labels"]
                for k, v in selector.items():
                    self.assertEqual(labels.get(k), v, f"{name}: the selector does not match the pod labels")
                for c in spec["template"]["spec"]["containers"]:
                    self.assertTrue(c.get("image"), f"{name}/{c['name']}: no image")
                    mounts = {m["name"] for m in c.get("volumeMounts", [])}
                    volumes = {v["name"] for v in spec["template"]["spec"].get("volumes", [])}
                    volumes |= {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
                    self.assertLessEqual(mounts, volumes, f"{name}: mounts without a volume")
        self.assertEqual(sorted(self.kustomization["resources"]), self.files)

    def test_agent_daemonset(self):
        ds = self.doc("DaemonSet", "tlsprof-agent")
        pod = ds["spec"]["template"]["spec"]
        self.assertIs(pod.get("hostPID"), True)
        self.assertIn({"operator": "Exists"}, pod.get("tolerations", []))
        (c,) = pod["containers"]
        sc = c["securityContext"]
        self.assertFalse(sc.get("privileged", False))
        self.assertIs(sc.get("allowPrivilegeEscalation"), False)
        self.assertIs(sc.get("readOnlyRootFilesystem"), True)
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        # The same capabilities as the systemd unit's bounding set (both found necessary by test_packaging).
        unit = unit_settings(os.path.join(PKG, "systemd", "tlsprof-agent.service"))
        unit_caps = sorted(c.removeprefix("CAP_") for c in unit["CapabilityBoundingSet"][0].split())
        self.assertEqual(sorted(sc["capabilities"]["add"]), unit_caps)
        self.assertNotIn("SYS_ADMIN", unit_caps)
        for kind in ("requests", "limits"):
            self.assertIn("cpu", c["resources"][kind])
            self.assertIn("memory", c["resources"][kind])

        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for path in ("/sys/kernel/btf", "/sys/kernel/debug", "/sys/kernel/tracing"):
            self.assertIn(path, mounts)
            self.assertIs(mounts[path].get("readOnly"), True, path)
            self.assertEqual(volumes[mounts[path]["name"]]["hostPath"]["path"], path)
        # Where the config points: the state directory on the host, the TLS files of the node's own certificate.
        state = self.config_value(self.agent_conf, "state-dir", "run")
        self.assertIn("hostPath", volumes[mounts[state]["name"]])
        tls_mount = mounts["/etc/tlsprof/tls"]
        self.assertIs(tls_mount.get("readOnly"), True)
        self.assertEqual(volumes[tls_mount["name"]]["hostPath"], {"path": "/etc/tlsprof/agent-tls", "type": "Directory"})
        for key in ("tls-ca", "tls-cert", "tls-key"):
            self.assertTrue(self.config_value(self.agent_conf, key, "run").startswith("/etc/tlsprof/tls/"), key)
        self.assertEqual(volumes[mounts["/etc/tlsprof"]["name"]]["configMap"]["name"], "tlsprof-agent-config")
        self.assertIn("/etc/tlsprof/agent.conf", c["args"])
        # Prometheus finds /metrics by the port name and the annotations.
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        metrics_port = port_of(self.config_value(self.agent_conf, "metrics-listen", "run"))
        self.assertEqual(ports["metrics"], metrics_port)
        annotations = ds["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/port"], str(metrics_port))
        self.assertTrue(self.config_value(self.agent_conf, "metrics-listen", "run").startswith("0.0.0.0:"))
        # Liveness is the window loop's (GET /healthz, docs/fleet.md "Health"): /metrics answers while it is stalled.
        live = c["livenessProbe"]
        self.assertEqual(live["httpGet"], {"path": "/healthz", "port": "metrics"})
        self.assertEqual(c["readinessProbe"]["httpGet"]["port"], "metrics")
        # Kubernetes' defaults: period 10 s, 3 failures, a 1 s timeout. /healthz turns 503 only after
        # STALL_INTERVALS intervals without a window; the probes then restart after period x failures, which
        # must not be shorter than one interval (a 503 is not undone sooner than the next window), and its
        # timeout leaves a starved node a few seconds to answer.
        interval = self.agent_interval()
        self.assertGreaterEqual(live.get("periodSeconds", 10) * live.get("failureThreshold", 3), interval)
        self.assertGreaterEqual(live.get("timeoutSeconds", 1), 2)
        self.assertNotIn("initialDelaySeconds", live, "the set-up is /healthz's own (kSetupLimit): no delay needed")

    def agent_interval(self):
        """The agent's window interval in the DaemonSet's config, else the binary's default."""
        for section, key, value in parse_config(self.agent_conf):
            if section == "run" and key == "interval":
                return float(value)
        return float(self.agent_run["--interval"])

    def test_agent_unit_notify_and_watchdog(self):
        unit = unit_settings(os.path.join(PKG, "systemd", "tlsprof-agent.service"))
        self.assertEqual(unit["Type"], ["notify"])
        self.assertEqual(unit["NotifyAccess"], ["main"])
        self.assertIn(unit["Restart"][-1], ("on-failure", "on-abnormal", "on-watchdog", "always"))
        # Pings go every WatchdogSec/4 while healthy; the watchdog must outlast a late window or two.
        self.assertGreaterEqual(seconds(unit["WatchdogSec"][-1]), 2 * float(self.agent_run["--interval"]))
        # The set-up (the first snapshot of every process) is healthy for kSetupLimit; systemd waits as long
        # for READY=1.
        with open(os.path.join(SRC, "agent", "expose", "health.h")) as f:
            setup_limit = re.search(r"kSetupLimit\{(\d+)\}", f.read())
        self.assertIsNotNone(setup_limit, "agent/expose/health.h: no kSetupLimit{SECONDS}")
        self.assertEqual(seconds(unit["TimeoutStartSec"][-1]), int(setup_limit.group(1)))
        # The notify datagram: an AF_UNIX socket, and the calls libsystemd's sd_notify makes, none of them
        # denied by the filter (its groups expanded by systemd-analyze itself).
        self.assertIn("AF_UNIX", unit["RestrictAddressFamilies"][-1].split())
        allowed = allowed_system_calls(unit)
        for call in ("socket", "sendmsg", "getpid", "close"):
            self.assertTrue(call in allowed, f"SystemCallFilter= denies {call}, which sd_notify needs")

    def test_units_allow_the_calls_the_binaries_make(self):
        # Beyond @system-service: the agent's sampler (bpf, perf_event_open), and the capability drop both binaries
        # make at start (capset, in @privileged); a denied one is EPERM (SystemCallErrorNumber=), and the agent and
        # the collector refuse to run when they cannot drop their capabilities.
        for name, calls in (("tlsprof-agent", ("bpf", "perf_event_open", "capset", "prctl")),
                            ("tlsprof-collector", ("capset", "prctl"))):
            unit = unit_settings(os.path.join(PKG, "systemd", f"{name}.service"))
            self.assertEqual(unit["SystemCallErrorNumber"], ["EPERM"], name)
            allowed = allowed_system_calls(unit)
            for call in calls:
                self.assertTrue(call in allowed, f"{name}.service: SystemCallFilter= denies {call}")
            self.assertFalse("mount" in allowed, f"{name}.service: the filter allows everything?")

    def test_each_node_has_its_own_certificate(self):
        """The collector takes a report only for the host its certificate names (docs/fleet.md, "Identity"): the
        DaemonSet's certificate is each node's own (a hostPath, not one Secret or volume every pod shares), its
        pods report the node's hostname (hostNetwork), and no collector trusts the agents as relays."""
        pod = self.doc("DaemonSet", "tlsprof-agent")["spec"]["template"]["spec"]
        self.assertIs(pod.get("hostNetwork"), True)
        tls = [v for v in pod["volumes"] if v["name"] == "tls"]
        self.assertEqual(len(tls), 1)
        self.assertEqual(set(tls[0]) - {"name"}, {"hostPath"})
        self.assertNotIn("csi", tls[0])
        self.assertFalse([k for k in self.docs if k[0] == "Secret"], "a Secret would be one for all nodes")
        self.assertEqual([k for _, k, _ in parse_config(self.collector_conf) if k == "relay-identity"], [])

    def test_agents_dial_every_collector_replica(self):
        # One stable name per replica, in order, and no other: the agents' rendezvous hashing places each agent
        # on one of them, so a replica missing from the list would get no agent, a name of no replica would be
        # a collector that is always down.
        sts = self.doc("StatefulSet", "tlsprof-collector")
        svc = self.doc("Service", sts["spec"]["serviceName"])
        grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
        ns = sts["metadata"]["namespace"]
        expected = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}.{ns}.svc:{grpc['port']}"
                    for i in range(sts["spec"]["replicas"])]
        self.assertEqual(self.config_list(self.agent_conf, "collector", "run"), expected)
        # The name the comments tell the collectors' certificate to cover matches every one of them.
        for manifest in ("agent-configmap.yaml", "collector-service.yaml", "collector-statefulset.yaml"):
            with open(os.path.join(PKG, "kubernetes", manifest)) as f:
                self.assertIn(f"*.{svc['metadata']['name']}.{ns}.svc", f.read(), manifest)

    def test_collector_statefulset(self):
        sts = self.doc("StatefulSet", "tlsprof-collector")
        spec = sts["spec"]
        self.assertGreaterEqual(spec["replicas"], 2, "the fleet needs more than one collector")
        self.assertEqual(spec["updateStrategy"]["type"], "RollingUpdate")
        pod = spec["template"]["spec"]
        self.assertIs(pod["securityContext"]["runAsNonRoot"], True)
        self.assertNotEqual(pod["securityContext"]["runAsUser"], 0)
        (c,) = pod["containers"]
        sc = c["securityContext"]
        self.assertFalse(sc.get("privileged", False))
        self.assertIs(sc.get("allowPrivilegeEscalation"), False)
        self.assertIs(sc.get("readOnlyRootFilesystem"), True)
        self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        # The state directory is a volume of each replica's own (a claim template), never one shared claim.
        state = self.config_value(self.collector_conf, "state-dir")
        templates = {t["metadata"]["name"]: t for t in spec["volumeClaimTemplates"]}
        self.assertIn(mounts[state]["name"], templates)
        self.assertNotIn(mounts[state]["name"], volumes)
        self.assertEqual(templates[mounts[state]["name"]]["spec"]["accessModes"], ["ReadWriteOnce"])
        self.assertNotIn("PersistentVolumeClaim", {kind for kind, _ in self.docs})
        self.assertEqual(volumes[mounts["/etc/tlsprof/tls"]["name"]]["secret"]["secretName"], "tlsprof-collector-tls")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports["grpc"], port_of(self.config_value(self.collector_conf, "listen")))
        self.assertEqual(ports["metrics"], port_of(self.config_value(self.collector_conf, "metrics-listen")))
        # serviceName: a headless Service over these pods, which gives each its DNS name.
        svc = self.doc("Service", spec["serviceName"])
        self.assertEqual(svc["spec"].get("clusterIP"), "None")
        labels = spec["template"]["metadata"]["labels"]
        for k, v in svc["spec"]["selector"].items():
            self.assertEqual(labels.get(k), v)
        self.assertEqual({p["name"]: p["targetPort"] for p in svc["spec"]["ports"]},
                         {"grpc": "grpc", "metrics": "metrics"})
        # Drains take one replica at a time, and leave the others.
        pdb = self.doc("PodDisruptionBudget", sts["metadata"]["name"])
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], spec["selector"]["matchLabels"])
        self.assertLess(pdb["spec"]["maxUnavailable"], spec["replicas"])

    # --- against the real binaries -------------------------------------------------------------------------

    def test_container_flags_exist(self):
        known = {"tlsprof-agent": set(self.agent_top) | set(self.agent_run) | {"run"},
                 "tlsprof-collector": set(self.collector_flags)}
        for (kind, name), doc in self.docs.items():
            if kind not in WORKLOADS:
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                binary = os.path.basename(c["command"][0])
                self.assertIn(binary, known)
                for arg in c["args"]:
                    if arg.startswith("-") or arg == "run":
                        self.assertIn(arg, known[binary], f"{name}: {binary} has no {arg}")

    def fake_files(self, text):
        """The config with every absolute path that must exist replaced by a file or directory in tmp."""
        def replace(m):
            path = m.group(1)
            local = os.path.join(self.tmp, "files", path.lstrip("/"))
            if path.startswith(("/etc/tlsprof/tls/", "/etc/tlsprof/allowed")):
                os.makedirs(os.path.dirname(local), exist_ok=True)
                open(local, "a").close()
                return f'"{local}"'
            if path.startswith("/srv/"):
                os.makedirs(local, exist_ok=True)
                return f'"{local}"'
            return m.group(0)
        return re.sub(r'"(/[^"]+)"', replace, text)

    def agent_accepts(self, text):
        path = os.path.join(self.tmp, "agent.conf")
        with open(path, "w") as f:
            f.write(self.fake_files(text))
        # --interval 0 (the command line wins) stops the agent right after parsing, before it needs privileges.
        p = subprocess.run([AGENT, "--config", path, "run", "--interval", "0"], capture_output=True, text=True,
                           timeout=30)
        return p.returncode == 1 and "--interval must be > 0" in p.stderr, p.returncode, p.stderr

    def test_agent_accepts_its_configs(self):
        with open(os.path.join(PKG, "config", "agent.conf")) as f:
            shipped = f.read()
        # Every commented example switched on, except those that exclude each other.
        examples = shipped
        for line, key, _ in commented_examples(shipped):
            examples = examples.replace(line, line[2:])
        self.assertIn('\ncollector = "', examples)
        for name, text in (("ConfigMap agent.conf", self.agent_conf), ("packaging/config/agent.conf", shipped),
                           ("agent.conf with every example on", examples)):
            ok, code, err = self.agent_accepts(text)
            self.assertTrue(ok, f"{name}: tlsprof-agent exited {code}: {err}")
        ok, code, err = self.agent_accepts(self.agent_conf + "intreval = 5\n")
        self.assertFalse(ok, "a misspelled key was not rejected")
        self.assertEqual(code, 2, err)

    def start_collector(self, text, extra):
        path = os.path.join(self.tmp, "collector.conf")
        with open(path, "w") as f:
            f.write(text)
        http = free_port()
        state = tempfile.mkdtemp(dir=self.tmp)
        argv = [COLLECTOR, "--config", path, "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen",
                f"127.0.0.1:{http}", "--state-dir", state, *extra]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return False, proc.returncode, proc.stdout.read()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=2) as r:
                        if b"tlsprof_collector_reports_total" in r.read():
                            return True, 0, ""
                except OSError:
                    time.sleep(0.1)
            return False, None, "not serving /metrics after 20 s"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
            proc.stdout.close()

    def test_collector_accepts_its_configs(self):
        pki = os.path.join(self.tmp, "pki")
        subprocess.run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki], check=True, capture_output=True)
        tls = ["--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/collector.crt", "--tls-key", f"{pki}/collector.key"]
        with open(os.path.join(PKG, "config", "collector.conf")) as f:
            shipped = f.read()
        examples = shipped
        for line, key, _ in commented_examples(shipped):
            examples = examples.replace(line, line[2:])
        examples = self.fake_files(examples)
        for name, text in (("ConfigMap collector.conf", self.collector_conf),
                           ("packaging/config/collector.conf", shipped),
                           ("collector.conf with every example on", examples)):
            ok, code, out = self.start_collector(text, tls)
            self.assertTrue(ok, f"{name}: tlsprof-collector exited {code}: {out}")
        ok, code, out = self.start_collector(self.collector_conf + "max-host = 5\n", tls)
        self.assertFalse(ok, "a misspelled key was not rejected")
        self.assertEqual(code, 2, out)
        self.assertIn("max-host", out)

    def test_commented_defaults_are_the_binaries(self):
        for conf, flags in (("agent.conf", self.agent_run | self.agent_top), ("collector.conf", self.collector_flags)):
            with open(os.path.join(PKG, "config", conf)) as f:
                text = f.read()
            active = parse_config(text)
            checked = 0
            for line, key, value in commented_examples(text) + [(f"{k} = {v}", k, v) for _, k, v in active]:
                self.assertIn(f"--{key}", flags, f"{conf}: `{line}`: no such option")
                default = flags[f"--{key}"]
                if key == "memory-limit" and default is not None and SANITIZER_MEMORY_FACTOR != 1:
                    mib = int(default.removesuffix("MiB"))
                    self.assertEqual(mib % SANITIZER_MEMORY_FACTOR, 0, default)
                    default = f"{mib // SANITIZER_MEMORY_FACTOR}MiB"
                    print(f"sanitizer pass: the ASan build's --memory-limit default {flags['--' + key]} is "
                          f"{SANITIZER_MEMORY_FACTOR}x the release's, {default}")
                if default is not None and line.startswith("#"):
                    self.assertEqual(value.strip('"'), default, f"{conf}: `{line}` is not the default")
                    checked += 1
            self.assertGreater(checked, 3, conf)

    def test_systemd_units_match_configs(self):
        for name, conf in (("tlsprof-agent", "agent.conf"), ("tlsprof-collector", "collector.conf")):
            unit = unit_settings(os.path.join(PKG, "systemd", f"{name}.service"))
            self.assertIn(f"--config /etc/tlsprof/{conf}", unit["ExecStart"][0])
            with open(os.path.join(PKG, "config", conf)) as f:
                text = f.read()
            state = re.search(r'^#? ?state-dir = "([^"]+)"', text, re.M).group(1)
            self.assertEqual(f"/var/lib/{unit['StateDirectory'][0]}", state, name)
        collector = unit_settings(os.path.join(PKG, "systemd", "tlsprof-collector.service"))
        self.assertEqual(collector["CapabilityBoundingSet"], [""])
        self.assertEqual(collector["User"], ["tlsprof"])

    # --- Prometheus ----------------------------------------------------------------------------------------

    def test_scrape_jobs(self):
        for name in ("scrape-static.yml", "scrape-kubernetes.yml"):
            with open(os.path.join(PKG, "prometheus", name)) as f:
                config = yaml.safe_load(f)
            jobs = {j["job_name"]: j for j in config["scrape_configs"]}
            self.assertEqual(set(jobs), {"tlsprof-agent", "tlsprof-collector"}, name)
        # Kubernetes discovery keeps the pods by the manifests' labels and port name.
        for job, workload in (("tlsprof-agent", ("DaemonSet", "tlsprof-agent")),
                              ("tlsprof-collector", ("StatefulSet", "tlsprof-collector"))):
            keep = {tuple(r["source_labels"]): r["regex"] for r in jobs[job]["relabel_configs"]
                    if r.get("action") == "keep"}
            template = self.doc(*workload)["spec"]["template"]
            self.assertEqual(keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)],
                             template["metadata"]["labels"]["app.kubernetes.io/name"])
            port_names = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
            self.assertIn(keep[("__meta_kubernetes_pod_container_port_name",)], port_names)
        # Debian's promtool has no Kubernetes discovery: it checks the static file only.
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool is missing: scripts/install-deps.sh installs prometheus")
        p = subprocess.run([promtool, "check", "config", os.path.join(PKG, "prometheus", "scrape-static.yml")],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
