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

from tlsprof_testlib import build_once, raise_go_line, sources_under

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
# with what is mounted below it (pivot_root needs a mount point), /proc and
# /dev for the workload, then pivot_root and the old root detached, so nothing
# of the host stays visible.
_PIVOT = (
    'set -e; r="$1"; shift; '
    'mount --rbind "$r" "$r"; '
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


GROUNDTRUTH_DIR = "/tmp/tlsprof-groundtruth"  # inside the root
_SOURCES = ["workloads/common", "workloads/groundtruth"]


def build_groundtruth():
    """Builds tlsprof-groundtruth (the root's libcrypto.a linked in, full
    .symtab) and tlsprof-groundtruth-shared (its libcrypto.so.3) inside the
    root, with its g++ and OpenSSL 3.5 headers, from this tree's sources.
    Returns {name: path inside the root}; rebuilt only when the sources
    changed (build_once)."""
    out = {n: f"{GROUNDTRUTH_DIR}/{n}" for n in ("tlsprof-groundtruth", "tlsprof-groundtruth-shared")}
    src = f"{GROUNDTRUTH_DIR}/src"
    cxx = ["g++", "-std=c++20", "-O2", "-g1", f"-I{src}/workloads/common", f"-I{src}"]
    gt = f"{src}/workloads/groundtruth/main.cc"

    def build():
        run_inside(cxx + ["-c", f"{src}/workloads/common/groundtruth_runner.cc", "-o", f"{GROUNDTRUTH_DIR}/runner.o"])
        run_inside(cxx + [gt, f"{GROUNDTRUTH_DIR}/runner.o", "/usr/lib/x86_64-linux-gnu/libcrypto.a", "-lz", "-lzstd",
                          "-ldl", "-pthread", "-static-libgcc", "-static-libstdc++", "-o", out["tlsprof-groundtruth"]])
        run_inside(cxx + ['-DTLSPROF_GROUNDTRUTH_PROGRAM="tlsprof-groundtruth-shared"', gt,
                          f"{GROUNDTRUTH_DIR}/runner.o", "-lcrypto", "-pthread", "-o", out["tlsprof-groundtruth-shared"]])
    sources = [rel for d in _SOURCES for rel in sources_under(d, (".cc", ".h"))]
    build_once(host_path(GROUNDTRUTH_DIR), sources, [host_path(p) for p in out.values()], build)
    return out


GO_ENV = ["env", "GOROOT=/usr/lib/go-1.24", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local", "CGO_ENABLED=0",
          "GOTELEMETRY=off", "HOME=/tmp"]


def build_go(workload, binaries):
    """Builds the Go main package workloads/<workload> inside the root with its
    Go 1.24, one binary per entry of `binaries` (name -> -ldflags), into
    /tmp/tlsprof-<workload> of the root, its go line raised to 1.24
    (raise_go_line). Returns {name: path inside the root}; rebuilt only when
    the sources or the flags changed (build_once)."""
    out_dir = f"/tmp/tlsprof-{workload}"
    src = f"{out_dir}/src/workloads/{workload}"
    out = {n: f"{out_dir}/{n}" for n in binaries}
    env = GO_ENV + [f"GOCACHE={out_dir}/cache", f"GOPATH={out_dir}/gopath"]

    def build():
        raise_go_line(host_path(f"{src}/go.mod"), "1.24")
        for name, ldflags in binaries.items():
            run_inside(["sh", "-c", f'cd {src} && exec "$@"', "sh", *env, "/usr/lib/go-1.24/bin/go", "build",
                        f"-ldflags={ldflags}", "-o", out[name], "."])
    build_once(host_path(out_dir), sources_under(f"workloads/{workload}", (".go", "go.mod")),
               [host_path(p) for p in out.values()], build, salt=repr(sorted(binaries.items())))
    return out


def build_go_tls():
    """The workloads' Go TLS server (workloads/go-tls) built by the root's Go
    1.24: tlsprof-go-tls (symbols, DWARF) and tlsprof-go-tls-stripped (-s -w)."""
    return build_go("go-tls", {"tlsprof-go-tls": "", "tlsprof-go-tls-stripped": "-s -w"})


def build_go_groundtruth():
    """The Go ground truth (workloads/go-groundtruth) built by the root's Go
    1.24, with symbols and with -s -w; -checklinkname=0 lets its linkname to
    the std's vendored ChaCha20-Poly1305 through (Go 1.23+ refuses it)."""
    return build_go("go-groundtruth", {
        name: f"{strip}-checklinkname=0 -X main.program={name}"
        for name, strip in (("tlsprof-go-groundtruth", ""), ("tlsprof-go-groundtruth-stripped", "-s -w "))})


BORINGSSL_DIR = "/tmp/tlsprof-boringssl-server"  # inside the root
ANDROID_LIBS = "/usr/lib/x86_64-linux-gnu/android"


def build_boringssl_server():
    """The handshake server and client (workloads/handshake-server) built
    inside the root with its g++ on its android-libboringssl 14 (Android's
    BoringSSL: Kyber768 and its experimental X25519Kyber/P256Kyber groups).
    Returns its path inside the root; rebuilt only when the sources changed."""
    out = f"{BORINGSSL_DIR}/tlsprof-boringssl-server"
    src = f"{BORINGSSL_DIR}/src"

    def build():
        run_inside(["g++", "-std=c++20", "-O2", "-g1", f"-I{src}/workloads/common", f"-I{src}", "-isystem",
                    "/usr/include/android", f"{src}/workloads/handshake-server/main.cc", f"-L{ANDROID_LIBS}", "-lssl",
                    "-lcrypto", f"-Wl,-rpath,{ANDROID_LIBS}", "-pthread", "-o", out])
    sources = ["workloads/handshake-server/main.cc"] + sources_under("workloads/common", (".h",))
    build_once(host_path(BORINGSSL_DIR), sources, [host_path(out)], build)
    return out
