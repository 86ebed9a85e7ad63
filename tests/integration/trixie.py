"""The Debian 13 (trixie) root of today's TLS stacks (scripts/make-trixie-root.sh)
and the two ways the tests run it as a container:

  chroot      a plain chroot in the host's mount namespace: /proc/PID/maps, read
              from the host, names the files by their host paths (ROOT/usr/lib/...)
  pivot_root  an own mount namespace whose root is ROOT after pivot_root, as runc
              does: /proc/PID/maps names the files by their paths inside
              (/usr/lib/...), which the host opens through /proc/PID/root

Both wrap an argv (paths inside the root) so that Processes.start runs it in the
container; files the test shares with it go under ROOT/tmp, which is the same
directory seen from both sides."""
import os
import shlex
import subprocess
import unittest

ROOT = os.environ.get("TLSPROF_TRIXIE_ROOT", "/opt/tlsprof-trixie")
STAMP = os.path.join(ROOT, ".tlsprof-stamp")


def require_trixie(test: unittest.TestCase):
    """Fails (never skips) when the root is missing: scripts/test.sh makes it."""
    test.assertTrue(os.path.exists(STAMP),
                    f"no Debian 13 root at {ROOT}: run scripts/make-trixie-root.sh (scripts/install-deps.sh --tests)")


def host_path(path_inside):
    """The host's path of a file inside the root."""
    return os.path.join(ROOT, path_inside.lstrip("/"))


def chroot(argv):
    """argv run in a plain chroot of the root (the host's mount namespace)."""
    return ["chroot", ROOT, *argv]


# runc's sequence: a private mount namespace, the root bind-mounted on itself
# (pivot_root needs a mount point), /proc and /dev for the workload, then
# pivot_root and the old root detached, so nothing of the host stays visible.
_PIVOT = (
    'set -e; r="$1"; shift; '
    'mount --bind "$r" "$r"; '
    'mount -t proc proc "$r/proc"; '
    'mount --rbind /dev "$r/dev"; '
    'mkdir -p "$r/.oldroot"; cd "$r"; '
    'pivot_root . .oldroot; '
    'cd /; umount -l /.oldroot; '
    'exec "$@"'
)


def pivot_root(argv):
    """argv run in an own mount namespace whose root is the trixie root."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _PIVOT, "sh", ROOT, *argv]


CONTAINERS = {"chroot": chroot, "pivot_root": pivot_root}


def run_inside(argv, timeout=600, container=chroot):
    """Runs argv in the root to completion; returns its stdout, failing with
    its output when it exits non-zero."""
    r = subprocess.run(container(argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{shlex.join(argv)} in {ROOT} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def versions():
    """The stamp's lines after the first: what make-trixie-root.sh installed."""
    with open(STAMP) as f:
        return f.read().splitlines()[1:]
