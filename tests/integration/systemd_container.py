"""A real systemd for the tests of what the units do at run time (Type=notify,
the watchdog): systemd is not PID 1 on the development machines, so a Debian
12 root boots in a container, `systemd-nspawn --boot` (package
systemd-container).

The root (minbase bookworm with systemd, systemd-sysv and dbus) is made once
with debootstrap from this machine's own Debian archive and kept at
$TLSPROF_SYSTEMD_ROOT (default /opt/tlsprof-systemd-bookworm); the packages a
test installs are put in first with apt (their Depends). Each boot is
--volatile=overlay: what the test does inside is gone when the container
stops. The container shares the host's network (the tests reach the agent's
/healthz from here) but has its own PID namespace.
"""
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tlsprof_testlib import SRC

ROOT = os.environ.get("TLSPROF_SYSTEMD_ROOT", "/opt/tlsprof-systemd-bookworm")
STAMP = ".tlsprof-stamp"
LAYOUT = 1  # bump when what the root holds changes
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus")


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def archive_uri():
    p = _run(["bash", "-c", f"source {SRC}/scripts/debian-archive.sh && debian_archive_uri"])
    return p.stdout.strip()


def chroot_apt(root, *args, timeout=900):
    """apt-get inside the root, with /proc mounted in a mount namespace that ends with it."""
    script = ('set -e; mount -t proc proc "$0/proc"; '
              'chroot "$0" env DEBIAN_FRONTEND=noninteractive apt-get -qq "$@"')
    return _run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, root, *args], timeout=timeout)


def depends_of(deb):
    """The package names of a .deb's Depends (the first of each alternative)."""
    field = _run(["dpkg-deb", "-f", deb, "Depends"], check=True).stdout
    return sorted({alt.split("|")[0].split("(")[0].split(":")[0].strip() for alt in field.split(",") if alt.strip()})


def ensure_root(packages=()):
    """The root, made if missing, with `packages` installed. Raises (with the log's tail) when it cannot be
    made: debootstrap and apt need this machine's Debian archive."""
    with open(ROOT + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = hashlib.sha256(f"layout {LAYOUT}\n{' '.join(BASE_PACKAGES)}".encode()).hexdigest()
        stamp = os.path.join(ROOT, STAMP)
        if not (os.path.exists(stamp) and Path(stamp).read_text().split("\n")[0] == want):
            _make_root(want)
        missing = [p for p in packages
                   if _run(["chroot", ROOT, "dpkg-query", "-W", "-f=${Status}", p]).stdout.split()[-1:] != ["installed"]]
        if missing:
            for args in (("update",), ("install", "-y", "--no-install-recommends", *missing), ("clean",)):
                p = chroot_apt(ROOT, *args)
                if p.returncode != 0:
                    raise AssertionError(f"apt-get {' '.join(args)} in {ROOT} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return ROOT


def _make_root(want):
    uri = archive_uri()
    if not uri:
        raise AssertionError("no Debian archive URI in this machine's apt sources: the systemd root cannot be made")
    if not shutil.which("debootstrap") or not shutil.which("systemd-nspawn"):
        raise AssertionError("debootstrap and systemd-nspawn are needed (scripts/install-deps.sh installs "
                             "debootstrap and systemd-container)")
    new = ROOT + ".new"
    shutil.rmtree(new, ignore_errors=True)
    p = _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", new, uri],
             timeout=1200)
    if p.returncode != 0:
        raise AssertionError(f"debootstrap bookworm from {uri} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    shutil.copy("/etc/resolv.conf", os.path.join(new, "etc", "resolv.conf"))
    # No service started by a package's postinst while apt runs in the chroot.
    policy = os.path.join(new, "usr", "sbin", "policy-rc.d")
    with open(policy, "w") as f:
        f.write("#!/bin/sh\nexit 101\n")
    os.chmod(policy, 0o755)
    with open(os.path.join(new, STAMP), "w") as f:
        f.write(want + "\n")
    shutil.rmtree(ROOT, ignore_errors=True)
    os.rename(new, ROOT)


class Container:
    """A booted container of the root; stop() (or the Processes that started it) shuts it down."""

    def __init__(self, procs, root, binds=(), capabilities=(), system_calls=()):
        argv = ["systemd-nspawn", "-D", root, "--boot", "--register=no", "--keep-unit", "--volatile=overlay",
                "--console=passive"]
        argv += [f"--bind-ro={b}" for b in binds]
        if capabilities:
            argv.append("--capability=" + ",".join(capabilities))
        # nspawn's own seccomp filter denies some calls whatever the capabilities (bpf, perf_event_open).
        if system_calls:
            argv.append("--system-call-filter=" + " ".join(system_calls))
        self.procs = procs
        self.nspawn = procs.start(argv)
        self.pid1 = self._wait_pid1()
        self._wait_running()

    def _wait_pid1(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise AssertionError(f"systemd-nspawn exited with {self.nspawn.returncode}:\n"
                                     f"{self.procs.log(self.nspawn)}")
            children = _run(["pgrep", "-P", str(self.nspawn.pid)]).stdout.split()
            for child in children:
                try:
                    with open(f"/proc/{child}/comm") as f:
                        comm = f.read().strip()
                except FileNotFoundError:
                    continue  # a short-lived child of nspawn, gone since pgrep listed it
                if comm == "systemd":
                    return int(child)
            time.sleep(0.2)
        raise AssertionError(f"no systemd in the container after {timeout} s:\n{self.procs.log(self.nspawn)}")

    def _wait_running(self, timeout=120):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run(["systemctl", "is-system-running"]).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.5)
        raise AssertionError(f"the container's systemd is '{state}' after {timeout} s:\n"
                             f"{self.run(['systemctl', '--failed', '--no-pager']).stdout}")

    def run(self, argv, **kw):
        """argv inside the container (every namespace of its PID 1)."""
        return _run(["nsenter", "-t", str(self.pid1), "-a", *argv], **kw)

    def show(self, unit, *properties):
        """{property: value} of `systemctl show`."""
        out = self.run(["systemctl", "show", unit, "-p", ",".join(properties)], check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit):
        return self.run(["journalctl", "-u", unit, "--no-pager", "-o", "short-monotonic"]).stdout

    def host_pid(self, pid):
        """The host's pid of the container's `pid`."""
        ns = os.readlink(f"/proc/{self.pid1}/ns/pid")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                    continue
                with open(f"/proc/{entry}/status") as f:
                    nspid = re.search(r"^NSpid:\s+(.*)$", f.read(), re.M).group(1).split()
            except (OSError, AttributeError):
                continue
            if int(nspid[-1]) == pid:
                return int(entry)
        raise AssertionError(f"no host process is pid {pid} in the container")

    def stop(self):
        self.procs.stop(self.nspawn, timeout=60)
