#!/usr/bin/env python3
"""collector_load.py: how many agents can one tlsprof-collector take?

For each mode (plaintext; mTLS with a relay identity; plaintext with
--state-dir, i.e. the fsynced journal) and each agent count it starts a fresh
tlsprof-collector, runs tlsprof-loadgen against it for --duration seconds
(N agents, one report of --series rows each every --interval seconds, spread
evenly), samples the collector's CPU (/proc/PID/stat utime+stime) and RSS
(/proc/PID/status VmRSS) every 0.5 s, and prints per row: agents, series
updates/s achieved, the loadgen's p50/p99 call latency, the collector's
server-side p99 (its tlsprof_collector_ingest_seconds histogram), collector
CPU (% of one core) and peak RSS, errors, the loadgen's own CPU and the
host's busy share; then the highest sustained rate (every report answered,
>= 98% of the offered rate, p99 within --p99-ms) and the acceptance check
(--target-agents at >= 100 series, p99 <= --p99-ms, RSS <= --rss-mib).

The collector and the loadgen share this machine's CPUs (and with anything
else running: the load average is printed first). The anchor for the
collector's CPU is the loadgen's own CPU in the same row.

With --perf-agents N, the N-agent row of the first mode also runs
`perf record -a -g` over its middle and prints the collector's hottest symbols
(perf report --pid, sorted by pid,sym; see overhead_vs_perf.py for why).

Python 3 standard library only; scripts/make-test-pki.sh makes the throw-away PKI.

    python3 bench/collector_load.py [--agents 1000,5000,10000,20000] [--interval 10]
        [--series 100] [--duration 40] [--modes insecure,mtls,state-dir]
        [--connections 32] [--perf-agents N] [--nice N] [--bin DIR] [--json FILE] [--keep DIR]
"""

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_vs_perf import (REPO, PhaseError, cpu_jiffies, host_busy, run_workloads, start, stop,  # noqa: E402
                              table, tail)

MODES = ("insecure", "mtls", "state-dir")
RELAY = "tlsprof-loadgen"


# --------------------------------------------------------------------------
# Throw-away PKI from scripts/make-test-pki.sh: the CA, the collector's
# certificate (SAN localhost, 127.0.0.1) and the loadgen's relay identity.

def make_pki(d):
    script = os.path.join(REPO, "scripts", "make-test-pki.sh")
    p = subprocess.run(["bash", script, d, RELAY], capture_output=True, text=True)
    if p.returncode != 0:
        raise PhaseError(f"{script} failed: {p.stderr.strip()}")
    return {"ca.crt": os.path.join(d, "ca.crt"), "collector.crt": os.path.join(d, "collector.crt"),
            "collector.key": os.path.join(d, "collector.key"), "loadgen.crt": os.path.join(d, f"{RELAY}.crt"),
            "loadgen.key": os.path.join(d, f"{RELAY}.key")}


# --------------------------------------------------------------------------
# Collector process and its /proc figures

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_ns(pid):
    """utime + stime of the whole process from /proc/PID/stat: unlike a sum
    over /proc/PID/task, it keeps the time of threads that have exited (gRPC
    starts and ends threads as load changes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) * 1_000_000_000 // CLK_TCK


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def start_collector(args, mode, tmp, tag, pki, agents):
    grpc_port, metrics_port = free_port(), free_port()
    argv = [os.path.join(args.bin, "tlsprof-collector"), "--listen", f"127.0.0.1:{grpc_port}",
            "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    if mode == "mtls":
        argv += ["--tls-ca", pki["ca.crt"], "--tls-cert", pki["collector.crt"], "--tls-key", pki["collector.key"],
                 "--relay-identity", RELAY]
    else:
        argv.append("--insecure")
    if mode == "state-dir":
        state = os.path.join(tmp, f"{tag}-state")
        os.makedirs(state, exist_ok=True)
        argv += ["--state-dir", state]
    # The collector must hold the whole fleet: at its default --max-agents
    # (10,000) a larger row would be half refused (RESOURCE_EXHAUSTED).
    if not any(a.startswith("--max-agents") for a in args.collector_arg):
        argv += ["--max-agents", str(max(agents, 10000))]
    argv += args.collector_arg
    if args.nice:
        argv = ["nice", "-n", str(args.nice)] + argv  # nice execs: the pid stays the collector's
    log = os.path.join(tmp, f"{tag}-collector.log")
    with open(log, "w") as lf:
        p = start(argv, stdout=lf, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (port_open(grpc_port) and port_open(metrics_port)):
        if p.poll() is not None:
            raise PhaseError(f"tlsprof-collector exited {p.returncode}: {shlex.join(argv)}\n{tail(log)}")
        if time.monotonic() > deadline:
            raise PhaseError(f"tlsprof-collector not listening after 30 s: {shlex.join(argv)}\n{tail(log)}")
        time.sleep(0.05)
    return p, grpc_port, metrics_port, argv, log


class Sampler(threading.Thread):
    """The collector's CPU and RSS every `period` seconds."""

    def __init__(self, pid, period=0.5):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples = []  # (monotonic, cpu_ns, rss_bytes)
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            cpu, rss = proc_cpu_ns(self.pid), rss_bytes(self.pid)
            if cpu is not None and rss is not None:
                self.samples.append((time.monotonic(), cpu, rss))
            self.done.wait(self.period)

    def between(self, t0, t1):
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if len(s) < 2:
            return None, None
        cpu = (s[-1][1] - s[0][1]) / 1e9 / (s[-1][0] - s[0][0])
        return cpu, max(x[2] for x in s)


def fetch_metrics(port):
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def histogram_quantile(text, name, q):
    """q-quantile of a Prometheus histogram in an exposition (linear
    interpolation inside the bucket, like PromQL's histogram_quantile)."""
    buckets = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == f"{name}_bucket":
            le = re.search(r'le="([^"]+)"', m.group(2) or "")
            if le:
                buckets.append((float(le.group(1)), float(m.group(3))))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_le, prev_count = le, count
    return None


def metric_sum(text, name, label_filter=""):
    total, seen = 0.0, False
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name and label_filter in (m.group(2) or ""):
            total += float(m.group(3))
            seen = True
    return total if seen else None


# --------------------------------------------------------------------------
# One row: a fresh collector, one loadgen run

def run_row(args, mode, agents, tmp, pki, perf):
    tag = f"{mode}-{agents}"
    coll, grpc_port, metrics_port, coll_argv, coll_log = start_collector(args, mode, tmp, tag, pki, agents)
    sampler = Sampler(coll.pid)
    sampler.start()
    argv = [os.path.join(args.bin, "tlsprof-loadgen"), "--collector", f"127.0.0.1:{grpc_port}",
            "--agents", str(agents), "--interval", str(args.interval), "--series", str(args.series),
            "--duration", str(args.duration), "--connections", str(args.connections), "--seed", str(args.seed),
            "--retries", "0", "--json"]
    if mode == "mtls":
        argv += ["--tls-ca", pki["ca.crt"], "--tls-cert", pki["loadgen.crt"], "--tls-key", pki["loadgen.key"],
                 "--tls-server-name", "localhost"]
    else:
        argv.append("--insecure")
    if args.nice:
        argv = ["nice", "-n", str(args.nice)] + argv
    out, err = os.path.join(tmp, f"{tag}-loadgen.json"), os.path.join(tmp, f"{tag}-loadgen.stderr")
    perf_proc = None
    try:
        h = cpu_jiffies()
        t0 = time.monotonic()
        with open(out, "w") as of, open(err, "w") as ef:
            lg = start(argv, stdout=of, stderr=ef)
        if perf:
            time.sleep(min(args.interval * 1.5, args.duration / 3))
            perf_data = os.path.join(tmp, f"{tag}-perf.data")
            perf_proc = start(["perf", "record", "-a", "-g", "-F", "499", "-o", perf_data, "--", "sleep",
                               str(max(5, args.duration / 3))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc = lg.wait(args.duration + 120)
        t1 = time.monotonic()
        busy = host_busy(h)
        if perf_proc:
            perf_proc.wait(60)
        if coll.poll() is not None:
            raise PhaseError(f"the collector exited {coll.returncode} during the {tag} run\n{tail(coll_log)}")
        try:
            with open(out) as f:
                lgres = json.load(f)
        except ValueError:
            raise PhaseError(f"tlsprof-loadgen exited {rc} without JSON: {shlex.join(argv)}\n{tail(err)}")
        # The first interval creates every agent's state: leave it out of the
        # steady-state CPU figure, but not of the peak RSS.
        cpu_steady, _ = sampler.between(t0 + min(args.interval, args.duration / 2), t1)
        _, rss_peak = sampler.between(t0, t1 + 1)
        metrics = fetch_metrics(metrics_port)
    finally:
        sampler.done.set()
        stop(coll)
    server_p99 = histogram_quantile(metrics, "tlsprof_collector_ingest_seconds", 0.99)
    accepted_by_collector = metric_sum(metrics, "tlsprof_collector_reports_total", 'result="accepted"')
    offered = agents / args.interval
    row = {
        "mode": mode, "agents": agents, "offered_reports_per_second": offered,
        "reports_per_second": lgres["reports_per_second"], "series_per_second": lgres["series_per_second"],
        "latency_ms": lgres["latency_ms"], "schedule_lag_ms": lgres["schedule_lag_ms"],
        "server_p99_ms": None if server_p99 is None else server_p99 * 1000,
        "errors": lgres["errors"], "failed": lgres["failed"], "sent": lgres["sent"], "accepted": lgres["accepted"],
        "accepted_by_collector": accepted_by_collector, "dropped_series": lgres["dropped_series"],
        "collector_cpu": cpu_steady, "collector_rss_bytes": rss_peak,
        "loadgen_cpu": lgres["loadgen_cpu_percent"] / 100, "host_busy": busy,
        "collector_pid": coll.pid, "collector_argv": coll_argv, "loadgen_argv": argv,
    }
    row["sustained"] = (row["failed"] == 0 and row["reports_per_second"] >= 0.98 * offered
                        and row["latency_ms"]["p99"] <= args.p99_ms)
    if perf_proc:
        row["perf_top"] = perf_top(os.path.join(tmp, f"{tag}-perf.data"), coll.pid)
    return row


def perf_top(data, pid, n=25):
    """The collector's hottest symbols in a `perf record -a -g` file: self
    time (leaf) and inclusive (anywhere on the stack; our binaries have no
    frame pointers, so mostly kernel and libc callers), as shares of the
    collector's own samples. From `perf script --pid`, which filters samples;
    perf report's --pid with a per-thread sort splits gRPC's many threads."""
    p = subprocess.run(["perf", "script", "-i", data, "--pid", str(pid), "-F", "ip,sym,dso"],
                       capture_output=True, text=True)
    leaf, incl, samples, frames = {}, {}, 0, []

    def flush():
        nonlocal samples
        if frames:
            samples += 1
            leaf[frames[0]] = leaf.get(frames[0], 0) + 1
            for f in set(frames):
                incl[f] = incl.get(f, 0) + 1
        frames.clear()

    for line in p.stdout.splitlines():
        parts = line.split(None, 1)
        if not parts:
            flush()
        elif len(parts) == 2 and "[unknown]" not in parts[1]:
            sym = re.sub(r"\+0x[0-9a-f]+", "", parts[1])
            sym = re.sub(r" \((?:/[^)]*/)?([^/)]+)\)$", r" (\1)", sym)  # the dso's file name only
            frames.append(sym[:140])
    flush()
    if not samples:
        return []
    out = [f"{samples} samples of the collector"]
    out += [f"self {100 * c / samples:5.1f}%  {s}" for s, c in sorted(leaf.items(), key=lambda x: -x[1])[:n]]
    ours = [(s, c) for s, c in incl.items() if "tlsprof" in s or "grpc" in s]
    out += [f"incl {100 * c / samples:5.1f}%  {s}" for s, c in sorted(ours, key=lambda x: -x[1])[:n // 2]]
    return out


# --------------------------------------------------------------------------

def f_ms(x):
    return "-" if x is None else f"{x:.1f}"


def render(args, mode, rows):
    body = []
    for r in rows:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(r["errors"].items())) or "0"
        body.append((f"{r['agents']:,}", f"{r['series_per_second']:,.0f}", f"{r['reports_per_second']:,.0f}",
                     f_ms(r["latency_ms"]["p50"]), f_ms(r["latency_ms"]["p99"]), f_ms(r["latency_ms"]["max"]),
                     f_ms(r["server_p99_ms"]),
                     "-" if r["collector_cpu"] is None else f"{100 * r['collector_cpu']:.0f}%",
                     "-" if r["collector_rss_bytes"] is None else f"{r['collector_rss_bytes'] / 1048576:.0f}",
                     errs, f"{100 * r['loadgen_cpu']:.0f}%",
                     "-" if r["host_busy"] is None else f"{100 * r['host_busy']:.0f}%",
                     "yes" if r["sustained"] else "no"))
    header = ("series/s", "reports/s", "p50 ms", "p99 ms", "max ms", "srv p99", "coll CPU", "RSS MiB",
              "errors", "lg CPU", "host", "ok")
    lines = [f"{mode}: agents at a {args.interval:g} s interval, {args.series} series per report, "
             f"{args.duration:g} s per row, a fresh collector per row",
             table("agents", header, body)]
    best = max((r for r in rows if r["sustained"]), key=lambda r: r["series_per_second"], default=None)
    lines.append(f"highest sustained: {best['agents']:,} agents, {best['series_per_second']:,.0f} series updates/s, "
                 f"{best['reports_per_second']:,.0f} reports/s" if best else "highest sustained: none of these rows")
    target = next((r for r in rows if r["agents"] == args.target_agents), None)
    if target:
        checks = [
            (f"series updates/s >= {args.target_agents * args.series / args.interval:,.0f}",
             target["series_per_second"] >= 0.98 * args.target_agents * args.series / args.interval),
            (f"p99 <= {args.p99_ms:g} ms", target["latency_ms"]["p99"] <= args.p99_ms),
            (f"RSS <= {args.rss_mib} MiB", (target["collector_rss_bytes"] or 0) <= args.rss_mib * 1048576),
            ("no errors", target["failed"] == 0),
        ]
        verdict = "PASS" if all(ok for _, ok in checks) else "FAIL"
        lines.append(f"acceptance ({args.target_agents:,} agents): {verdict}: " +
                     "; ".join(f"{what} {'ok' if ok else 'NOT MET'}" for what, ok in checks))
    for r in rows:
        if r.get("perf_top"):
            lines.append(f"collector's hottest symbols at {r['agents']:,} agents (perf record -a -g, "
                         "perf script --pid; self = leaf, incl = on the stack):")
            lines += ["  " + ln.strip() for ln in r["perf_top"]]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="1000,5000,10000,20000", help="comma-separated agent counts")
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--series", type=int, default=100)
    ap.add_argument("--duration", type=float, default=40, help="seconds of load per row")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="insecure", help=f"comma-separated, of {','.join(MODES)}")
    ap.add_argument("--perf-agents", type=int, default=0, help="perf record the collector at this agent count")
    ap.add_argument("--target-agents", type=int, default=10000)
    ap.add_argument("--p99-ms", type=float, default=100)
    ap.add_argument("--rss-mib", type=int, default=1024)
    ap.add_argument("--nice", type=int, default=0,
                    help="run the collector and the loadgen at this nice value (e.g. -10 on a machine others "
                         "share: their capacity rather than the competition for the CPUs)")
    ap.add_argument("--collector-arg", action="append", default=[], help="extra collector flag (repeatable)")
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(REPO, "build", "bin")))
    ap.add_argument("--json")
    ap.add_argument("--keep", help="keep logs, loadgen JSON and perf data in this directory")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m}: use {', '.join(MODES)}")
    counts = [int(x) for x in args.agents.split(",") if x]
    for b in ("tlsprof-collector", "tlsprof-loadgen"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            ap.error(f"{args.bin}/{b} is missing: build it (./scripts/build.sh) or pass --bin")

    print(f"# reproduce: python3 bench/collector_load.py {shlex.join(sys.argv[1:])}")
    load = os.getloadavg()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  nproc {os.cpu_count()}  load average at start {load:.2f}"
          + ("  WARNING: other processes are busy (> nproc/2): CPU and latency figures include them"
             if load > os.cpu_count() / 2 else ""))
    print("# the collector and tlsprof-loadgen share these CPUs; 'lg CPU' is the loadgen's share of one core, "
          "'coll CPU' the collector's (steady state, after the first interval), 'host' all CPUs busy")
    results = {"args": vars(args), "load_average": load, "workloads": {}}
    state = {"pki": None, "perf_done": False}

    def run_mode(mode, tmp):
        if mode == "mtls" and state["pki"] is None:
            state["pki"] = make_pki(os.path.join(tmp, "pki"))
        rows = []
        for n in counts:
            perf = n == args.perf_agents and not state["perf_done"]
            state["perf_done"] |= perf
            rows.append(run_row(args, mode, n, tmp, state["pki"], perf))
            r = rows[-1]
            print(f"# {mode} {n:,} agents: {r['series_per_second']:,.0f} series/s, p99 {r['latency_ms']['p99']:.1f} ms, "
                  f"collector {100 * (r['collector_cpu'] or 0):.0f}% CPU, "
                  f"{(r['collector_rss_bytes'] or 0) / 1048576:.0f} MiB", flush=True)
        return rows, render(args, mode, rows)

    return run_workloads("collector_load.py", args, results, modes, run_mode, "tlsprof-collector-load-")


if __name__ == "__main__":
    sys.exit(main())
