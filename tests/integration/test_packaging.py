"""The Debian packages, installed on this machine (issue 6's acceptance).

scripts/package.sh builds tlsprof-agent and tlsprof-collector .debs from the
build directory; `dpkg -i` installs both; the files, conffiles, system user
and unit enablement are checked; `systemd-analyze verify` must be clean on the
installed units. systemd is not PID 1 here, so each service is started the way
its installed unit says: the unit's ExecStart (unchanged), in a mount namespace
with its ProtectSystem=strict/ProtectHome=/PrivateTmp=/StateDirectory= view of
the file system, as its User=, under its CapabilityBoundingSet= (setpriv), with
its NoNewPrivileges= and MemoryDenyWriteExecute= (prctl PR_SET_MDWE). The installed
agent.conf and collector.conf are used as shipped; the test only adds flags
for what it must (free ports, a test PKI, the collector's address, 2 s
windows). The demo workload runs as `nobody` from a directory only `nobody`
may enter, so the agent profiles it only if its bounding set really holds
CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH. A second copy of the demo (comm
`tlsprof-upgrade`) has its binary deleted once it runs, as a package upgrade
would: only /proc/PID/map_files can open it, so the agent profiles it only if
the unit grants CAP_CHECKPOINT_RESTORE. The collector must count TLS CPU of
both, shipped over mTLS by the agent. `dpkg --purge` must then leave
nothing behind. Cleanup (purge, the system user if the test made it) also
runs when the test fails.
"""
import grp
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

from tlsprof_testlib import BIN, SRC, Processes, free_port, require_root

BUILD = os.path.dirname(os.path.abspath(BIN))
PACKAGES = ("tlsprof-agent", "tlsprof-collector")
UNIT_DIR = "/lib/systemd/system"
# What each package puts where (mode), and what its postinst makes.
FILES = {
    "tlsprof-agent": {"/usr/bin/tlsprof-agent": 0o755, "/etc/tlsprof/agent.conf": 0o644,
                      f"{UNIT_DIR}/tlsprof-agent.service": 0o644,
                      "/usr/share/doc/tlsprof-agent/README.md": 0o644},
    "tlsprof-collector": {"/usr/bin/tlsprof-collector": 0o755, "/etc/tlsprof/collector.conf": 0o644,
                          f"{UNIT_DIR}/tlsprof-collector.service": 0o644,
                          "/usr/share/doc/tlsprof-collector/README.md": 0o644},
}
CONFFILES = {"tlsprof-agent": ["/etc/tlsprof/agent.conf"], "tlsprof-collector": ["/etc/tlsprof/collector.conf"]}
STATE_DIRS = {"tlsprof-agent": "/var/lib/tlsprof-agent", "tlsprof-collector": "/var/lib/tlsprof-collector"}
AGENT_CACHE = "/var/cache/tlsprof-agent"  # CacheDirectory= (systemd, or the test's sandbox, makes it)
ENABLED_LINK = "/etc/systemd/system/multi-user.target.wants/{}.service"
# prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN), then exec argv[1:].
MDWE_EXEC = ("import ctypes, os, sys\n"
             "if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:\n"
             "    sys.exit(f'prctl(PR_SET_MDWE): {os.strerror(ctypes.get_errno())}')\n"
             "os.execv(sys.argv[1], sys.argv[1:])")
# linux/capability.h
CAP_NUMBERS = {"CAP_DAC_READ_SEARCH": 2, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39,
               "CAP_CHECKPOINT_RESTORE": 40}


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def installed(package):
    p = run(["dpkg-query", "-W", "-f=${Status}", package])
    return p.returncode == 0 and "installed" in p.stdout.split()


def parse_unit(path):
    """The [Service] settings of a unit file: {key: [values in order]}."""
    settings, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and "=" in line:
                key, value = line.split("=", 1)
                settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def sandbox_script(unit):
    """Shell commands that give a process (root, in its own mount namespace) the file-system view the
    unit's ProtectSystem=strict, ProtectHome=, PrivateTmp=, ProtectKernelTunables=,
    ProtectControlGroups=, StateDirectory= and CacheDirectory= give it under systemd: private /tmp,
    everything read-only but the state and cache directories (and /dev, /proc)."""
    def on(key, value="yes"):
        return unit.get(key, [""])[-1] == value

    # shadowed: trees a fresh tmpfs now covers; the mounts listed below them are out of reach (their
    # mount points do not exist in this view), so they are left alone, as systemd leaves them.
    cmds, writable, shadowed = [], [], []
    if on("PrivateTmp"):
        cmds += ["mount -t tmpfs -o mode=1777 tmpfs /tmp", "mount -t tmpfs -o mode=1777 tmpfs /var/tmp"]
        shadowed += ["/tmp", "/var/tmp"]
    if on("ProtectHome"):
        cmds += [f"if [ -d {d} ]; then mount -t tmpfs -o mode=0755,ro tmpfs {d}; fi" for d in ("/home", "/root")]
        shadowed += ["/home", "/root"]
    for key, base in (("StateDirectory", "/var/lib"), ("CacheDirectory", "/var/cache")):
        for name in " ".join(unit.get(key, [])).split():
            cmds += [f"mkdir -p {base}/{name}", f"mount --bind {base}/{name} {base}/{name}"]
            writable.append(f"{base}/{name}")
    if on("ProtectKernelTunables"):
        cmds += ["mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys"]
    # Every read-write mount read-only: all of them (strict), /sys's (kernel tunables, control groups),
    # /home's (ProtectHome=read-only); the ones made writable above excepted.
    ro = []
    if on("ProtectSystem", "strict"):
        ro.append("^/")
    if on("ProtectKernelTunables"):
        ro.append("^/sys(/|$)")
    if on("ProtectControlGroups"):
        ro.append("^/sys/fs/cgroup(/|$)")
    if on("ProtectHome", "read-only"):
        ro.append("^/(home|root)(/|$)")
    keep = ["^/(proc|dev)(/|$)"] + ([] if on("ProtectKernelTunables") else ["^/sys(/|$)"])
    keep += [f"^{w}$" for w in writable] + [f"^{t}(/|$)" for t in shadowed]
    if ro:
        cmds.append(
            "awk '$6 ~ /^rw/ {print $5}' /proc/self/mountinfo | grep -v '\\\\' | "
            f"grep -E '{'|'.join(ro)}' | grep -Ev '{'|'.join(keep)}' | sort -u | "
            'while read -r m; do mount -o remount,bind,ro "$m"; done')
    return "\n".join(cmds)


def capability_mask(names):
    mask = 0
    for name in names:
        mask |= 1 << CAP_NUMBERS[name]
    return mask


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def rw_mounts(pid):
    with open(f"/proc/{pid}/mountinfo") as f:
        return sorted({line.split()[4] for line in f if line.split()[5].startswith("rw")})


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_sum(text, name, label_filter=""):
    total = 0.0
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if label_filter in (m.group(1) or ""):
            total += float(m.group(2))
    return total


class PackagingTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        for package in PACKAGES:
            if installed(package):
                self.fail(f"{package} is already installed on this machine: this test installs and purges it; "
                          f"remove it first (dpkg --purge {package})")
        self.had_user = run(["getent", "passwd", "tlsprof"]).returncode == 0
        self.had_group = run(["getent", "group", "tlsprof"]).returncode == 0
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def purge(self):
        """Cleanup, also after a failure: the packages, and the system user if this test made it (after its
        processes: userdel refuses a user that still runs one)."""
        for proc in self.procs.procs:
            self.procs.stop(proc)
        run(["dpkg", "--purge", *PACKAGES])
        if not self.had_user and run(["getent", "passwd", "tlsprof"]).returncode == 0:
            run(["deluser", "--system", "tlsprof"])
        if not self.had_group and run(["getent", "group", "tlsprof"]).returncode == 0:
            run(["delgroup", "--system", "tlsprof"])

    def test_install_start_purge(self):
        started = time.monotonic()
        debs = self.build_packages()
        self.addCleanup(self.purge)
        self.install(debs)
        self.check_installed_files()
        self.verify_units()
        pki = self.make_pki()
        collector, collector_http = self.start_collector(pki)
        demo = self.start_demo()
        upgraded = self.start_deleted_demo()
        agent, agent_http = self.start_agent(pki, collector.grpc)
        self.check_pipeline(collector, collector_http, agent, agent_http, demo, upgraded)
        for proc in (agent, collector):
            self.procs.stop(proc)
            self.assertEqual(proc.returncode, 0, f"{proc.args}: {self.procs.log(proc)}")
        self.purge_and_check()
        print(f"\npackaging test: {time.monotonic() - started:.1f} s")

    # --- build and install ---------------------------------------------------------------------------------

    def build_packages(self):
        p = run([os.path.join(SRC, "scripts", "package.sh"), BUILD], timeout=900)
        self.assertEqual(p.returncode, 0, f"scripts/package.sh failed:\n{p.stdout}\n{p.stderr}")
        print("\n" + p.stdout.strip())
        debs = {}
        for package in PACKAGES:
            found = [f for f in os.listdir(os.path.join(BUILD, "packages"))
                     if f.startswith(package + "_") and f.endswith(".deb")]
            self.assertEqual(len(found), 1, f"{package}: expected one .deb in build/packages, found {found}")
            debs[package] = os.path.join(BUILD, "packages", found[0])
            fields = run(["dpkg-deb", "-f", debs[package], "Package", "Version", "Depends", "Section",
                          "Maintainer"]).stdout
            self.assertIn(f"Package: {package}", fields)
            self.assertIn("Depends: ", fields, f"{package}: no Depends (dpkg-shlibdeps did not run?)")
            self.assertIn("libc6", fields)
        return debs

    def install(self, debs):
        p = run(["dpkg", "-i", *debs.values()], timeout=300)
        self.assertEqual(p.returncode, 0, f"dpkg -i failed (missing Depends?):\n{p.stdout}\n{p.stderr}")
        self.assertNotIn("dependency problems", p.stderr)
        for package in PACKAGES:
            self.assertTrue(installed(package), package)

    def check_installed_files(self):
        for package, files in FILES.items():
            listed = run(["dpkg", "-L", package]).stdout.split("\n")
            for path, mode in files.items():
                self.assertIn(path, listed, f"{package} does not list {path}")
                st = os.stat(path)
                self.assertEqual(st.st_mode & 0o7777, mode, f"{path}: mode {oct(st.st_mode & 0o7777)}")
                self.assertEqual((st.st_uid, st.st_gid), (0, 0), f"{path} is not owned by root")
            conffiles = run(["dpkg-query", "-W", "-f=${Conffiles}", package]).stdout
            marked = [line.split()[0] for line in conffiles.strip().split("\n") if line.strip()]
            self.assertEqual(marked, CONFFILES[package], f"{package}: conffiles")
        # The collector's system user: no login, no password, a system uid.
        user = pwd.getpwnam("tlsprof")
        self.assertLess(user.pw_uid, 1000)
        self.assertEqual(user.pw_shell, "/usr/sbin/nologin")
        self.assertEqual(grp.getgrgid(user.pw_gid).gr_name, "tlsprof")
        for package, state in STATE_DIRS.items():
            st = os.stat(state)
            owner = user.pw_uid if package == "tlsprof-collector" else 0
            self.assertEqual(st.st_uid, owner, f"{state} owner")
            self.assertEqual(st.st_mode & 0o777, 0o750 if owner else 0o700, f"{state} mode")
        # The agent is enabled on install (as shipped it only serves /metrics on 127.0.0.1); the collector,
        # which needs certificates first, is not.
        self.assertTrue(os.path.islink(ENABLED_LINK.format("tlsprof-agent")))
        self.assertFalse(os.path.lexists(ENABLED_LINK.format("tlsprof-collector")))

    def verify_units(self):
        for package in PACKAGES:
            unit = f"{UNIT_DIR}/{package}.service"
            p = run(["systemd-analyze", "verify", unit], timeout=60)
            self.assertEqual((p.returncode, p.stdout + p.stderr), (0, ""), f"systemd-analyze verify {unit}")
            p = run(["systemd-analyze", "security", "--offline=true", "--no-pager", unit], timeout=60)
            exposure = re.search(r"Overall exposure level for \S+: (\S+ \S+)", p.stdout)
            self.assertIsNotNone(exposure, p.stdout + p.stderr)
            print(f"{package}.service: systemd-analyze security exposure {exposure.group(1)}")

    # --- run the services the way their units say ----------------------------------------------------------

    def unit_command(self, package, extra):
        """setpriv + the unit's ExecStart + extra flags: its User=, bounding set, no-new-privs."""
        unit = parse_unit(f"{UNIT_DIR}/{package}.service")
        self.assertEqual(len(unit["ExecStart"]), 1)
        exec_start = shlex.split(unit["ExecStart"][0])
        caps = " ".join(unit.get("CapabilityBoundingSet", [])).split()
        self.assertTrue(caps or "CapabilityBoundingSet" in unit, f"{package}: no CapabilityBoundingSet=")
        bounding = "-all" + "".join(",+" + c.removeprefix("CAP_").lower() for c in caps)
        wrapper = ["setpriv", "--bounding-set", bounding, "--inh-caps", "-all"]
        if unit.get("NoNewPrivileges") == ["yes"]:
            wrapper.append("--no-new-privs")
        user = unit.get("User", ["root"])[-1]
        if user != "root":
            wrapper += ["--reuid", user, "--regid", unit.get("Group", [user])[-1], "--init-groups"]
        # The mounts first (they need root's CAP_SYS_ADMIN), then setpriv drops to the unit's
        # credentials and execs the ExecStart: one process, one pid.
        sandbox = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
                   sandbox_script(unit) + '\nexec "$@"', "sandbox"]
        # MemoryDenyWriteExecute=yes as the kernel's own prctl (Linux 6.3+), kept across execve.
        mdwe = ["python3", "-c", MDWE_EXEC] if unit.get("MemoryDenyWriteExecute") == ["yes"] else []
        return sandbox + wrapper + ["--", *mdwe, *exec_start, *extra], caps, user

    def make_pki(self):
        # The collector (user tlsprof) reads its files: a directory it may enter, its key by group.
        # Not in /tmp: both units have PrivateTmp=yes.
        pki = tempfile.mkdtemp(prefix="tlsprof-pki-", dir="/run")
        self.addCleanup(shutil.rmtree, pki, ignore_errors=True)
        # The agent reports this machine's hostname: its certificate names it (docs/fleet.md, "Identity").
        p = run([os.path.join(SRC, "scripts", "make-test-pki.sh"), pki, f"agent-1={socket.gethostname()}"],
                timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        os.chmod(pki, 0o755)
        gid = grp.getgrnam("tlsprof").gr_gid
        for name in ("collector.key", "collector.crt", "ca.crt"):
            os.chown(os.path.join(pki, name), 0, gid)
            os.chmod(os.path.join(pki, name), 0o640)
        return pki

    def start_collector(self, pki):
        grpc, http = free_port(), free_port()
        argv, caps, user = self.unit_command("tlsprof-collector", [
            "--listen", f"127.0.0.1:{grpc}", "--metrics-listen", f"127.0.0.1:{http}",
            "--tls-ca", f"{pki}/ca.crt", "--tls-cert", f"{pki}/collector.crt", "--tls-key", f"{pki}/collector.key"])
        self.assertEqual(caps, [], "the collector's unit must have an empty bounding set")
        self.assertEqual(user, "tlsprof")
        collector = self.procs.start(argv, port=http)
        collector.grpc = grpc
        return collector, f"127.0.0.1:{http}"

    def start_demo(self):
        # A directory only `nobody` may enter: reading its binary takes CAP_DAC_READ_SEARCH, its maps
        # CAP_SYS_PTRACE.
        private = tempfile.mkdtemp(prefix="tlsprof-demo-")
        self.addCleanup(shutil.rmtree, private, ignore_errors=True)
        os.chmod(private, 0o755)
        home = os.path.join(private, "nobody")
        os.mkdir(home)
        demo = os.path.join(home, "tlsprof-demo")
        shutil.copy(os.path.join(BIN, "tlsprof-demo"), demo)
        nobody = pwd.getpwnam("nobody")
        for path in (home, demo):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        os.chmod(home, 0o700)
        ready = os.path.join(private, "ready")
        os.chown(private, nobody.pw_uid, nobody.pw_gid)  # it writes its ready file here
        return self.procs.start(["setpriv", "--reuid", "nobody", "--regid", str(nobody.pw_gid), "--clear-groups",
                                 demo, "--duration", "0", "--ready-file", ready], ready_file=ready)

    def start_deleted_demo(self):
        # Its binary is deleted once it runs (a package upgrade replaces files the same way): /proc/PID/root
        # finds nothing, /proc/PID/map_files needs CAP_CHECKPOINT_RESTORE.
        where = tempfile.mkdtemp(prefix="tlsprof-upgrade-")
        self.addCleanup(shutil.rmtree, where, ignore_errors=True)
        os.chmod(where, 0o755)
        demo = os.path.join(where, "tlsprof-upgrade")  # 15 characters: the whole name is its comm
        shutil.copy(os.path.join(BIN, "tlsprof-demo"), demo)
        nobody = pwd.getpwnam("nobody")
        os.chown(where, nobody.pw_uid, nobody.pw_gid)
        ready = os.path.join(where, "ready")
        proc = self.procs.start(["setpriv", "--reuid", "nobody", "--regid", str(nobody.pw_gid), "--clear-groups",
                                 demo, "--duration", "0", "--ready-file", ready], ready_file=ready)
        os.unlink(demo)
        with open(f"/proc/{proc.pid}/maps") as f:
            self.assertIn(f"{demo} (deleted)", f.read())
        return proc

    def start_agent(self, pki, collector_grpc):
        http = free_port()
        argv, caps, user = self.unit_command("tlsprof-agent", [
            "--collector", f"127.0.0.1:{collector_grpc}", "--tls-ca", f"{pki}/ca.crt",
            "--tls-cert", f"{pki}/agent-1.crt", "--tls-key", f"{pki}/agent-1.key",
            "--metrics-listen", f"127.0.0.1:{http}", "--interval", "2"])
        self.assertEqual(user, "root")
        self.assertNotIn("CAP_SYS_ADMIN", caps)
        agent = self.procs.start(argv, port=http)
        agent.caps = caps
        return agent, f"127.0.0.1:{http}"

    def check_pipeline(self, collector, collector_http, agent, agent_http, demo, upgraded):
        deadline = time.monotonic() + 90
        demo_tls = upgraded_tls = accepted = 0.0
        while time.monotonic() < deadline:
            for proc in (collector, agent, demo, upgraded):
                if proc.poll() is not None:
                    self.fail(f"{proc.args} exited with {proc.returncode}:\n{self.procs.log(proc)}")
            text = scrape(collector_http)
            accepted = metric_sum(text, "tlsprof_collector_reports_total", 'result="accepted"')
            demo_tls = metric_sum(text, "tlsprof_cpu_seconds_total", 'service="tlsprof-demo"')
            upgraded_tls = metric_sum(text, "tlsprof_cpu_seconds_total", 'service="tlsprof-upgrade"')
            if accepted >= 3 and demo_tls > 0 and upgraded_tls > 0:
                break
            time.sleep(0.5)
        self.assertGreaterEqual(accepted, 3, f"agent log:\n{self.procs.log(agent)}")
        self.assertGreater(demo_tls, 0, "the collector counted no TLS CPU of the demo (run as nobody): the agent "
                           f"could not read its process or binary. Agent log:\n{self.procs.log(agent)}")
        # The agent counts a window before it seals its batch, so once the collector has accepted `accepted` of
        # them the agent's windows_total is at least that: sound only if every accepted batch was a window of this
        # process, not one an earlier run left in the spool (the agent logs what it found there at start).
        with open(agent.log_path, errors="replace") as f:
            start_log = f.read()
        self.assertRegex(start_log, r"next sequence \d+, 0 batch\(es\)",
                         "the agent started with batches of an earlier run in its spool")
        agent_text = scrape(agent_http)
        self.assertGreaterEqual(metric_sum(agent_text, "tlsprof_agent_windows_total"), accepted,
                                f"agent metrics:\n{agent_text}\nagent log:\n{self.procs.log(agent)}")
        # The shipper's counters reach /metrics at the agent's next poll (0.5 s): waited for, not raced.
        deadline = time.monotonic() + 30
        while (metric_sum(agent_text, "tlsprof_agent_batches_total", 'result="accepted"') == 0
               and time.monotonic() < deadline):
            time.sleep(0.2)
            agent_text = scrape(agent_http)
        self.assertGreater(metric_sum(agent_text, "tlsprof_agent_batches_total", 'result="accepted"'), 0)
        self.assertGreater(upgraded_tls, 0, "the collector counted no TLS CPU of the demo whose binary was deleted: "
                           f"the agent could not open /proc/PID/map_files. Agent log:\n{self.procs.log(agent)}")
        print(f"collector: {accepted:.0f} reports accepted, demo TLS CPU {demo_tls:.2f} s, "
              f"deleted-binary demo {upgraded_tls:.2f} s")

        status = proc_status(agent.pid)
        want = capability_mask(agent.caps)
        self.assertEqual(int(status["CapBnd"], 16), want, status)
        # After set-up the agent keeps only its steady state (docs/fleet.md, "Capabilities"). The unit's bounding
        # set has no CAP_SETPCAP, so the bounding set stays the unit's; no_new_privs makes it moot.
        from test_privileges import steady_state_mask
        self.assertEqual(int(status["CapEff"], 16), want & steady_state_mask(), status)
        self.assertEqual(int(status["CapPrm"], 16), want & steady_state_mask(), status)
        self.assertEqual(status["NoNewPrivs"], "1")
        status = proc_status(collector.pid)
        self.assertEqual(int(status["CapBnd"], 16), 0, status)
        self.assertEqual(int(status["CapEff"], 16), 0, status)
        self.assertEqual(int(status["CapPrm"], 16), 0, status)
        self.assertEqual(int(status["Uid"].split()[0]), pwd.getpwnam("tlsprof").pw_uid)
        self.assertEqual(status["NoNewPrivs"], "1")
        # The sandbox held: nothing writable but the API file systems, a private /tmp and the unit's own
        # directories (the agent read the demo's binary through /proc/PID/root all the same). Mounts other tests
        # made below the host's /tmp are still listed, shadowed by the private /tmp and out of reach.
        for proc, allowed in ((agent, ("/tmp", "/var/tmp", STATE_DIRS["tlsprof-agent"], AGENT_CACHE)),
                              (collector, ("/tmp", "/var/tmp", STATE_DIRS["tlsprof-collector"]))):
            writable = [m for m in rw_mounts(proc.pid)
                        if m not in allowed and not re.match(r"^/(proc|dev)(/|$)|^/(var/)?tmp/", m)]
            self.assertEqual(writable, [], f"{proc.args[-1]}: writable mounts outside its sandbox")
            with open(f"/proc/{proc.pid}/root/tmp/.probe", "w"):
                pass  # its /tmp, not the host's
            self.assertFalse(os.path.exists("/tmp/.probe"))
        # The collector kept its state where collector.conf says, as its user.
        state = STATE_DIRS["tlsprof-collector"]
        self.assertTrue(os.listdir(state), f"{state} is empty")
        for name in os.listdir(state):
            self.assertEqual(os.stat(os.path.join(state, name)).st_uid, pwd.getpwnam("tlsprof").pw_uid, name)
        # The agent's spool is the installed state directory (its instance id is there).
        self.assertTrue(os.path.exists(os.path.join(STATE_DIRS["tlsprof-agent"], "instance")))

    # --- purge ---------------------------------------------------------------------------------------------

    def purge_and_check(self):
        p = run(["dpkg", "--purge", *PACKAGES], timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for package, files in FILES.items():
            self.assertFalse(installed(package))
            self.assertNotEqual(run(["dpkg-query", "-W", package]).returncode, 0, f"{package} still known to dpkg")
            for path in files:
                self.assertFalse(os.path.lexists(path), f"{path} is left after purge")
            self.assertFalse(os.path.lexists(STATE_DIRS[package]), f"{STATE_DIRS[package]} is left after purge")
            self.assertFalse(os.path.lexists(ENABLED_LINK.format(package)))
            self.assertFalse(os.path.lexists(f"/etc/systemd/system/{package}.service"), "a mask is left")
        self.assertFalse(os.path.lexists(AGENT_CACHE), f"{AGENT_CACHE} is left after purge")
        self.assertFalse(os.path.lexists("/etc/tlsprof"))


if __name__ == "__main__":
    unittest.main()
