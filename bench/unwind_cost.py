#!/usr/bin/env python3
"""unwind_cost.py: what do stacks cost? The agent with in-kernel stack
unwinding against the leaf-only agent (--no-stacks), at the same frequency on
the same workload.

For each workload (node's https server under load, tlsprof-groundtruth with
static libcrypto.a, tlsprof-groundtruth-shared with Debian's stripped
libcrypto.so.3) it profiles the same running process --repeat times in each
mode, alternating leaf-only and stacks runs so both see the same drift, and
prints the medians side by side with their ratio:

  - the agent's share of one core in the window (user+sys + BPF run time),
    the number the acceptance bound (stacks <= 2x leaf-only) is about;
  - user+sys CPU and BPF run time (bpf_prog_info run_time_ns / run_cnt);
  - BPF ns per sample over all samples, the walks' own time per walked sample
    and per frame (the program's bpf_ktime_get_ns clock around each walk),
    frames per walk, and the unwinding cost spread over every sample;
  - set-up and report CPU outside the window, peak RSS, report latency.

With --baseline-agent PATH the leaf-only column is replaced by another
agent binary with stacks (an earlier build), so a change's cost per sample is
read side by side on the same running workload: "baseline" against "stacks".

Must run as root (BPF). Python 3 standard library only.

    sudo python3 bench/unwind_cost.py [--workload node|static|shared|all]
        [--frequency 999] [--duration 10] [--repeat 3] [--bin DIR] [--json FILE] [--keep DIR]
        [--baseline-agent PATH]
"""

import argparse
import math
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time

# The process handling (every child ended by its pid), the node load and the
# table layout are shared with overhead_vs_perf.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_vs_perf import (NODE_DIR, PhaseError, cpu_jiffies, host_busy, node_load, node_load_result,  # noqa: E402
                              print_load_average, read_agent_report, run_workloads, start, stop, table, tail, wait_file, wait_rusage)

MODES = ["leaf", "stacks"]  # "leaf" becomes "baseline" with --baseline-agent
GROUNDTRUTH = {"static": "tlsprof-groundtruth", "shared": "tlsprof-groundtruth-shared"}


# --------------------------------------------------------------------------
# One agent run

def run_agent(args, pid, tmp, tag, mode):
    out = os.path.join(tmp, f"{tag}.json")
    err = os.path.join(tmp, f"{tag}.stderr")
    agent = args.baseline_agent if mode == "baseline" else os.path.join(args.bin, "tlsprof-agent")
    argv = [agent, "profile", "--pid", str(pid),
            "--duration", str(args.duration), "--frequency", str(args.frequency),
            "--format", "json", "-o", out]
    if mode == "leaf":
        argv.append("--no-stacks")
    h = cpu_jiffies()
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    rc, _ = wait_rusage(p)
    hb = host_busy(h)
    rep = read_agent_report(rc, argv, out, err)
    a = rep["agent"]
    if not a.get("bpf_stats_enabled", False):
        raise PhaseError("BPF run-time stats are off: the agent's BPF time would read as 0")
    u = a.get("unwind", {})
    # An agent older than this script has no walk counters: those rows read "-".
    walked = mode != "leaf" and "walks" in u
    proc = next((x for x in rep.get("processes", []) if x.get("pid") == pid), None)
    return {
        "argv": argv,
        "window_seconds": rep["duration_seconds"],
        "window_cpu_seconds": a["window_cpu_seconds"],
        "bpf_seconds": a["bpf_seconds"],
        "bpf_runs": a["bpf_runs"],
        "cpu_share_of_core": a["cpu_share_of_core"],
        "outside_window_cpu_seconds": a["cpu_seconds"] - a["window_cpu_seconds"],
        "max_rss_bytes": a["max_rss_bytes"],
        "report_latency_seconds": a["report_latency_seconds"],
        "walks": u["walks"] if walked else None,
        "frames": u["frames"] if walked else None,
        "walk_seconds": u["walk_seconds"] if walked else None,
        "row_searches": u.get("row_searches") if walked else None,
        "stacks": u["stacks"] if walked else None,
        "not_tls": u["not_tls"] if walked else None,
        "process_samples": round(proc["cpu_seconds"] * rep["frequency_hz"]) if proc else 0,
        "tls_samples": round(proc["tls_cpu_seconds"] * rep["frequency_hz"]) if proc else 0,
        "host_busy": hb,
    }


def run_modes(args, pid, tmp, tag, check=None, before=None, after=None):
    """--repeat runs per mode, alternating (leaf, stacks, leaf, ...)."""
    runs = {m: [] for m in MODES}
    for i in range(args.repeat):
        for mode in MODES:
            if check:
                check()
            ctx = before(f"{tag}-{mode}{i}") if before else None
            runs[mode].append(run_agent(args, pid, tmp, f"{tag}-{mode}{i}", mode))
            if after:
                runs[mode][-1]["load"] = after(ctx)
            r = runs[mode][-1]
            print(f"#   {tag} {mode:6s} run {i + 1}/{args.repeat}: {r['cpu_share_of_core'] * 100:.2f}% of a core "
                  f"(BPF {r['bpf_seconds']:.3f} s, user+sys {r['window_cpu_seconds']:.3f} s)", flush=True)
    return runs


# --------------------------------------------------------------------------
# Workloads

def run_groundtruth(args, tmp, variant):
    binary = GROUNDTRUTH[variant]
    ready = os.path.join(tmp, f"{variant}.ready")
    out = os.path.join(tmp, f"{variant}.gt.json")
    err = os.path.join(tmp, f"{variant}.gt.stderr")
    argv = [os.path.join(args.bin, binary), "--duration", "0", "--warmup", "1", "--with-p256",
            "--ready-file", ready, "--output", out]
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    pid = int(wait_file(ready, p, 60, binary))

    def check():
        if p.poll() is not None:
            raise PhaseError(f"{binary} exited {p.returncode}\n{tail(err)}")

    runs = run_modes(args, pid, tmp, variant, check=check)
    rc = stop(p, timeout=30)
    if rc != 0:
        raise PhaseError(f"{binary} exited {rc}\n{tail(err)}")
    return {"workload": variant, "binary": binary, "runs": runs}


def run_node(args, tmp):
    if not shutil.which("node") or not shutil.which("wrk"):
        raise PhaseError("node workload needs `node` and `wrk` on PATH")
    certdir = os.path.join(tmp, "node-cert")
    cp = subprocess.run(["sh", os.path.join(NODE_DIR, "make-cert.sh"), certdir, "rsa"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        raise PhaseError(f"make-cert.sh failed: {cp.stderr.strip()}")
    ready = os.path.join(tmp, "node.ready")
    if os.path.exists(ready):
        os.unlink(ready)
    err = os.path.join(tmp, "node-server.out")
    with open(err, "w") as ef:
        srv = start(["node", os.path.join(NODE_DIR, "https-server.js"),
                     "--cert", os.path.join(certdir, "cert.pem"), "--key", os.path.join(certdir, "key.pem"),
                     "--ready-file", ready], stdout=ef, stderr=subprocess.STDOUT)
    port = int(wait_file(ready, srv, 30, "node https-server.js"))
    lead = 1.0  # the load runs this long before the agent starts (steady state)
    load_s = int(math.ceil(args.duration + lead + 2))  # and covers the agent's start-up and finish
    timeout = load_s + 60

    def check():
        if srv.poll() is not None:
            raise PhaseError(f"node server exited {srv.returncode}\n{tail(err)}")

    def before(tag):
        lp, lo = node_load(port, load_s, tmp, tag)
        time.sleep(lead)
        return lp, lo

    def after(ctx):
        return node_load_result(ctx[0], ctx[1], load_s, timeout)

    # Warm-up (V8 compiles the server's hot paths), not measured.
    warm = max(3, int(args.duration // 2))
    node_load_result(*node_load(port, warm, tmp, "node-warmup"), warm, warm + 60)
    runs = run_modes(args, srv.pid, tmp, "node", check=check, before=before, after=after)
    rc = stop(srv)
    if rc != 0:
        raise PhaseError(f"node server exited {rc} on SIGTERM\n{tail(err)}")
    return {"workload": "node", "runs": runs}


# --------------------------------------------------------------------------
# Output

def med(runs, fn):
    vals = [v for v in (fn(r) for r in runs) if v is not None]
    return statistics.median(vals) if vals else None


def per(a, b, scale=1.0):
    return a * scale / b if a is not None and b else None


def summarize(runs):
    """Medians of one mode's runs (each ratio is taken per run, then the median)."""
    return {
        "share": med(runs, lambda r: r["cpu_share_of_core"]),
        "user_sys": med(runs, lambda r: r["window_cpu_seconds"]),
        "bpf": med(runs, lambda r: r["bpf_seconds"]),
        "runs": med(runs, lambda r: r["bpf_runs"]),
        "ns_per_sample": med(runs, lambda r: per(r["bpf_seconds"], r["bpf_runs"], 1e9)),
        "walks": med(runs, lambda r: r["walks"]),
        "stacks": med(runs, lambda r: r["stacks"]),
        "not_tls": med(runs, lambda r: r["not_tls"]),
        "frames_per_walk": med(runs, lambda r: per(r["frames"], r["walks"])),
        "ns_per_walk": med(runs, lambda r: per(r["walk_seconds"], r["walks"], 1e9)),
        "searches_per_frame": med(runs, lambda r: per(r["row_searches"], r["frames"])),
        "ns_per_frame": med(runs, lambda r: per(r["walk_seconds"], r["frames"], 1e9)),
        "unwind_ns_per_sample": med(runs, lambda r: per(r["walk_seconds"], r["bpf_runs"], 1e9)),
        "outside": med(runs, lambda r: r["outside_window_cpu_seconds"]),
        "rss": med(runs, lambda r: r["max_rss_bytes"]),
        "latency": med(runs, lambda r: r["report_latency_seconds"]),
        "process_samples": med(runs, lambda r: r["process_samples"]),
        "tls_samples": med(runs, lambda r: r["tls_samples"]),
        "host_busy": med(runs, lambda r: r["host_busy"]),
    }


def fmt(x, spec, scale=1.0, suffix=""):
    return "-" if x is None else f"{x * scale:{spec}}{suffix}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def render(args, res):
    base = MODES[0]
    leaf, stk = summarize(res["runs"][base]), summarize(res["runs"]["stacks"])
    rows = []

    def row(label, key, spec, scale=1.0, suffix="", with_ratio=True):
        rows.append((label, fmt(leaf[key], spec, scale, suffix), fmt(stk[key], spec, scale, suffix),
                     ratio(stk[key], leaf[key]) if with_ratio else ""))

    rows.append(("-- agent CPU in the profiled window" + (
        " (the acceptance: stacks <= 2x leaf-only)" if base == "leaf" else " (this build against --baseline-agent)"),))
    row("agent share of one core (user+sys + BPF)", "share", ".2f", 100, "%")
    row("agent user+sys CPU (s)", "user_sys", ".3f")
    row("BPF run time (s)", "bpf", ".3f")
    rows.append(("-- per sample (BPF runs = samples of every task on every CPU)",))
    row("BPF runs (samples)", "runs", ".0f")
    row("BPF ns per sample, all samples", "ns_per_sample", ".0f")
    rows.append(("stacks' extra BPF ns per sample", "", fmt(
        None if leaf["ns_per_sample"] is None or stk["ns_per_sample"] is None
        else stk["ns_per_sample"] - leaf["ns_per_sample"], ".0f"), ""))
    row("walks (user samples of the process)", "walks", ".0f", with_ratio=False)
    row("  stacks counted (TLS)", "stacks", ".0f", with_ratio=False)
    row("  walks that found no TLS code", "not_tls", ".0f", with_ratio=False)
    row("frames per walk", "frames_per_walk", ".2f", with_ratio=False)
    row("row-array searches per frame (cache misses)", "searches_per_frame", ".2f", with_ratio=False)
    row("walk ns per walked sample (in-BPF clock)", "ns_per_walk", ".0f", with_ratio=False)
    row("walk ns per frame", "ns_per_frame", ".0f", with_ratio=False)
    row("unwinding cost per sample, all samples (ns)", "unwind_ns_per_sample", ".0f", with_ratio=False)
    rows.append(("-- outside the window, memory, latency",))
    row("set-up + report CPU outside window (s)", "outside", ".3f")
    row("peak RSS", "rss", ".1f", 1 / 2**20, " MiB")
    row("report ready after window end (ms)", "latency", ".0f", 1000)
    rows.append(("-- the workload",))
    row("samples of the workload process", "process_samples", ".0f")
    row("TLS samples of the workload process", "tls_samples", ".0f")
    row("host CPU busy during the run", "host_busy", ".0f", 100, "%")
    if res["workload"] == "node":
        rows.append(("wrk requests/s", fmt(med(res["runs"][base], lambda r: r["load"]["wrk_rps"]), ",.0f"),
                     fmt(med(res["runs"]["stacks"], lambda r: r["load"]["wrk_rps"]), ",.0f"), ""))
    title = f"{res['workload']} @{args.frequency} Hz, {args.duration:g} s, median of {args.repeat}"
    if base == "baseline":
        text = table(title, ["baseline", "this build", "this/base"], rows)
        shares = {m: " ".join(f"{r['cpu_share_of_core'] * 100:.2f}" for r in res["runs"][m]) for m in MODES}
        text += f"\nshare of a core per run (%): baseline {shares['baseline']} | this build {shares['stacks']}"
        r = per(stk["ns_per_sample"], leaf["ns_per_sample"])
        return text + f"\nBPF ns per sample, this build / baseline (medians): {fmt(r, '.2f', suffix='x')}"
    text = table(title, ["leaf-only", "stacks", "stacks/leaf"], rows)
    shares = {m: " ".join(f"{r['cpu_share_of_core'] * 100:.2f}" for r in res["runs"][m]) for m in MODES}
    text += f"\nshare of a core per run (%): leaf-only {shares['leaf']} | stacks {shares['stacks']}"
    r = None if not leaf["share"] or stk["share"] is None else stk["share"] / leaf["share"]
    text += (f"\nstacks / leaf-only agent CPU (medians): {fmt(r, '.2f', suffix='x')}"
             + ("" if r is None else ("  (<= 2x)" if r <= 2.0 else "  (ABOVE 2x)")))
    return text


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["node", "static", "shared", "all"], default="all")
    ap.add_argument("--frequency", type=int, default=999)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (medians are printed)")
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin")),
                    help="directory with tlsprof-agent and the groundtruth workloads")
    ap.add_argument("--json", help="also write every run's numbers to this file")
    ap.add_argument("--baseline-agent", help="compare with this tlsprof-agent (with stacks) instead of leaf-only")
    ap.add_argument("--keep", help="keep the agent's JSON reports and logs in this directory")
    args = ap.parse_args()
    if args.duration < 1 or args.frequency < 1 or args.repeat < 1:
        ap.error("--duration, --frequency and --repeat must be >= 1")
    if args.baseline_agent:
        if not os.access(args.baseline_agent, os.X_OK):
            ap.error(f"--baseline-agent {args.baseline_agent}: not an executable")
        MODES[0] = "baseline"

    cmd = "sudo python3 " + shlex.join([os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())] + sys.argv[1:])
    print(f"# reproduce: {cmd}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {socket.gethostname()}  "
          f"nproc {os.cpu_count()}  kernel {os.uname().release}  agent {args.bin}/tlsprof-agent")
    print_load_average()
    sys.stdout.flush()

    if os.geteuid() != 0:
        sys.exit("unwind_cost.py: must run as root (BPF)")
    todo = ["node", "static", "shared"] if args.workload == "all" else [args.workload]
    needed = ["tlsprof-agent"] + [GROUNDTRUTH[w] for w in todo if w in GROUNDTRUTH]
    for tool in needed:
        if not os.access(os.path.join(args.bin, tool), os.X_OK):
            sys.exit(f"unwind_cost.py: {tool} not found in {args.bin} (build it or pass --bin)")

    results = {"command": cmd, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
               "nproc": os.cpu_count(), "kernel": os.uname().release, "frequency_hz": args.frequency,
               "duration_seconds": args.duration, "repeat": args.repeat, "workloads": {}}

    def run_one(w, tmp):
        res = run_node(args, tmp) if w == "node" else run_groundtruth(args, tmp, w)
        text = render(args, res)
        res["median"] = {m: summarize(res["runs"][m]) for m in MODES}
        return res, text

    return run_workloads("unwind_cost.py", args, results, todo, run_one, "tlsprof-unwind-cost-")


if __name__ == "__main__":
    sys.exit(main())
