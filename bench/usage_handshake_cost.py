#!/usr/bin/env python3
"""usage_handshake_cost.py: does the agent count a TLS server's handshakes
right, and what does a handshake cost?

Issue 4's handshake-only load, as in the Go crypto/tls study: the server runs
on one core (Go: GOMAXPROCS=1; nginx: one worker), and each client connection
handshakes, sends one byte and waits for the server to close. The servers:

  go     workloads/go-tls `server --handshake-only` (Go crypto/tls)
  nginx  Debian's nginx, stream module, `return x` (stripped OpenSSL 3)

The client is `tlsprof-go-tls handshakes` for both (it counts full and
resumed handshakes itself), at --rate connections per second: a rate where
the probe budget does not bind (the report's duty cycle must be 1). For each
certificate (ECDSA P-256, RSA-2048) without and with session tickets, two
runs of --seconds each:

  1. without the agent: the server's CPU (utime + stime from /proc) per
     handshake, the ground truth of what a handshake costs;
  2. under `tlsprof-agent profile --usage --pid SERVER`: the agent's count
     against the client's, the agent's TLS CPU of the handshake phase per
     handshake (sampled, docs/usage.md "Cost per handshake"), the server's
     busy CPU the agent sampled per handshake, and the server's /proc CPU
     with the probes on (their traps are charged to it).

Then the RSA/ECDSA ratio of full handshakes by each measure. Root only
(BPF). Python 3 standard library only.

    sudo python3 bench/usage_handshake_cost.py [--server go nginx] [--seconds 20] [--rate 100] [--bin DIR]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids):
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
    """A handshake-only server: its address, the pids whose CPU is its own."""

    def __init__(self, kind, cert, tickets, bindir, tmp):
        self.kind = kind
        root = os.path.join(tmp, f"{kind}-{cert}-{tickets}")
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
        else:
            port = free_port()
            self.addr = f"127.0.0.1:{port}"
            env = {**os.environ, "NGINX_SESSION_TICKETS": tickets, "NGINX_WORKERS": "1",
                   "NGINX_HANDSHAKE_PORT": str(port)}
            self.proc = subprocess.Popen(["sh", os.path.join(REPO, "workloads/nginx/run-nginx.sh"), root,
                                          str(free_port()), cert], env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            wait_for(os.path.join(root, "ready"))
            with open(os.path.join(root, "nginx.pid")) as f:
                master = f.read().strip()
            self.pids = [int(p) for p in subprocess.run(["pgrep", "-P", master], capture_output=True,
                                                        text=True).stdout.split()]

    def close(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)


def load(bindir, addr, tickets, seconds, rate, out):
    """The client's own count over `seconds`."""
    args = [os.path.join(bindir, "tlsprof-go-tls"), "handshakes", "--addr", addr, "--duration", f"{seconds}s",
            "--concurrency", "2", "--output", out]
    if rate:
        args += ["--rate", str(rate)]
    if tickets == "on":
        args.append("--resume")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def run(args, kind, cert, tickets, tmp):
    server = Server(kind, cert, tickets, args.bin, tmp)
    try:
        # 1. The ground truth: the server alone.
        before = cpu_seconds(server.pids)
        alone = load(args.bin, server.addr, tickets, args.seconds, args.rate, os.path.join(tmp, "alone.json"))
        truth_us = (cpu_seconds(server.pids) - before) / alone["handshakes"] * 1e6
        # 2. Under the agent.
        report_path = os.path.join(tmp, f"report-{kind}-{cert}-{tickets}.json")
        log_path = os.path.join(tmp, f"agent-{kind}-{cert}-{tickets}.log")
        agent_args = [os.path.join(args.bin, "tlsprof-agent"), "--log-level", "info", "profile", "--usage",
                      "--format", "json", "-o", report_path, "--duration", str(args.seconds + 3)]
        for pid in server.pids:
            agent_args += ["--pid", str(pid)]
        with open(log_path, "wb") as log:
            agent = subprocess.Popen(agent_args, stderr=log)
        deadline = time.monotonic() + 30
        while "usage probes: " + ("/" if kind == "go" else "") not in open(log_path, errors="replace").read() or \
                ("libssl.so.3" not in open(log_path, errors="replace").read() and kind == "nginx"):
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit(f"the agent did not attach: {open(log_path).read()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1)
        before = cpu_seconds(server.pids)
        client = load(args.bin, server.addr, tickets, args.seconds, args.rate, os.path.join(tmp, "client.json"))
        probed_us = (cpu_seconds(server.pids) - before) / max(client["handshakes"], 1) * 1e6
        if agent.wait(timeout=args.seconds + 60) != 0:
            raise SystemExit(f"the agent failed: {open(log_path).read()[-2000:]}")
        with open(report_path) as f:
            report = json.load(f)
    finally:
        server.close()
    counted = {"full": 0, "resumed": 0}
    for h in report["handshakes"]:
        if h["side"] == "server" and h["pid"] in server.pids:
            counted[h["kind"]] = counted.get(h["kind"], 0) + h["count"]
    handshakes = sum(counted.values())
    hs_cpu = sum(c["handshake_tls_cpu_seconds"] for c in report["handshake_cpu"] if c["pid"] in server.pids)
    busy = sum(p["cpu_seconds"] for p in report["processes"] if p["pid"] in server.pids)
    per = (lambda x: x / handshakes * 1e6) if handshakes else (lambda x: 0.0)
    return {"server": kind, "cert": cert, "tickets": tickets, "client": client, "counted": counted,
            "handshakes": handshakes, "agent_tls_us": per(hs_cpu), "agent_busy_us": per(busy),
            "probed_us": probed_us, "truth_us": truth_us, "alone_rate": alone["handshakes"] / alone["seconds"],
            "duty_cycle": report["agent"]["usage"].get("budget", {}).get("duty_cycle", 1.0),
            "hits_per_hs": report["agent"]["usage"]["probe_hits"] / max(handshakes, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", nargs="+", choices=["go", "nginx"], default=["go", "nginx"])
    ap.add_argument("--seconds", type=int, default=20, help="per run")
    ap.add_argument("--rate", type=float, default=100, help="connections per second (0: as fast as they go)")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"), help="where tlsprof-agent is")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")
    print("$ " + " ".join(["python3"] + sys.argv))
    rows = []
    with tempfile.TemporaryDirectory(prefix="tlsprof-bench-") as tmp:
        for kind in args.server:
            for cert in ("ecdsa", "rsa"):
                for tickets in ("off", "on"):
                    rows.append(run(args, kind, cert, tickets, tmp))
    print(f"{'server':<6} {'cert':<6} {'tickets':<7} {'client':>7} {'agent':>7} {'diff':>7} {'full':>6} "
          f"{'resumed':>7} {'duty':>5} | {'agent TLS':>9} {'agent busy':>10} {'/proc':>7} {'/proc alone':>11} "
          f"(us/handshake) {'hits/hs':>7}")
    for r in rows:
        c = r["client"]["handshakes"]
        diff = (r["handshakes"] - c) / c * 100 if c else 0.0
        print(f"{r['server']:<6} {r['cert']:<6} {r['tickets']:<7} {c:>7} {r['handshakes']:>7} {diff:>6.2f}% "
              f"{r['counted']['full']:>6} {r['counted']['resumed']:>7} {r['duty_cycle']:>5.2f} | "
              f"{r['agent_tls_us']:>9.1f} {r['agent_busy_us']:>10.1f} {r['probed_us']:>7.1f} {r['truth_us']:>11.1f}"
              f"                {r['hits_per_hs']:>7.1f}")
    measures = (("agent_tls_us", "agent TLS"), ("agent_busy_us", "agent busy"), ("probed_us", "/proc"),
                ("truth_us", "/proc alone"))
    for kind in args.server:
        full = {r["cert"]: r for r in rows if r["tickets"] == "off" and r["server"] == kind}
        ratios = {m: full["rsa"][m] / full["ecdsa"][m] if full["ecdsa"][m] else 0.0 for m, _ in measures}
        print(f"{kind}: RSA/ECDSA per full handshake: " + ", ".join(f"{name} {ratios[m]:.2f}" for m, name in measures)
              + f"; agent busy vs /proc {ratios['agent_busy_us'] / ratios['probed_us'] - 1:+.1%}, agent TLS vs "
              f"/proc {ratios['agent_tls_us'] / ratios['probed_us'] - 1:+.1%}")

if __name__ == "__main__":
    main()
