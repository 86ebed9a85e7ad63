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
import hashlib
import os
import shlex
import shutil
import subprocess
import unittest

from tlsprof_testlib import SRC

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
    Returns {name: path inside the root}. Rebuilt only when the sources
    changed (a hash of them beside the binaries)."""
    digest = hashlib.sha256()
    files = []
    for d in _SOURCES:
        for name in sorted(os.listdir(os.path.join(SRC, d))):
            if name.endswith((".cc", ".h")):
                files.append(os.path.join(d, name))
                with open(os.path.join(SRC, d, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    out = {n: f"{GROUNDTRUTH_DIR}/{n}" for n in ("tlsprof-groundtruth", "tlsprof-groundtruth-shared")}
    stamp = host_path(f"{GROUNDTRUTH_DIR}/sources.sha256")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and \
            all(os.path.exists(host_path(p)) for p in out.values()):
        return out
    src = f"{GROUNDTRUTH_DIR}/src"
    shutil.rmtree(host_path(GROUNDTRUTH_DIR), ignore_errors=True)
    for rel in files:
        os.makedirs(host_path(f"{src}/{os.path.dirname(rel)}"), exist_ok=True)
        shutil.copy(os.path.join(SRC, rel), host_path(f"{src}/{rel}"))
    cxx = ["g++", "-std=c++20", "-O2", "-g1", f"-I{src}/workloads/common", f"-I{src}"]
    gt = f"{src}/workloads/groundtruth/main.cc"
    run_inside(cxx + ["-c", f"{src}/workloads/common/groundtruth_runner.cc", "-o", f"{GROUNDTRUTH_DIR}/runner.o"])
    run_inside(cxx + [gt, f"{GROUNDTRUTH_DIR}/runner.o", "/usr/lib/x86_64-linux-gnu/libcrypto.a", "-lz", "-lzstd", "-ldl", "-pthread",
                      "-static-libgcc", "-static-libstdc++", "-o", out["tlsprof-groundtruth"]])
    run_inside(cxx + ['-DTLSPROF_GROUNDTRUTH_PROGRAM="tlsprof-groundtruth-shared"', gt, f"{GROUNDTRUTH_DIR}/runner.o",
                      "-lcrypto", "-pthread", "-o", out["tlsprof-groundtruth-shared"]])
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
    return out


GO_ENV = ["env", "GOROOT=/usr/lib/go-1.24", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local", "CGO_ENABLED=0",
          "GOTELEMETRY=off", "HOME=/tmp"]


def build_go(workload, binaries):
    """Builds the Go main package workloads/<workload> inside the root with its
    Go 1.24, one binary per entry of `binaries` (name -> -ldflags), into
    /tmp/tlsprof-<workload> of the root. The go.mod's `go 1.19` becomes `go
    1.24`: a main module's go line sets the GODEBUG defaults, and 1.19's would
    turn X25519MLKEM768 off (tlsmlkem=0). Returns {name: path inside the
    root}; rebuilt only when the sources or the flags changed."""
    out_dir = f"/tmp/tlsprof-{workload}"
    src_dir = os.path.join(SRC, "workloads", workload)
    names = sorted(n for n in os.listdir(src_dir) if n.endswith(".go") or n == "go.mod")
    digest = hashlib.sha256(repr(sorted(binaries.items())).encode())
    for name in names:
        with open(os.path.join(src_dir, name), "rb") as f:
            digest.update(name.encode() + f.read())
    out = {n: f"{out_dir}/{n}" for n in binaries}
    stamp = host_path(f"{out_dir}/sources.sha256")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and \
            all(os.path.exists(host_path(p)) for p in out.values()):
        return out
    shutil.rmtree(host_path(out_dir), ignore_errors=True)
    os.makedirs(host_path(f"{out_dir}/src"))
    for name in names:
        with open(os.path.join(src_dir, name)) as f:
            text = f.read()
        if name == "go.mod":
            text = text.replace("\ngo 1.19\n", "\ngo 1.24\n")
        with open(host_path(f"{out_dir}/src/{name}"), "w") as f:
            f.write(text)
    env = GO_ENV + [f"GOCACHE={out_dir}/cache", f"GOPATH={out_dir}/gopath"]
    for name, ldflags in binaries.items():
        run_inside(["sh", "-c", f'cd {out_dir}/src && exec "$@"', "sh", *env, "/usr/lib/go-1.24/bin/go", "build",
                    f"-ldflags={ldflags}", "-o", out[name], "."])
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
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
    sources = ["workloads/handshake-server/main.cc"] + [
        f"workloads/common/{n}" for n in sorted(os.listdir(os.path.join(SRC, "workloads/common"))) if n.endswith(".h")]
    digest = hashlib.sha256()
    for rel in sources:
        with open(os.path.join(SRC, rel), "rb") as f:
            digest.update(rel.encode() + f.read())
    out = f"{BORINGSSL_DIR}/tlsprof-boringssl-server"
    stamp = host_path(f"{BORINGSSL_DIR}/sources.sha256")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and os.path.exists(host_path(out)):
        return out
    shutil.rmtree(host_path(BORINGSSL_DIR), ignore_errors=True)
    src = f"{BORINGSSL_DIR}/src"
    for rel in sources:
        os.makedirs(host_path(f"{src}/{os.path.dirname(rel)}"), exist_ok=True)
        shutil.copy(os.path.join(SRC, rel), host_path(f"{src}/{rel}"))
    run_inside(["g++", "-std=c++20", "-O2", "-g1", f"-I{src}/workloads/common", f"-I{src}", "-isystem",
                "/usr/include/android", f"{src}/workloads/handshake-server/main.cc", f"-L{ANDROID_LIBS}", "-lssl",
                "-lcrypto", f"-Wl,-rpath,{ANDROID_LIBS}", "-pthread", "-o", out])
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
    return out
