"""The handshake-only servers and helpers the usage benches share
(usage_handshake_cost.py, usage_budget.py). Python 3 standard library only."""

import os
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
    """A handshake-only TLS server: `go` (workloads/go-tls, GOMAXPROCS=1) or
    `nginx` (Debian's, stream module, `workers` workers). `addr` is its
    host:port, `pids` the processes whose CPU is its own."""

    def __init__(self, kind, cert, tickets, bindir, root, workers=1):
        os.makedirs(root)
        if kind == "go":
            ready = os.path.join(root, "ready")
            env = {**os.environ, "GOMAXPROCS": "1"}
            self.proc = subprocess.Popen([os.path.join(bindir, "tlsprof-go-tls"), "server", "--cert", cert,
                                          "--handshake-only", f"--tickets={'true' if tickets == 'on' else 'false'}",
                                          "--ready-file", ready], env=env, stdout=subprocess.DEVNULL,
                                         start_new_session=True)
            wait_for(ready)
            with open(ready) as f:
                self.addr = f.read().strip()
            self.pids = [self.proc.pid]
            return
        port = free_port()
        self.addr = f"127.0.0.1:{port}"
        env = {**os.environ, "NGINX_SESSION_TICKETS": tickets, "NGINX_WORKERS": str(workers),
               "NGINX_HANDSHAKE_PORT": str(port)}
        self.proc = subprocess.Popen(["sh", os.path.join(REPO, "workloads/nginx/run-nginx.sh"), root, str(free_port()),
                                      cert], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(os.path.join(root, "ready"))
        with open(os.path.join(root, "nginx.pid")) as f:
            master = f.read().strip()
        self.pids = [int(p) for p in subprocess.run(["pgrep", "-P", master], capture_output=True,
                                                    text=True).stdout.split()]

    def close(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
