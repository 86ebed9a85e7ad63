#!/usr/bin/env python3
"""usage_handshake_cost.py: does the agent count a TLS server's handshakes
right, and what does a handshake cost?

Issue 4's handshake-only load, as in the Go crypto/tls study: the server runs
on one core (Go: GOMAXPROCS=1; the others: one worker), and each client
connection handshakes, sends one byte and waits for the server to close. The
servers:

  go         workloads/go-tls `server --handshake-only` (Go crypto/tls)
  openssl    workloads/handshake-server on Debian's stripped OpenSSL 3
  boringssl  the same on Debian's stripped BoringSSL (android-libboringssl)
  nginx      Debian's nginx, stream module, `return x` (stripped OpenSSL 3)

The client is `tlsprof-go-tls handshakes` for all (it counts full and
resumed handshakes itself; a copy of the binary, so that its own crypto/tls
is not probed), at --rate connections per second: a rate where the probe
budget does not bind (the report's duty cycle is printed and must be 1). For
each certificate (ECDSA P-256, RSA-2048) without and with session tickets,
two runs of --seconds each, each with a server of its own:

  1. without the agent: the server's CPU (utime + stime from /proc) per
     handshake; and, for go, openssl and boringssl, the server's own measure
     of its TLS library's CPU per handshake ("own TLS": each handshake timed
     on its thread's CPU clock, less the system calls; see the servers'
     --stats-file), the ground truth of the agent's TLS CPU per handshake;
  2. under `tlsprof-agent profile --usage --pid SERVER`: the agent's count
     against the client's, the agent's TLS CPU of the handshake phase per
     handshake (sampled, docs/usage.md "Cost per handshake"), the server's
     busy CPU the agent sampled per handshake, the server's /proc CPU with
     the probes on (their traps are charged to it), and its own TLS CPU
     with the probes on (their traps land inside the handshake's calls).

Then the RSA/ECDSA ratio of full handshakes by each measure: the agent's TLS
CPU against the server's own (alone), and the agent's busy CPU against /proc
(the issue asks for 15%). Root only (BPF). Python 3 standard library only.

    sudo python3 bench/usage_handshake_cost.py [--server go openssl boringssl nginx] [--seconds 20] [--rate 50]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from usage_servers import REPO, Server, cpu_seconds

# The file whose probes the agent must have attached before the load starts.
PROBED = {"go": "tlsprof-go-tls", "nginx": "libssl.so.3", "openssl": "libssl.so.3", "boringssl": "libssl.so.0"}


def load(client, addr, tickets, seconds, rate, out):
    """The client's own count over `seconds`."""
    args = [client, "handshakes", "--addr", addr, "--duration", f"{seconds}s",
            "--concurrency", "2", "--output", out]
    if rate:
        args += ["--rate", str(rate)]
    if tickets == "on":
        args.append("--resume")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def own_us(stats, kind):
    """A self-timed server's own TLS CPU per handshake of `kind` (full or
    resumed), in us; None for nginx, or where it made none."""
    if stats is None:
        return None
    n = stats["resumed"] if kind == "resumed" else stats["handshakes"] - stats["resumed"]
    return stats["handshake_cpu_seconds"][kind] / n * 1e6 if n else None


def run(args, kind, cert, tickets, tmp):
    name = f"{kind}-{cert}-{tickets}"
    hs_kind = "resumed" if tickets == "on" else "full"
    # 1. The server alone: its /proc CPU per handshake and its own TLS CPU.
    server = Server(kind, cert, tickets, args.bin, os.path.join(tmp, name + "-alone"))
    try:
        before = cpu_seconds(server.pids)
        alone = load(args.client, server.addr, tickets, args.seconds, args.rate, os.path.join(tmp, "alone.json"))
        truth_us = (cpu_seconds(server.pids) - before) / alone["handshakes"] * 1e6
    finally:
        server.close()
    own_alone_us = own_us(server.stats(), hs_kind)
    # 2. A server of its own under the agent.
    server = Server(kind, cert, tickets, args.bin, os.path.join(tmp, name + "-agent"))
    try:
        report_path = os.path.join(tmp, f"report-{name}.json")
        log_path = os.path.join(tmp, f"agent-{name}.log")
        agent_args = [os.path.join(args.bin, "tlsprof-agent"), "--log-level", "info", "profile", "--usage",
                      "--format", "json", "-o", report_path, "--duration", str(args.seconds + 3)]
        for pid in server.pids:
            agent_args += ["--pid", str(pid)]
        with open(log_path, "wb") as log:
            agent = subprocess.Popen(agent_args, stderr=log)
        deadline = time.monotonic() + 30
        while not any("usage probes: " in line and PROBED[kind] in line
                      for line in open(log_path, errors="replace")):
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit(f"the agent did not attach: {open(log_path).read()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1)
        before = cpu_seconds(server.pids)
        client = load(args.client, server.addr, tickets, args.seconds, args.rate, os.path.join(tmp, "client.json"))
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
            counted[h["kind"]] = counted.get(h["kind"], 0) + h["estimated_count"]
    handshakes = sum(counted.values())
    hs_cpu = sum(c["handshake_tls_cpu_seconds"] for c in report["handshake_cpu"] if c["pid"] in server.pids)
    busy = sum(p["cpu_seconds"] for p in report["processes"] if p["pid"] in server.pids)
    per = (lambda x: x / handshakes * 1e6) if handshakes else (lambda x: 0.0)
    return {"server": kind, "cert": cert, "tickets": tickets, "client": client, "counted": counted,
            "handshakes": handshakes, "agent_tls_us": per(hs_cpu), "agent_busy_us": per(busy),
            "probed_us": probed_us, "truth_us": truth_us, "own_alone_us": own_alone_us,
            "own_probed_us": own_us(server.stats(), hs_kind), "alone_rate": alone["handshakes"] / alone["seconds"],
            "duty_cycle": report["agent"]["usage"].get("budget", {}).get("duty_cycle", 1.0),
            "hits_per_hs": report["agent"]["usage"]["probe_hits"] / max(handshakes, 1)}


def cell(x, width):
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.1f}"


def ratio(rows, measure):
    """RSA/ECDSA of `measure` per full handshake (None where not measured)."""
    full = {r["cert"]: r[measure] for r in rows if r["tickets"] == "off"}
    return full["rsa"] / full["ecdsa"] if full.get("rsa") and full.get("ecdsa") else None


def print_results(servers, rows):
    print(f"{'server':<9} {'cert':<6} {'tickets':<7} {'client':>7} {'agent':>7} {'diff':>7} {'duty':>5} | "
          f"{'agent TLS':>9} {'own TLS':>8} {'own TLS':>8} | {'agent busy':>10} {'/proc':>7} {'/proc':>7} | "
          f"{'hits/hs':>7}")
    print(f"{'':<9} {'':<6} {'':<7} {'':>7} {'':>7} {'':>7} {'':>5} | {'':>9} {'alone':>8} {'probed':>8} | "
          f"{'':>10} {'probed':>7} {'alone':>7} | (us per handshake)")
    for r in rows:
        c = r["client"]["handshakes"]
        diff = (r["handshakes"] - c) / c * 100 if c else 0.0
        print(f"{r['server']:<9} {r['cert']:<6} {r['tickets']:<7} {c:>7} {r['handshakes']:>7.0f} {diff:>6.2f}% "
              f"{r['duty_cycle']:>5.2f} | {r['agent_tls_us']:>9.1f} {cell(r['own_alone_us'], 8)} "
              f"{cell(r['own_probed_us'], 8)} | {r['agent_busy_us']:>10.1f} {r['probed_us']:>7.1f} "
              f"{r['truth_us']:>7.1f} | {r['hits_per_hs']:>7.1f}")
    print()
    print("RSA/ECDSA per full handshake (agent TLS against the server's own TLS alone; agent busy against /proc, "
          "same run):")
    for kind in servers:
        mine = [r for r in rows if r["server"] == kind]
        q = {m: ratio(mine, m) for m in ("agent_tls_us", "own_alone_us", "agent_busy_us", "probed_us", "truth_us")}
        if None in (q["agent_tls_us"], q["agent_busy_us"], q["probed_us"], q["truth_us"]):
            print(f"  {kind:<9} (no full handshakes of one of the keys)")
            continue
        line = f"  {kind:<9} agent TLS {q['agent_tls_us']:.2f}"
        if q["own_alone_us"]:
            line += f" vs own TLS {q['own_alone_us']:.2f} ({q['agent_tls_us'] / q['own_alone_us'] - 1:+.1%})"
        line += (f"; agent busy {q['agent_busy_us']:.2f} vs /proc {q['probed_us']:.2f} "
                 f"({q['agent_busy_us'] / q['probed_us'] - 1:+.1%}); /proc alone {q['truth_us']:.2f}")
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", nargs="+", choices=["go", "openssl", "boringssl", "nginx"],
                    default=["go", "openssl", "boringssl", "nginx"])
    ap.add_argument("--seconds", type=int, default=20, help="per run")
    ap.add_argument("--rate", type=float, default=50,
                    help="connections per second (0: as fast as they go); 50 keeps the default budget from binding")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"), help="where tlsprof-agent is")
    ap.add_argument("--json", help="write every row here too")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")
    print("$ " + " ".join(["python3"] + sys.argv))
    rows = []
    with tempfile.TemporaryDirectory(prefix="tlsprof-bench-") as tmp:
        args.client = os.path.join(tmp, "handshake-client")
        shutil.copy(os.path.join(args.bin, "tlsprof-go-tls"), args.client)
        for kind in args.server:
            for cert in ("ecdsa", "rsa"):
                for tickets in ("off", "on"):
                    rows.append(run(args, kind, cert, tickets, tmp))
    print_results(args.server, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
