#!/usr/bin/env python3
"""agent_cost.py: where does the agent's own CPU go on real busy TLS
workloads, and what does it cost next to `perf record` on the same workload in
the same run?

For each workload (tlsprof-demo: client and server threads in one process, a
random TLS mix on every CPU; Debian's nginx with an RSA and an ECDSA
certificate under workloads/nginx/load-nginx.sh (wrk keep-alive load plus full
handshakes, which all pick the ECDSA certificate) plus `openssl s_time -new`
TLS 1.2 ECDHE-RSA handshakes so RSA signs too; the single-threaded
tlsprof-groundtruth) it starts the workload once and measures, back to back:

  - profile F: `tlsprof-agent profile --pid PID... --duration D --frequency F
    --format json` for each --frequency F, and with --no-stacks at the highest
    F (leaf-only rows). From the report's `agent` block: user+sys CPU in the
    window, BPF run time, their share of one core (`cpu_share_of_core`), the
    CPU per phase of the window's cycle (`phase_cpu_seconds`, which includes
    the attribution after the window), µs per sample (user: the cycle's CPU per
    sample taken; BPF: bpf_seconds / bpf_runs);
  - run F: `tlsprof-agent run --pid PID... --frequency F --interval I
    --metrics-listen 127.0.0.1:PORT --state-dir DIR`, the daemon's steady
    state: /metrics is scraped right after the agent closes its 2nd window
    and again right after it has closed round(D / I) more (the closes are
    read from its log: a scrape costs the agent about 0.3 ms, so it is
    scraped twice, as a Prometheus would), so the deltas cover whole
    windows. Cost = (Δ
    tlsprof_agent_cpu_seconds_total + Δ tlsprof_agent_bpf_seconds_total) / Δt
    as a share of one core, per phase likewise
    (tlsprof_agent_phase_cpu_seconds_total), per sample over Δ
    tlsprof_agent_samples_total. The agent's user+sys from /proc/PID/stat
    over the same interval is printed beside the counter as a cross-check;
  - with --usage: `run --usage` at 99 Hz against the same run without it;
  - perf: `perf record -a -e cpu-clock -F F -o FILE -- sleep D` and the same
    with -g, for each F: perf's own CPU inside the window (schedstat of its
    threads when its `sleep` child execs and when it exits) and over its whole
    life, and tlsprof's cost against it as a ratio. perf's in-kernel work per
    sample (writing the sample and, with -g, walking the stack in the
    interrupt) is charged to the interrupted tasks and is not in its column;
    tlsprof's BPF time is in tlsprof's, so the "user+sys / perf" ratio is the
    like-for-like one, the "total / perf" ratio is unfavourable to tlsprof.

With --soak S it also runs `run` at 99 Hz on the demo or nginx and, from the
close of its 2nd window on, samples the agent's VmRSS and VmHWM every 10 s for
S seconds (first, last, min, max and the least-squares slope in MB per 10
minutes, over all samples and over the second half).

Must run as root (BPF, perf -a). Python 3 standard library only.

    sudo python3 bench/agent_cost.py [--workload demo|nginx|groundtruth|all]
        [--frequency 99 --frequency 999 | --frequency 99,999] [--mode profile|run|all|none]
        [--duration 20] [--interval 10] [--usage] [--soak SECONDS] [--soak-workload demo|nginx]
        [--bin DIR] [--json FILE] [--keep DIR]
"""

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

# Process handling (every child ended by its pid), the groundtruth start/end,
# the /proc helpers and the table layout are shared with overhead_vs_perf.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_vs_perf import (REPO, PhaseError, cpu_jiffies, follow_perf_window, gt_finish, gt_start,  # noqa: E402
                              host_busy, print_load_average, proc_stat, read_agent_report, run_workloads, start, stop, table, tail,
                              task_cpu_ns, wait_file, wait_rusage)

NGINX_DIR = os.path.join(REPO, "workloads", "nginx")
PHASES = ["loop", "discovery", "unwind_registration", "map_read", "attribution", "describe", "sinks",
          "other_threads"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOAD_LEAD = 2.0        # nginx: the load runs this long before a profiler starts
WORKLOAD_WARMUP = 2.0  # demo, groundtruth: running this long before the first measurement
SOAK_STEP = 10.0       # seconds between RSS samples of the soak


# --------------------------------------------------------------------------
# /proc and network helpers

def proc_cpu_seconds(pid):
    """user+sys of the whole process pid (exited threads included) from
    /proc/PID/stat, in seconds (clock-tick resolution), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()   # rest[0] is field 3 (state)
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def procs_cpu_seconds(pids):
    vals = [proc_cpu_seconds(p) for p in pids]
    if any(v is None for v in vals):
        return None
    return sum(vals)


def proc_status_kb(pid, *keys):
    """{key: kB} of /proc/PID/status lines (VmRSS, VmHWM, ...)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    out[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port):
    """/metrics of the agent as {name: {((label, value), ...): float}}, or None
    if the server does not answer (yet)."""
    try:
        with _opener.open(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        labels = tuple(sorted(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        try:
            out.setdefault(m.group(1), {})[labels] = float(m.group(3))
        except ValueError:
            continue
    return out


def metric(m, name, required=True, **labels):
    key = tuple(sorted(labels.items()))
    v = m.get(name, {}).get(key)
    if v is None and required:
        raise PhaseError(f"the agent's /metrics has no {name}{labels or ''} (an agent older than this script?)")
    return v


# --------------------------------------------------------------------------
# Workloads: one process (or nginx's master and workers) per workload, kept
# running through all of its measurements.

class Workload:
    name = ""
    pids = []

    def describe(self):
        return ""

    def begin(self, tag):
        """Called before each measurement (nginx starts its load)."""
        self.check()
        return None

    def end(self, ctx):
        """Called after each measurement (nginx checks and stops its load)."""
        self.check()

    def check(self):
        pass

    def finish(self):
        return {}


class Demo(Workload):
    name = "demo"

    def __init__(self, args, tmp):
        self.bin = os.path.join(args.bin, "tlsprof-demo")
        ready = os.path.join(tmp, "demo.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.err = os.path.join(tmp, "demo.stderr")
        argv = [self.bin, "--duration", "0", "--ready-file", ready]
        with open(self.err, "w") as ef:
            self.p = start(argv, stdout=ef, stderr=subprocess.STDOUT)
        wait_file(ready, self.p, 60, "tlsprof-demo")
        self.pids = [self.p.pid]
        self.argv = argv
        time.sleep(WORKLOAD_WARMUP)

    def describe(self):
        return f"tlsprof-demo pid {self.p.pid}: client and server threads, default random mix (no seed flag)"

    def check(self):
        if self.p.poll() is not None:
            raise PhaseError(f"tlsprof-demo exited {self.p.returncode}\n{tail(self.err)}")

    def finish(self):
        self.check()
        rc = stop(self.p, timeout=30)
        if rc != 0:
            print(f"# warning: tlsprof-demo exited {rc} on SIGTERM: {tail(self.err, 3)}", file=sys.stderr)
        return {"argv": self.argv, "exit_code": rc, "summary": tail(self.err, 3)}


class Groundtruth(Workload):
    name = "groundtruth"

    def __init__(self, args, tmp):
        self.p, self.out, self.err = gt_start(args, tmp, "agent-cost")
        self.pids = [self.p.pid]
        time.sleep(WORKLOAD_WARMUP)

    def describe(self):
        return (f"tlsprof-groundtruth pid {self.p.pid}: single-threaded, default equal mix "
                f"(no --seed), --duration 0 --warmup 1")

    def check(self):
        if self.p.poll() is not None:
            raise PhaseError(f"tlsprof-groundtruth exited {self.p.returncode}\n{tail(self.err)}")

    def finish(self):
        self.check()
        gt = gt_finish(self.p, self.out, self.err)
        return {"process_cpu_seconds": gt.get("process_cpu_seconds"), "wall_seconds": gt.get("wall_seconds")}


class Nginx(Workload):
    name = "nginx"
    WRK_CONNECTIONS = 4
    HANDSHAKE_RATE = 0   # unlimited

    def __init__(self, args, tmp):
        self.tmp = tmp
        self.dir = os.path.join(tmp, "nginx")
        self.port = free_port()
        self.err = os.path.join(tmp, "nginx.stderr")
        argv = ["sh", os.path.join(NGINX_DIR, "run-nginx.sh"), self.dir, str(self.port), "dual"]
        with open(self.err, "w") as ef:
            # Its own group: the readiness poller and the workers go with it.
            self.p = start(argv, own_group=True, stdout=ef, stderr=subprocess.STDOUT)
        wait_file(os.path.join(self.dir, "ready"), self.p, 60, "run-nginx.sh")
        master = self.p.pid
        deadline = time.monotonic() + 10
        workers = []
        while time.monotonic() < deadline:
            workers = [int(n) for n in os.listdir("/proc") if n.isdigit()
                       and (st := proc_stat(int(n))) and st[0] == master and st[2].startswith("nginx")]
            if len(workers) >= 2:
                break
            time.sleep(0.1)
        st = proc_stat(master)
        if not st or not st[2].startswith("nginx") or not workers:
            raise PhaseError(f"nginx: master {master} ({st}) has no nginx workers\n{tail(self.err)}")
        self.pids = [master] + sorted(workers)
        self.argv = argv
        # Warm-up load (not measured).
        ctx = self.begin("nginx-warmup")
        self.end(ctx)

    def describe(self):
        return (f"nginx master {self.pids[0]}, workers {' '.join(map(str, self.pids[1:]))}: dual RSA+ECDSA "
                f"certificates, port {self.port}; load-nginx.sh: wrk -c{self.WRK_CONNECTIONS} keep-alive "
                f"16 KiB responses + full handshakes (rate {self.HANDSHAKE_RATE or 'unlimited'}), "
                f"plus openssl s_time -new -tls1_2 ECDHE-RSA full handshakes (RSA signatures); "
                f"started {LOAD_LEAD:g} s before each measurement")

    def begin(self, tag):
        self.check()
        out = os.path.join(self.tmp, f"{tag}.load.out")
        with open(out, "w") as f:
            # A long load, ended by its group once the measurement is done.
            lp = start(["sh", os.path.join(NGINX_DIR, "load-nginx.sh"), str(self.port), "86400",
                        str(self.WRK_CONNECTIONS), str(self.HANDSHAKE_RATE)],
                       own_group=True, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, TMPDIR=self.tmp))
        # Both wrk and node's handshake client pick the ECDSA certificate of
        # the pair: TLS 1.2 full handshakes with an RSA-only cipher make
        # nginx sign with RSA too.
        rsa_out = os.path.join(self.tmp, f"{tag}.rsa-load.out")
        with open(rsa_out, "w") as f:
            rp = start(["openssl", "s_time", "-connect", f"127.0.0.1:{self.port}", "-new", "-tls1_2",
                        "-cipher", "ECDHE-RSA-AES128-GCM-SHA256", "-time", "86400"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f)  # stdout: a '*' per handshake
        time.sleep(LOAD_LEAD)
        for p, o, what in ((lp, out, "load-nginx.sh"), (rp, rsa_out, "openssl s_time")):
            if p.poll() is not None:
                raise PhaseError(f"{what} exited {p.returncode} at once:\n{tail(o)}")
        return [(lp, out, "load-nginx.sh"), (rp, rsa_out, "openssl s_time")]

    def end(self, ctx):
        dead = [(p, o, what) for p, o, what in ctx if p.poll() is not None]
        for p, _, _ in ctx:
            stop(p)
        for p, o, what in dead:
            raise PhaseError(f"{what} exited {p.returncode} during the measurement:\n{tail(o)}")
        self.check()

    def check(self):
        if self.p.poll() is not None:
            raise PhaseError(f"nginx exited {self.p.returncode}\n{tail(self.err)}\n"
                             f"{tail(os.path.join(self.dir, 'error.log'))}")
        for pid in self.pids[1:]:
            st = proc_stat(pid)
            if not st or st[0] != self.pids[0]:
                raise PhaseError(f"nginx worker {pid} is gone (respawned?); the agent's --pid list is stale")

    def finish(self):
        self.check()
        rc = stop(self.p, timeout=30)
        if rc != 0:
            print(f"# warning: nginx exited {rc} on SIGTERM", file=sys.stderr)
        return {"argv": self.argv, "pids": self.pids, "exit_code": rc}


WORKLOADS = {"demo": Demo, "nginx": Nginx, "groundtruth": Groundtruth}


# --------------------------------------------------------------------------
# Measurements

def agent_path(args):
    return os.path.join(args.bin, "tlsprof-agent")


def pid_flags(wl):
    out = []
    for p in wl.pids:
        out += ["--pid", str(p)]
    return out


def run_profile(args, wl, freq, stacks, tmp, tag):
    out = os.path.join(tmp, f"{tag}.json")
    err = os.path.join(tmp, f"{tag}.stderr")
    argv = [agent_path(args), "profile", *pid_flags(wl), "--duration", str(args.duration),
            "--frequency", str(freq), "--format", "json", "-o", out]
    if not stacks:
        argv.append("--no-stacks")
    ctx = wl.begin(tag)
    w0, h, t0 = procs_cpu_seconds(wl.pids), cpu_jiffies(), time.monotonic()
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    rc, ru = wait_rusage(p)
    w1, hb, wall = procs_cpu_seconds(wl.pids), host_busy(h), time.monotonic() - t0
    wl.end(ctx)
    rep = read_agent_report(rc, argv, out, err)
    a = rep.get("agent", {})
    missing = [k for k in ("window_cpu_seconds", "bpf_seconds", "bpf_runs", "cpu_share_of_core",
                           "phase_cpu_seconds", "cycle_cpu_seconds", "user_us_per_sample", "bpf_us_per_sample")
               if k not in a]
    if missing:
        raise PhaseError(f"the report's agent block lacks {', '.join(missing)} (an agent older than this script?)")
    if not a.get("bpf_stats_enabled", False):
        raise PhaseError("BPF run-time stats are off: the agent's BPF time would read as 0")
    if not a["bpf_runs"]:
        raise PhaseError(f"{tag}: the BPF program never ran (bpf_runs 0)")
    procs = [x for x in rep.get("processes", []) if x.get("pid") in wl.pids]
    proc_cpu = sum(x.get("cpu_seconds", 0) for x in procs)
    if not procs or proc_cpu <= 0:
        raise PhaseError(f"{tag}: the report has no samples of pids {wl.pids}")
    dur = rep["duration_seconds"]
    phases = {k: a["phase_cpu_seconds"].get(k, 0.0) for k in PHASES}
    unknown = sorted(set(a["phase_cpu_seconds"]) - set(PHASES))
    total_samples = rep.get("samples", {}).get("total")
    return {
        "mode": "profile", "frequency_hz": freq, "stacks": stacks, "usage": False, "argv": argv,
        "span_seconds": dur,
        "user_sys_seconds": a["window_cpu_seconds"],
        "bpf_seconds": a["bpf_seconds"],
        "samples": total_samples,
        "bpf_runs": a["bpf_runs"],
        "phase_seconds": phases,
        "unknown_phases": unknown,
        "cycle_seconds": a["cycle_cpu_seconds"],
        "user_share": a["window_cpu_seconds"] / dur,
        "bpf_share": a["bpf_seconds"] / dur,
        "total_share": a["cpu_share_of_core"],
        "cycle_share": a["cycle_cpu_seconds"] / dur,
        "user_us_per_sample": a["user_us_per_sample"],
        "bpf_us_per_sample": a["bpf_us_per_sample"],
        "whole_life_cpu_seconds": a.get("cpu_seconds"),
        "rusage_cpu_seconds": ru.ru_utime + ru.ru_stime,
        "max_rss_bytes": a.get("max_rss_bytes"),
        "rusage_maxrss_bytes": ru.ru_maxrss * 1024,
        "report_latency_seconds": a.get("report_latency_seconds"),
        "wall_seconds": wall,
        "workload_share": (w1 - w0) / wall if w0 is not None and w1 is not None else None,
        "workload_report_cpu_seconds": proc_cpu,
        "host_busy": hb,
        "dropped_samples": rep.get("samples", {}).get("dropped", 0),
        "agent": a,
    }


def closes_logged(err):
    """Windows the agent closed, from its log (one `registry:` line per close,
    written after the close's sinks): reading a file costs the agent nothing,
    a scrape of /metrics costs its metrics thread about 0.3 ms."""
    try:
        with open(err, errors="replace") as f:
            return f.read().count("registry: processes=")
    except OSError:
        return 0


def wait_windows(p, port, target, timeout, err):
    """Waits (reading the agent's log every 0.1 s) until it has closed
    `target` windows, then scrapes /metrics once, 50 ms later: one scrape
    per span boundary, as a Prometheus would make. Returns (scrape, monotonic
    time, agent's /proc cpu, schedstat ns)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise PhaseError(f"tlsprof-agent run exited {p.returncode}\n{tail(err)}")
        if closes_logged(err) >= target:
            time.sleep(0.05)
            m2 = scrape(port)
            t = time.monotonic()
            cpu, sched = proc_cpu_seconds(p.pid), task_cpu_ns(p.pid)
            if m2 is None:
                raise PhaseError(f"tlsprof-agent run stopped answering /metrics on port {port}\n{tail(err)}")
            return m2, t, cpu, sched
        time.sleep(0.1)
    raise PhaseError(f"tlsprof-agent run: windows_total did not reach {target} within {timeout:.0f} s "
                     f"(port {port})\n{tail(err)}")


def counters(m):
    c = {
        "windows": metric(m, "tlsprof_agent_windows_total"),
        "cpu": metric(m, "tlsprof_agent_cpu_seconds_total"),
        "bpf": metric(m, "tlsprof_agent_bpf_seconds_total"),
        "samples": metric(m, "tlsprof_agent_samples_total"),
        "rss": metric(m, "tlsprof_agent_resident_memory_bytes"),
        "dropped": metric(m, "tlsprof_agent_dropped_samples_total", required=False),
        "usage_probe_cpu": metric(m, "tlsprof_agent_usage_probe_cpu_seconds_total", required=False),
    }
    for ph in PHASES:
        c["phase_" + ph] = metric(m, "tlsprof_agent_phase_cpu_seconds_total", phase=ph)
    return c


def run_daemon(args, wl, freq, stacks, usage, tmp, tag):
    port = free_port()
    state = os.path.join(tmp, f"{tag}.state")
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state)
    err = os.path.join(tmp, f"{tag}.stderr")
    argv = [agent_path(args), "run", *pid_flags(wl), "--frequency", str(freq), "--interval", f"{args.interval:g}",
            "--metrics-listen", f"127.0.0.1:{port}", "--state-dir", state]
    if not stacks:
        argv.append("--no-stacks")
    if usage:
        argv.append("--usage")
    n = max(1, round(args.duration / args.interval))
    ctx = wl.begin(tag)
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    try:
        ma, ta, pa, sa = wait_windows(p, port, 2, 2 * args.interval + 60, err)
        wa, h = procs_cpu_seconds(wl.pids), cpu_jiffies()
        a = counters(ma)
        mb, tb, pb, sb = wait_windows(p, port, a["windows"] + n, n * args.interval + 60, err)
        wb, hb = procs_cpu_seconds(wl.pids), host_busy(h)
        b = counters(mb)
        status = proc_status_kb(p.pid, "VmRSS", "VmHWM")
    finally:
        rc = stop(p, timeout=30)
        wl.end(ctx)
    if rc != 0:
        raise PhaseError(f"tlsprof-agent run exited {rc} on SIGTERM: {shlex.join(argv)}\n{tail(err)}")
    dt = tb - ta
    d = {k: (b[k] - a[k]) if b[k] is not None and a[k] is not None else None for k in a}
    if not d["samples"] or d["samples"] <= 0 or not d["windows"]:
        raise PhaseError(f"{tag}: no samples between the scrapes (Δsamples {d['samples']}, Δwindows {d['windows']})")
    if not d["bpf"] or d["bpf"] <= 0:
        raise PhaseError(f"{tag}: Δ tlsprof_agent_bpf_seconds_total is {d['bpf']}: are BPF run-time stats off?")
    phases = {ph: d["phase_" + ph] for ph in PHASES}
    cycle = sum(phases.values())
    return {
        "mode": "run", "frequency_hz": freq, "stacks": stacks, "usage": usage, "argv": argv,
        "span_seconds": dt,
        "windows": d["windows"],
        "windows_span_seconds": d["windows"] * args.interval,
        "user_sys_seconds": d["cpu"],
        "bpf_seconds": d["bpf"],
        "samples": d["samples"],
        "bpf_runs": d["samples"],
        "phase_seconds": phases,
        "cycle_seconds": cycle,
        "user_share": d["cpu"] / dt,
        "bpf_share": d["bpf"] / dt,
        "total_share": (d["cpu"] + d["bpf"]) / dt,
        "cycle_share": cycle / dt,
        "user_us_per_sample": cycle / d["samples"] * 1e6,
        "cpu_counter_us_per_sample": d["cpu"] / d["samples"] * 1e6,
        "bpf_us_per_sample": d["bpf"] / d["samples"] * 1e6,
        "proc_stat_cpu_seconds": (pb - pa) if pa is not None and pb is not None else None,
        "schedstat_cpu_seconds": (sb - sa) / 1e9 if sa is not None and sb is not None else None,
        "usage_probe_cpu_seconds": d["usage_probe_cpu"],
        "dropped_samples": d["dropped"],
        "rss_bytes": b["rss"],
        "vm_rss_kb": status.get("VmRSS"),
        "vm_hwm_kb": status.get("VmHWM"),
        "workload_share": (wb - wa) / dt if wa is not None and wb is not None else None,
        "host_busy": hb,
        "scrape_start": a,
        "scrape_end": b,
    }


def perf_record(args, wl, freq, callgraph, tmp, tag):
    """perf record -a [-g] for the window, on the running workload; perf's own
    CPU inside the window (follow_perf_window, overhead_vs_perf.py) and over its
    whole life."""
    data = os.path.join(tmp, f"{tag}.perf.data")
    err = os.path.join(tmp, f"{tag}.perf-record.stderr")
    argv = ["perf", "record", "-a"] + (["-g"] if callgraph else []) + [
        "-e", "cpu-clock", "-F", str(freq), "-o", data, "--", "sleep", f"{args.duration:g}"]
    ctx = wl.begin(tag)
    t0 = time.monotonic()
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    marks = {}

    def window_start():
        marks["wl_start"], marks["h"] = procs_cpu_seconds(wl.pids), cpu_jiffies()

    def window_end():
        marks["wl_end"], marks["hb"] = procs_cpu_seconds(wl.pids), host_busy(marks["h"])

    w_start, w_end, cpu_start, cpu_end = follow_perf_window(p, args.duration, window_start, window_end)
    wl_start, wl_end, hb = marks.get("wl_start"), marks.get("wl_end"), marks.get("hb")
    try:
        rc, ru = wait_rusage(p)
    finally:
        wl.end(ctx)
    done = time.monotonic()
    text = tail(err, 40)
    if rc != 0:
        raise PhaseError(f"perf record exited {rc}: {shlex.join(argv)}\n{tail(err)}")
    if not os.path.exists(data):
        raise PhaseError(f"perf record wrote no {data}\n{tail(err)}")
    if None in (w_start, w_end, cpu_start, cpu_end):
        raise PhaseError(f"perf record: could not see its window (sleep child not observed): {shlex.join(argv)}")
    m = re.search(r"\((\d+) samples\)", text)
    if not m or int(m.group(1)) == 0:
        raise PhaseError(f"perf record captured no samples: {shlex.join(argv)}\n{tail(err)}")
    lost = re.search(r"lost (\d+) chunks|Lost (\d+) samples", text)
    window = w_end - w_start
    window_cpu = (cpu_end - cpu_start) / 1e9
    total = ru.ru_utime + ru.ru_stime
    return {
        "argv": argv, "frequency_hz": freq, "callgraph": callgraph,
        "window_seconds": window,
        "window_cpu_seconds": window_cpu,
        "share": window_cpu / window,
        "whole_life_cpu_seconds": total,
        "outside_window_cpu_seconds": total - window_cpu,
        "finish_seconds": done - w_end,
        "wall_seconds": done - t0,
        "samples": int(m.group(1)),
        "data_bytes": os.path.getsize(data),
        "max_rss_bytes": ru.ru_maxrss * 1024,
        "lost": lost.group(0) if lost else "",
        "workload_share": (wl_end - wl_start) / window if wl_start is not None and wl_end is not None else None,
        "host_busy": hb,
    }


# --------------------------------------------------------------------------
# One workload

def row_label(r):
    s = f"{r['mode']} {r['frequency_hz']}"
    if not r["stacks"]:
        s += " leaf-only"
    if r["usage"]:
        s += " --usage"
    return s


def plan(args):
    """The agent measurements in order: (mode, frequency, stacks, usage)."""
    todo = []
    top = max(args.frequencies)
    modes = {"all": ["profile", "run"], "none": []}.get(args.mode, [args.mode])
    for mode in modes:
        for f in args.frequencies:
            todo.append((mode, f, True, False))
        todo.append((mode, top, False, False))
    if args.usage:
        if ("run", 99, True, False) not in todo:
            todo.append(("run", 99, True, False))
        todo.append(("run", 99, True, True))
    return todo


def run_workload(args, name, tmp):
    wl = WORKLOADS[name](args, tmp)
    res = {"workload": name, "description": wl.describe(), "pids": wl.pids, "rows": [], "perf": []}
    print(f"# {name}: {wl.describe()}", flush=True)
    for mode, f, stacks, usage in plan(args):
        tag = f"{name}-{mode}{f}{'' if stacks else '-leaf'}{'-usage' if usage else ''}"
        if mode == "profile":
            r = run_profile(args, wl, f, stacks, tmp, tag)
        else:
            r = run_daemon(args, wl, f, stacks, usage, tmp, tag)
        res["rows"].append(r)
        print(f"#   {row_label(r)}: {100 * r['total_share']:.2f}% of a core "
              f"(user+sys {100 * r['user_share']:.2f}%, BPF {100 * r['bpf_share']:.2f}%) "
              f"over {r['span_seconds']:.1f} s", flush=True)
    if args.mode != "none" and not args.no_perf:
        for f in args.frequencies:
            for cg in (False, True):
                tag = f"{name}-perf{f}{'-g' if cg else ''}"
                r = perf_record(args, wl, f, cg, tmp, tag)
                res["perf"].append(r)
                print(f"#   perf record -a{' -g' if cg else ''} @{f}: {100 * r['share']:.2f}% of a core in the "
                      f"window, {r['whole_life_cpu_seconds']:.2f} s CPU over its life", flush=True)
    res["workload_end"] = wl.finish()
    return res


# --------------------------------------------------------------------------
# Output

def pct(x, nd=2):
    return "-" if x is None else f"{100 * x:.{nd}f}%"


def num(x, spec):
    return "-" if x is None else f"{x:{spec}}"


def ratio(a, b):
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def top_phases(r, n=3):
    cyc = r["cycle_seconds"]
    if not cyc:
        return "-"
    ranked = sorted(PHASES, key=lambda k: -r["phase_seconds"][k])[:n]
    return ", ".join(f"{k} {100 * r['phase_seconds'][k] / cyc:.0f}%" for k in ranked)


def render(args, res):
    out = []
    rows = res["rows"]
    if rows:
        title = f"{res['workload']}: agent CPU, % of one core"
        header = ["user+sys", "BPF", "total", "cycle", "user µs/sample", "BPF µs/sample", "workload",
                  "top phases (share of cycle)"]
        body = []
        for r in rows:
            body.append((row_label(r), pct(r["user_share"]), pct(r["bpf_share"]), pct(r["total_share"]),
                         pct(r["cycle_share"]), num(r["user_us_per_sample"], ".2f"), num(r["bpf_us_per_sample"], ".2f"),
                         pct(r["workload_share"], 0), "  " + top_phases(r)))
        out.append(table(title, header, body))
        out.append("  profile: user+sys = agent.window_cpu_seconds / window (total = agent.cpu_share_of_core); "
                   "cycle = agent.cycle_cpu_seconds / window\n"
                   "    (the phases, from the window's start to the end of its close: the attribution after the "
                   "window is in cycle, not in user+sys)\n"
                   f"  run: Δ of the /metrics counters between scrapes right after window closes, "
                   f"--interval {args.interval:g} s; cycle = Δ sum of tlsprof_agent_phase_cpu_seconds_total\n"
                   "  user µs/sample = cycle CPU / samples taken (idle included); BPF µs/sample = BPF time / "
                   "BPF runs; workload = the profiled pids' CPU, % of one core")
        title = f"{res['workload']}: CPU by phase, % of one core"
        header = PHASES + ["sum (cycle)"]
        body = [(row_label(r), *[pct(r["phase_seconds"][k] / r["span_seconds"], 3) for k in PHASES],
                 pct(r["cycle_share"], 3)) for r in rows]
        out.append("")
        out.append(table(title, header, body))
        runs = [r for r in rows if r["mode"] == "run"]
        if runs:
            title = f"{res['workload']}: run, cross-check of the CPU counter"
            header = ["Δt (s)", "windows", "Δcpu counter (s)", "/proc stat (s)", "schedstat (s)",
                      "Δphases sum (s)", "stat/counter", "RSS", "VmHWM", "dropped"]
            body = [(row_label(r), num(r["span_seconds"], ".2f"), num(r["windows"], ".0f"),
                     num(r["user_sys_seconds"], ".3f"), num(r["proc_stat_cpu_seconds"], ".3f"),
                     num(r["schedstat_cpu_seconds"], ".3f"), num(r["cycle_seconds"], ".3f"),
                     ratio(r["proc_stat_cpu_seconds"], r["user_sys_seconds"]),
                     num(r["rss_bytes"] / 2**20 if r["rss_bytes"] is not None else None, ".1f") + " MiB",
                     num(r["vm_hwm_kb"] / 1024 if r["vm_hwm_kb"] is not None else None, ".1f") + " MiB",
                     num(r["dropped_samples"], ".0f")) for r in runs]
            out.append("")
            out.append(table(title, header, body))
            out.append("  /proc stat: utime+stime of the agent process (1/%d s ticks); schedstat: its live threads" % CLK_TCK)
            base = next((r for r in runs if r["frequency_hz"] == 99 and r["stacks"] and not r["usage"]), None)
            use = next((r for r in runs if r["usage"]), None)
            if base and use:
                extra = use["total_share"] - base["total_share"]
                probe = use["usage_probe_cpu_seconds"]
                out.append(f"  --usage at 99 Hz: agent total {pct(use['total_share'])} vs {pct(base['total_share'])} "
                           f"without: {100 * extra:+.3f} pt of a core ({ratio(use['total_share'], base['total_share'])})"
                           + (f"; the probes' own CPU (estimated by the agent, charged to the workload's threads): "
                              f"{pct(probe / use['span_seconds'], 3)} of a core" if probe is not None else ""))
        profs = [r for r in rows if r["mode"] == "profile"]
        if profs:
            title = f"{res['workload']}: profile, outside the window"
            header = ["whole-life CPU (s)", "rusage CPU (s)", "peak RSS", "report latency (ms)", "dropped"]
            body = [(row_label(r), num(r["whole_life_cpu_seconds"], ".3f"), num(r["rusage_cpu_seconds"], ".3f"),
                     num(r["max_rss_bytes"] / 2**20 if r["max_rss_bytes"] else None, ".1f") + " MiB",
                     num(r["report_latency_seconds"] * 1000 if r["report_latency_seconds"] is not None else None,
                         ".0f"), num(r["dropped_samples"], ".0f")) for r in profs]
            out.append("")
            out.append(table(title, header, body))
    if res["perf"]:
        title = f"{res['workload']}: perf record on the same workload"
        header = ["CPU in window", "(ms)", "whole-life CPU (s)", "after window (s)", "samples", "perf.data", "peak RSS",
                  "lost", "workload"]
        body = [(f"perf record -a{' -g' if p['callgraph'] else ''} @{p['frequency_hz']}", pct(p["share"], 3),
                 num(p["window_cpu_seconds"] * 1000, ".1f"), num(p["whole_life_cpu_seconds"], ".3f"), num(p["finish_seconds"], ".2f"), str(p["samples"]),
                 f"{p['data_bytes'] / 2**20:.1f} MiB", f"{p['max_rss_bytes'] / 2**20:.1f} MiB", p["lost"] or "0",
                 pct(p["workload_share"], 0)) for p in res["perf"]]
        out.append("")
        out.append(table(title, header, body))
        perf = {(p["frequency_hz"], p["callgraph"]): p for p in res["perf"]}
        body = []
        for r in rows:
            pa, pg = perf.get((r["frequency_hz"], False)), perf.get((r["frequency_hz"], True))
            body.append((row_label(r),
                         ratio(r["total_share"], pa and pa["share"]), ratio(r["total_share"], pg and pg["share"]),
                         ratio(r["user_share"], pa and pa["share"]), ratio(r["user_share"], pg and pg["share"])))
            if r["mode"] == "profile":
                tl = (r["whole_life_cpu_seconds"] or 0) + r["bpf_seconds"]
                body[-1] += (ratio(tl, pa and pa["whole_life_cpu_seconds"]),
                             ratio(tl, pg and pg["whole_life_cpu_seconds"]))
            else:
                body[-1] += ("", "")
        if body:
            title = f"{res['workload']}: tlsprof / perf, same frequency"
            header = ["total/perf -a", "total/perf -a -g", "user+sys/perf -a", "user+sys/perf -a -g",
                      "life/perf -a life", "life/perf -a -g life"]
            out.append("")
            out.append(table(title, header, body))
            out.append("  perf's column is the perf process's user+sys in its window; its in-kernel per-sample work "
                       "(and -g's stack walk\n  in the interrupt) is charged to the sampled tasks and not counted, "
                       "tlsprof's BPF time is: user+sys/perf is like for like.\n"
                       "  life: profile's whole-life CPU + BPF against perf record's whole-life CPU (set-up, "
                       "build-id pass at exit)")
    return "\n".join(out)


# --------------------------------------------------------------------------
# Soak

def slope_mb_per_10min(points):
    """Least-squares slope of (seconds, kB) points, in MB per 10 minutes."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 600 / 1024


def run_soak(args, tmp):
    wl = WORKLOADS[args.soak_workload](args, tmp)
    port = free_port()
    state = os.path.join(tmp, "soak.state")
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state)
    err = os.path.join(tmp, "soak.stderr")
    argv = [agent_path(args), "run", *pid_flags(wl), "--frequency", "99", "--interval", f"{args.interval:g}",
            "--metrics-listen", f"127.0.0.1:{port}", "--state-dir", state]
    print(f"# soak: {wl.describe()}; {shlex.join(argv)} for {args.soak:g} s", flush=True)
    ctx = wl.begin("soak")
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    samples = []
    first = last = None
    try:
        # Sampling starts once the agent has closed its 2nd window (set-up
        # and the first windows' growth are not the drift we look for).
        wait_windows(p, port, 2, 2 * args.interval + 60, err)
        t0 = time.monotonic()
        while True:
            now = time.monotonic() - t0
            if p.poll() is not None:
                raise PhaseError(f"tlsprof-agent run exited {p.returncode} during the soak\n{tail(err)}")
            wl.check()
            st = proc_status_kb(p.pid, "VmRSS", "VmHWM")
            if "VmRSS" in st:
                samples.append({"t": now, "vm_rss_kb": st["VmRSS"], "vm_hwm_kb": st.get("VmHWM")})
            m = scrape(port)
            if m is not None:
                c = counters(m)
                c["t"] = now
                if first is None:
                    first = c
                last = c
            if now >= args.soak:
                break
            time.sleep(max(0.0, min(SOAK_STEP * (len(samples)) - (time.monotonic() - t0), SOAK_STEP)))
    finally:
        rc = stop(p, timeout=30)
        wl.end(ctx)
        wend = wl.finish()
    if rc != 0:
        raise PhaseError(f"tlsprof-agent run exited {rc} on SIGTERM after the soak\n{tail(err)}")
    if len(samples) < 2:
        raise PhaseError(f"soak: only {len(samples)} RSS samples of the agent")
    rss = [(s["t"], s["vm_rss_kb"]) for s in samples]
    half = [x for x in rss if x[0] >= rss[-1][0] / 2]
    res = {"workload": args.soak_workload, "argv": argv, "soak_seconds": args.soak, "samples": samples,
           "first_kb": rss[0][1], "last_kb": rss[-1][1], "min_kb": min(v for _, v in rss),
           "max_kb": max(v for _, v in rss), "hwm_kb": samples[-1]["vm_hwm_kb"],
           "slope_mb_per_10min": slope_mb_per_10min(rss), "slope_second_half_mb_per_10min": slope_mb_per_10min(half),
           "workload_end": wend}
    if first and last and last["t"] > first["t"] and last["windows"] > first["windows"]:
        dt = last["t"] - first["t"]
        res["agent_share"] = (last["cpu"] - first["cpu"] + last["bpf"] - first["bpf"]) / dt
        res["agent_windows"] = last["windows"] - first["windows"]
    mb = lambda kb: f"{kb / 1024:.1f} MB"
    rows = [("agent VmRSS first (at {:.0f} s)".format(rss[0][0]), mb(res["first_kb"])),
            ("agent VmRSS last (at {:.0f} s)".format(rss[-1][0]), mb(res["last_kb"])),
            ("agent VmRSS min", mb(res["min_kb"])), ("agent VmRSS max", mb(res["max_kb"])),
            ("agent VmHWM at the end", mb(res["hwm_kb"]) if res["hwm_kb"] else "-"),
            ("VmRSS slope, all samples (MB / 10 min)", num(res["slope_mb_per_10min"], "+.2f")),
            ("VmRSS slope, second half (MB / 10 min)", num(res["slope_second_half_mb_per_10min"], "+.2f")),
            ("RSS samples", str(len(samples)))]
    if "agent_share" in res:
        rows.append((f"agent CPU + BPF over the soak ({res['agent_windows']:.0f} windows)", pct(res["agent_share"])))
    text = table(f"soak: run @99 Hz on {args.soak_workload}, {args.soak:g} s from window 2, VmRSS every {SOAK_STEP:g} s",
                 ["value"], rows)
    return res, text


# --------------------------------------------------------------------------

def parse_frequencies(values):
    out = []
    for v in values or ["99", "999"]:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                f = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"--frequency {part!r}: not a number")
            if f < 1:
                raise argparse.ArgumentTypeError(f"--frequency {f}: must be >= 1")
            if f not in out:
                out.append(f)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["demo", "nginx", "groundtruth", "all"], default="all")
    ap.add_argument("--frequency", action="append",
                    help="Hz; repeatable or a comma list (default 99 and 999)")
    ap.add_argument("--mode", choices=["profile", "run", "all", "none"], default="all",
                    help="agent modes to measure (none: only the --soak)")
    ap.add_argument("--duration", type=float, default=20.0,
                    help="seconds per profile window, run steady-state span and perf record (default 20)")
    ap.add_argument("--interval", type=float, default=10.0, help="run --interval (default 10, the agent's)")
    ap.add_argument("--no-perf", action="store_true",
                    help="leave out the perf record runs (agent-against-agent comparisons)")
    ap.add_argument("--usage", action="store_true", help="add run --usage at 99 Hz against run at 99 Hz")
    ap.add_argument("--soak", type=float, default=0, help="seconds of run @99 Hz with the agent's RSS sampled")
    ap.add_argument("--soak-workload", choices=["demo", "nginx"],
                    help="workload of the soak (default: --workload if demo or nginx, else demo)")
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(REPO, "build", "bin")),
                    help="directory with tlsprof-agent and the workloads (default build/bin of this checkout)")
    ap.add_argument("--json", help="also write every raw figure to this file")
    ap.add_argument("--keep", help="keep the agent's reports, perf.data and logs in this directory")
    args = ap.parse_args()
    try:
        args.frequencies = parse_frequencies(args.frequency)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if args.duration < 1 or args.interval < 1:
        ap.error("--duration and --interval must be >= 1")
    if args.soak < 0:
        ap.error("--soak must be >= 0")
    if args.soak and args.soak < 2 * SOAK_STEP:
        ap.error(f"--soak must be at least {2 * SOAK_STEP:g} s (RSS is sampled every {SOAK_STEP:g} s)")
    if args.mode == "none" and not args.soak:
        ap.error("--mode none measures nothing without --soak")
    if args.soak_workload is None:
        args.soak_workload = args.workload if args.workload in ("demo", "nginx") else "demo"

    cmd = "sudo python3 " + shlex.join([os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())] + sys.argv[1:])
    print(f"# reproduce: {cmd}")
    try:
        perf_version = subprocess.run(["perf", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        perf_version = ""
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {socket.gethostname()}  nproc {os.cpu_count()}  "
          f"kernel {os.uname().release}  {perf_version or 'perf missing'}  agent {agent_path(args)}")
    print(f"# frequencies {', '.join(map(str, args.frequencies))} Hz, leaf-only (--no-stacks) at "
          f"{max(args.frequencies)} Hz; {args.duration:g} s per profile window / run span / perf record; "
          f"run --interval {args.interval:g} s, steady state from window 2; event cpu-clock"
          + ("; --usage at 99 Hz" if args.usage else "") + (f"; soak {args.soak:g} s" if args.soak else ""))
    print_load_average()
    sys.stdout.flush()

    if os.geteuid() != 0:
        sys.exit("agent_cost.py: must run as root (BPF, perf record -a)")
    todo = [] if args.mode == "none" else (
        ["demo", "nginx", "groundtruth"] if args.workload == "all" else [args.workload])
    used = set(todo) | ({args.soak_workload} if args.soak else set())
    needed = ["tlsprof-agent"] + [{"demo": "tlsprof-demo", "groundtruth": "tlsprof-groundtruth"}[w]
                                  for w in sorted(used) if w != "nginx"]
    for tool in needed:
        if not os.access(os.path.join(args.bin, tool), os.X_OK):
            sys.exit(f"agent_cost.py: {tool} not found in {args.bin} (build it or pass --bin)")
    tools = (["perf"] if todo and not args.no_perf else []) + (["wrk", "node", "curl", "openssl"] if "nginx" in used else [])
    for tool in tools:
        if not shutil.which(tool):
            sys.exit(f"agent_cost.py: {tool} not found on PATH")
    if "nginx" in used and not os.access(os.environ.get("NGINX", "/usr/sbin/nginx"), os.X_OK):
        sys.exit("agent_cost.py: /usr/sbin/nginx not found (apt-get install nginx-light or nginx)")
    if args.soak:
        todo.append("soak")

    results = {"command": cmd, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
               "nproc": os.cpu_count(), "kernel": os.uname().release, "perf_version": perf_version,
               "frequencies_hz": args.frequencies, "duration_seconds": args.duration,
               "interval_seconds": args.interval, "usage": args.usage, "soak_seconds": args.soak,
               "workloads": {}}

    def run_one(w, tmp):
        if w == "soak":
            return run_soak(args, tmp)
        res = run_workload(args, w, tmp)
        return res, render(args, res)

    return run_workloads("agent_cost.py", args, results, todo, run_one, "tlsprof-agent-cost-")


if __name__ == "__main__":
    sys.exit(main())
