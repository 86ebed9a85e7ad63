#!/usr/bin/env python3
"""overhead_vs_perf.py: what does tlsprof cost, and does it attribute TLS time
the same as `perf record` at the same frequency on the same workload?

For each workload (tlsprof-groundtruth, node's https server under load) it runs
three phases back to back, each over the same window of --duration seconds:

  1. baseline: no profiler;
  2. tlsprof-agent profile --pid PID --duration D --frequency F --format json;
  3. perf record -a -e cpu-clock -F F -o FILE -- sleep D  (leaf only), then
     perf report --pid PID --sort sym to count the workload's samples per symbol.
     The symbol names go through `tlsprof-agent classify --family openssl`, so
     both profilers attribute with the same rules table.

and prints the profilers' cost, the workload's slowdown in each phase, and the
TLS attribution of each profiler (and, for groundtruth, the truth) side by
side. Must run as root (perf -a, BPF). Python 3 standard library only.

    sudo python3 bench/overhead_vs_perf.py [--workload groundtruth|node|all]
        [--frequency 999] [--duration 10] [--bin DIR] [--json FILE] [--keep DIR]
"""

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_DIR = os.path.join(REPO, "workloads", "node")


class PhaseError(Exception):
    """A phase could not run or produced nothing usable."""


class Stopped(Exception):
    """SIGTERM / SIGINT: unwind so that every child gets cleaned up."""


# --------------------------------------------------------------------------
# Child processes: every one we start is tracked and ended by its pid (or the
# process group it leads) on every exit path.

_children = []  # list of (Popen, own_group)


def start(argv, own_group=False, **kw):
    p = subprocess.Popen(argv, start_new_session=own_group, **kw)
    _children.append((p, own_group))
    return p


def _signal_child(p, own_group, sig):
    try:
        if own_group:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(p, timeout=10.0):
    """SIGTERM the child (its group if it leads one), SIGKILL after timeout."""
    own = next((g for q, g in _children if q is p), False)
    if p.poll() is None:
        _signal_child(p, own, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_child(p, own, signal.SIGKILL)
            p.wait()
    elif own:
        # The leader is gone; make sure nothing it started lingers.
        _signal_child(p, own, signal.SIGKILL)
    _children[:] = [(q, g) for q, g in _children if q is not p]
    return p.returncode


def stop_all():
    for p, _ in list(_children):
        stop(p, timeout=5.0)


def _on_signal(signum, _frame):
    raise Stopped(f"stopped by signal {signum}")


def wait_rusage(p):
    """Reap child p with wait4; returns (returncode, rusage of p and its
    reaped descendants). Popen must not have reaped it yet."""
    while True:
        try:
            pid, status, ru = os.wait4(p.pid, 0)
            break
        except InterruptedError:
            continue
    p.returncode = os.waitstatus_to_exitcode(status)
    _children[:] = [(q, g) for q, g in _children if q is not p]
    return p.returncode, ru


def wait_file(path, proc, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        if proc.poll() is not None:
            raise PhaseError(f"{what} exited with {proc.returncode} before writing its ready file")
        time.sleep(0.02)
    raise PhaseError(f"{what}: no ready file {path} after {timeout:.0f} s")


def tail(path, n=8):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return ""


# --------------------------------------------------------------------------
# /proc helpers

def task_cpu_ns(pid):
    """CPU time (ns, user+sys) of all threads of pid, from schedstat."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return total


def proc_stat(pid):
    """(ppid, state, comm) of pid or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    rest = s[s.rindex(")") + 2:].split()
    return int(rest[1]), rest[0], comm


def cpu_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)   # idle + iowait
    total = sum(v[:8])                           # guest time is already in user
    return total - idle, total


def host_busy(since):
    b0, t0 = since
    b1, t1 = cpu_jiffies()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else None


def find_child(ppid):
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st and st[0] == ppid:
                return int(name)
    return None


# --------------------------------------------------------------------------
# Profilers

def read_agent_report(rc, argv, out, err):
    """The JSON report an agent run (exit status rc, command argv) wrote to
    out; a PhaseError with its stderr's tail if it failed or wrote none."""
    if rc != 0:
        raise PhaseError(f"tlsprof-agent exited {rc}: {shlex.join(argv)}\n{tail(err)}")
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise PhaseError(f"tlsprof-agent wrote no readable JSON ({e})\n{tail(err)}")


def run_tlsprof(args, pid, tmp, tag):
    out = os.path.join(tmp, f"{tag}.tlsprof.json")
    err = os.path.join(tmp, f"{tag}.tlsprof.stderr")
    argv = [os.path.join(args.bin, "tlsprof-agent"), "profile", "--pid", str(pid),
            "--duration", str(args.duration), "--frequency", str(args.frequency),
            "--format", "json", "-o", out]
    t0 = time.monotonic()
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    rc, ru = wait_rusage(p)
    wall = time.monotonic() - t0
    rep = read_agent_report(rc, argv, out, err)
    proc = next((x for x in rep.get("processes", []) if x.get("pid") == pid), None)
    if proc is None:
        raise PhaseError(f"tlsprof report has no entry for pid {pid} (samples: {rep.get('samples')})")
    a = rep["agent"]
    return {
        "argv": argv,
        "report": rep,
        "process": proc,
        "wall_seconds": wall,
        "json_bytes": os.path.getsize(out),
        "window_seconds": rep["duration_seconds"],
        "window_cpu_seconds": a["window_cpu_seconds"],
        "bpf_seconds": a["bpf_seconds"],
        "bpf_stats_enabled": a.get("bpf_stats_enabled", False),
        "cpu_share_of_core": a["cpu_share_of_core"],
        "outside_window_cpu_seconds": a["cpu_seconds"] - a["window_cpu_seconds"],
        "total_cpu_seconds": a["cpu_seconds"],
        "max_rss_bytes": a["max_rss_bytes"],
        "rusage_maxrss_bytes": ru.ru_maxrss * 1024,
        "report_latency_seconds": a["report_latency_seconds"],
        "process_samples": round(proc["cpu_seconds"] * rep["frequency_hz"]),
        "dropped_samples": rep["samples"].get("dropped", 0),
    }


def follow_perf_window(p, seconds, on_start=None, on_end=None):
    """Follows `perf record ... -- sleep SECONDS` (process p) to its window.
    perf forks the workload at once and holds it (still named "perf") until
    its events are open and synthesized; then it execs `sleep`: that is the
    window start. The window ends when sleep exits. on_start() and on_end()
    run at those moments. Returns (w_start, w_end, cpu_start, cpu_end): the
    monotonic times and perf's own CPU (ns, schedstat of its threads); None
    where the window was not seen."""
    child = None
    w_start = w_end = None
    cpu_start = cpu_end = None
    deadline = time.monotonic() + seconds + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        if child is None:
            child = find_child(p.pid)
        if child is not None:
            st = proc_stat(child)
            if w_start is None and st and st[2] == "sleep":
                cpu_start = task_cpu_ns(p.pid)
                w_start = time.monotonic()
                if on_start:
                    on_start()
            if w_start is not None and (st is None or st[1] in "ZX" or st[0] != p.pid):
                cpu_end = task_cpu_ns(p.pid)
                w_end = time.monotonic()
                if on_end:
                    on_end()
                break
        time.sleep(0.005 if w_start is None else 0.02)
    return w_start, w_end, cpu_start, cpu_end


def print_load_average():
    """The header line every bench prints: a busy machine gives noisy CPU figures."""
    with open("/proc/loadavg") as f:
        la = float(f.read().split()[0])
    print(f"# load average at start {la:.2f}" + (
        "  WARNING: other processes are busy (> nproc/2); expect noisy CPU figures"
        if la > (os.cpu_count() or 1) / 2 else ""))


def run_perf_record(args, tmp, tag, on_window_end=None):
    """perf record -a for the window. Measures perf's own CPU inside the window
    (schedstat of its threads when its `sleep` child execs and when it exits)
    and over its whole life (wait4 rusage). on_window_end() is called as soon as
    the window ends (before perf finishes writing)."""
    data = os.path.join(tmp, f"{tag}.perf.data")
    err = os.path.join(tmp, f"{tag}.perf-record.stderr")
    argv = ["perf", "record", "-a", "-e", "cpu-clock", "-F", str(args.frequency),
            "-o", data, "--", "sleep", str(args.duration)]
    t0 = time.monotonic()
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    w_start, w_end, cpu_start, cpu_end = follow_perf_window(p, args.duration)
    if on_window_end:
        on_window_end()
    rc, ru = wait_rusage(p)
    done = time.monotonic()
    if rc != 0:
        raise PhaseError(f"perf record exited {rc}: {shlex.join(argv)}\n{tail(err)}")
    if not os.path.exists(data):
        raise PhaseError(f"perf record wrote no {data}\n{tail(err)}")
    total = ru.ru_utime + ru.ru_stime
    if w_start is None or w_end is None or cpu_start is None or cpu_end is None:
        # Could not see the window (perf too fast to poll?): report whole life.
        window_cpu = None
        window = None
    else:
        window_cpu = (cpu_end - cpu_start) / 1e9
        window = w_end - w_start
    lost = re.search(r"lost (\d+) chunks|Lost (\d+) samples", open(err, errors="replace").read())
    return {
        "argv": argv,
        "data": data,
        "data_bytes": os.path.getsize(data),
        "wall_seconds": done - t0,
        "window_seconds": window,
        "window_cpu_seconds": window_cpu,
        "total_cpu_seconds": total,
        "outside_window_cpu_seconds": (total - window_cpu) if window_cpu is not None else None,
        "max_rss_bytes": ru.ru_maxrss * 1024,
        "finish_seconds": (done - w_end) if w_end else None,
        "stderr_lost": lost.group(0) if lost else "",
    }


SUFFIX = re.compile(r"(@plt|@@?[A-Za-z0-9_.]+|(\.(cold|isra|part|constprop|lto_priv|llvm)(\.\d+)?)+|\.\d+)$")


def normalize_sym(name):
    prev = None
    while prev != name:
        prev = name
        name = SUFFIX.sub("", name)
    return name


def perf_attribution(args, rec, pid, tmp, tag):
    """perf report --pid PID --sort sym: per-symbol samples of the process,
    classified with tlsprof's rules table. Returns attribution + analysis cost."""
    out = os.path.join(tmp, f"{tag}.perf-report.txt")
    err = os.path.join(tmp, f"{tag}.perf-report.stderr")
    # The sort keys must include pid: perf report applies --pid to histogram
    # entries, and with --sort sym alone an entry merges a symbol's samples of
    # every process (kernel symbols, libc) and is kept or dropped whole.
    argv = ["perf", "report", "-i", rec["data"], "--pid", str(pid), "--sort", "pid,sym",
            "--stdio", "-F", "overhead,sample,pid,sym", "-t", "\t"]
    env = dict(os.environ, PAGER="cat", DEBUGINFOD_URLS="")
    t0 = time.monotonic()
    with open(out, "w") as of, open(err, "w") as ef:
        p = start(argv, stdout=of, stderr=ef, env=env)
    rc, ru = wait_rusage(p)
    wall = time.monotonic() - t0
    if rc != 0:
        raise PhaseError(f"perf report exited {rc}: {shlex.join(argv)}\n{tail(err)}")
    user = {}   # symbol -> samples
    kernel = 0
    lost = 0
    threads = set()  # "tid:comm" seen
    with open(out, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                m = re.search(r"Total Lost Samples: (\d+)", line)
                if m:
                    lost = int(m.group(1))
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 4:
                continue
            try:
                n = int(cols[1].strip())
            except ValueError:
                continue
            threads.add(cols[2].strip())
            sym = cols[3].strip()
            m = re.match(r"\[(.)\]\s+(.*)$", sym)
            if not m:
                raise PhaseError(f"perf report: cannot parse symbol column {sym!r} in {out}")
            level, name = m.group(1), m.group(2)
            if level == "k" or level == "g":   # kernel / guest kernel: non-TLS busy time
                kernel += n
            else:
                user[name] = user.get(name, 0) + n
    total = kernel + sum(user.values())
    if total == 0:
        raise PhaseError(f"perf recorded no samples of pid {pid} ({rec['data']})")
    # Classify every distinct (normalized) user symbol with tlsprof's rules.
    names = sorted({normalize_sym(s) for s in user if not s.startswith("0x")})
    cls = {}
    if names:
        cp = subprocess.run([os.path.join(args.bin, "tlsprof-agent"), "classify", "--family", "openssl"],
                            input="\n".join(names) + "\n", capture_output=True, text=True)
        if cp.returncode != 0:
            raise PhaseError(f"tlsprof-agent classify exited {cp.returncode}: {cp.stderr.strip()}")
        for line in cp.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                cls[parts[0]] = (parts[1], parts[2])
        missing = [n for n in names if n not in cls]
        if missing:
            raise PhaseError(f"classify gave no answer for {len(missing)} names, e.g. {missing[:3]}")
    algos = {}  # key -> samples
    tls = 0
    unresolved = 0
    for s, n in user.items():
        if s.startswith("0x"):
            unresolved += n
            continue
        bucket, algo = cls[normalize_sym(s)]
        if bucket == "-":
            continue
        tls += n
        key = algo_key(bucket, algo)
        algos[key] = algos.get(key, 0) + n
    return {
        "argv": argv,
        "analysis_cpu_seconds": ru.ru_utime + ru.ru_stime,
        "analysis_wall_seconds": wall,
        "analysis_max_rss_bytes": ru.ru_maxrss * 1024,
        "process_samples": total,
        "kernel_samples": kernel,
        "unresolved_samples": unresolved,
        "tls_samples": tls,
        "tls_share": tls / total,
        "lost_samples": lost,
        "share_of_tls": {k: v / tls for k, v in algos.items()} if tls else {},
        "symbols": len(user),
        "threads": sorted(threads),
    }


def algo_key(bucket, algo):
    return f"unknown ({bucket})" if algo == "unknown" else algo


def tlsprof_shares(proc):
    out = {}
    for a in proc.get("algorithms", []):
        k = algo_key(a["bucket"], a["algorithm"])
        out[k] = out.get(k, 0.0) + a["share_of_tls"]
    return out


# --------------------------------------------------------------------------
# Workloads

def gt_start(args, tmp, tag):
    ready = os.path.join(tmp, f"{tag}.gt.ready")
    out = os.path.join(tmp, f"{tag}.gt.json")
    err = os.path.join(tmp, f"{tag}.gt.stderr")
    for f in (ready, out):
        if os.path.exists(f):
            os.unlink(f)
    argv = [os.path.join(args.bin, "tlsprof-groundtruth"), "--duration", "0", "--warmup", "1",
            "--ready-file", ready, "--output", out]
    with open(err, "w") as ef:
        p = start(argv, stdout=subprocess.DEVNULL, stderr=ef)
    pid = int(wait_file(ready, p, 60, "tlsprof-groundtruth"))
    if pid != p.pid:
        raise PhaseError(f"groundtruth ready file says pid {pid}, started {p.pid}")
    return p, out, err


def gt_finish(p, out, err, signalled=False):
    if signalled:
        # SIGTERM already sent: a second one must not interrupt the JSON write.
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            pass
    rc = stop(p)
    if rc != 0:
        raise PhaseError(f"tlsprof-groundtruth exited {rc}\n{tail(err)}")
    try:
        with open(out) as f:
            gt = json.load(f)
    except (OSError, ValueError) as e:
        raise PhaseError(f"groundtruth JSON unreadable ({e})")
    if not gt.get("ok", False):
        raise PhaseError("groundtruth reports ok=false")
    return gt


def gt_truth(gt):
    cats = gt["categories"]
    measured = sum(c["cpu_seconds"] for c in cats)
    return {
        "tls_share": measured / gt["process_cpu_seconds"] if gt["process_cpu_seconds"] else None,
        "share_of_tls": {c["algorithm"]: c["cpu_seconds"] / measured for c in cats if measured},
        "ops_per_cpu_second": {c["algorithm"]: c["ops"] / c["cpu_seconds"]
                               for c in cats if c["cpu_seconds"] > 0},
        "worker_cpu_per_wall": gt["thread_cpu_seconds"] / gt["wall_seconds"],
        "wall_seconds": gt["wall_seconds"],
    }


def run_groundtruth(args, tmp):
    res = {"workload": "groundtruth", "phases": {}}
    # 1. baseline
    p, out, err = gt_start(args, tmp, "gt-base")
    h = cpu_jiffies()
    time.sleep(args.duration)
    res["phases"]["baseline"] = {"host_busy": host_busy(h), "truth": gt_truth(gt_finish(p, out, err))}
    # 2. tlsprof
    p, out, err = gt_start(args, tmp, "gt-tlsprof")
    h = cpu_jiffies()
    tp = run_tlsprof(args, p.pid, tmp, "gt")
    hb = host_busy(h)
    res["phases"]["tlsprof"] = {"profiler": tp, "host_busy": hb, "truth": gt_truth(gt_finish(p, out, err))}
    # 3. perf record; end the workload's window with perf's, then analyse.
    p, out, err = gt_start(args, tmp, "gt-perf")
    pid = p.pid
    h = cpu_jiffies()
    rec = run_perf_record(args, tmp, "gt", on_window_end=lambda: p.send_signal(signal.SIGTERM))
    hb = host_busy(h)
    truth = gt_truth(gt_finish(p, out, err, signalled=True))
    attr = perf_attribution(args, rec, pid, tmp, "gt")
    res["phases"]["perf"] = {"profiler": rec, "attribution": attr, "host_busy": hb, "truth": truth}
    # 4. baseline again: how much the workload drifts without any profiler.
    p, out, err = gt_start(args, tmp, "gt-base2")
    h = cpu_jiffies()
    time.sleep(args.duration)
    res["phases"]["baseline2"] = {"host_busy": host_busy(h), "truth": gt_truth(gt_finish(p, out, err))}
    return res


def free_port_file(path):
    if os.path.exists(path):
        os.unlink(path)


def node_load(port, seconds, tmp, tag):
    err = os.path.join(tmp, f"{tag}.load.out")
    f = open(err, "w")
    env = dict(os.environ, TMPDIR=tmp)
    p = start(["sh", os.path.join(NODE_DIR, "run-load.sh"), str(port), str(seconds)],
              own_group=True, stdout=f, stderr=subprocess.STDOUT, env=env)
    f.close()
    return p, err


def node_load_result(p, path, seconds, timeout):
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(p)
        raise PhaseError(f"load (run-load.sh) did not finish within {timeout:.0f} s")
    _children[:] = [(q, g) for q, g in _children if q is not p]
    try:
        os.killpg(p.pid, signal.SIGKILL)   # nothing of the group should remain
    except (ProcessLookupError, PermissionError):
        pass
    text = open(path, errors="replace").read()
    if rc != 0:
        raise PhaseError(f"run-load.sh exited {rc}:\n{text.strip()[-800:]}")
    m = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", text)
    h = re.search(r"handshakes=(\d+) errors=(\d+)", text)
    if not m:
        raise PhaseError(f"no wrk summary in run-load.sh output:\n{text.strip()[-800:]}")
    secs = float(m.group(2)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(3)]
    return {
        "wrk_requests": int(m.group(1)),
        "wrk_seconds": secs,
        "wrk_rps": int(m.group(1)) / secs,
        "handshakes": int(h.group(1)) if h else None,
        "handshakes_per_second": int(h.group(1)) / seconds if h else None,
        "load_seconds": seconds,
    }


def run_node(args, tmp):
    if not shutil.which("node") or not shutil.which("wrk"):
        raise PhaseError("node workload needs `node` and `wrk` on PATH")
    res = {"workload": "node", "phases": {}}
    certdir = os.path.join(tmp, "node-cert")
    cp = subprocess.run(["sh", os.path.join(NODE_DIR, "make-cert.sh"), certdir, "rsa"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        raise PhaseError(f"make-cert.sh failed: {cp.stderr.strip()}")
    ready = os.path.join(tmp, "node.ready")
    free_port_file(ready)
    err = os.path.join(tmp, "node-server.out")
    with open(err, "w") as ef:
        srv = start(["node", os.path.join(NODE_DIR, "https-server.js"),
                     "--cert", os.path.join(certdir, "cert.pem"),
                     "--key", os.path.join(certdir, "key.pem"),
                     "--ready-file", ready], stdout=ef, stderr=subprocess.STDOUT)
    port = int(wait_file(ready, srv, 30, "node https-server.js"))
    pid = srv.pid
    lead = 1.0   # load runs this long before the profiler starts (steady state)
    tail_s = 2   # and covers the profiler's own start-up and finish
    load_s = int(math.ceil(args.duration + lead + tail_s))
    timeout = load_s + 60

    def check_server():
        if srv.poll() is not None:
            raise PhaseError(f"node server exited {srv.returncode}\n{tail(err)}")


    # 0. warm-up (V8 compiles the server's hot paths), not measured
    lp, lo = node_load(port, max(3, int(args.duration // 2)), tmp, "node-warmup")
    node_load_result(lp, lo, max(3, int(args.duration // 2)), timeout)
    check_server()
    # 1. baseline
    lp, lo = node_load(port, load_s, tmp, "node-base")
    h = cpu_jiffies()
    res["phases"]["baseline"] = {"load": node_load_result(lp, lo, load_s, timeout), "host_busy": host_busy(h)}
    check_server()
    # 2. tlsprof
    lp, lo = node_load(port, load_s, tmp, "node-tlsprof")
    h = cpu_jiffies()
    time.sleep(lead)
    tp = run_tlsprof(args, pid, tmp, "node")
    res["phases"]["tlsprof"] = {"profiler": tp, "load": node_load_result(lp, lo, load_s, timeout),
                                "host_busy": host_busy(h)}
    check_server()
    # 3. perf
    lp, lo = node_load(port, load_s, tmp, "node-perf")
    h = cpu_jiffies()
    time.sleep(lead)
    rec = run_perf_record(args, tmp, "node")
    load = node_load_result(lp, lo, load_s, timeout)
    hb = host_busy(h)
    check_server()
    attr = perf_attribution(args, rec, pid, tmp, "node")
    res["phases"]["perf"] = {"profiler": rec, "attribution": attr, "load": load, "host_busy": hb}
    # 4. baseline again: the load's drift without any profiler.
    lp, lo = node_load(port, load_s, tmp, "node-base2")
    h = cpu_jiffies()
    res["phases"]["baseline2"] = {"load": node_load_result(lp, lo, load_s, timeout), "host_busy": host_busy(h)}
    check_server()
    rc = stop(srv)
    res["server_summary"] = tail(err, 1)
    if rc != 0:
        raise PhaseError(f"node server exited {rc} on SIGTERM\n{tail(err)}")
    return res


# --------------------------------------------------------------------------
# Output

def f_s(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def f_pct(x, nd=1):
    return "-" if x is None else f"{100 * x:.{nd}f}%"


def f_ratio(a, b):
    if a is None or b is None or b == 0:
        return ""
    return f"{a / b:.2f}x"


def f_mib(b):
    return "-" if b is None else f"{b / 1048576:.1f} MiB"


def f_size(b):
    if b is None:
        return "-"
    return f"{b / 1024:.1f} KiB" if b < 1048576 else f"{b / 1048576:.2f} MiB"


def f_delta(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def f_pt(a, b):
    if a is None or b is None:
        return ""
    return f"{100 * (a - b):+.1f} pt"


def table(title, header, rows):
    w0 = max([len(title)] + [len(r[0]) for r in rows if len(r) > 1]) + 2
    ncol = len(header)
    widths = [max([len(header[i])] + [len(r[i + 1]) for r in rows if len(r) > i + 1]) + 2
              for i in range(ncol)]
    lines = [title.ljust(w0) + "".join(h.rjust(w) for h, w in zip(header, widths))]
    for r in rows:
        if len(r) == 1:
            lines.append(r[0])
            continue
        lines.append(r[0].ljust(w0) + "".join(c.rjust(w) for c, w in zip(r[1:], widths)))
    return "\n".join(lines)


def cost_rows(tp, rec, attr):
    rows = [
        ("profiled window (s, wall)", f_s(tp["window_seconds"], 2), f_s(rec["window_seconds"], 2), ""),
        ("profiler CPU in window, user+sys (s)", f_s(tp["window_cpu_seconds"]),
         f_s(rec["window_cpu_seconds"]), f_ratio(tp["window_cpu_seconds"], rec["window_cpu_seconds"])),
        ("  + in-kernel per-sample work (s)",
         f_s(tp["bpf_seconds"]) if tp["bpf_stats_enabled"] else "n/a", "not measured", ""),
        ("profiler share of one core in window",
         f_pct(tp["cpu_share_of_core"], 2),
         f_pct(rec["window_cpu_seconds"] / rec["window_seconds"], 2)
         if rec["window_cpu_seconds"] is not None and rec["window_seconds"] else "-", ""),
        ("profiler CPU outside window (s)", f_s(tp["outside_window_cpu_seconds"]),
         f_s(rec["outside_window_cpu_seconds"]),
         f_ratio(tp["outside_window_cpu_seconds"], rec["outside_window_cpu_seconds"])),
        ("analysis CPU, perf report (s)", "(in row above)", f_s(attr["analysis_cpu_seconds"]), ""),
    ]
    tp_total = tp["total_cpu_seconds"] + (tp["bpf_seconds"] or 0)
    pf_total = rec["total_cpu_seconds"] + attr["analysis_cpu_seconds"]
    rows += [
        ("total profiler CPU, record+analysis (s)", f_s(tp_total), f_s(pf_total), f_ratio(tp_total, pf_total)),
        ("result ready after window end (s)", f_s(tp["report_latency_seconds"]),
         f_s((rec["finish_seconds"] or 0) + attr["analysis_wall_seconds"]),
         f_ratio(tp["report_latency_seconds"], (rec["finish_seconds"] or 0) + attr["analysis_wall_seconds"])),
        ("peak RSS, recording", f_mib(tp["max_rss_bytes"]), f_mib(rec["max_rss_bytes"]),
         f_ratio(tp["max_rss_bytes"], rec["max_rss_bytes"])),
        ("peak RSS, perf report", "-", f_mib(attr["analysis_max_rss_bytes"]), ""),
        ("output size (JSON vs perf.data)", f_size(tp["json_bytes"]), f_size(rec["data_bytes"]),
         f_ratio(tp["json_bytes"], rec["data_bytes"])),
        ("samples of the workload process", str(tp["process_samples"]), str(attr["process_samples"]), ""),
        ("lost/dropped samples", str(tp["dropped_samples"]), str(attr["lost_samples"]), ""),
    ]
    return rows


def attribution_rows(tp_proc, attr, truth_t=None, truth_p=None, min_share=0.005):
    t = tlsprof_shares(tp_proc)
    p = attr["share_of_tls"]
    rows = [("TLS share of process CPU", f_pct(tp_proc["tls_share"]), f_pct(attr["tls_share"]),
             f_pt(tp_proc["tls_share"], attr["tls_share"]))]
    if truth_t:
        rows[0] += (f"{f_pct(truth_t['tls_share'])} / {f_pct(truth_p['tls_share'])}",)
    keys = set(t) | set(p)
    if truth_t:
        keys |= set(truth_t["share_of_tls"]) | set(truth_p["share_of_tls"])

    def order(k):
        tr = truth_t["share_of_tls"].get(k, 0) if truth_t else 0
        return (-tr, -max(t.get(k, 0), p.get(k, 0)), k)

    for k in sorted(keys, key=order):
        tv, pv = t.get(k, 0.0), p.get(k, 0.0)
        trv = truth_t["share_of_tls"].get(k) if truth_t else None
        if max(tv, pv, trv or 0) < min_share:
            continue
        r = (f"{k} share of TLS", f_pct(tv), f_pct(pv), f_pt(tv, pv))
        if truth_t:
            r += (f"{f_pct(trv or 0.0)} / {f_pct(truth_p['share_of_tls'].get(k, 0.0))}",)
        rows.append(r)
    return rows


def render_groundtruth(args, res):
    ph = res["phases"]
    tp, rec, attr = ph["tlsprof"]["profiler"], ph["perf"]["profiler"], ph["perf"]["attribution"]
    title = f"groundtruth @{args.frequency} Hz, {args.duration:g} s"
    header = ["tlsprof", "perf record", "tlsprof/perf", "truth (tlsprof/perf phase)"]
    rows = [("-- cost",)] + [r + ("",) for r in cost_rows(tp, rec, attr)]
    base = ph["baseline"]["truth"]
    rows.append(("-- workload slowdown: ops per worker-thread CPU-second vs baseline "
                 "(3rd column: a 2nd baseline run after the perf phase = noise)",))
    phases = ("tlsprof", "perf", "baseline2")
    ratios = {k: [] for k in phases}
    for algo in sorted(base["ops_per_cpu_second"]):
        b = base["ops_per_cpu_second"][algo]
        cells = []
        for k in phases:
            v = ph[k]["truth"]["ops_per_cpu_second"].get(algo)
            if v:
                ratios[k].append(v / b)
            cells.append(f_delta(v / b - 1 if v else None))
        rows.append((f"{algo} (baseline {b:,.0f} ops/s)", *cells, ""))
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs)) - 1 if xs else None
    rows.append(("all categories (geometric mean)", *[f_delta(gm(ratios[k])) for k in phases], ""))
    rows.append(("worker thread CPU / wall (baseline {:.0f}%)".format(100 * base["worker_cpu_per_wall"]),
                 *[f_pct(ph[k]["truth"]["worker_cpu_per_wall"]) for k in phases], ""))
    rows.append(("host CPU busy, all processes (baseline {:.0f}%)".format(100 * ph["baseline"]["host_busy"]),
                 *[f_pct(ph[k]["host_busy"], 0) for k in phases], ""))
    rows.append(("-- attribution (leaf samples of the groundtruth pid)",))
    rows += attribution_rows(tp["process"], attr, ph["tlsprof"]["truth"], ph["perf"]["truth"])
    return table(title, header, rows)


def render_node(args, res):
    ph = res["phases"]
    tp, rec, attr = ph["tlsprof"]["profiler"], ph["perf"]["profiler"], ph["perf"]["attribution"]
    title = f"node https @{args.frequency} Hz, {args.duration:g} s"
    header = ["tlsprof", "perf record", "tlsprof/perf"]
    rows = [("-- cost",)] + cost_rows(tp, rec, attr)
    b = ph["baseline"]["load"]
    loads = [ph[k]["load"] for k in ("tlsprof", "perf", "baseline2")]
    rows.append((f"-- workload slowdown vs baseline (load runs {b['load_seconds']} s per phase, "
                 f"covering the profiler's run; 3rd column: a 2nd baseline after the perf phase = noise)",))
    rows.append((f"wrk requests/s (baseline {b['wrk_rps']:,.0f})",
                 *[f_delta(x["wrk_rps"] / b["wrk_rps"] - 1) for x in loads]))
    if b["handshakes_per_second"]:
        rows.append((f"full handshakes/s (baseline {b['handshakes_per_second']:,.1f})",
                     *[f_delta(x["handshakes_per_second"] / b["handshakes_per_second"] - 1)
                       if x["handshakes_per_second"] is not None else "-" for x in loads]))
    rows.append(("host CPU busy, all processes (baseline {:.0f}%)".format(100 * ph["baseline"]["host_busy"]),
                 *[f_pct(ph[k]["host_busy"], 0) for k in ("tlsprof", "perf", "baseline2")]))
    rows.append(("-- attribution (leaf samples of the node server pid)",))
    rows += attribution_rows(tp["process"], attr)
    rows.append(("perf samples with no symbol (JIT code etc.)", "-",
                 f_pct(attr["unresolved_samples"] / attr["process_samples"]), ""))
    rows.append(("perf samples in the kernel", "-", f_pct(attr["kernel_samples"] / attr["process_samples"]), ""))
    return table(title, header, rows)


def strip_for_json(res):
    """Drop bulky/unserializable parts (the full tlsprof report stays)."""
    return json.loads(json.dumps(res, default=str))


def run_workloads(script, args, results, todo, run_one, tmp_prefix):
    """The benches' main loop: stop on SIGINT/SIGTERM, a scratch directory
    (or --keep), each workload in turn (run_one(workload, tmp) returns its
    result and its printed table), every child ended by pid whatever
    happens, the numbers to --json. Returns the exit code."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        tmp = args.keep
    else:
        tmp = tempfile.mkdtemp(prefix=tmp_prefix)
    rc = 0
    try:
        for w in todo:
            t0 = time.monotonic()
            res, text = run_one(w, tmp)
            print()
            print(text)
            print(f"# {w}: {time.monotonic() - t0:.0f} s")
            sys.stdout.flush()
            results["workloads"][w] = res
    except PhaseError as e:
        print(f"\n{script}: run failed: {e}", file=sys.stderr)
        rc = 1
    except Stopped as e:
        print(f"\n{script}: {e}; cleaning up", file=sys.stderr)
        rc = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_all()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(strip_for_json(results), f, indent=2)
        print(f"# numbers written to {args.json}")
    return rc


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["groundtruth", "node", "all"], default="all")
    ap.add_argument("--frequency", type=int, default=999)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin")),
                    help="directory with tlsprof-agent and tlsprof-groundtruth")
    ap.add_argument("--json", help="also write all numbers to this file")
    ap.add_argument("--keep", help="keep raw files (perf.data, reports) in this directory")
    args = ap.parse_args()
    if args.duration < 1 or args.frequency < 1:
        ap.error("--duration must be >= 1 and --frequency >= 1")

    cmd = "sudo python3 " + shlex.join([os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())] + sys.argv[1:])
    print(f"# reproduce: {cmd}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {socket.gethostname()}  "
          f"nproc {os.cpu_count()}  kernel {os.uname().release}  "
          f"perf event cpu-clock (same as tlsprof), leaf only")
    with open("/proc/loadavg") as f:
        la = float(f.read().split()[0])
    print(f"# load average at start {la:.2f}" + (
        "  WARNING: other processes are busy (> nproc/2); slowdown figures will be noise"
        if la > (os.cpu_count() or 1) / 2 else ""))
    sys.stdout.flush()

    if os.geteuid() != 0:
        sys.exit("overhead_vs_perf.py: must run as root (perf record -a and BPF)")
    for tool in ("tlsprof-agent", "tlsprof-groundtruth"):
        if not os.access(os.path.join(args.bin, tool), os.X_OK):
            sys.exit(f"overhead_vs_perf.py: {tool} not found in {args.bin} (build it or pass --bin)")
    if not shutil.which("perf"):
        sys.exit("overhead_vs_perf.py: perf not found")

    results = {"command": cmd, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "host": socket.gethostname(), "nproc": os.cpu_count(), "kernel": os.uname().release,
               "frequency_hz": args.frequency, "duration_seconds": args.duration, "workloads": {}}
    todo = ["groundtruth", "node"] if args.workload == "all" else [args.workload]

    def run_one(w, tmp):
        if w == "groundtruth":
            res = run_groundtruth(args, tmp)
            return res, render_groundtruth(args, res)
        res = run_node(args, tmp)
        return res, render_node(args, res)

    return run_workloads("overhead_vs_perf.py", args, results, todo, run_one, "tlsprof-bench-")


if __name__ == "__main__":
    sys.exit(main())
