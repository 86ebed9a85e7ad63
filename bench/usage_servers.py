"""The handshake-only servers and helpers the usage benches share
(usage_handshake_cost.py, usage_budget.py). Python 3 standard library only."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids):
    """utime + stime of the processes, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / TICKS


def wait_for(path, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} did not appear in {timeout} s")


class Server:
    """A handshake-only TLS server: `go` (workloads/go-tls, GOMAXPROCS=1),
    `openssl` or `boringssl` (workloads/handshake-server, on Debian's OpenSSL 3
    or BoringSSL), or `nginx` (Debian's, stream module, `workers` workers).
    `addr` is its host:port, `pids` the processes whose CPU is its own.
    The go, openssl and boringssl servers time their own handshakes
    (--stats-file): `stats()` after `close()` is what they measured, None
    for nginx.

    `twin=True` runs the server on copies of its files (a copy of the Go
    binary; copies of the TLS libraries, through LD_LIBRARY_PATH), so that
    an agent probing the originals leaves it alone: beside a probed server,
    in the same seconds, it says what the server costs without the agent."""

    SELF_TIMED = ("go", "openssl", "boringssl")
    # The TLS libraries each server maps, copied for a twin.
    LIBRARIES = {"openssl": "/usr/lib/x86_64-linux-gnu", "nginx": "/usr/lib/x86_64-linux-gnu",
                 "boringssl": "/usr/lib/x86_64-linux-gnu/android"}

    def __init__(self, kind, cert, tickets, bindir, root, workers=1, twin=False):
        os.makedirs(root)
        env = {**os.environ, "GOMAXPROCS": "1"}
        go = os.path.join(bindir, "tlsprof-go-tls")
        if twin and kind == "go":
            go = shutil.copy(go, os.path.join(root, "tlsprof-go-tls-twin"))
        elif twin:
            libs = os.path.join(root, "twin-lib")
            os.makedirs(libs)
            suffix = ".so.0" if kind == "boringssl" else ".so.3"
            for name in ("libssl", "libcrypto"):
                shutil.copy(os.path.join(self.LIBRARIES[kind], name + suffix), libs)
            env["LD_LIBRARY_PATH"] = libs
        self.stats_path = os.path.join(root, "stats.json") if kind in self.SELF_TIMED else None
        if kind in self.SELF_TIMED:
            ready = os.path.join(root, "ready")
            if kind == "go":
                argv = [go, "server", "--cert", cert, "--handshake-only",
                        f"--tickets={'true' if tickets == 'on' else 'false'}", "--ready-file", ready,
                        "--stats-file", self.stats_path]
            else:
                argv = [os.path.join(bindir, f"tlsprof-{kind}-server"), "--cert", cert, "--tickets", tickets,
                        "--ready-file", ready, "--stats-file", self.stats_path]
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
            wait_for(ready)
            with open(ready) as f:
                self.addr = f.read().strip()
            self.pids = [self.proc.pid]
            self.check_twin(twin, go if kind == "go" else env.get("LD_LIBRARY_PATH"))
            return
        port = free_port()
        self.addr = f"127.0.0.1:{port}"
        env.update({"NGINX_SESSION_TICKETS": tickets, "NGINX_WORKERS": str(workers),
                    "NGINX_HANDSHAKE_PORT": str(port)})
        self.proc = subprocess.Popen(["sh", os.path.join(REPO, "workloads/nginx/run-nginx.sh"), root, str(free_port()),
                                      cert], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(os.path.join(root, "ready"))
        with open(os.path.join(root, "nginx.pid")) as f:
            master = f.read().strip()
        self.pids = [int(p) for p in subprocess.run(["pgrep", "-P", master], capture_output=True,
                                                    text=True).stdout.split()]
        self.check_twin(twin, env.get("LD_LIBRARY_PATH"))

    def check_twin(self, twin, copies):
        """A twin must map the copies, or the agent probes it too."""
        for pid in self.pids if twin else []:
            with open(f"/proc/{pid}/maps") as f:
                if copies not in f.read():
                    raise SystemExit(f"twin server {pid} does not map {copies}")

    def close(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        if self.proc.wait(timeout=30) != 0 and self.stats_path:
            raise SystemExit(f"the {self.proc.args[0]} server exited {self.proc.returncode}")

    def stats(self):
        """What a self-timed server wrote at its stop (None for nginx)."""
        if self.stats_path is None:
            return None
        with open(self.stats_path) as f:
            return json.load(f)
