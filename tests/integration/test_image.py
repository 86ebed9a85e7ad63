"""The images of packaging/kubernetes/Containerfile, built from the .debs with
podman on a debootstrapped Debian 12 base (no registry here) and run as the
manifests run them: the agent with the DaemonSet's security context and
volumes profiles a host nginx under load and ships over mTLS to the
collector's image, run with the StatefulSet's security context."""
import fcntl
import glob
import hashlib
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import yaml

from systemd_container import archive_uri, chroot_apt, depends_of
from tlsprof_testlib import (BIN, SRC, Processes, free_port, metric_sum, require_root, scrape, start_nginx,
                             wait_for)

BUILD = os.path.dirname(os.path.abspath(BIN))
KUBERNETES = os.path.join(SRC, "packaging", "kubernetes")
# The base: a minbase bookworm root holding both packages' Depends, made once and imported into podman's store.
BASE_ROOT = os.environ.get("TLSPROF_IMAGE_ROOT", "/opt/tlsprof-image-bookworm")
STAMP = ".tlsprof-stamp"
LAYOUT = 1  # bump when what the root holds changes
INTERVAL = 2  # seconds, the agent's windows (the DaemonSet's 10 s would make the test wait)
MIN_WINDOWS = 3
LOAD_BOUND_SECONDS = 300  # the load runs until the test ends it; this only bounds it
# nginx's TLS share of its own CPU under load-nginx.sh is well above this (test_nginx.py prints it); the check is
# that the agent in its container finds nginx's crypto at all.
MIN_NGINX_TLS_SHARE = 0.10
# linux/capability.h
CAPABILITIES = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def _read(path):
    with open(path) as f:
        return f.read()


def ensure_base(packages):
    """The podman image of BASE_ROOT with `packages` in it (made and imported if missing): its name."""
    with open(BASE_ROOT + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = hashlib.sha256(f"layout {LAYOUT}\n{' '.join(sorted(packages))}".encode()).hexdigest()
        stamp = os.path.join(BASE_ROOT, STAMP)
        if not os.path.exists(stamp) or _read(stamp).strip() != want:
            _make_root(want, packages)
        tag = f"localhost/tlsprof-base:bookworm-{want[:12]}"
        if run(["podman", "image", "exists", tag]).returncode != 0:
            tar = subprocess.Popen(["tar", "-C", BASE_ROOT, "--exclude", f"./{STAMP}", "-c", "."],
                                   stdout=subprocess.PIPE)
            p = run(["podman", "import", "--change", "CMD=/bin/bash", "-", tag], stdin=tar.stdout, timeout=600)
            tar.stdout.close()
            if tar.wait() != 0 or p.returncode != 0:
                raise AssertionError(f"podman import of {BASE_ROOT} failed:\n{p.stderr[-3000:]}")
    return tag


def _make_root(want, packages):
    uri = archive_uri()
    if not uri:
        raise AssertionError("no Debian archive URI in this machine's apt sources: the image's base cannot be made")
    if not shutil.which("debootstrap"):
        raise AssertionError("debootstrap is needed (scripts/install-deps.sh installs it)")
    new = BASE_ROOT + ".new"
    shutil.rmtree(new, ignore_errors=True)
    p = run(["debootstrap", "--variant=minbase", "bookworm", new, uri], timeout=1200)
    if p.returncode != 0:
        raise AssertionError(f"debootstrap bookworm from {uri} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    # apt, not debootstrap's --include, for the Depends: some are virtual packages (libspdlog1.10-fmt9).
    shutil.copy("/etc/resolv.conf", os.path.join(new, "etc", "resolv.conf"))
    for args in (("update",), ("install", "-y", "--no-install-recommends", *sorted(packages)), ("clean",)):
        p = chroot_apt(new, *args)
        if p.returncode != 0:
            raise AssertionError(f"apt-get {' '.join(args)} in {new} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    os.remove(os.path.join(new, "etc", "resolv.conf"))
    # What debian:12-slim leaves out too: downloaded .debs, package lists (the Containerfile needs none), docs.
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*",
                    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*"):
        for path in glob.glob(os.path.join(new, pattern)):
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    with open(os.path.join(new, STAMP), "w") as f:
        f.write(want + "\n")
    shutil.rmtree(BASE_ROOT, ignore_errors=True)
    os.rename(new, BASE_ROOT)


def manifest(name, kind=None):
    """The first document of packaging/kubernetes/NAME (of `kind`, if given)."""
    with open(os.path.join(KUBERNETES, name)) as f:
        return next(d for d in yaml.safe_load_all(f) if d and (kind is None or d["kind"] == kind))


def config_map_data(name):
    """{file: text} of the ConfigMap called `name` in packaging/kubernetes."""
    for path in glob.glob(os.path.join(KUBERNETES, "*.yaml")):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == name:
                    return d["data"]
    raise AssertionError(f"no ConfigMap {name} in {KUBERNETES}")


def ulimits():
    """podman 4.3 gives a root container RLIMIT_NOFILE 1048576, which runc cannot set where root lacks
    CAP_SYS_RESOURCE (a nested VM's): the host's own limits, as containerd passes them. RLIMIT_NPROC too, at
    podman's usual 32768: given nofile alone, runc failed to set the nproc podman then asked for."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = min(32768, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={nproc}:{nproc}"]


def security_args(pod, container, seccomp_file=None):
    """podman run's options for a pod spec's namespaces and a container's security context (the pod's merged
    under it), the way the kubelet asks a CRI runtime for them. `seccomp_file`: the Localhost profile to use when
    the context says RuntimeDefault and the runtime's default cannot run the container (see the test)."""
    ctx = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    args = []
    if pod.get("hostPID"):
        args.append("--pid=host")
    if pod.get("hostIPC"):
        args.append("--ipc=host")
    if pod.get("hostNetwork"):  # the node's network and UTS namespaces
        args += ["--network=host", "--uts=host"]
    if ctx.get("privileged"):
        raise AssertionError(f"{container['name']} is privileged: nothing left to test of its security context")
    if "runAsUser" in ctx:
        args.append(f"--user={ctx['runAsUser']}" + (f":{ctx['runAsGroup']}" if "runAsGroup" in ctx else ""))
    if "fsGroup" in ctx:
        args.append(f"--group-add={ctx['fsGroup']}")
    caps = ctx.get("capabilities", {})
    args += [f"--cap-drop={'all' if c == 'ALL' else 'CAP_' + c}" for c in caps.get("drop", [])]
    args += [f"--cap-add=CAP_{c}" for c in caps.get("add", [])]
    if ctx.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if ctx.get("readOnlyRootFilesystem"):
        # Kubernetes mounts no tmpfs of its own on /tmp or /run: neither does the test.
        args += ["--read-only", "--read-only-tmpfs=false"]
    seccomp = ctx.get("seccompProfile", {}).get("type")
    if seccomp == "RuntimeDefault":
        if seccomp_file:
            args += ["--security-opt", f"seccomp={seccomp_file}"]
    elif seccomp is not None:
        raise AssertionError(f"seccompProfile {seccomp}: the test knows only RuntimeDefault")
    apparmor = ctx.get("appArmorProfile", {}).get("type")
    if apparmor == "Unconfined":
        args += ["--security-opt", "apparmor=unconfined"]
    elif apparmor is not None:
        raise AssertionError(f"appArmorProfile {apparmor}: the test knows only Unconfined")
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        args.append("--memory=" + limits["memory"].replace("Gi", "g").replace("Mi", "m"))
    if "cpu" in limits:
        cpu = limits["cpu"]
        args.append(f"--cpus={int(cpu[:-1]) / 1000 if cpu.endswith('m') else float(cpu)}")
    args += [f"--env={e['name']}={e['value']}" for e in container.get("env", [])]
    return args


def agent_seccomp_profile(default_path, out_path):
    """The Localhost profile the DaemonSet's comment prescribes for runtimes whose default denies the agent,
    written by the script shipped for nodes (packaging/kubernetes/agent-seccomp-profile.py)."""
    with open(out_path, "w") as f:
        subprocess.run([os.path.join(SRC, "packaging", "kubernetes", "agent-seccomp-profile.py"), default_path],
                       check=True, stdout=f)
    return out_path


class Pod:
    """One container of a manifest's pod template, run by podman as the kubelet would run it: its command and
    args (plus the test's `extra` flags), security context, volumes and ports, with test stand-ins for what a
    cluster provides (ConfigMaps from the manifests, a Secret from the test PKI, a temporary directory for a
    node's hostPath under /var and for a volume claim). `pki` maps the config's tls-ca, tls-cert and tls-key to
    the test's files: the volume mounted where the config looks for them holds them, whatever its kind (a
    Secret, cert-manager's CSI driver, a node's directory)."""

    def __init__(self, test, procs, workload, image, pki, extra=(), seccomp_file=None, ports=()):
        spec = workload["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        self.name = f"tlsprof-it-{container['name']}-{os.getpid()}-{free_port()}"
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        mounts, made = {}, {}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for claim in workload["spec"].get("volumeClaimTemplates", []):
            volumes[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "claim": True}
        args = ["podman", "--runtime", "runc", "run", "--rm", "--name", self.name, *ulimits(),
                *security_args(spec, container, seccomp_file)]
        tls_files = {}  # path in the container: the test's file
        for v in volumes.values():
            for text in config_map_data(v["configMap"]["name"]).values() if "configMap" in v else ():
                for key, path in re.findall(r'^(tls-ca|tls-cert|tls-key)\s*=\s*"([^"]+)"', text, re.M):
                    tls_files[path] = pki[key]
        for m in container.get("volumeMounts", []):
            v = volumes[m["name"]]
            source, options = None, "ro" if m.get("readOnly") else "rw"
            here = {p: f for p, f in tls_files.items() if os.path.dirname(p) == m["mountPath"]}
            if here:
                source = procs.path(f"{self.name}-{m['name']}")
                os.makedirs(source)
                mode = v.get("secret", {}).get("defaultMode", 0o440 if fs_group is not None else 0o400)
                for path, file in here.items():
                    target = os.path.join(source, os.path.basename(path))
                    shutil.copy(file, target)
                    os.chown(target, 0, fs_group if fs_group is not None else 0)
                    os.chmod(target, mode)
            elif "configMap" in v:
                source = procs.path(f"{self.name}-{m['name']}")
                os.makedirs(source)
                for file, text in config_map_data(v["configMap"]["name"]).items():
                    with open(os.path.join(source, file), "w") as f:
                        f.write(text)
            elif "hostPath" in v:
                path = v["hostPath"]["path"]
                # The node's kernel and identity are the host's; its state directories are the test's own.
                if path.startswith(("/sys/", "/etc/")):
                    source = path
                else:
                    source = procs.path(f"{self.name}-{m['name']}")
                    os.makedirs(source)
            elif "emptyDir" in v:
                size = v["emptyDir"].get("sizeLimit", "").replace("Gi", "g").replace("Mi", "m")
                tmpfs = f"type=tmpfs,destination={m['mountPath']}" + (f",tmpfs-size={size}" if size else "")
                args += ["--mount", tmpfs]
            elif v.get("claim"):
                # A volume of its own, group-owned by fsGroup and setgid, as the kubelet gives one.
                source = procs.path(f"{self.name}-{m['name']}")
                os.makedirs(source)
                os.chown(source, 0, fs_group if fs_group is not None else 0)
                os.chmod(source, 0o2770)
            else:
                raise AssertionError(f"volume {v}: the test knows no such kind")
            if source:
                mounts[m["mountPath"]] = source
                args += ["--volume", f"{source}:{m['mountPath']}:{options}"]
            made[m["name"]] = source
        # A mount below another one (the Secret at /etc/tlsprof/tls inside the ConfigMap's /etc/tlsprof) needs
        # its mount point in the outer volume, since runc cannot make one in a read-only mount: the kubelet
        # makes it when it fills a ConfigMap or Secret volume (MakeNestedMountpoints), and so does the test.
        for path in mounts:
            for outer, source in mounts.items():
                if path != outer and path.startswith(outer + "/") and not source.startswith(("/sys/", "/etc/")):
                    os.makedirs(os.path.join(source, os.path.relpath(path, outer)), exist_ok=True)
        for container_port, host_port in ports:
            args += ["--publish", f"127.0.0.1:{host_port}:{container_port}"]
        self.volumes = made
        self.argv = args + [image, *container.get("command", []), *container.get("args", []), *extra]
        test.addCleanup(lambda: run(["podman", "rm", "-f", "--time", "5", self.name]))

    def start(self, procs, **kw):
        print(f"\n{' '.join(self.argv)}")
        return procs.start(self.argv, **kw)


def image_size(tag):
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", tag], check=True).stdout)


def try_scrape(port):
    try:
        return scrape(port)
    except OSError:
        return ""


class ImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("podman", "runc"):
            if not shutil.which(tool):
                raise AssertionError(f"{tool} is needed (scripts/install-deps.sh installs podman and runc)")
        started = time.monotonic()
        p = run([os.path.join(SRC, "scripts", "package.sh"), BUILD], timeout=900)
        if p.returncode != 0:
            raise AssertionError(f"scripts/package.sh failed:\n{p.stdout}\n{p.stderr}")
        cls.daemonset = manifest("agent-daemonset.yaml", "DaemonSet")
        cls.statefulset = manifest("collector-statefulset.yaml", "StatefulSet")
        debs = {}
        for package in ("tlsprof-agent", "tlsprof-collector"):
            (debs[package],) = glob.glob(os.path.join(BUILD, "packages", f"{package}_*.deb"))
        packaged = time.monotonic()
        base = ensure_base({d for deb in debs.values() for d in depends_of(deb)})
        based = time.monotonic()
        cls.images = {}
        for package, workload in (("tlsprof-agent", cls.daemonset), ("tlsprof-collector", cls.statefulset)):
            (container,) = workload["spec"]["template"]["spec"]["containers"]
            # The manifest's image name, whose tag must be the package's version.
            image = container["image"]
            version = run(["dpkg-deb", "-f", debs[package], "Version"], check=True).stdout.strip()
            if image != f"{package}:{version.split('-')[0]}":
                raise AssertionError(f"{workload['kind']} runs {image}, but the package is {package} {version}")
            # Each package.sh run makes new .debs (new mtimes), so each build makes a new image: the one it
            # replaces is removed after, to keep the store from growing run by run.
            old = run(["podman", "image", "inspect", "--format", "{{.Id}}", f"localhost/{image}"]).stdout.strip()
            with tempfile.TemporaryDirectory() as context:
                os.makedirs(os.path.join(context, "build", "packages"))
                shutil.copy(debs[package], os.path.join(context, "build", "packages"))
                # No network: the base holds the Depends, so the Containerfile's apt needs no archive.
                p = run(["podman", "--runtime", "runc", "build", "--network=none", "--build-arg", f"BASE={base}",
                         "--build-arg", f"PACKAGE={package}", "-f", os.path.join(KUBERNETES, "Containerfile"),
                         "-t", f"localhost/{image}", context], timeout=600)
            if p.returncode != 0:
                raise AssertionError(f"podman build of {image} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            cls.images[package] = f"localhost/{image}"
            new = run(["podman", "image", "inspect", "--format", "{{.Id}}", cls.images[package]]).stdout.strip()
            if old and old != new:
                run(["podman", "rmi", old])
        built = time.monotonic()
        print(f"\npackage.sh {packaged - started:.0f} s, base {based - packaged:.0f} s, images {built - based:.0f} s; "
              f"base {image_size(base) / 1e6:.0f} MB, " +
              ", ".join(f"{i} {image_size(i) / 1e6:.0f} MB" for i in cls.images.values()))

    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def logs(self, *procs):
        return lambda: "\n".join(f"--- {p.args[:6]}:\n{self.procs.log(p)}" for p in procs)

    def test_agent_image_profiles_host_nginx_and_ships_to_collector_image(self):
        started = time.monotonic()
        hostname = socket.gethostname()
        pki = self.procs.path("pki")
        # The agent's certificate names this host: its reports' host.hostname (the node's, by hostNetwork).
        run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki, hostname], check=True)
        grpc, http, metrics = free_port(), free_port(), free_port()
        collector = Pod(self, self.procs, self.statefulset, self.images["tlsprof-collector"],
                        {"tls-ca": f"{pki}/ca.crt", "tls-cert": f"{pki}/collector.crt",
                         "tls-key": f"{pki}/collector.key"}, ports=((4317, grpc), (9465, http)))
        collector_proc = collector.start(self.procs, port=http, http_path="/metrics", timeout=60)

        nginx_port, _ = start_nginx(self.procs, "rsa")
        self.procs.start(["bash", os.path.join(SRC, "workloads/nginx/load-nginx.sh"), str(nginx_port),
                          str(LOAD_BOUND_SECONDS)])

        # The agent's own flags on top of the DaemonSet's args: this collector, a free port for /metrics on the
        # host's network, short windows.
        agent_args = dict(workload=self.daemonset, image=self.images["tlsprof-agent"],
                          pki={"tls-ca": f"{pki}/ca.crt", "tls-cert": f"{pki}/{hostname}.crt",
                                "tls-key": f"{pki}/{hostname}.key"},
                          extra=["--collector", f"127.0.0.1:{grpc}", "--metrics-listen", f"127.0.0.1:{metrics}",
                                 "--interval", str(INTERVAL)])
        # First under the runtime's default seccomp profile, as the manifest asks (RuntimeDefault).
        default_profile = run(["podman", "info", "--format", "{{.Host.Security.SECCOMPProfilePath}}"],
                              check=True).stdout.strip()
        agent = Pod(self, self.procs, **agent_args).start(self.procs)
        wait_for(self, "the agent under the default seccomp profile: /metrics, or its exit",
                 lambda: agent.poll() is not None or try_scrape(metrics), 120, self.logs(agent))
        seccomp = f"the runtime's default ({default_profile})"
        if agent.poll() is not None:
            log = self.procs.log(agent)
            # A runtime whose default denies bpf() without CAP_SYS_ADMIN (containers-common before 0.53:
            # Debian 12's podman, CRI-O): the agent must say so, not crash.
            # The message names the filter, not the capabilities the agent already has.
            self.assertIn("tlsprof-agent has CAP_BPF and CAP_PERFMON, but a seccomp filter denies the calls of its "
                          "BPF sampler", log)
            self.assertIn("loading the BPF sampler into the kernel failed: Operation not permitted", log)
            print(f"\nthe default seccomp profile {default_profile} denies the agent: "
                  f"{log.strip().splitlines()[-1]}")
            profile = agent_seccomp_profile(default_profile, self.procs.path("seccomp-agent.json"))
            agent = Pod(self, self.procs, seccomp_file=profile, **agent_args).start(
                self.procs, port=metrics, http_path="/metrics", timeout=120)
            seccomp = f"a Localhost profile: the default plus bpf/perf_event_open under CAP_BPF/CAP_PERFMON"
        agent_name = agent.args[agent.args.index("--name") + 1]
        pid = int(run(["podman", "inspect", "--format", "{{.State.Pid}}", agent_name], check=True).stdout)
        self.check_agent_process(pid)

        def nginx_tls():
            text = try_scrape(metrics)
            tls = metric_sum(text, "tlsprof_cpu_seconds_total", service="nginx")
            busy = metric_sum(text, "tlsprof_busy_cpu_seconds_total", service="nginx")
            windows = metric_sum(text, "tlsprof_agent_windows_total")
            return windows >= MIN_WINDOWS and tls > 0 and (tls, busy, windows)
        tls, busy, windows = wait_for(self, "the agent's /metrics: nginx's TLS CPU", nginx_tls, 120,
                                      self.logs(agent))
        share = tls / busy
        # A process of the host, seen through hostPID: no container or pod of its own.
        for line in try_scrape(metrics).splitlines():
            if line.startswith("tlsprof_cpu_seconds_total{") and 'service="nginx"' in line:
                self.assertNotIn("container_id=", line)
        self.assertGreater(share, MIN_NGINX_TLS_SHARE, f"nginx TLS {tls:.2f} s of busy {busy:.2f} s")

        def counted():
            text = try_scrape(http)
            accepted = metric_sum(text, "tlsprof_collector_reports_total", result="accepted")
            nginx = metric_sum(text, "tlsprof_cpu_seconds_total", service="nginx")
            host = metric_sum(text, "tlsprof_host_cpu_seconds_total", host=hostname)
            return accepted > 0 and nginx > 0 and host > 0 and (accepted, nginx, host, text)
        accepted, collected, host_tls, text = wait_for(self, "the collector's /metrics: the agent's reports",
                                                       counted, 60, self.logs(agent, collector_proc))
        refused = {r: metric_sum(text, "tlsprof_collector_reports_total", result=r)
                   for r in ("unauthenticated", "denied", "invalid")}
        self.assertEqual(set(refused.values()), {0.0}, refused)
        print(f"\nagent ({seccomp}): nginx TLS {share * 100:.1f}% of its CPU ({tls:.2f} of {busy:.2f} s) over "
              f"{windows:.0f} windows; collector: {accepted:.0f} reports accepted, nginx TLS {collected:.2f} s, "
              f"host {hostname} {host_tls:.2f} s; test {time.monotonic() - started:.0f} s")

    def check_agent_process(self, pid):
        """What the kernel says of the agent's process: the DaemonSet's capabilities only, no_new_privs, a
        seccomp filter, a read-only root."""
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        (container,) = self.daemonset["spec"]["template"]["spec"]["containers"]
        want = 0
        for cap in container["securityContext"]["capabilities"]["add"]:
            want |= 1 << CAPABILITIES[cap]
        self.assertEqual(int(status["CapBnd"], 16), want, status["CapBnd"])
        self.assertEqual(status["NoNewPrivs"].strip(), "1")
        self.assertEqual(status["Seccomp"].strip(), "2")
        with open(f"/proc/{pid}/mountinfo") as f:
            root = next(line.split() for line in f if line.split()[4] == "/")
        self.assertTrue(root[5].startswith("ro"), root)


if __name__ == "__main__":
    unittest.main()
