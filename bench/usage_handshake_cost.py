#!/usr/bin/env python3
"""usage_handshake_cost.py: does `profile --usage` count an OpenSSL server's
handshakes right, and what does a handshake cost?

Issue 4's handshake-only load on an OpenSSL server. Debian's nginx
(workloads/nginx/run-nginx.sh, stripped OpenSSL 3) with an ECDSA P-256 or an
RSA-2048 certificate, without and with session tickets. `openssl s_time`
makes a connection per handshake (fetching the 16 KiB page, which also
takes in TLS 1.3 session tickets) for --seconds and keeps its own count:
`-new` (full handshakes) without tickets, `-reuse` (one full handshake, then
resumptions of its session) with tickets. For each of the four runs it
prints, side by side:

  - the client's count and the agent's (nginx's server-side handshakes);
  - the agent's TLS CPU of the handshake phase per handshake (sampled);
  - nginx's own CPU (utime + stime of its workers) per handshake;

and then the RSA/ECDSA ratio of full handshakes by both measures. Root only
(BPF). Python 3 standard library only.

    sudo python3 bench/usage_handshake_cost.py [--seconds 10] [--bin DIR]
"""

import argparse
import json
import os
import re
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
        if os.path.exists(path):
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} did not appear in {timeout} s")


def run(agent, kind, tickets, seconds, tmp):
    port = free_port()
    root = os.path.join(tmp, f"nginx-{kind}-{tickets}")
    os.makedirs(root)
    env = {**os.environ, "NGINX_SESSION_TICKETS": tickets}
    nginx = subprocess.Popen(["sh", os.path.join(REPO, "workloads/nginx/run-nginx.sh"), root, str(port), kind],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(os.path.join(root, "ready"))
        with open(os.path.join(root, "nginx.pid")) as f:
            master = f.read().strip()
        workers = subprocess.run(["pgrep", "-P", master], capture_output=True, text=True).stdout.split()
        report_path = os.path.join(root, "report.json")
        log_path = os.path.join(root, "agent.log")
        args = [agent, "--log-level", "info", "profile", "--usage", "--format", "json", "-o", report_path,
                "--duration", str(seconds + 4)]
        for pid in workers:
            args += ["--pid", pid]
        with open(log_path, "wb") as log:
            agent_proc = subprocess.Popen(args, stderr=log)
        deadline = time.monotonic() + 30
        while "libssl.so.3" not in open(log_path, errors="replace").read():
            if time.monotonic() > deadline or agent_proc.poll() is not None:
                raise SystemExit(f"the agent did not attach: {open(log_path).read()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1)
        cpu_before = cpu_seconds(workers)
        mode = "-new" if tickets == "off" else "-reuse"
        # -www: each connection also fetches the page, so a TLS 1.3 client
        # takes in the session tickets sent after the handshake (-reuse
        # resumes nothing without them).
        out = subprocess.run(["openssl", "s_time", "-connect", f"127.0.0.1:{port}", mode, "-www", "/", "-time",
                              str(seconds)], capture_output=True, text=True).stdout
        cpu = cpu_seconds(workers) - cpu_before
        m = re.search(r"(\d+) connections in [0-9.]+s", out)
        if not m:
            raise SystemExit(f"cannot read openssl s_time's output:\n{out}")
        clients = int(m.group(1))
        if agent_proc.wait(timeout=seconds + 60) != 0:
            raise SystemExit(f"the agent failed: {open(log_path).read()[-2000:]}")
        with open(report_path) as f:
            report = json.load(f)
    finally:
        subprocess.run(["kill", "-TERM", str(nginx.pid)])
        nginx.wait(timeout=10)
    counted = {"full": 0, "resumed": 0}
    for h in report["handshakes"]:
        if h["side"] == "server":
            counted[h["kind"]] = counted.get(h["kind"], 0) + h["count"]
    handshakes = sum(counted.values())
    hs_cpu = sum(c["handshake_tls_cpu_seconds"] for c in report["handshake_cpu"])
    return {"kind": kind, "tickets": tickets, "clients": clients, "counted": counted, "handshakes": handshakes,
            "agent_us": hs_cpu / handshakes * 1e6 if handshakes else 0.0,
            "process_us": cpu / handshakes * 1e6 if handshakes else 0.0,
            "hits": report["agent"]["usage"]["probe_hits"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=10, help="openssl s_time -time, per run")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"), help="where tlsprof-agent is")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")
    print("$ " + " ".join(["python3"] + sys.argv))
    agent = os.path.join(args.bin, "tlsprof-agent")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tlsprof-bench-") as tmp:
        for kind in ("ecdsa", "rsa"):
            for tickets in ("off", "on"):
                rows.append(run(agent, kind, tickets, args.seconds, tmp))
    print(f"{'cert':<6} {'tickets':<8} {'client':>7} {'agent':>7} {'diff':>7} {'full':>6} {'resumed':>8} "
          f"{'agent TLS hs us/hs':>19} {'nginx CPU us/hs':>16} {'probe hits':>11}")
    for r in rows:
        diff = (r["handshakes"] - r["clients"]) / r["clients"] * 100 if r["clients"] else 0.0
        print(f"{r['kind']:<6} {r['tickets']:<8} {r['clients']:>7} {r['handshakes']:>7} {diff:>6.2f}% "
              f"{r['counted']['full']:>6} {r['counted']['resumed']:>8} {r['agent_us']:>19.1f} "
              f"{r['process_us']:>16.1f} {r['hits']:>11}")
    full = {r["kind"]: r for r in rows if r["tickets"] == "off"}
    if full["ecdsa"]["agent_us"] and full["ecdsa"]["process_us"]:
        agent_ratio = full["rsa"]["agent_us"] / full["ecdsa"]["agent_us"]
        process_ratio = full["rsa"]["process_us"] / full["ecdsa"]["process_us"]
        print(f"RSA/ECDSA per full handshake: agent (TLS, handshake phase) {agent_ratio:.2f}, nginx process CPU "
              f"{process_ratio:.2f}, agent/process {agent_ratio / process_ratio:.3f}")


if __name__ == "__main__":
    main()
