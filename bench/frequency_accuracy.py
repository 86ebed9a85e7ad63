#!/usr/bin/env python3
"""What sampling frequency should `tlsprof-agent run` default to?

For each frequency, runs the ground-truth workload (tlsprof-groundtruth-shared:
Debian's shared libcrypto, or --workload static for tlsprof-groundtruth) under
`tlsprof-agent profile --pid PID --duration D --frequency F` several times and
prints, per frequency, next to the 999 Hz anchor from the same run:

- TLS-rate error: the agent's TLS CPU rate against the workload's own measured
  CPU over the profile's window (mean and worst |error| over the repeats);
- max bucket error and max algorithm error: the largest |difference| in
  percentage points of TLS time between the agent's split and the truth's
  (mean and worst over the repeats);
- agent cost: share of one core in the window (user+sys of the agent plus its
  BPF run time, `agent.cpu_share_of_core`), mean over the repeats.

A D-second profile is one daemon window of D seconds (10 s is `run`'s default
--interval), so the errors are what one window of `run` would show.

    sudo python3 bench/frequency_accuracy.py                       # ~5 min
    sudo python3 bench/frequency_accuracy.py --frequencies 19,49 --repeats 5 --duration 10 --json out.json

Python 3 standard library only; run as root. Every process it starts is ended
by its pid.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.environ.get("TLSPROF_BIN", os.path.join(HERE, "..", "build", "bin"))
ANCHOR_HZ = 999


def truth_rate_in_window(truth, report):
    """The workload's measured CPU rate over the profile's own window (its
    CLOCK_MONOTONIC timeline interpolated at the report's window)."""
    timeline = truth["timeline"]
    start, end = report["window"]["start_monotonic_ns"], report["window"]["end_monotonic_ns"]

    def cpu_at(t):
        for (t0, c0), (t1, c1) in zip(timeline, timeline[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return timeline[-1][1] if t > timeline[-1][0] else timeline[0][1]

    return (cpu_at(end) - cpu_at(start)) / (end - start)


def shares(rows, key, total):
    out = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0.0) + r["cpu_seconds"] / total
    return out


def max_diff_pp(a, b):
    keys = set(a) | set(b)
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys) * 100 if keys else 0.0


def run_once(args, hz, tmp, started):
    ready = os.path.join(tmp, "gt.ready")
    truth_file = os.path.join(tmp, "gt.json")
    for f in (ready, truth_file):
        if os.path.exists(f):
            os.remove(f)
    workload = "tlsprof-groundtruth-shared" if args.workload == "shared" else "tlsprof-groundtruth"
    gt = subprocess.Popen([os.path.join(args.bin, workload), "--warmup", "1", "--duration", str(args.duration + 4),
                           "--output", truth_file, "--ready-file", ready],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started.append(gt)
    deadline = time.monotonic() + 30
    while not os.path.exists(ready):
        if gt.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{workload} did not get ready")
        time.sleep(0.05)
    agent = subprocess.run([os.path.join(args.bin, "tlsprof-agent"), "profile", "--pid", str(gt.pid), "--duration",
                            str(args.duration), "--frequency", str(hz), "--format", "json"],
                           capture_output=True, text=True, timeout=args.duration + 60)
    if agent.returncode != 0:
        raise RuntimeError(f"tlsprof-agent failed at {hz} Hz: {agent.stderr[-2000:]}")
    report = json.loads(agent.stdout)
    gt.wait(args.duration + 30)
    with open(truth_file) as f:
        truth = json.load(f)
    proc = next(p for p in report["processes"] if p["pid"] == gt.pid)
    truth_total = sum(c["cpu_seconds"] for c in truth["categories"])
    truth_rate = truth_rate_in_window(truth, report)
    rate = proc["tls_cpu_seconds"] / report["duration_seconds"]
    tls = max(proc["tls_cpu_seconds"], 1e-9)
    bucket_err = max_diff_pp(shares(proc["buckets"], "bucket", tls), shares(truth["categories"], "bucket", truth_total))
    alg_err = max_diff_pp(shares(proc["algorithms"], "algorithm", tls),
                          shares(truth["categories"], "algorithm", truth_total))
    return {
        "hz": hz,
        "rate_error": rate / truth_rate - 1,
        "bucket_error_pp": bucket_err,
        "algorithm_error_pp": alg_err,
        "agent_core_share": report["agent"]["cpu_share_of_core"],
        "agent_window_cpu_seconds": report["agent"]["window_cpu_seconds"],
        "bpf_seconds": report["agent"]["bpf_seconds"],
        "tls_samples": report["samples"]["tls"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frequencies", default="19,29,49,99", help="comma-separated Hz (the 999 Hz anchor is added)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=10, help="seconds per profile (one daemon window)")
    p.add_argument("--workload", choices=["shared", "static"], default="shared")
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--json", help="write every run's numbers here")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("frequency_accuracy.py: run as root (the agent loads BPF)")
    print("# " + " ".join([sys.executable, *sys.argv]))
    freqs = [int(f) for f in args.frequencies.split(",") if f]
    if ANCHOR_HZ not in freqs:
        freqs.append(ANCHOR_HZ)
    started = []

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="tlsprof-freq-") as tmp:
            # Interleaved (19, 29, ..., 999, 19, ...) so that drifting load
            # on the machine spreads over all frequencies alike.
            for rep in range(args.repeats):
                for hz in freqs:
                    r = run_once(args, hz, tmp, started)
                    r["repeat"] = rep
                    runs.append(r)
                    print(f"#   {hz:>4} Hz run {rep + 1}: rate {r['rate_error'] * 100:+5.1f}%  bucket "
                          f"{r['bucket_error_pp']:4.1f} pp  algorithm {r['algorithm_error_pp']:4.1f} pp  agent "
                          f"{r['agent_core_share'] * 100:.3f}% of a core", flush=True)
    except KeyboardInterrupt as e:
        print(f"frequency_accuracy.py: stopped ({e})", file=sys.stderr)
        return 130
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    print()
    print(f"{args.workload} ground truth, {args.duration:.0f} s profiles, {args.repeats} repeats per frequency")
    print(f"{'Hz':>5} {'TLS rate err mean/max':>22} {'bucket err mean/max':>21} {'algorithm err mean/max':>24} "
          f"{'agent % core':>13} {'TLS samples':>12}")
    summary = {}
    for hz in freqs:
        rs = [r for r in runs if r["hz"] == hz]
        rate = [abs(r["rate_error"]) * 100 for r in rs]
        bucket = [r["bucket_error_pp"] for r in rs]
        alg = [r["algorithm_error_pp"] for r in rs]
        cost = statistics.mean(r["agent_core_share"] for r in rs) * 100
        samples = statistics.mean(r["tls_samples"] for r in rs)
        summary[hz] = {"rate_error_pct": [statistics.mean(rate), max(rate)],
                       "bucket_error_pp": [statistics.mean(bucket), max(bucket)],
                       "algorithm_error_pp": [statistics.mean(alg), max(alg)], "agent_core_pct": cost,
                       "tls_samples": samples}
        print(f"{hz:>5} {statistics.mean(rate):>10.1f}% / {max(rate):>5.1f}% {statistics.mean(bucket):>9.1f} / "
              f"{max(bucket):>4.1f} pp {statistics.mean(alg):>11.1f} / {max(alg):>4.1f} pp {cost:>12.3f}% "
              f"{samples:>12.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=2)
        print(f"# numbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
